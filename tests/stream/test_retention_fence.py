"""
Retention against writers still in flight on PostgreSQL: the horizon never passes
``safe_seq + 1``, so a transaction that took its seq below the published watermark
and commits late is never below the horizon, and its row is never pruned unseen.
"""

import pytest
from django.db import connection

from rindle_app.engine.capture import FENCE_KEY, OUTBOX
from rindle_app.stream import fence
from tests.support.threads import OpenTransaction

from .retention_support import DAY, T0, Clock, add_events, outbox_seqs, publish, read_state, stamp

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'postgresql'"),
]


def test_the_horizon_stays_at_or_below_a_late_writers_seq():
    """
    W1 takes seq s1 and waits inside its transaction; later rows commit and are
    published as far as the fence allows (not past s1). Every row is 30 days old,
    yet retention's horizon stays <= s1; W1 commits and its row is kept for readers.
    """
    before = add_events([T0 - 30 * DAY] * 5)
    publish()

    def late_write():
        """W1: the shared side of the fence and an outbox seq (returned), old already."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [FENCE_KEY])
            cursor.execute(
                f'INSERT INTO {OUTBOX} (txid, "table", op, pk, new, created_at) '
                "VALUES (NULL, 't', 'add', '[1]', '{}', %s) RETURNING seq",
                [stamp(T0 - 30 * DAY)],
            )
            return cursor.fetchone()[0]

    with OpenTransaction(late_write) as w1:
        s1 = w1.result
        after = add_events([T0 - 30 * DAY] * 5)  # committed, above s1
        assert fence.safe_seq("default", timeout=0.1) is None  # W1 holds the fence
        from rindle_app.stream.retention import Retention

        Retention(age=7 * DAY, now=Clock(T0)).run_once()
        st = read_state()
        assert st.safe_seq == before[-1] < s1
        assert st.horizon <= st.safe_seq + 1 <= s1
        assert set(after) <= set(outbox_seqs())
    publish()
    assert s1 in outbox_seqs() and read_state().horizon <= s1
    Retention(age=7 * DAY, now=Clock(T0)).run_once()
    st = read_state()
    assert st.safe_seq == after[-1] and st.horizon == after[-1]
    assert outbox_seqs() == [after[-1]]
