"""
On SQLite, commits the engine did not make (a plain ORM ``save()`` in this process,
or in another process) wake the hub as they are written (``stream/wake.py``), not on
its poll: with the poll 5 s away, the frame still arrives at once. With the watcher
off (``SQLITE_WAKE = "poll"``) or unavailable, the poll delivers them as before.
Nothing subscribed: the writes are left to the poll, and a subscription catches up.
"""

import asyncio
import sqlite3
import time

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth import get_user_model
from django.db import connection

from project.demo.models import User
from rindle_app.realtime.hub import get_hub
from rindle_app.stream import wake
from rindle_app.testing import fresh_runtime
from tests.support.processes import Child

from .conftest import Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SLOW_POLL = {"POLL_INTERVAL": 5.0, "WAKE_POLL_INTERVAL": 5.0}
FAST = 0.5  # seconds: far below the 5 s poll, far above the wake-up's milliseconds


def sqlite_only():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's wake-up; PostgreSQL wakes on the watermarker's NOTIFY")


@pytest.fixture
def serving(settings, transactional_db):
    """A fresh runtime whose poll is 5 s away (the watcher's safety net only)."""
    sqlite_only()
    settings.RINDLE = {**settings.RINDLE, **SLOW_POLL}
    with fresh_runtime() as runtime:
        yield runtime.engine


async def subscribed(query="users"):
    client = Client()
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 1, "name": query, "mode": "normalized"})
    frames = await client.recv_until("progress")
    return client, frames


def added(frames):
    return [op for f in frames if f["t"] == "nbatch" for op in f["batch"]["ops"]]


async def receive_stamped(client, timeout):
    """The frames up to the next progress, and the time.time() they had all arrived."""
    frames = await client.recv_until("progress", timeout=timeout)
    return frames, time.time()


async def test_an_orm_save_in_this_process_reaches_a_subscriber_without_the_poll(serving):
    """Its committing thread applies it (tests/realtime/test_local_commits.py), not the poll."""
    client, _ = await subscribed()
    hub = get_hub(serving)
    assert hub.poll_interval == 5.0 and hub._watcher is not None and hub._watcher.armed

    def save():
        User(id="w1", name="saved here").save()
        return time.time()

    receiving = asyncio.ensure_future(receive_stamped(client, timeout=4))
    committed = await sync_to_async(save)()
    frames, received = await receiving
    assert added(frames) == [{"table": "user", "op": "add", "row": ["w1", "saved here"]}]
    assert received - committed < FAST, f"{(received - committed) * 1000:.0f} ms"
    await client.close()


async def test_an_orm_save_in_another_process_reaches_a_subscriber_without_the_poll(
    serving, tmp_path
):
    child = Child([], tmp_path / "writer.err", module="write_child", interactive=True)
    try:
        await sync_to_async(child.wait_started)()
        client, _ = await subscribed()
        hub = get_hub(serving)
        assert hub.poll_interval == 5.0 and hub._watcher.armed
        for n in range(3):  # a few, so one lucky wake-up cannot pass for the mechanism
            receiving = asyncio.ensure_future(receive_stamped(client, timeout=4))
            child.send(f"user p{n} From another process")
            line = await sync_to_async(child.line)(f"WROTE p{n} ", 30)
            committed = float(line.split()[2])
            frames, received = await receiving
            assert added(frames) == [
                {"table": "user", "op": "add", "row": [f"p{n}", "From another process"]}
            ]
            assert received - committed < FAST, f"{(received - committed) * 1000:.0f} ms"
        await client.close()
    finally:
        await sync_to_async(child.kill)()


async def test_with_the_watcher_off_only_the_poll_delivers(settings, transactional_db):
    """
    The control: the same commit with SQLITE_WAKE "poll" waits for the 5 s poll (made
    through the stdlib driver: an ORM save of this process is applied at once anyway).
    """
    sqlite_only()
    settings.RINDLE = {**settings.RINDLE, **SLOW_POLL, "SQLITE_WAKE": "poll"}
    with fresh_runtime():
        client, _ = await subscribed()
        hub = await sync_to_async(get_hub)()
        assert hub._watcher is None and hub.poll_interval == 5.0
        await sync_to_async(raw_insert)("w2", "waits for the poll")
        assert await client.nothing(timeout=1.0)
        await client.close()


async def test_without_inotify_the_hub_polls_at_its_usual_interval(
    settings, transactional_db, monkeypatch
):
    sqlite_only()

    def refused(cls):
        raise wake.Unavailable(38, "no inotify here")

    monkeypatch.setattr(wake._Inotify, "libc", classmethod(refused))
    with fresh_runtime():
        client, _ = await subscribed()
        hub = await sync_to_async(get_hub)()
        assert hub._watcher is None
        assert hub.poll_interval == pytest.approx(settings.RINDLE.get("POLL_INTERVAL", 0.01))
        receiving = asyncio.ensure_future(receive_stamped(client, timeout=4))
        await sync_to_async(User(id="w3", name="found by the poll").save)()
        frames, _ = await receiving
        assert added(frames) == [{"table": "user", "op": "add", "row": ["w3", "found by the poll"]}]
        await client.close()


async def test_with_nothing_subscribed_writes_are_not_read_and_a_subscription_catches_up(
    serving,
):
    hub = await sync_to_async(get_hub)(serving)
    watcher = hub._watcher
    assert not watcher.armed
    checks = watcher.checks
    for n in range(5):
        await sync_to_async(User(id=f"q{n}", name="while nobody watched").save)()
    await asyncio.sleep(0.2)
    assert watcher.checks == checks  # nothing subscribed: the writes cost no read
    assert hub.catalog.version < await sync_to_async(_newest)()  # left to the 5 s poll
    client, frames = await subscribed()
    assert watcher.armed
    rows = sorted(op["row"][0] for op in added(frames) if op["row"][0].startswith("q"))
    assert rows == [f"q{n}" for n in range(5)]  # seq 0 is current, not 5 s old
    await client.send({"t": "unsubscribe", "queryId": 1})
    await asyncio.sleep(0.1)
    await sync_to_async(User(id="q9", name="after the last one left").save)()  # wakes once
    deadline = time.monotonic() + 2
    while watcher.armed and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert not watcher.armed  # the hub's next step saw nothing subscribed
    await client.close()


async def test_writes_that_capture_nothing_and_idle_time_do_not_wake_the_hub(serving):
    """No loop: the hub's own reads write nothing, and uncaptured writes wake nobody."""
    client, _ = await subscribed()
    hub = get_hub(serving)
    steps, real = [], hub.step

    def step():
        steps.append(time.monotonic())
        return real()

    hub.step = step
    watcher = hub._watcher
    wakes = watcher.wakes
    await asyncio.sleep(1.0)  # idle, subscribed: no reads, no steps
    assert steps == []
    checks = watcher.checks
    for n in range(3):  # an uncaptured table: the watcher reads, the hub sleeps on
        await sync_to_async(get_user_model().objects.create)(username=f"uncaptured{n}")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    assert watcher.checks - checks <= 3 * (1 + len(wake.LATE_READS))
    assert watcher.wakes == wakes and steps == []
    assert await client.nothing(timeout=0.2)
    settled = watcher.checks
    await asyncio.sleep(0.5)
    assert watcher.checks == settled and steps == []
    await client.close()


def raw_insert(pk, name):
    """A captured commit Django never sees: the stdlib driver on the same file."""
    db = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=5)
    try:
        db.execute('INSERT INTO "user" (id, name) VALUES (?, ?)', [pk, name])
    finally:
        db.close()


def _newest():
    from rindle_app.testing import outbox_high_water

    return outbox_high_water()
