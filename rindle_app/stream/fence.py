"""
The outbox fence on PostgreSQL: the greatest seq a reader may tail up to.

Sequence numbers are allocated when a row is captured, but transactions commit in
their own order: seq 11 can be visible while seq 10's transaction is still open. A
reader that moved past 11 would never see 10. So every capturing transaction holds
the SHARED side of an advisory lock from before its first seq to its commit (the
outbox's guard trigger takes it, ``engine.capture``), and ``safe_seq`` takes the
EXCLUSIVE side, which waits
until every transaction that had allocated a seq has ended, then reads the greatest
committed seq in a fresh statement: everything at or below it is final.

The exclusive lock is held for one statement and waits at most ``timeout``
seconds; past that (a long transaction writing captured rows), ``safe_seq``
returns None and the reader tries again later rather than skip anything. SQLite
needs none of this: its write lock already orders commits by seq.

``stream.watermark`` now publishes the same value for the whole fleet; this
per-reader helper stays until the readers read the published one.
"""

from django.db import connections

from ..engine.capture import FENCE_KEY, OUTBOX


def safe_seq(using, timeout=0.2):
    """The greatest seq below which no transaction can still commit, or None on timeout."""
    conn = connections[using]
    if conn.vendor != "postgresql":
        raise ValueError("the outbox fence is for PostgreSQL; SQLite's write lock orders seqs")
    if conn.in_atomic_block:
        raise RuntimeError("safe_seq must not run inside a transaction: it would see too little")
    conn.ensure_connection()
    raw = conn.connection
    with raw.transaction():
        with raw.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{int(timeout * 1000)}ms'")
            try:
                with raw.transaction():  # a savepoint: a timeout leaves the outer one usable
                    cursor.execute("SELECT pg_advisory_xact_lock(%s)", [FENCE_KEY])
            except Exception as exc:
                if getattr(exc, "sqlstate", None) == "55P03":  # lock_not_available
                    return None
                raise
            cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
            return cursor.fetchone()[0]
