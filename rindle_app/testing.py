"""Public test helpers for projects that use rindle."""

import contextlib

from django.db import connections

from .engine.capture import OUTBOX
from .engine.engine import Engine


@contextlib.contextmanager
def fresh_runtime(using="default"):
    """
    ``with fresh_runtime() as runtime:`` — the block runs as a fresh process: every
    runtime of this process (engine, hub, ledger, tick, quota and grant caches; see
    ``rindle_app.runtime``) is shut down first, and again when the block ends, so
    nothing a test started outlives it. Ledgers are dropped unflushed, as a crash
    drops them: flush in the test what it must see stored. Yields the runtime of
    ``using``; its parts start on first use, as in a server. As a pytest fixture:
    ``rindle_runtime`` (``pytest_plugins = ["rindle_app.pytest_plugin"]``).
    """
    from . import runtime as runtimes

    runtimes.shutdown(flush=False)
    try:
        yield runtimes.get_runtime(using)
    finally:
        runtimes.shutdown(flush=False)


def outbox_high_water(using="default"):
    """The greatest outbox seq committed so far (0 when empty)."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
        return cursor.fetchone()[0]


def outbox_since(seq, using="default"):
    """Captured events after ``seq`` as dicts, oldest first."""
    from .models import ChangeEvent

    return [
        {"seq": e.seq, "table": e.table, "op": e.op, "pk": e.key, "old": e.old, "new": e.new}
        for e in ChangeEvent.objects.using(using).filter(seq__gt=seq).order_by("seq")
    ]


class running:
    """``with running() as engine:`` — a fresh engine, closed (drained) on exit."""

    def __init__(self, using="default"):
        self.engine = Engine(using)

    def __enter__(self):
        return self.engine.start()

    def __exit__(self, *exc):
        self.engine.close()


class hold_writer:
    """
    ``with hold_writer(engine):`` — the writer thread is busy until the block ends, so
    requests submitted inside it queue up and commit together (a group commit) after.
    """

    def __init__(self, engine, timeout=10):
        self.engine = engine
        self.timeout = timeout

    def __enter__(self):
        import threading

        entered, self._release = threading.Event(), threading.Event()

        def gate(tx):
            entered.set()
            self._release.wait(self.timeout)

        self._request = self.engine.submit(gate)
        if not entered.wait(self.timeout):
            raise TimeoutError("the writer did not pick up the gate")
        return self

    def __exit__(self, *exc):
        self._release.set()
        self.engine.wait(self._request)
