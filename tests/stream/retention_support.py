"""
Helpers of the retention tests (``test_retention_*.py``): outbox rows stamped by a
fake clock, the watermark published as the watermarker would, and the invariant.
"""

import datetime

from django.db import connection, transaction

from rindle_app.engine.capture import FENCE_KEY, OUTBOX
from rindle_app.stream import fence, state

UTC = datetime.UTC
T0 = datetime.datetime(2026, 1, 1, tzinfo=UTC)
DAY = datetime.timedelta(days=1)


class Clock:
    """A fake clock: ``clock()`` is the time, ``clock.advance(delta)`` moves it."""

    def __init__(self, start=T0):
        self.at = start

    def __call__(self):
        return self.at

    def advance(self, delta):
        self.at += delta


def stamp(value):
    """``value`` as the outbox column stores it on this backend."""
    return connection.ops.adapt_datetimefield_value(value)


def add_events(stamps):
    """One committed outbox row per datetime in ``stamps`` (in seq order); their seqs."""
    seqs = []
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":  # the writer side of the fence, as capture takes it
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [FENCE_KEY])
        for at in stamps:
            cursor.execute(
                f'INSERT INTO {OUTBOX} (txid, "table", op, pk, old, new, created_at) '
                "VALUES (NULL, 't', 'add', '[1]', NULL, '{}', %s) RETURNING seq",
                [stamp(at)],
            )
            seqs.append(cursor.fetchone()[0])
    return seqs


def publish():
    """Publish safe_seq as the watermarker does (SQLite's is MAX(seq) already)."""
    if connection.vendor != "postgresql":
        return read_state().safe_seq
    seq = fence.safe_seq("default", timeout=5)
    with transaction.atomic(), connection.cursor() as cursor:
        return state.publish(cursor, seq)


def read_state():
    with transaction.atomic(), connection.cursor() as cursor:
        return state.read(cursor)


def outbox_seqs():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT seq FROM {OUTBOX} ORDER BY seq")
        return [row[0] for row in cursor.fetchall()]


def assert_prefix_invariant(original):
    """
    What a pruner leaves, wherever it stopped: the outbox is exactly the rows of
    ``original`` at or above the horizon (a contiguous prefix went, nothing else),
    the horizon is the first seq kept once anything went, and it is at most
    ``safe_seq + 1``.
    """
    st = read_state()
    kept = outbox_seqs()
    assert kept == [s for s in original if s >= st.horizon], (st, kept[:5])
    assert st.horizon <= st.safe_seq + 1, st
    if st.horizon > original[0]:
        assert kept and st.horizon == kept[0], (st, kept[:5])
    return st, kept
