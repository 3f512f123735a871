"""Helpers of the lock-free reader tests (tests/stream/test_reader_*.py)."""

import threading
import time

import pytest
from django.db import connection, connections, transaction

from project.demo.models import User
from tests.support.threads import OpenTransaction


def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("on SQLite the write lock orders commits: nothing is in flight to read past")


def held_user(pk):
    """``with held_user("u-open"):`` another session holds a transaction open on a
    synced table (it inserted user ``pk``, so it holds the shared side of the outbox
    fence and an outbox seq) until the block ends; then it commits."""
    return OpenTransaction(lambda: User.objects.create(id=pk, name="held open"))


class ShortWrites:
    """
    ``with ShortWrites() as w:`` a thread commits one short synced-table write after
    another (an UPDATE of user ``pk``, its own transaction) and records each one's
    latency until the block ends; ``w.p99()`` in seconds.
    """

    def __init__(self, pk="u-short"):
        self.pk = pk
        self.latencies = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            n = 0
            while not self._stop.is_set():
                n += 1
                started = time.monotonic()
                User.objects.filter(id=self.pk).update(name=f"short {n}")
                self.latencies.append(time.monotonic() - started)
                time.sleep(0.005)
        finally:
            connections.close_all()

    def __enter__(self):
        User.objects.get_or_create(id=self.pk, defaults={"name": "short"})
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def p99(self):
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def prune(upto, horizon=None):
    """
    What retention does, by hand: delete the outbox prefix ``seq <= upto`` and raise
    the horizon to ``upto + 1`` (or ``horizon``) in ONE transaction.
    """
    from rindle_app.engine.capture import OUTBOX
    from rindle_app.stream import state

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {OUTBOX} WHERE seq <= %s", [upto])
        state.ensure(cursor)
        cursor.execute(
            f"UPDATE {state.TABLE} SET horizon = %s WHERE name = %s",
            [upto + 1 if horizon is None else horizon, state.STREAM],
        )


def stream_state():
    from rindle_app.stream import state

    with connection.cursor() as cursor:
        return state.read(cursor)
