"""
Per-socket and per-principal limits (issue 13 findings 5, 6, 10): subscriptions,
footprint, frame size and sockets are capped with a coded refusal; a failure inside
a named query, a read rule or a mutator is answered, never silent.
"""

import gc
import logging
import tracemalloc

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from project.demo.models import User
from rindle_app import tokens
from rindle_app.engine import mutator
from rindle_app.named import named_query
from rindle_app.realtime import limits
from rindle_app.realtime.consumer import RindleConsumer
from rindle_app.realtime.hub import get_hub
from rindle_app.runtime import get_runtime

from .conftest import ORIGIN, Client, application, push_set_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async


class Boom(Exception):
    pass


@named_query("rtExploding")
def exploding(args, ctx):
    raise Boom("a bug in the query builder")


@pytest.fixture
def log(caplog, monkeypatch):
    """``caplog`` that sees rindle's loggers (the project's LOGGING stops them propagating)."""
    application()  # the project's LOGGING is applied when the ASGI app is first loaded
    monkeypatch.setattr(logging.getLogger("rindle"), "propagate", True)
    caplog.set_level(logging.WARNING)
    return caplog


def limit(settings, **caps):
    settings.RINDLE = {**settings.RINDLE, "WS_RATE": 10_000, "WS_BURST": 10_000, **caps}


async def subscribe(client, query_id, name, args=None):
    await client.send(
        {"t": "subscribe", "queryId": query_id, "name": name, "args": args, "mode": "normalized"}
    )
    first = await client.recv()
    if first["t"] != "nhello":
        return [first]
    return [first, *await client.recv_until("progress")]


def seed_users(n, prefix="u"):
    User.objects.bulk_create([User(id=f"{prefix}{i:05}", name=f"user {i}") for i in range(n)])


async def test_a_socket_holds_at_most_ws_max_subscriptions(live, settings):
    limit(settings, WS_MAX_SUBSCRIPTIONS=3)
    client = Client()
    assert await client.connect()
    for qid in range(3):
        assert (await subscribe(client, qid, "issuesPage", {"limit": qid + 1}))[0]["t"] == "nhello"
    (refusal,) = await subscribe(client, 3, "users")
    assert refusal["t"] == "queryError" and refusal["queryId"] == 3
    assert refusal["code"] == "too_many_subscriptions" and refusal["retryable"] is False
    assert "WS_MAX_SUBSCRIPTIONS = 3" in refusal["message"]
    # Re-subscribing a queryId it holds replaces it; unsubscribing frees a place.
    assert (await subscribe(client, 2, "users"))[0]["hello"]["epoch"] == 2
    await client.send({"t": "unsubscribe", "queryId": 0})
    assert (await subscribe(client, 3, "tagOptions"))[0]["t"] == "nhello"
    await client.close()


async def test_memory_stays_flat_through_a_refused_burst(live, settings):
    """Thousands of subscribes past the cap allocate no query, view or frame that stays."""
    await db(seed_users)(200)
    limit(settings, WS_MAX_SUBSCRIPTIONS=5)
    client = Client()
    assert await client.connect()
    for qid in range(5):
        await subscribe(client, qid, "issuesPage", {"limit": qid + 1})
    hub = await db(get_hub)()
    queries = len(hub.catalog.queries)
    # warm every code path once before measuring
    await subscribe(client, 99, "users")
    tracemalloc.start()
    try:
        gc.collect()  # refusals are exceptions: their frames are cyclic garbage
        before = tracemalloc.take_snapshot()
        for qid in range(100, 1100):
            (refusal,) = await subscribe(client, qid, "issuesPage", {"limit": qid})
            assert refusal["code"] == "too_many_subscriptions"
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert grown < 512 * 1024, f"{grown} bytes stayed after 1,000 refused subscribes"
    assert len(hub.catalog.queries) == queries
    conn = next(iter(hub.conns.values()))
    assert sorted(conn.subs) == [0, 1, 2, 3, 4]
    await client.close()


async def test_a_socket_holds_at_most_ws_max_footprint_rows(live, settings):
    await db(seed_users)(20)
    limit(settings, WS_MAX_FOOTPRINT_ROWS=30)
    client = Client()
    assert await client.connect()
    frames = await subscribe(client, 1, "users")
    assert len(frames[1]["batch"]["ops"]) == 20
    (refusal,) = await subscribe(client, 2, "users")  # 40 rows > 30
    assert refusal["code"] == "footprint_too_large" and refusal["retryable"] is False
    assert "WS_MAX_FOOTPRINT_ROWS = 30" in refusal["message"]
    hub = await db(get_hub)()
    assert sorted(next(iter(hub.conns.values())).subs) == [1]
    assert len(hub.catalog.queries) == 1
    # The subscription it holds goes on receiving its changes.
    await db(User.objects.create)(id="new", name="Ada")
    batch, _progress = await client.recv_until("progress")
    assert batch["queryId"] == 1 and batch["batch"]["seq"] == 1
    await client.close()


async def test_a_snapshot_over_ws_max_send_bytes_is_refused_loudly(live, settings):
    await db(seed_users)(100)
    limit(settings, WS_MAX_SEND_BYTES=2000)
    client = Client()
    assert await client.connect()
    (refusal,) = await subscribe(client, 1, "users")
    assert refusal["t"] == "queryError" and refusal["code"] == "result_too_large"
    assert refusal["retryable"] is False and "WS_MAX_SEND_BYTES = 2000" in refusal["message"]
    hub = await db(get_hub)()
    assert hub.catalog.queries == {}  # nothing is kept for it
    assert (await subscribe(client, 2, "tagOptions"))[0]["t"] == "nhello"  # the socket works
    await client.close()


async def test_an_increment_over_ws_max_send_bytes_drops_its_subscription_loudly(live, settings):
    limit(settings, WS_MAX_SEND_BYTES=4000)
    client = Client()
    assert await client.connect()
    assert (await subscribe(client, 1, "users"))[0]["t"] == "nhello"
    await db(seed_users)(200)  # one commit, far more than 4,000 bytes of ops
    frames = await client.recv_until("progress")
    assert [f["t"] for f in frames] == ["queryError", "progress"]
    assert frames[0]["code"] == "batch_too_large" and frames[0]["retryable"] is True
    hub = await db(get_hub)()
    assert hub.catalog.queries == {}
    await client.close()


async def test_sockets_per_principal_are_capped_with_close_4429(live, settings, log):
    limit(settings, WS_MAX_SOCKETS_PER_PRINCIPAL=2)
    alice = await db(get_user_model().objects.create_user)("alice", password="pw")
    raw, _ = await db(tokens.create)(alice, ["read"])
    first, second, third = Client(), Client(), Client()
    assert await first.connect() and await second.connect()
    assert await third.connect()  # accepted, so that the close code reaches it
    closed = await third.comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": limits.CLOSE_TOO_MANY_SOCKETS}
    assert "refused a socket of address:" in log.text
    # Another principal (a token) is counted apart.
    machine = Client(headers=[ORIGIN, (b"authorization", f"Bearer {raw}".encode())])
    assert await machine.connect()
    assert (await subscribe(machine, 1, "users"))[0]["t"] == "nhello"
    # A closed socket frees its place.
    await first.close()
    fourth = Client()
    assert await fourth.connect()
    assert (await subscribe(fourth, 1, "users"))[0]["t"] == "nhello"
    for client in (second, fourth, machine):
        await client.close()
    assert get_runtime(None).sockets.count("address:?") == 0


async def test_a_failing_named_query_is_answered_and_logged(live, log):
    client = Client()
    assert await client.connect()
    (reply,) = await subscribe(client, 1, "rtExploding")
    assert reply["t"] == "queryError" and reply["code"] == "internal_error"
    assert reply["retryable"] is False and "rtExploding" in reply["message"]
    assert "Boom: a bug in the query builder" in log.text  # the traceback is logged
    assert (await subscribe(client, 2, "users"))[0]["t"] == "nhello"
    await client.close()


async def test_a_failing_read_rule_is_answered_and_logged(live, settings, log):
    settings.RINDLE = {**settings.RINDLE, "ADAPTER": "tests.support.adapters.BrokenReadRules"}
    client = Client()
    assert await client.connect()
    (reply,) = await subscribe(client, 1, "users")
    assert reply["code"] == "internal_error" and reply["retryable"] is False
    assert "read rules are broken" in log.text
    await client.close()


async def test_a_failing_adapter_during_a_mutation_is_answered(live, settings, log):
    settings.RINDLE = {
        **settings.RINDLE,
        "ADAPTER": "tests.support.adapters.BrokenMutations",
        "ALLOW_ANONYMOUS_MUTATIONS": True,
    }
    client = Client()
    assert await client.connect()
    reply = await push_set_status(client)
    assert reply["t"] == "error" and reply["code"] == "internal_error" and reply["mid"] == 1
    assert "authorize_mutation is broken" in log.text
    await client.close()


@mutator("rtExplodingMutator")
def exploding_mutator(tx, args, user):
    raise Boom("a bug in the mutator")


async def test_a_failing_mutator_is_rejected_and_its_traceback_logged(live, settings, log):
    settings.RINDLE = {**settings.RINDLE, "ALLOW_ANONYMOUS_MUTATIONS": True}
    client = Client()
    assert await client.connect()
    await client.send({"t": "init", "clientID": "c1"})
    env = {"clientID": "c1", "mid": 1, "name": "rtExplodingMutator", "args": {}}
    await client.send({"t": "pushMutation", "envelope": env})
    reply = await client.recv()
    assert reply["t"] == "mutationOutcome" and reply["kind"] == "rejected" and reply["mid"] == 1
    assert "Boom" in reply["reason"]
    assert "Boom: a bug in the mutator" in log.text and "Traceback" in log.text
    await client.close()


async def test_a_socket_with_a_full_footprint_is_refused_before_any_hydration(live, settings):
    await db(seed_users)(20)
    limit(settings, WS_MAX_FOOTPRINT_ROWS=20)
    client = Client()
    assert await client.connect()
    assert len((await subscribe(client, 1, "users"))[1]["batch"]["ops"]) == 20  # 20 <= 20
    hub = await db(get_hub)()
    registered = []
    register = hub.catalog.register
    hub.catalog.register = lambda ast, budget=None: registered.append(ast) or register(ast, budget)
    (refusal,) = await subscribe(client, 2, "tagOptions")  # no rows, but the budget is full
    assert refusal["code"] == "footprint_too_large" and registered == []
    # Re-subscribing the queryId that holds the rows is not refused: its rows are replaced.
    assert (await subscribe(client, 1, "users"))[0]["hello"]["epoch"] == 2
    await client.close()


async def test_a_query_too_large_for_the_budget_is_refused_while_it_is_read(live, settings):
    """
    ``users`` over 2,000 rows on a socket allowed 20: the view stops at its first batch
    over the budget and is refused, the store having read a few pages, not the table;
    a query within the budget still subscribes on that socket.
    """
    await db(seed_users)(2000)
    limit(settings, WS_MAX_FOOTPRINT_ROWS=20)
    client = Client()
    assert await client.connect()
    (refusal,) = await subscribe(client, 1, "users")
    assert refusal["t"] == "queryError" and refusal["code"] == "footprint_too_large"
    hub = await db(get_hub)()
    assert not hub.catalog.queries or all(
        s.query.table != "user" for s in hub.catalog.queries.values()
    )
    assert hub.catalog.store.rows_held < 1000
    assert len((await subscribe(client, 2, "tagOptions"))[1]["batch"]["ops"]) == 0
    await client.close()


async def test_a_frame_the_server_cannot_write_closes_the_socket_loudly(
    live, settings, monkeypatch, log
):
    """
    Daphne raises on a message over its own limit; that write once failed silently and
    the client waited forever after its hello. Now it is logged and the socket closed.
    """
    await db(seed_users)(50)
    limit(settings, WS_MAX_SEND_BYTES=None)  # as if rindle's limit were above Daphne's
    real = RindleConsumer.__call__

    async def call(self, scope, receive, send):
        async def daphne_send(message):
            if message["type"] == "websocket.send" and len(message.get("text") or "") > 1000:
                raise RuntimeError("tried to send WebSocket message exceeding payload limit")
            await send(message)

        return await real(self, scope, receive, daphne_send)

    monkeypatch.setattr(RindleConsumer, "__call__", call)
    client = Client()
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    assert (await client.recv())["t"] == "nhello"
    closed = await client.comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": 4500}
    assert "a frame could not be written" in log.text and "payload limit" in log.text
