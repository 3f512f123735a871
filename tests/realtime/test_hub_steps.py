"""
Which thread applies this process's commits to the live queries.

On SQLite the writer hands its rows over, so the committing thread applies them
itself when the hub is free (no hub-thread wake-up per commit); a busy hub never
makes a write wait, and the hub thread applies the commit once it is free. On
Postgres the hub thread always does.
"""

import threading
import time

import pytest

from rindle_app.realtime.hub import get_hub

pytestmark = pytest.mark.django_db(transaction=True)


def _write_user(engine, pk):
    sql = 'INSERT INTO "user" ("id", "name") VALUES (%s, %s)'
    return engine.write(lambda tx: tx.execute(sql, [pk, f"user {pk}"])).cv


def _record_steps(hub):
    """Wrap ``hub.step``: the ident of each thread that ran a step that applied commits."""
    threads, real = [], hub.step

    def step():
        before = hub.catalog.version
        version = real()
        if version > before:
            threads.append(threading.get_ident())
        return version

    hub.step = step
    return threads


def _quiet_hub(engine):
    hub = get_hub(engine)
    hub.poll_interval = 60.0  # the hub thread wakes only when it is woken
    hub._wake.set()  # let it pick up the long interval
    time.sleep(0.05)
    return hub


def test_a_commit_is_applied_by_the_committing_thread_when_the_hub_is_free(live):
    hub = _quiet_hub(live)
    threads = _record_steps(hub)
    cv = _write_user(live, "h1")
    if live.vendor == "sqlite":
        # applied before the write returned, here
        assert hub.catalog.version == cv
        assert threads == [threading.get_ident()]
    else:
        deadline = time.monotonic() + 5
        while hub.catalog.version < cv and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hub.catalog.version == cv
        assert threading.get_ident() not in threads


def test_a_busy_hub_does_not_hold_up_a_write_and_its_thread_applies_the_commit(live):
    hub = _quiet_hub(live)
    threads = _record_steps(hub)
    taken, release = threading.Event(), threading.Event()

    def hold():
        with hub.lock:
            taken.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert taken.wait(5)
        started = time.monotonic()
        cv = _write_user(live, "h2")
        assert time.monotonic() - started < 1.0  # not the 5 s the lock is held for
        assert hub.catalog.version < cv  # nobody could apply it yet
    finally:
        release.set()
        holder.join(5)
    deadline = time.monotonic() + 5
    while hub.catalog.version < cv and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.catalog.version == cv
    assert threads and threading.get_ident() not in threads


def test_a_step_that_fails_on_the_committing_thread_is_retried_by_the_hub(live):
    if live.vendor != "sqlite":
        pytest.skip("on Postgres every step runs on the hub thread")
    hub = _quiet_hub(live)
    real, failed = hub.step, []

    def step():
        if not failed:
            failed.append(threading.get_ident())
            raise RuntimeError("boom")
        return real()

    hub.step = step
    cv = _write_user(live, "h3")  # the write itself succeeds
    deadline = time.monotonic() + 5
    while hub.catalog.version < cv and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hub.catalog.version == cv
    assert failed == [threading.get_ident()]


def test_a_close_during_a_start_on_another_thread_leaves_nothing_running(live, monkeypatch):
    """
    A server shutting down while a hub is still starting (a slow first read) must not
    leave the hub thread, the commit listener or the change listener behind.
    """
    from rindle_app.ivm import live as live_module
    from rindle_app.realtime.hub import Hub

    real_start, in_start = live_module.LiveQueries.start, threading.Event()

    def slow_start(self):
        in_start.set()
        time.sleep(0.3)
        return real_start(self)

    monkeypatch.setattr(live_module.LiveQueries, "start", slow_start)
    hub = Hub(live)
    errors = []

    def start():
        try:
            hub.start()
        except RuntimeError as error:  # a close that won the race refuses the start
            errors.append(error)

    starter = threading.Thread(target=start)
    starter.start()
    assert in_start.wait(5)
    hub.close()  # while start() is still inside LiveQueries.start
    starter.join(5)
    assert not starter.is_alive()
    assert hub._thread is None or not hub._thread.is_alive()
    assert hub._on_commit not in live._writer._listeners
    if hub.live is not None:
        assert hub.live._deliver not in [fn for _since, fn in live._writer._change_listeners]


def test_a_closed_hub_refuses_to_start(live):
    from rindle_app.realtime.hub import Hub

    hub = Hub(live)
    hub.close()
    with pytest.raises(RuntimeError, match="closed before it started"):
        hub.start()
    assert hub._on_commit not in live._writer._listeners
