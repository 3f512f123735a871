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
"""

import secrets
from dataclasses import dataclass

from ..engine.capture import OUTBOX

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
