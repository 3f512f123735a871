"""A failing query faults alone; a connection that falls behind is shed alone."""

import asyncio

import pytest
from channels.db import database_sync_to_async

from project.demo.models import Tag, User
from rindle_app.exceptions import FAULTED, SHED
from rindle_app.ivm.view import View
from rindle_app.realtime import wire
from rindle_app.realtime.consumer import RindleConsumer
from rindle_app.realtime.hub import get_hub

from .conftest import Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async


async def sub(client, qid, name):
    await client.send({"t": "subscribe", "queryId": qid, "name": name, "mode": "normalized"})
    return await client.recv_until("progress")


async def test_a_query_that_raises_faults_only_itself(live, monkeypatch):
    client = Client()
    assert await client.connect()
    await sub(client, 1, "users")
    await sub(client, 2, "tagOptions")
    real_apply = View.apply

    def apply(self, changes, affected=None):
        if self.query.table == "user":
            raise RuntimeError("boom")
        return real_apply(self, changes, affected)

    monkeypatch.setattr(View, "apply", apply)
    await db(User.objects.create)(id="u1", name="Ada")
    fault, progress = await client.recv_until("progress")
    assert fault["t"] == "queryError" and fault["queryId"] == 1
    assert fault["code"] == "faulted" and fault["retryable"] is True
    await db(Tag.objects.create)(id="t1", issue_id="i1", name="ui")
    batch, _ = await client.recv_until("progress")
    assert batch["queryId"] == 2 and batch["batch"]["seq"] == 1
    monkeypatch.setattr(View, "apply", real_apply)
    hello, snap, _ = await sub(client, 1, "users")  # the client's retry: a fresh seq 0
    assert hello["hello"]["epoch"] == 2
    assert [op["row"] for op in snap["batch"]["ops"]] == [["u1", "Ada"]]
    await client.close()


async def test_a_slow_connection_is_shed_and_others_keep_up(live, settings, monkeypatch):
    settings.RINDLE = {**settings.RINDLE, "WS_MAX_QUEUED_MESSAGES": 3, "WS_SHED_RETRY_MS": 50}
    slow_channels, consumers = set(), []
    real = RindleConsumer.__call__

    async def call(self, scope, receive, send):
        consumers.append(self)

        async def server_send(message):  # the server's send, waiting for a slow socket
            if self.channel_name in slow_channels and message["type"] == "websocket.send":
                await asyncio.sleep(0.2)
            await send(message)

        return await real(self, scope, receive, server_send)

    monkeypatch.setattr(RindleConsumer, "__call__", call)
    slow, fast = Client(), Client()
    assert await slow.connect() and await fast.connect()
    await sub(slow, 1, "users")
    await sub(fast, 1, "users")
    slow_channels.add(consumers[0].channel_name)  # the first connection made is the slow one
    for i in range(12):
        await db(User.objects.create)(id=f"u{i}", name=f"n{i}")
        await asyncio.sleep(0.01)
    # The fast connection receives all 12 rows, in order, promptly. (On PostgreSQL
    # commits published by one watermark step arrive as one increment.)
    seqs, added = [], 0
    while added < 12:
        frame = await fast.recv(timeout=5)
        if frame["t"] == "nbatch":
            seqs.append(frame["batch"]["seq"])
            added += sum(1 for op in frame["batch"]["ops"] if op["op"] == "add")
    assert added == 12 and seqs == list(range(1, len(seqs) + 1))
    # The slow one gets what was queued before it fell behind, then a shed notice.
    frames_seen = []
    while True:
        frame = await slow.recv(timeout=10)
        frames_seen.append(frame)
        if frame["t"] == "queryError":
            break
    assert frame["code"] == "shed" and frame["retryable"] is True
    assert frame["retryAfterMs"] == 50
    got = [f["batch"]["seq"] for f in frames_seen if f["t"] == "nbatch"]
    assert got == list(range(1, len(got) + 1)) and len(got) < len(seqs)
    # re-subscribing brings it back with the whole current state
    slow_channels.clear()
    hello, snap, _ = await sub(slow, 1, "users")
    assert hello["hello"]["epoch"] == 2 and len(snap["batch"]["ops"]) == 12
    await slow.close()
    await fast.close()


async def test_a_shed_connection_gets_its_query_errors_and_no_data_whatever_the_text(live):
    """
    A connection shed for falling behind is sent the query errors it was due and a
    shed notice per subscription, never a data frame, even one whose payload spells
    a ``queryError``: the hub knows a frame's type from where it was built.
    """
    client = Client()
    assert await client.connect()
    await sub(client, 1, "users")
    hub = await db(get_hub)()
    conn = next(iter(hub.conns.values()))
    lookalike = wire.nbatch(1, 1, 1, "fp", wire.dumps([{"t": "queryError"}]), 99)
    due = wire.query_error(2, "boom", FAULTED, True, retry_after_ms=500)

    def fall_behind_then_deliver():
        with hub.lock:
            conn.handed = conn.sent + hub.max_queued
            hub._deliver(conn, [lookalike, due])
            hub._dispatch()

    await db(fall_behind_then_deliver)()
    first, second = await client.recv(), await client.recv()
    assert (first["t"], first["queryId"], first["code"]) == ("queryError", 2, FAULTED)
    assert (second["t"], second["queryId"], second["code"]) == ("queryError", 1, SHED)
    assert await client.nothing()
    await client.close()
