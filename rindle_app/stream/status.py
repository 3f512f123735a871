"""
How far the change stream is behind, and who holds it back: what ``/metrics``,
``/healthz`` and the admin's stream page show an operator.

A transaction that captured a row holds the fence's shared side until it ends, and
the watermark cannot pass its seq until then (``stream.fence``). That is correct,
and must never be silent: an idle-in-transaction session holding the fence stalls
every live subscriber and the public stream. So this module reads

- the lag: ``max_seq - safe_seq`` (events committed but not yet published), and its
  age: how long the oldest of them has waited, bounded by how long safe_seq has not
  moved (``now - GREATEST(advanced_at, created_at of the first event above it)``);
- the open transactions holding (or waiting for) the fence, oldest first, from
  ``pg_locks`` joined with ``pg_stat_activity``: the backend pid to look up or
  terminate, its age, state and current query.

Every read is a few index lookups plus a scan of ``pg_locks``, capped by LIMIT and
run under ``SET LOCAL statement_timeout``: it takes no lock a writer waits on. On
SQLite the write lock orders commits, so nothing can lag and no fence exists.
"""

from dataclasses import dataclass, field

from ..engine.capture import FENCE_KEY, OUTBOX
from . import state as stream_state

# A bigint advisory key is reported in pg_locks as (classid, objid) = its high and
# low 32 bits, with objsubid 1.
FENCE_CLASSID = FENCE_KEY >> 32
FENCE_OBJID = FENCE_KEY & 0xFFFFFFFF
QUERY_CHARS = 500  # how much of a session's current query is shown
STATEMENT_TIMEOUT_MS = 500


@dataclass(frozen=True)
class FencedTransaction:
    """An open transaction on the fence: ``holding`` the shared side, or waiting."""

    pid: int
    age_seconds: float | None  # None: the role may not see other roles' sessions
    state: str | None
    query: str | None
    application: str | None
    user: str | None
    mode: str
    granted: bool

    @property
    def holding(self):
        return self.granted and self.mode == "ShareLock"


@dataclass(frozen=True)
class Status:
    epoch: str
    safe_seq: int
    max_seq: int
    horizon: int
    lag_seconds: float
    advanced_at: object = None
    checked_at: object = None
    fenced: list = field(default_factory=list)  # FencedTransaction, oldest first

    @property
    def lag(self):
        return max(0, self.max_seq - self.safe_seq)

    @property
    def oldest_fenced(self):
        """The oldest transaction holding the fence's shared side, or None."""
        return next((t for t in self.fenced if t.holding), None)


def read(cursor, *, fenced_limit=20):
    """
    The stream's ``Status`` read on ``cursor`` (inside a transaction on
    PostgreSQL, so the statement timeout is its own). Writes nothing: a missing
    state row reads as a fresh stream.
    """
    vendor = cursor.db.vendor
    if vendor == "postgresql":
        cursor.execute("SET LOCAL statement_timeout = %s", [f"{STATEMENT_TIMEOUT_MS}ms"])
        cursor.execute(
            "SELECT s.epoch, s.safe_seq, s.horizon, s.advanced_at, s.checked_at, m.max_seq, "
            "CASE WHEN m.max_seq > s.safe_seq THEN EXTRACT(EPOCH FROM clock_timestamp() - "
            f"GREATEST(s.advanced_at, (SELECT created_at FROM {OUTBOX} "
            "WHERE seq > s.safe_seq ORDER BY seq LIMIT 1))) ELSE 0 END "
            f"FROM {stream_state.TABLE} AS s, "
            f"(SELECT COALESCE(MAX(seq), 0) AS max_seq FROM {OUTBOX}) AS m WHERE s.name = %s",
            [stream_state.STREAM],
        )
        row = cursor.fetchone()
        fenced = fenced_transactions(cursor, limit=fenced_limit)
    else:
        cursor.execute(
            f"SELECT s.epoch, s.safe_seq, s.horizon, s.advanced_at, s.checked_at, "
            f"(SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}), 0 "
            f"FROM {stream_state.TABLE} AS s WHERE s.name = %s",
            [stream_state.STREAM],
        )
        row = cursor.fetchone()
        fenced = []
        if row is not None:  # the greatest seq is safe on SQLite (stream.state)
            row = (*row[:1], max(row[1], row[5], row[2] - 1), *row[2:])
    if row is None:
        cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
        max_seq = int(cursor.fetchone()[0])
        safe = max_seq if vendor != "postgresql" else 0
        return Status("", safe, max_seq, 1, 0.0, fenced=fenced)
    epoch, safe_seq, horizon, advanced_at, checked_at, max_seq, lag_seconds = row
    return Status(
        epoch=epoch,
        safe_seq=int(safe_seq),
        max_seq=int(max_seq),
        horizon=int(horizon),
        lag_seconds=max(0.0, float(lag_seconds or 0)),
        advanced_at=advanced_at,
        checked_at=checked_at,
        fenced=fenced,
    )


def fenced_transactions(cursor, *, limit=20):
    """
    The sessions holding or waiting for the outbox fence in this database, oldest
    transaction first (PostgreSQL). A role without ``pg_read_all_stats`` sees other
    roles' sessions without their start, state and query.
    """
    cursor.execute(
        "SELECT l.pid, EXTRACT(EPOCH FROM clock_timestamp() - a.xact_start), a.state, "
        "LEFT(a.query, %s), a.application_name, a.usename, l.mode, l.granted "
        "FROM pg_locks AS l LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid "
        "WHERE l.locktype = 'advisory' AND l.classid::bigint = %s AND l.objid::bigint = %s "
        "AND l.objsubid = 1 "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "ORDER BY a.xact_start NULLS LAST, l.pid LIMIT %s",
        [QUERY_CHARS, FENCE_CLASSID, FENCE_OBJID, limit],
    )
    return [
        FencedTransaction(
            pid=int(pid),
            age_seconds=None if age is None else max(0.0, float(age)),
            state=state,
            query=query,
            application=application,
            user=user,
            mode=mode,
            granted=bool(granted),
        )
        for pid, age, state, query, application, user, mode, granted in cursor.fetchall()
    ]


def leases(cursor):
    """The singleton leases (``_rindle_stream_leases``) with whether each is live now."""
    now = "clock_timestamp()" if cursor.db.vendor == "postgresql" else "CURRENT_TIMESTAMP"
    cursor.execute(
        "SELECT name, holder, epoch, acquired_at, renewed_at, expires_at, transitions, "
        f"CASE WHEN expires_at > {now} THEN 1 ELSE 0 END "
        "FROM _rindle_stream_leases ORDER BY name"
    )
    keys = ("name", "holder", "epoch", "acquired_at", "renewed_at", "expires_at", "transitions")
    return [dict(zip(keys, row[:7]), live=bool(row[7])) for row in cursor.fetchall()]


def sample(using, *, fresh=False, fenced_limit=20):
    """
    ``read`` in a short read-only transaction of its own: on a new connection when
    ``fresh`` (or when this thread's connection is inside an atomic block, whose
    statement timeout must stay the caller's), closed afterwards.
    """
    from django.db import connections

    own = fresh or connections[using].in_atomic_block
    conn = connections.create_connection(using) if own else connections[using]
    try:
        with conn.cursor() as cursor:
            if conn.vendor != "postgresql":
                return read(cursor, fenced_limit=fenced_limit)
            cursor.execute("BEGIN READ ONLY")
            try:
                return read(cursor, fenced_limit=fenced_limit)
            finally:
                cursor.execute("ROLLBACK")
    finally:
        if own:
            conn.close()
