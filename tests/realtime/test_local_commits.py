"""
On SQLite a plain ORM write of this process reaches subscribers from its committing
thread, right after the commit (``stream/local.py``), with no ``-wal`` watcher at all
and the poll 5 s away: once per transaction, never a rolled-back one, and a commit
that lands while the hub reads is applied with it. A commit Django did not make (a
raw driver, another process) is still left to the watcher or the poll.
"""

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction

from project.demo.models import User
from rindle_app.ivm import live as live_module
from rindle_app.realtime.hub import get_hub
from rindle_app.testing import fresh_runtime

from .conftest import Client
from .test_wake import FAST, added, raw_insert, receive_stamped, subscribed

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

NO_WATCHER = {"POLL_INTERVAL": 5.0, "WAKE_POLL_INTERVAL": 5.0, "SQLITE_WAKE": "poll"}


class Abandoned(Exception):
    """Raised to roll a block back."""


@pytest.fixture
def serving(settings, transactional_db):
    """A fresh runtime with no watcher and its poll 5 s away."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's commit notifications; PostgreSQL wakes on the watermarker's NOTIFY")
    settings.RINDLE = {**settings.RINDLE, **NO_WATCHER}
    with fresh_runtime() as runtime:
        yield runtime.engine


def row(pk, name):
    return {"table": "user", "op": "add", "row": [pk, name]}


async def test_an_orm_save_reaches_a_subscriber_without_the_watcher_or_the_poll(serving):
    client, _ = await subscribed()
    hub = get_hub(serving)
    assert hub._watcher is None and hub.poll_interval == 5.0

    def save():
        User(id="s1", name="saved here").save()
        return time.time()

    receiving = asyncio.ensure_future(receive_stamped(client, timeout=4))
    committed = await sync_to_async(save)()
    frames, received = await receiving
    assert added(frames) == [row("s1", "saved here")]
    assert received - committed < FAST, f"{(received - committed) * 1000:.0f} ms"
    await client.close()


async def test_a_transaction_arrives_once_and_a_rolled_back_one_never(serving):
    client, _ = await subscribed()

    def write():
        with transaction.atomic():
            User.objects.create(id="t1", name="one")
            try:
                with transaction.atomic():
                    User.objects.create(id="t2", name="rolled back with its savepoint")
                    raise Abandoned
            except Abandoned:
                pass
            User.objects.create(id="t3", name="three")
        try:
            with transaction.atomic():
                User.objects.create(id="t4", name="rolled back")
                raise Abandoned
        except Abandoned:
            pass

    await sync_to_async(write)()
    frames = await client.recv_until("progress", timeout=2)
    assert added(frames) == [row("t1", "one"), row("t3", "three")]
    assert await client.nothing(timeout=0.3)
    await sync_to_async(User(id="t5", name="five").save)()
    frames = await client.recv_until("progress", timeout=2)
    assert added(frames) == [row("t5", "five")]  # nothing applied twice
    await client.close()


async def test_a_commit_that_lands_while_the_hub_reads_is_applied_with_it(serving, monkeypatch):
    """The second commit has no notification of its own here: only a read again finds it."""
    client, _ = await subscribed()
    real, landed = live_module.tail, []

    def tail(using, version, tables):
        read = real(using, version, tables)
        if not landed:  # right after the first read: a commit nobody reports
            landed.append(True)
            raw_insert("b2", "landed during the read")
        return read

    monkeypatch.setattr(live_module, "tail", tail)
    started = time.monotonic()
    await sync_to_async(User(id="b1", name="first").save)()
    ops = []
    while len(ops) < 2:
        ops += added(await client.recv_until("progress", timeout=2))
    assert ops == [row("b1", "first"), row("b2", "landed during the read")]
    assert time.monotonic() - started < FAST
    await client.close()


async def test_a_commit_django_did_not_make_waits_for_the_poll_without_the_watcher(serving):
    """The control: no notification reaches the hub, so the 5 s poll is all there is."""
    client, _ = await subscribed()
    await sync_to_async(raw_insert)("r1", "raw")
    assert await client.nothing(timeout=1.0)
    await client.close()


async def test_a_closed_hub_is_not_called_by_later_commits(settings, transactional_db):
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's commit notifications")
    settings.RINDLE = {**settings.RINDLE, **NO_WATCHER}
    with fresh_runtime():
        client = Client()
        assert await client.connect()
        hub = await sync_to_async(get_hub)()
        await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
        await client.recv_until("progress")
        steps = []
        real = hub.step
        hub.step = lambda: steps.append(1) or real()
        await sync_to_async(User(id="c1", name="while open").save)()
        frames = await client.recv_until("progress", timeout=2)
        assert added(frames) == [row("c1", "while open")] and steps
        await client.close()
    steps.clear()
    await sync_to_async(User(id="c2", name="after the close").save)()
    assert steps == []
