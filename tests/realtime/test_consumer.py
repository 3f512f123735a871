"""
The websocket protocol at /ws/rindle/, through the project's ASGI stack (origin
validation, sessions, the consumer and the hub).
"""

import json

import pytest
from channels.db import database_sync_to_async

from project.demo.models import Issue, Tag, User
from rindle_app.ivm.builder import table
from rindle_app.ivm.normalized import normalized_fp
from rindle_app.named import named_query
from rindle_app.testing import outbox_high_water
from tests.support.demo import create_issue

from .conftest import ORIGIN, Client, eventually, push_set_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async


def users_ops(batch):
    return sorted((op["op"], tuple(op.get("row") or op.get("new"))) for op in batch["ops"])


async def subscribe(client, query_id, name, args=None, mode="normalized"):
    await client.send(
        {"t": "subscribe", "queryId": query_id, "name": name, "args": args, "mode": mode}
    )
    return await client.recv_until("progress")


async def test_seq0_hello_snapshot_then_progress(live):
    await db(User.objects.create)(id="u1", name="Ada")
    client = Client()
    assert await client.connect()
    hello, snap, progress = await subscribe(client, 7, "users")
    assert hello["t"] == "nhello" and hello["queryId"] == 7
    assert hello["bootId"] == live.boot_id
    tables = hello["hello"]["tables"]
    assert tables == [{"name": "user", "columns": ["id", "name"], "primaryKey": [0]}]
    assert hello["hello"]["normalizedFp"] == normalized_fp(tables)
    assert hello["hello"]["comparatorVersion"] == 2 and hello["hello"]["epoch"] == 1
    assert snap["t"] == "nbatch" and snap["batch"]["seq"] == 0
    assert snap["batch"]["ops"] == [{"table": "user", "op": "add", "row": ["u1", "Ada"]}]
    high = await db(outbox_high_water)()
    assert snap["batch"]["cv"] == high
    assert progress == {"t": "progress", "frame": {"cvMin": high}}
    await client.close()


async def test_the_socket_needs_no_channel_layer(live, settings):
    """Frames go straight from the hub to the socket; no CHANNEL_LAYERS at all."""
    settings.CHANNEL_LAYERS = {}
    client = Client()
    assert await client.connect()
    await subscribe(client, 1, "users")
    await db(User.objects.create)(id="u1", name="Ada")
    batch, _progress = await client.recv_until("progress")
    assert batch["batch"]["ops"] == [{"table": "user", "op": "add", "row": ["u1", "Ada"]}]
    await client.close()


async def test_empty_snapshot_is_still_sent(live):
    client = Client()
    assert await client.connect()
    hello, snap, progress = await subscribe(client, 1, "users")
    assert snap["batch"]["seq"] == 0 and snap["batch"]["ops"] == []
    assert progress["frame"]["cvMin"] == snap["batch"]["cv"]
    await client.close()


async def test_orm_writes_arrive_as_increments_and_empty_commits_send_nothing(live):
    client = Client()
    assert await client.connect()
    await subscribe(client, 1, "users")
    await db(User.objects.create)(id="u1", name="Ada")
    batch, progress = await client.recv_until("progress")
    assert batch["batch"]["seq"] == 1 and batch["batch"]["epoch"] == 1
    assert batch["batch"]["ops"] == [{"table": "user", "op": "add", "row": ["u1", "Ada"]}]
    assert progress["frame"]["cvMin"] == batch["batch"]["cv"] == await db(outbox_high_water)()
    # a commit the query cannot see: no frame, no seq consumed
    await db(create_issue)("i1")
    assert await client.nothing()
    await db(User.objects.filter(id="u1").update)(name="Grace")
    batch, progress = await client.recv_until("progress")
    assert batch["batch"]["seq"] == 2
    assert batch["batch"]["ops"] == [
        {"table": "user", "op": "edit", "old": ["u1", "Ada"], "new": ["u1", "Grace"]}
    ]
    await db(User.objects.filter(id="u1").delete)()
    batch, _ = await client.recv_until("progress")
    assert batch["batch"]["seq"] == 3
    assert batch["batch"]["ops"] == [{"table": "user", "op": "remove", "row": ["u1", "Grace"]}]
    await client.close()


async def test_resubscribe_bumps_the_epoch_and_restarts_at_seq0(live):
    client = Client()
    assert await client.connect()
    await subscribe(client, 3, "users")
    await db(User.objects.create)(id="u1", name="Ada")
    await client.recv_until("progress")
    hello, snap, _ = await subscribe(client, 3, "users")
    assert hello["hello"]["epoch"] == 2
    assert snap["batch"]["epoch"] == 2 and snap["batch"]["seq"] == 0
    assert [op["row"] for op in snap["batch"]["ops"]] == [["u1", "Ada"]]
    await db(User.objects.create)(id="u2", name="Bob")
    batch, _ = await client.recv_until("progress")
    assert (batch["batch"]["epoch"], batch["batch"]["seq"]) == (2, 1)
    await client.close()


async def test_unsubscribe_stops_frames(live):
    client = Client()
    assert await client.connect()
    await subscribe(client, 1, "users")
    await client.send({"t": "unsubscribe", "queryId": 1})
    await client.nothing(0.1)
    await db(User.objects.create)(id="u1", name="Ada")
    assert await client.nothing()
    await client.close()


async def test_progress_only_for_connections_whose_data_changed(live):
    a, b = Client(), Client()
    assert await a.connect() and await b.connect()
    await subscribe(a, 1, "users")
    await subscribe(b, 1, "tagOptions")
    await db(User.objects.create)(id="u1", name="Ada")
    frames = await a.recv_until("progress")
    assert [f["t"] for f in frames] == ["nbatch", "progress"]
    assert await b.nothing()
    await a.close()
    await b.close()


async def test_two_subscribers_share_one_query_and_see_the_same_ops(live):
    from rindle_app.realtime.hub import get_hub

    a, b = Client(), Client()
    assert await a.connect() and await b.connect()
    await subscribe(a, 1, "users")
    await subscribe(b, 9, "users")
    hub = await db(get_hub)()
    assert len(hub.catalog.queries) == 1
    await db(User.objects.create)(id="u1", name="Ada")
    fa, _ = await a.recv_until("progress")
    fb, _ = await b.recv_until("progress")
    assert fa["batch"]["ops"] == fb["batch"]["ops"]
    assert (fa["queryId"], fb["queryId"]) == (1, 9)
    await a.close()
    await b.close()
    assert await db(lambda: len(hub.catalog.queries))() == 0


async def test_a_named_query_with_relationships_and_counts(live):
    await db(User.objects.create)(id="u1", name="Ada")
    await db(create_issue)("i1", title="First")
    client = Client()
    assert await client.connect()
    hello, snap, _ = await subscribe(client, 1, "issuesPage", {"limit": 10})
    names = [t["name"] for t in hello["hello"]["tables"]]
    assert names == sorted(names) and {"issue", "user", "tag"} <= set(names)
    assert any(n.startswith("__agg") or "agg" in n for n in names)
    tables = {op["table"] for op in snap["batch"]["ops"]}
    assert {"issue", "user"} <= tables
    await db(Tag.objects.create)(id="t1", issue_id="i1", name="ui")
    batch, _ = await client.recv_until("progress")
    assert {"table": "tag", "op": "add", "row": ["t1", "i1", "ui"]} in batch["batch"]["ops"]
    await client.close()


# --- mutations and the lmid system query ------------------------------------------------


def allow_anonymous_writes(settings):
    settings.RINDLE = {**settings.RINDLE, "ALLOW_ANONYMOUS_MUTATIONS": True}


async def test_an_anonymous_push_mutation_is_refused_unless_the_project_opts_in(live):
    """An error frame anonymous_mutations_disabled: no lmid, no row, socket open."""
    client = Client()
    assert await client.connect()
    reply = await push_set_status(client)
    assert (reply["t"], reply["code"], reply["mid"]) == ("error", "anonymous_mutations_disabled", 1)
    assert await db(lambda: live.client_lmid("c1"))() == 0
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    assert (await client.recv())["t"] == "nhello"  # still open
    await client.close()


async def test_push_mutation_confirms_through_the_lmid_query(live, settings):
    allow_anonymous_writes(settings)
    client = Client()
    assert await client.connect()
    await client.send({"t": "init", "clientID": "c1"})
    hello, snap, _ = await subscribe(client, 0, "_rindle/clientLmid", {})
    assert hello["hello"]["tables"] == [
        {
            "name": "_rindle_client_mutations",
            "columns": ["client_id", "last_mutation_id"],
            "primaryKey": [0],
        }
    ]
    assert snap["batch"]["ops"] == []
    # anonymous: createIssue is refused (a business rejection) yet lmid advances
    envelope = {
        "clientID": "c1",
        "mid": 1,
        "name": "createIssue",
        "args": {
            "id": "i1",
            "title": "x",
            "status": "todo",
            "priority": "low",
            "owner": "u1",
            "description": "",
            "descriptionCommentId": "c1",
            "createdAt": 1,
        },
    }
    await client.send({"t": "pushMutation", "envelope": envelope})
    outcome = await client.recv()
    assert outcome["t"] == "mutationOutcome" and outcome["mid"] == 1
    assert outcome["kind"] == "rejected"
    batch, progress = await client.recv_until("progress")
    assert batch["batch"]["ops"] == [
        {"table": "_rindle_client_mutations", "op": "add", "row": ["c1", 1]}
    ]
    assert progress["frame"]["cvMin"] == batch["batch"]["cv"]
    assert not await db(Issue.objects.exists)()
    # a gap is refused and changes nothing
    await client.send({"t": "pushMutation", "envelope": {**envelope, "mid": 5}})
    err = await client.recv()
    assert err["t"] == "error" and err["code"] == "mid_gap" and err["lmid"] == 1
    # a replay is absorbed silently
    await client.send({"t": "pushMutation", "envelope": envelope})
    assert await client.nothing()
    await client.close()


async def test_lmid_query_needs_init(live):
    client = Client()
    assert await client.connect()
    await client.send(
        {
            "t": "subscribe",
            "queryId": 0,
            "name": "_rindle/clientLmid",
            "args": {},
            "mode": "normalized",
        }
    )
    frame = await client.recv()
    assert frame["t"] == "queryError" and frame["retryable"] is False
    await client.close()


async def test_push_mutation_for_another_client_is_refused(live):
    client = Client()
    assert await client.connect()
    await client.send({"t": "init", "clientID": "c1"})
    env = {"clientID": "other", "mid": 1, "name": "setStatus", "args": {}}
    await client.send({"t": "pushMutation", "envelope": env})
    frame = await client.recv()
    assert frame["t"] == "error"
    assert await db(lambda: live.client_lmid("other"))() == 0
    await client.close()


# --- bad frames ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame, code",
    [
        ("{not json", "bad_frame"),
        ("[1, 2]", "bad_frame"),
        (json.dumps({"t": "nope"}), "bad_frame"),
        (json.dumps({"x": 1}), "bad_frame"),
        (json.dumps({"t": "subscribe", "queryId": "a", "name": "users"}), "bad_frame"),
        (json.dumps({"t": "subscribe", "queryId": True, "name": "users"}), "bad_frame"),
        (json.dumps({"t": "subscribe", "queryId": 1}), "bad_frame"),
        (json.dumps({"t": "subscribe", "queryId": 1, "name": "users", "mode": "x"}), "bad_frame"),
        (json.dumps({"t": "unsubscribe", "queryId": -1}), "bad_frame"),
        (json.dumps({"t": "init", "clientID": ""}), "bad_frame"),
        (json.dumps({"t": "init", "clientID": "x" * 500}), "bad_frame"),
        (json.dumps({"t": "pushMutation", "envelope": "x"}), "bad_frame"),
        (
            json.dumps({"t": "pushMutation", "envelope": {"clientID": "c", "mid": 0, "name": "a"}}),
            "bad_frame",
        ),
        (
            json.dumps({"t": "pushMutation", "envelope": {"clientID": "c", "mid": 1, "name": "a"}}),
            "bad_frame",
        ),  # before init
        (json.dumps({"t": "mutate", "mutations": []}), "unsupported"),
    ],
)
async def test_bad_frames_get_an_error_and_the_connection_stays_open(live, frame, code):
    client = Client()
    assert await client.connect()
    await client.send(frame)
    reply = await client.recv()
    assert reply["t"] == "error" and reply["code"] == code and reply["message"]
    hello, snap, _ = await subscribe(client, 1, "users")  # still serving
    assert hello["t"] == "nhello"
    assert await db(outbox_high_water)() == snap["batch"]["cv"]
    await client.close()


async def test_oversized_frame_is_refused(live, settings):
    settings.RINDLE = {**settings.RINDLE, "WS_MAX_FRAME_BYTES": 100}
    client = Client()
    assert await client.connect()
    await client.send({"t": "init", "clientID": "x" * 200})
    reply = await client.recv()
    assert reply["code"] == "frame_too_large"
    await client.close()


async def test_binary_frames_are_refused(live):
    client = Client()
    assert await client.connect()
    await client.comm.send_to(bytes_data=b"\x00\x01")
    reply = await client.recv()
    assert reply["t"] == "error"
    await client.close()


async def test_rate_limit(live, settings):
    settings.RINDLE = {**settings.RINDLE, "WS_RATE": 1, "WS_BURST": 3}
    client = Client()
    assert await client.connect()
    for _ in range(3):
        await client.send({"t": "init", "clientID": "c1"})
    await client.send({"t": "init", "clientID": "c1"})
    reply = await client.recv()
    assert reply["code"] == "rate_limited"
    await client.close()


@pytest.mark.parametrize(
    "name, args, code",
    [
        ("noSuchQuery", None, "unknown_query"),
        ("issuesPage", {"limit": 0}, "invalid_args"),
        ("issuesPage", {"limit": 10, "filter": [{"axis": "nope", "value": "x"}]}, "invalid_args"),
        ("issuesPage", "x", "invalid_args"),
        ("users", {"a": 1}, "invalid_args"),
    ],
)
async def test_bad_queries_get_a_terminal_query_error(live, name, args, code):
    client = Client()
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 4, "name": name, "args": args})
    reply = await client.recv()
    assert reply == {**reply, "t": "queryError", "queryId": 4, "code": code, "retryable": False}
    await client.close()


# --- origins ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin",
    [
        b"http://evil.example",
        b"null",
        b"http://localhost.evil.example",
        b"http://evil-localhost",
        b"http://127.0.0.1.evil.example",
    ],
)
async def test_foreign_origins_are_refused_before_accept(live, origin):
    client = Client(headers=[(b"origin", origin)])
    assert not await client.connect()


async def test_missing_origin_is_refused(live):
    client = Client(headers=[])
    assert not await client.connect()


async def test_same_origin_is_accepted(live):
    client = Client(headers=[ORIGIN])
    assert await client.connect()
    await client.close()


# --- flat mode (the default) --------------------------------------------------------------


async def test_flat_mode_hello_snapshot_and_path_addressed_changes(live):
    from rindle_app.realtime.flat import schema_fp

    await db(User.objects.create)(id="u1", name="Ada")
    client = Client()
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 2, "name": "users", "args": None})
    hello, snap, progress = await client.recv_until("progress")
    assert hello["t"] == "hello" and hello["bootId"] == live.boot_id
    schema = hello["hello"]["schema"]
    assert schema["columns"] == ["id", "name"] and schema["primaryKey"] == [0]
    assert hello["hello"]["schemaFp"] == schema_fp(schema)
    assert snap["t"] == "batch" and snap["batch"]["seq"] == 0
    assert snap["batch"]["events"] == [
        {"path": [], "op": {"tag": "add", "node": {"row": ["u1", "Ada"], "rels": []}}}
    ]
    assert progress["frame"]["cvMin"] == snap["batch"]["cv"]
    await db(User.objects.filter(id="u1").update)(name="Grace")
    batch, progress = await client.recv_until("progress")
    assert batch["batch"]["seq"] == 1 and batch["batch"]["cv"] == progress["frame"]["cvMin"]
    assert batch["batch"]["events"] == [
        {"path": [], "op": {"tag": "edit", "old": ["u1", "Ada"], "new": ["u1", "Grace"]}}
    ]
    await client.close()


async def test_flat_and_normalized_subscribers_of_one_query_each_get_their_form(live):
    client = Client()
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "args": None})
    await client.recv_until("progress")
    await subscribe(client, 2, "users")
    await db(User.objects.create)(id="u1", name="Ada")
    frames = await client.recv_until("progress")
    kinds = sorted((f["t"], f["queryId"]) for f in frames if f["t"] != "progress")
    assert kinds == [("batch", 1), ("nbatch", 2)]
    assert len([f for f in frames if f["t"] == "progress"]) == 1
    await client.close()


SCRATCH = "rt_scratch"


@named_query("scratchRows")
def scratch_rows(args, ctx):
    return table(SCRATCH)


async def test_a_schema_change_bounces_subscriptions_with_a_retryable_error(live):
    def setup():
        live.register_table(SCRATCH, ["id", "name"], [0], ["string", "string"])
        live.write(lambda tx: tx.insert(SCRATCH, {"id": "r1", "name": "Ada"}))

    def add_column():
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(f'ALTER TABLE "{SCRATCH}" ADD COLUMN "email" TEXT')
        live.register_existing_table(SCRATCH)

    await db(setup)()
    try:
        client = Client()
        assert await client.connect()
        hello, _, _ = await subscribe(client, 1, "scratchRows")
        assert hello["hello"]["tables"][0]["columns"] == ["id", "name"]
        await db(add_column)()
        frame = await client.recv()
        assert frame["t"] == "queryError" and frame["code"] == "schema_changed"
        assert frame["retryable"] is True
        hello, snap, _ = await subscribe(client, 1, "scratchRows")
        assert hello["hello"]["tables"][0]["columns"] == ["id", "name", "email"]
        assert snap["batch"]["ops"][0]["row"] == ["r1", "Ada", None]
        await client.close()
    finally:
        await db(_drop_scratch)()


def _drop_scratch():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE IF EXISTS "{SCRATCH}"')


async def test_connection_churn_leaves_no_state_behind(live):
    """Hundreds of sockets subscribing and leaving: the hub ends as it started."""
    from rindle_app.realtime.hub import get_hub

    hub = await db(get_hub)()
    names = [("users", None), ("issuesPage", {"limit": 5}), ("tagOptions", None)]
    for round_ in range(20):
        clients = [Client() for _ in range(10)]
        for i, client in enumerate(clients):
            assert await client.connect()
            await client.send({"t": "init", "clientID": f"churn-{round_}-{i}"})
            name, args = names[i % len(names)]
            await subscribe(client, 1, name, args)
            await subscribe(client, 2, "_rindle/clientLmid", {})
        await db(User.objects.create)(id=f"u{round_}", name="x")
        for i, client in enumerate(clients):
            if names[i % len(names)][0] == "users":
                await client.recv_until("progress")  # its subscribers see the write
            await client.close()
        await db(User.objects.filter(id=f"u{round_}").delete)()
    await eventually(lambda: not hub.conns)
    assert hub.catalog.queries == {} and hub._encoded == {}
    assert hub.catalog._by_sub == {}


async def test_a_busy_hub_lock_does_not_stall_the_event_loop(live, settings):
    """
    A long hydration holds the hub's lock; a socket's mutation waits for it, but every
    other socket keeps being served (nothing on the event loop takes that lock).
    """
    import asyncio
    import threading
    import time

    from rindle_app.realtime.hub import get_hub

    allow_anonymous_writes(settings)
    a, b = Client(), Client()
    assert await a.connect() and await b.connect()
    await a.send({"t": "init", "clientID": "busy-a"})
    hub = await db(get_hub)()
    taken, release = threading.Event(), threading.Event()

    def hold_lock():
        with hub.lock:
            taken.set()
            release.wait(1.0)  # a slow hydration

    holder = threading.Thread(target=hold_lock)
    holder.start()
    try:
        assert taken.wait(5)
        started = time.monotonic()
        env = {"clientID": "busy-a", "mid": 1, "name": "noSuchMutator", "args": {}}
        await a.send({"t": "pushMutation", "envelope": env})
        await asyncio.sleep(0.05)
        await b.send("{not json")
        reply = await b.recv(timeout=5)
        assert reply["t"] == "error"
        # served while the lock is still held (the test shares the consumers' event loop,
        # so a blocked loop would delay this past the second)
        assert time.monotonic() - started < 0.5
    finally:
        release.set()
        holder.join(5)
    outcome = await a.recv(timeout=5)  # the mutation went through once the lock was free
    assert outcome["t"] == "mutationOutcome" and outcome["kind"] == "rejected"
    await a.close()
    await b.close()
