"""
Websocket traffic in the usage ledger: a socket's frames in and batches out under
its namespace, refusals by reason, auth failures, and quotas that refuse subscribe
and pushMutation without changing anything.
"""

import asyncio
import json

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from project.demo.models import User
from rindle_app import tokens
from rindle_app.flow import FlowLedger, FlowStore, Transfer, now_ms, quota
from rindle_app.realtime.hub import get_hub

from .conftest import Client, bearer, today_async, utf8

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async
SUBSCRIBE = json.dumps({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})


@pytest.fixture
def alice(live):
    return get_user_model().objects.create_user("alice", password="pw")


async def token_socket(user, scopes=("read", "mutate")):
    raw, _ = await db(tokens.create)(user, list(scopes))
    client = Client(headers=bearer(raw))
    assert await client.connect()
    return client


async def receive_until(client, kind):
    """Raw frame texts up to and including the first of type ``kind``."""
    texts = []
    while True:
        text = await client.comm.receive_from(timeout=5)
        texts.append(text)
        if json.loads(text)["t"] == kind:
            return texts


async def settled(namespace, predicate, timeout=5):
    """Today's figure of ``namespace`` once ``predicate`` holds (the sender counts late)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        day = await today_async(namespace)
        if day is not None and predicate(day):
            return day
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached: {day}")
        await asyncio.sleep(0.02)


async def test_a_sockets_frames_in_and_batches_out_count_under_its_users_namespace(alice):
    namespace = f"user:{alice.pk}"
    client = await token_socket(alice)
    init = '{"t":"init","clientID":"café"}'  # counted in UTF-8 bytes, not characters
    await client.send(init)
    await client.send(SUBSCRIBE)
    out = await receive_until(client, "progress")  # nhello, the snapshot, progress
    await db(User.objects.create)(id="u1", name="Zoë")
    out += await receive_until(client, "progress")  # the batch, progress
    sent_in = utf8(init) + utf8(SUBSCRIBE)
    sent_out = sum(utf8(text) for text in out)
    assert sent_in == len(init) + 1 + len(SUBSCRIBE)

    # Both directions are counted as they happen, the frames in by the worker that
    # handles them: wait for both figures (a loaded machine delays either).
    day = await settled(namespace, lambda d: (d.bytes_in, d.bytes_out) == (sent_in, sent_out))
    assert (day.bytes_in, day.bytes_out) == (sent_in, sent_out)
    # Two accepted client frames, two batches the sender wrote; one connection.
    assert day.transfers == 4 and day.sessions == 1
    assert day.refused == 0 and day.auth_failures == 0
    assert await today_async("anonymous") is None
    await client.close()


async def test_anonymous_sockets_share_one_namespace_each_its_own_session(live):
    clients = [Client(), Client()]
    for i, client in enumerate(clients):
        assert await client.connect()
        await client.send({"t": "init", "clientID": f"c{i}"})
    day = await settled("anonymous", lambda d: d.transfers == 2)
    assert day.sessions == 2 and day.bytes_in == 2 * utf8('{"t": "init", "clientID": "c0"}')
    for client in clients:
        await client.close()


async def test_refused_frames_count_by_reason_and_move_no_bytes(alice, settings):
    settings.RINDLE = {
        **settings.RINDLE,
        "WS_MAX_FRAME_BYTES": 100,
        "WS_RATE": 0.001,
        "WS_BURST": 3,
    }
    namespace = f"user:{alice.pk}"
    client = await token_socket(alice, scopes=("mutate",))
    await client.comm.send_to(bytes_data=b"\x00")  # binary: bad_frame
    await client.send("x" * 101)  # over WS_MAX_FRAME_BYTES: frame_too_large
    await client.send("{not json")  # bad_frame (takes a rate token)
    await client.send({"t": "nope"})  # bad_frame (a token)
    await client.send(SUBSCRIBE)  # no read scope: unauthorized (the last token)
    await client.send({"t": "init", "clientID": "c1"})  # rate_limited
    codes = [(await client.recv())["code"] for _ in range(6)]
    assert codes == [
        "bad_frame",
        "frame_too_large",
        "bad_frame",
        "bad_frame",
        "unauthorized",
        "rate_limited",
    ]
    day = await settled(namespace, lambda d: d.refused == 6)
    assert {k: v for k, v in day.refusals.items() if v} == {
        "bad_request": 3,
        "too_large": 1,
        "permission": 1,
        "rate_limit": 1,
    }
    assert day.transfers == 0 and day.bytes_in == 0 and day.bytes_out == 0
    await client.close()


async def test_a_refused_bearer_is_an_auth_failure_of_nobody(live):
    client = Client(headers=bearer("rdl_nope_nope"))
    assert not await client.connect()
    day = await settled("anonymous", lambda d: d.auth_failures == 1)
    # Knocking is not being seen: the namespace of nobody did not become active.
    assert day.transfers == 0 and day.last_seen_ms is None


async def test_over_quota_subscribe_and_push_mutation_are_refused_and_change_nothing(
    live, alice, settings
):
    namespace = f"user:{alice.pk}"
    settings.RINDLE = {**settings.RINDLE, "FLOW_QUOTAS": {namespace: 300}}
    await db(User.objects.create)(id="u1", name="Ada")
    client = await token_socket(alice)
    await client.send({"t": "init", "clientID": "c1"})
    await client.send(SUBSCRIBE)  # admitted: nothing moved yet
    first = await receive_until(client, "progress")
    assert sum(utf8(t) for t in first) > 300  # this transfer crossed the quota
    await settled(namespace, lambda d: d.moved >= 300)

    await client.send({"t": "subscribe", "queryId": 2, "name": "users", "mode": "normalized"})
    refused = await client.recv()
    assert refused["t"] == "queryError" and refused["queryId"] == 2
    assert refused["code"] == "quota_exceeded" and refused["retryable"] is True
    assert 0 < refused["retryAfterMs"] <= 30 * 86_400_000
    hub = await database_sync_to_async(get_hub)()
    assert [sorted(conn.subs) for conn in hub.conns.values()] == [[1]]

    envelope = {"clientID": "c1", "mid": 1, "name": "setStatus", "args": {}}
    await client.send({"t": "pushMutation", "envelope": envelope})
    refused = await client.recv()
    assert refused["t"] == "error" and refused["code"] == "quota_exceeded"
    assert refused["mid"] == 1 and refused["retryable"] is True and refused["retryAfterMs"] > 0
    assert await db(live.client_lmid)("c1") == 0

    # The subscription it holds still receives its batches (they count as before).
    await db(User.objects.create)(id="u2", name="Bea")
    batch, _progress = await client.recv_until("progress")
    assert batch["queryId"] == 1 and batch["batch"]["seq"] == 1
    day = await settled(namespace, lambda d: d.refusals["quota"] == 2)
    assert day.refused == 2
    await client.close()


async def test_a_namespace_is_seeded_from_the_store_once_per_process(alice, settings, monkeypatch):
    namespace = f"user:{alice.pk}"
    settings.RINDLE = {**settings.RINDLE, "FLOW_QUOTAS": {namespace: 1000}}

    def other_process_moved_it():
        other = FlowLedger(FlowStore(), node="other-process").start(now_ms())
        other.record(namespace, now_ms(), Transfer(bytes_in=400, bytes_out=700))
        other.flush(now_ms())

    await db(other_process_moved_it)()
    reads = []
    rows = FlowStore.rows

    def counting(self, ns, first_day, last_day):
        reads.append(ns)
        return rows(self, ns, first_day, last_day)

    monkeypatch.setattr(FlowStore, "rows", counting)
    sockets = [await token_socket(alice), await token_socket(alice)]
    for client in sockets:
        # Over quota by what the other process flushed: refused at once.
        await client.send(SUBSCRIBE)
        refused = await client.recv()
        assert refused["t"] == "queryError" and refused["code"] == "quota_exceeded"
    assert reads == [namespace]
    assert quota.get_quotas().seeds == 1
    for client in sockets:
        await client.close()
