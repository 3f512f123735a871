"""
The change stream's state row (``_rindle_stream``, model ``StreamState``): the
one place readers, the watermarker and retention agree on how far the outbox may
be read, how far back it still reaches, and which numbering it is in.

- ``safe_seq``: every seq at or below it is committed or gone for good. On
  PostgreSQL the watermarker publishes it (``stream.watermark``), monotonically; on
  SQLite the write lock orders commits by seq, so it is simply the greatest seq.
- ``horizon``: the first seq retention kept (``stream.retention``). A reader whose
  next seq (cursor + 1) is below it must resnapshot.
- ``epoch``: names the numbering. A restored database gets a new one, so a cursor
  of the old one is told to resnapshot instead of reading re-issued seqs.

A Django test flush empties the table: readers then see (and ``ensure`` writes) a
fresh row, safe_seq 0 and horizon 1, under a new epoch.

Restores (``check_identity``). ``identity`` records what the epoch was minted for,
and ``check_identity`` (retention and the watermarker call it) mints a new epoch
when the database is no longer that one, or when its numbering went backwards; see
its docstring for what it detects and what it cannot.
"""

import logging
import os
import secrets
from dataclasses import dataclass

from django.db import DatabaseError, transaction

from ..engine.capture import FENCE_KEY, OUTBOX

logger = logging.getLogger("rindle.stream")

TABLE = "_rindle_stream"
STREAM = "outbox"  # the one stream: the whole outbox


@dataclass(frozen=True)
class State:
    epoch: str
    safe_seq: int
    horizon: int


def mint_epoch():
    """A new epoch: 16 random hex digits."""
    return secrets.token_hex(8)


def ensure(cursor):
    """Create the stream's row if it is missing (a fresh or flushed database)."""
    vendor = cursor.db.vendor
    conflict = "ON CONFLICT (name) DO NOTHING" if vendor == "postgresql" else ""
    verb = "INSERT" if vendor == "postgresql" else "INSERT OR IGNORE"
    cursor.execute(
        f"{verb} INTO {TABLE} (name, epoch, safe_seq, horizon, identity) "
        f"VALUES (%s, %s, 0, 1, '') {conflict}",
        [STREAM, mint_epoch()],
    )


def read(cursor):
    """
    The stream's ``State`` as of the cursor's snapshot (the row is created first if
    missing, so call it where a write is allowed, or after ``ensure``).

    On SQLite safe_seq is the greatest seq in the outbox, read in the same statement.
    """
    vendor = cursor.db.vendor
    if vendor == "postgresql":
        sql = f"SELECT epoch, safe_seq, horizon FROM {TABLE} WHERE name = %s"
    else:
        sql = (
            f"SELECT epoch, MAX(safe_seq, (SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX})), "
            f"horizon FROM {TABLE} WHERE name = %s"
        )
    cursor.execute(sql, [STREAM])
    row = cursor.fetchone()
    if row is None:
        ensure(cursor)
        cursor.execute(sql, [STREAM])
        row = cursor.fetchone()
    return State(epoch=row[0], safe_seq=int(row[1]), horizon=int(row[2]))


def publish(cursor, seq):
    """
    Raise the published safe_seq to ``seq`` (never lower it: a stale or second
    publisher is harmless) and return the value now published. The watermarker
    calls it holding the exclusive side of the fence (``stream.watermark``).
    """
    ensure(cursor)
    cursor.execute(
        f"UPDATE {TABLE} SET "
        "advanced_at = CASE WHEN %s > safe_seq THEN CURRENT_TIMESTAMP ELSE advanced_at END, "
        "checked_at = CURRENT_TIMESTAMP, "
        "safe_seq = CASE WHEN %s > safe_seq THEN %s ELSE safe_seq END "
        "WHERE name = %s RETURNING safe_seq",
        [seq, seq, seq, STREAM],
    )
    return int(cursor.fetchone()[0])


# --- the epoch and what it was minted for ------------------------------------------------


def identity(cursor):
    """
    What identifies this database as the one the epoch was minted for, as a dict of
    text values (a part the role may not read is left out, never guessed):

    - PostgreSQL: ``system`` (``pg_control_system()``'s system identifier: a new
      cluster, as ``initdb`` or a logical restore elsewhere makes, has another),
      ``timeline`` (the WAL timeline: a point-in-time recovery, and a promoted
      replica, run on a new one), ``database`` (the database's oid: a dump restored
      into a new database has another) and ``table`` (the oid of ``_rindle_stream``:
      a dump restored over this database, ``pg_restore --clean``, recreates it).
    - SQLite: ``file``, the database file's inode (a copy restored into place is a
      new file), or ``memory``.
    """
    if cursor.db.vendor == "postgresql":
        probes = {
            "system": "SELECT system_identifier::text FROM pg_control_system()",
            "timeline": "SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)",
            "database": "SELECT oid::text FROM pg_database WHERE datname = current_database()",
            "table": f"SELECT '{TABLE}'::regclass::oid::text",
        }
        found = {}
        for part, sql in probes.items():
            try:  # a savepoint: a refused probe (a managed service's role) leaves the rest
                with transaction.atomic(using=cursor.db.alias):
                    cursor.execute(sql)
                    row = cursor.fetchone()
            except DatabaseError:
                continue
            if row is not None and row[0] is not None:
                found[part] = str(row[0])
        return found
    cursor.execute("PRAGMA database_list")
    path = next((row[2] for row in cursor.fetchall() if row[1] == "main"), "")
    if not path:
        return {"file": "memory"}
    try:
        return {"file": str(os.stat(path).st_ino)}
    except OSError:
        return {}


def _encode(parts):
    return ";".join(f"{k}={v}" for k, v in sorted(parts.items()))


def _decode(text):
    parts = {}
    for item in (text or "").split(";"):
        key, sep, value = item.partition("=")
        if sep and key:
            parts[key] = value
    return parts


def _issued(cursor):
    """The greatest seq the outbox's numbering has handed out (committed or not)."""
    if cursor.db.vendor == "postgresql":
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'seq')", [OUTBOX])
        sequence = cursor.fetchone()[0]
        cursor.execute(f"SELECT last_value, is_called FROM {sequence}")
        last, called = cursor.fetchone()
        return int(last) if called else int(last) - 1
    cursor.execute("SELECT seq FROM sqlite_sequence WHERE name = %s", [OUTBOX])
    row = cursor.fetchone()
    cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
    return max(int(row[0]) if row else 0, int(cursor.fetchone()[0]))


def _renumber_past(cursor, floor, lock_timeout_ms):
    """
    Make the outbox's next seq greater than ``floor``; False when the fence was busy.

    On PostgreSQL it holds the EXCLUSIVE side of the writer fence to do so: no
    writer is then between taking a seq and committing, so none can commit a seq
    at or below ``floor`` after the new epoch is published. SQLite's write lock
    (held by the caller's transaction) does the same.
    """
    if cursor.db.vendor == "postgresql":
        cursor.execute(f"SET LOCAL lock_timeout = '{int(lock_timeout_ms)}ms'")
        try:
            with transaction.atomic(using=cursor.db.alias):
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [FENCE_KEY])
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available
                return False
            raise
        cursor.execute("SELECT pg_get_serial_sequence(%s, 'seq')", [OUTBOX])
        cursor.execute("SELECT setval(%s, %s, true)", [cursor.fetchone()[0], floor])
        return True
    cursor.execute("UPDATE sqlite_sequence SET seq = %s WHERE name = %s", [floor, OUTBOX])
    if cursor.rowcount == 0:
        cursor.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [OUTBOX, floor])
    return True


def check_identity(cursor, seen=None, lock_timeout_ms=50):
    """
    Mint a new epoch when this database is a restored one; ``(State, minted)``.

    Call it inside a transaction (retention and the watermarker do, on their own
    short one). It mints when:

    1. the recorded ``identity`` and this database's (``identity()``) differ in a
       part both know: a dump restored into a new database or cluster, a dump
       restored over this one, a point-in-time recovery or a promoted replica (its
       new timeline: an asynchronous replica may have lost commits whose seqs are
       then handed out again), a SQLite file restored from a copy;
    2. the numbering went backwards: the outbox's sequence has handed out less than
       ``safe_seq`` (or ``horizon - 1``), as when the sequence was reset or the rows
       restored without it. The sequence is then moved past both (under the fence),
       so the new epoch never re-issues a seq a reader already passed;
    3. ``seen``, a ``State`` the caller read earlier from this database, has the
       same epoch but a greater safe_seq or horizon: the database was swapped for
       an older copy under a running process (neither moves back otherwise).

    Two checkers never mint twice for one restore: the new epoch is written only
    over the epoch they read. A row with no identity yet (a fresh or flushed
    table, or one migrated before identities were recorded) records this
    database's and mints nothing.

    Limits, stated plainly: a restore is seen only when something checks (the
    first retention run of a starting process, each later run, the watermarker),
    so readers may serve the old epoch for that long; a file-system snapshot of a
    PostgreSQL data directory restored in place, or a SQLite file copied back over
    the same inode (``cp`` onto the file, ``.restore``), keeps every identity part,
    and is caught only by 2 or 3. A moved SQLite file, a failover to a synchronous
    replica or a managed service that moves the database also mint: those cost
    every reader one resnapshot, never a wrong answer.
    """
    ensure(cursor)
    cursor.execute(
        f"SELECT epoch, safe_seq, horizon, identity FROM {TABLE} WHERE name = %s", [STREAM]
    )
    epoch, stored_safe, horizon, recorded = cursor.fetchone()
    stored_safe, horizon = int(stored_safe), int(horizon)
    current = read(cursor)
    here = identity(cursor)
    known = _decode(recorded)
    reasons = []
    changed = sorted(k for k in here.keys() & known.keys() if here[k] != known[k])
    if changed and recorded:
        reasons.append("identity changed (" + ", ".join(changed) + ")")
    floor = max(stored_safe, horizon - 1)
    if _issued(cursor) < floor:
        reasons.append(f"the outbox numbering is below safe_seq/horizon ({floor})")
        if not _renumber_past(cursor, floor, lock_timeout_ms):
            logger.warning("rindle stream: the outbox numbering went backwards; fence busy, retry")
            return current, False
    if (
        seen is not None
        and seen.epoch == epoch
        and (current.safe_seq < seen.safe_seq or current.horizon < seen.horizon)
    ):
        reasons.append(f"safe_seq/horizon moved back (from {seen.safe_seq}/{seen.horizon})")
    merged = _encode({**known, **here})
    if not reasons:
        if merged != recorded:
            cursor.execute(
                f"UPDATE {TABLE} SET identity = %s WHERE name = %s AND epoch = %s",
                [merged, STREAM, epoch],
            )
        return current, False
    fresh = mint_epoch()
    cursor.execute(
        f"UPDATE {TABLE} SET epoch = %s, identity = %s WHERE name = %s AND epoch = %s",
        [fresh, _encode(here), STREAM, epoch],
    )
    if cursor.rowcount == 0:  # another checker minted first
        return read(cursor), False
    logger.warning(
        "rindle stream: a new epoch %s replaces %s (%s): every reader resnapshots",
        fresh,
        epoch,
        "; ".join(reasons),
    )
    return read(cursor), True
