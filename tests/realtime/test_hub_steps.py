"""
Which thread applies this process's commits to the live queries.

On SQLite the writer hands its rows over, so the committing thread applies them
itself when the hub is free (no hub-thread wake-up per commit); a busy hub never
makes a write wait, and the hub thread applies the commit once it is free. On
Postgres the hub thread always does.
"""

import json
import threading
import time

import pytest

from rindle_app.exceptions import LimitExceeded
from rindle_app.realtime.hub import get_hub
from rindle_app.testing import fresh_result

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


class _Loop:
    """A connection's event loop, standing in: each hand-over runs at once."""

    def call_soon_threadsafe(self, callback, *args):
        callback(*args)


READ_SECONDS = 0.6


def test_a_new_shapes_database_read_holds_no_lock_other_sockets_wait_for(live, monkeypatch):
    """
    A new shape's first read is made to take 0.6 s. Meanwhile a write commits and
    an already-subscribed socket gets its frame at once (it waited for the whole
    read before: the read ran under the hub's lock, and so did every commit). The
    new subscription's seq 0 is then the database at its cv, the write included,
    though the write committed after its rows were read.
    """
    from rindle_app.stream.partitions import PartitionSource

    hub = _quiet_hub(live)
    for n in range(5):
        _write_user(live, f"u{n}")
    loop = _Loop()
    other, late = [], []
    watching = hub.connect("watching", loop, other.extend)
    hub.subscribe(watching, 1, {"table": "user", "orderBy": [["name", "asc"]]}, "normalized")
    reading = threading.Event()
    real = PartitionSource.read

    def slow_read(source, table, sql, params, version):
        if table.name == "user" and threading.current_thread().name == "new-shape":
            if not reading.is_set():
                reading.set()
                time.sleep(READ_SECONDS)
        return real(source, table, sql, params, version)

    monkeypatch.setattr(PartitionSource, "read", slow_read)
    newcomer = hub.connect("newcomer", loop, late.extend)
    shape = {"table": "user", "orderBy": [["id", "desc"]], "limit": 3}
    subscriber = threading.Thread(
        target=hub.subscribe, args=(newcomer, 1, shape, "normalized"), name="new-shape"
    )
    subscriber.start()
    try:
        assert reading.wait(5)
        other.clear()
        started = time.monotonic()
        cv = _write_user(live, "u9")
        deadline = started + 5
        while not any(f'"cv":{cv}' in f for f in other) and time.monotonic() < deadline:
            time.sleep(0.002)
        waited = time.monotonic() - started
    finally:
        subscriber.join(10)
    assert any(f'"cv":{cv}' in f for f in other)
    assert waited < READ_SECONDS / 3, f"the other socket's frame waited {waited * 1000:.0f} ms"
    seq0 = next(json.loads(f) for f in late if f.startswith('{"t":"nbatch"'))
    assert seq0["batch"]["cv"] >= cv
    shared = hub.catalog.queries[newcomer.subs[1].key]
    assert [row["id"] for row in shared.view.rows()] == ["u9", "u4", "u3"]
    assert shared.view.result() == fresh_result(live, shared.query)


def test_a_new_shape_reads_nothing_under_the_hub_lock_and_a_too_large_one_is_refused(
    live, monkeypatch, settings
):
    """
    New shapes of every kind (a window over a whole table with its subtrees, a
    guarded window, a detail by primary key) are subscribed: not one of their
    database reads runs while the subscribing thread holds the hub's lock, and each
    seq 0 equals SQL. A query over the socket's footprint budget is refused, its
    reads made outside the lock too, and not read a second time under it.
    """
    from project.demo.models import Comment, Issue, User
    from rindle_app.stream.partitions import PartitionSource
    from tests.support.demo import issue
    from tests.support.wire import rel, simple

    User.objects.bulk_create([User(id=f"u{n}", name=f"User {n}") for n in range(60)])
    Issue.objects.bulk_create(
        [issue(f"i{n}", owner=f"u{n % 3}", created=float(n)) for n in range(40)]
    )
    Comment.objects.bulk_create(
        [
            Comment(id=f"c{n}", issue_id=f"i{n % 40}", author_id="u1", body="x", created_at=n)
            for n in range(80)
        ]
    )
    hub = _quiet_hub(live)
    real, reads = PartitionSource.read, []

    def read(source, table, sql, params, version):
        reads.append((table.name, hub.lock.held()))
        return real(source, table, sql, params, version)

    monkeypatch.setattr(PartitionSource, "read", read)
    comments = rel(["id"], ["issueId"], {"table": "comment", "alias": "comments"})
    owner = rel(["ownerId"], ["id"], {"table": "user", "alias": "owner", "one": True})
    shapes = [
        {
            "table": "issue",
            "orderBy": [["createdAt", "desc"]],
            "limit": 5,
            "related": [comments, owner],
        },
        {
            "table": "issue",
            "where": simple("ownerId", "=", "u1"),
            "orderBy": [["createdAt", "asc"]],
            "limit": 4,
        },
        {
            "table": "issue",
            "where": simple("id", "=", "i7"),
            "one": True,
            "orderBy": [["id", "asc"]],
            "related": [comments],
        },
    ]
    conn = hub.connect("c", _Loop(), lambda frames: None)
    for query_id, shape in enumerate(shapes, 1):
        reads.clear()
        sub = hub.subscribe(conn, query_id, shape, "normalized")
        assert reads and not [name for name, locked in reads if locked], shape
        shared = hub.catalog.queries[sub.key]
        assert shared.view.result() == fresh_result(live, shared.query)

    settings.RINDLE = {**settings.RINDLE, "WS_MAX_FOOTPRINT_ROWS": 40}
    reads.clear()
    built, register = [], hub.catalog.register
    hub.catalog.register = lambda ast, budget=None: built.append(ast) or register(ast, budget)
    with pytest.raises(LimitExceeded) as refused:
        hub.subscribe(conn, 9, {"table": "user", "orderBy": [["name", "asc"]]}, "normalized")
    assert refused.value.code == "footprint_too_large"
    assert reads and not [name for name, locked in reads if locked]
    assert built == []  # refused from what was read ahead: not built again under the lock
    assert 9 not in conn.subs
