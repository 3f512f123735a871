"""
The realtime lifecycle plane, as the published optimistic client drives it: a lease
of a realtime-labelled query writes the caller's occupancy row and carries a
doorbell lease; the doorbell, fence, ledger and outcome tables are subscribable
like any table (their row deltas arrive as the writes commit), each subscription
re-authorizes its parent query, and none of them is in /schema.
"""

import json

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client as HttpClient
from rest_framework.test import APIClient

from project.demo import models as demo
from rindle_app import leases, rooms, tokens
from rindle_app.adapter import RindleAdapter

from .conftest import ORIGIN, Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async
ISSUE = "i1"
DOC = f"issue/{ISSUE}"


@pytest.fixture
def alice(live):
    user = get_user_model().objects.create_user("alice", password="pw")
    demo.User.objects.create(id="u1", name="Ursula")
    demo.Issue.objects.create(
        id=ISSUE, title="t", status="todo", priority="low", owner_id="u1", created_at=1,
        updated_at=1,
    )  # fmt: skip
    return user


def lease(user, client_id, name="issueDetail", args=ISSUE):
    http = APIClient()
    http.force_authenticate(user)
    body = {"name": name, "args": args, "clientId": client_id}
    reply = http.post("/api/rindle/query", json.dumps(body), content_type="application/json")
    assert reply.status_code == 200, reply.content
    return reply.json()


def sessions():
    with connection.cursor() as cursor:
        cursor.execute("SELECT scope, client_id, expires_at FROM _rindle_scope_sessions")
        return sorted(cursor.fetchall())


def sql_rows(table, where, params):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} WHERE {where}", params)
        return sorted(list(r) for r in cursor.fetchall())


async def session_socket(user, client_id):
    http = HttpClient()
    await db(http.force_login)(user)
    cookie = f"sessionid={http.cookies['sessionid'].value}".encode()
    client = Client(headers=[ORIGIN, (b"cookie", cookie)])
    assert await client.connect()
    await client.send({"t": "init", "clientID": client_id})
    return client


async def hello(client, query_id, **subscribe):
    """Subscribe; ``(nhello, the rows hydrated up to progress)``."""
    await client.send({"t": "subscribe", "queryId": query_id, "mode": "normalized", **subscribe})
    frames = await client.recv_until("progress")
    assert frames[0]["t"] == "nhello", frames[0]
    return frames[0], sorted(row for _table, row in added(frames))


def added(frames):
    """``(table, row)`` of every add (or edit's new image) in the nbatch frames."""
    out = []
    for frame in frames:
        if frame["t"] == "nbatch":
            for op in frame["batch"]["ops"]:
                if op["op"] in ("add", "edit"):
                    out.append((op["table"], op.get("row") or op.get("new")))
    return out


async def test_a_labelled_lease_writes_occupancy_and_its_doorbell_rings_for_the_next(alice):
    """
    The lease of a labelled query carries a doorbell lease over the doc's sessions and
    writes the caller's row; a second client's lease is a row delta on the first
    client's doorbell subscription (the 1 -> 2 upgrade signal).
    """
    first = await db(lease)(alice, "c1")
    entry = first["lifecycle"]["doorbell"]
    assert (entry["table"], entry["scope"]) == ("_rindle_scope_sessions", DOC)
    assert "fence" not in first["lifecycle"]  # no room serves the doc
    assert [(s, c) for s, c, _ in await db(sessions)()] == [(DOC, "c1")]
    client = await session_socket(alice, "c1")
    _hello, rows = await hello(client, 1, leaseToken=entry["leaseToken"])
    assert [r[:2] for r in rows] == [[DOC, "c1"]]
    await db(lease)(alice, "c2")
    frames = await client.recv_until("nbatch")
    assert [r[:2] for _t, r in added(frames)] == [[DOC, "c2"]]
    await client.close()


async def test_an_unlabelled_lease_has_no_lifecycle_and_the_setting_turns_it_off(alice, settings):
    assert "lifecycle" not in await db(lease)(alice, "c1", name="users", args=None)
    settings.RINDLE = {**settings.RINDLE, "REALTIME_LIFECYCLE": False}
    assert "lifecycle" not in await db(lease)(alice, "c1")
    assert await db(sessions)() == []


async def test_the_fence_streams_follow_room_flushes_scoped_to_the_socket_client(alice, live):
    """
    The watermark, room ledger and outcome streams of the doc see each flush as it
    commits, the ledger and outcomes only for the socket's own client id; every view
    equals SQL at the end.
    """
    client = await session_socket(alice, "c1")
    parent = {"name": "issueDetail", "args": ISSUE}
    views = {}
    for qid, table in enumerate(rooms.FENCE_TABLES, start=1):
        args = {"table": table, "doc": DOC, "parent": parent}
        _hello, rows = await hello(client, qid, name=rooms.LIFECYCLE_QUERY_NAME, args=args)
        assert rows == []
        views[qid] = table
    epoch = await db(live.claim_room_epoch)(DOC)

    def co_edits(offset, lmids, outcomes):
        changes = [
            {"table": "_rindle_client_mutations", "op": "add", "row": [c, m]}
            for c, m in lmids.items()
        ]
        changes += [
            {"table": "_rindle_room_mutation_outcomes", "op": "add", "row": [c, m, "rejected",
             "no", "m", None]}
            for c, m in outcomes
        ]  # fmt: skip
        return live.commit_room_flush(changes, f"room:{DOC}", str(offset), doc=DOC, epoch=epoch)

    await db(co_edits)(1, {"c1": 2, "c2": 5}, [("c1", 2), ("c2", 4)])
    seen = {}
    while len(seen) < 3:
        for table, row in added([await client.recv()]):
            seen.setdefault(table, []).append(row)
    assert seen["_rindle_room_watermark"] == [[DOC, "1"]]
    assert seen["_rindle_room_client_mutations"] == [[DOC, "c1", 2]]
    assert [r[:3] for r in seen["_rindle_room_mutation_outcomes"]] == [[DOC, "c1", 2]]
    for table in rooms.FENCE_TABLES:
        client_only = table != "_rindle_room_watermark"
        where = "doc = %s" + (" AND client_id = %s" if client_only else "")
        params = [DOC, "c1"] if client_only else [DOC]
        assert len(await db(sql_rows)(table, where, params)) == 1, table
    await client.close()


@pytest.mark.parametrize(
    "args",
    [
        {"table": "_rindle_room_watermark", "doc": "issue/other", "parent": "P"},
        {"table": "_rindle_scope_sessions", "scope": "issue/other", "parent": "P"},
        {"table": "_rindle_client_mutations", "doc": DOC, "parent": "P"},
        {"table": "_rindle_room_watermark", "doc": DOC},
        {"table": "_rindle_room_watermark", "doc": DOC, "parent": {"name": "users"}},
        {"table": "_rindle_room_watermark", "doc": DOC, "parent": {"name": "nope"}},
        "not an object",
    ],
)
async def test_a_lifecycle_stream_must_be_the_one_its_parent_derives(alice, args):
    """A doc or scope the parent does not derive, an unlabelled or unknown parent: refused."""
    if isinstance(args, dict) and args.get("parent") == "P":
        args = {**args, "parent": {"name": "issueDetail", "args": ISSUE}}
    client = await session_socket(alice, "c1")
    await client.send(
        {"t": "subscribe", "queryId": 3, "name": rooms.LIFECYCLE_QUERY_NAME, "args": args}
    )
    reply = await client.recv()
    assert reply["t"] == "queryError" and reply["queryId"] == 3, reply
    assert reply["code"] in ("invalid_args", "unknown_query"), reply
    await client.close()


async def test_a_lifecycle_subscription_reauthorizes_its_parent(alice, settings):
    """A user the parent query refuses is refused its lifecycle streams too."""
    entry = (await db(lease)(alice, "c1"))["lifecycle"]["doorbell"]
    settings.RINDLE = {**settings.RINDLE, "ADAPTER": "tests.realtime.test_lifecycle.NoDetail"}
    client = await session_socket(alice, "c1")
    await client.send({"t": "subscribe", "queryId": 4, "leaseToken": entry["leaseToken"]})
    reply = await client.recv()
    assert (reply["t"], reply["code"]) == ("queryError", "unauthorized"), reply
    await client.close()


class NoDetail(RindleAdapter):
    def authorize_query(self, user, name, args):
        return name != "issueDetail"


async def test_the_system_tables_are_not_leased_by_name_nor_in_the_schema(alice):
    await db(system_tables_stay_private)(alice)


def system_tables_stay_private(alice):
    http = APIClient()
    http.force_authenticate(alice)
    body = {"name": rooms.LIFECYCLE_QUERY_NAME, "args": {}}
    reply = http.post("/api/rindle/query", json.dumps(body), content_type="application/json")
    assert reply.status_code == 404
    raw, _token = tokens.create(alice, ["schema"])
    schema = APIClient()
    schema.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    names = {t["name"] for t in schema.get("/schema").json()["tables"]}
    assert names and not names & set(rooms.LIFECYCLE_TABLES)


async def test_a_room_footprint_is_only_for_a_rooms_token(alice):
    """``_rindle/room`` (a room host's upstream) is refused to a browser's socket."""
    client = await session_socket(alice, "c1")
    await client.send(
        {"t": "subscribe", "queryId": 5, "name": rooms.ROOM_QUERY_NAME, "args": {"doc": DOC}}
    )
    reply = await client.recv()
    assert (reply["t"], reply["code"]) == ("queryError", "unauthorized"), reply
    await client.close()


async def test_room_boot_claims_the_epoch_and_leases_the_footprint(alice):
    """
    /api/rindle/room-boot answers the original's shape: the claimed epoch, the
    upstream lease (which hydrates the footprint on the websocket for the same
    token), the per-table write scopes and the flush routes with their headers.
    """
    raw, token = await db(tokens.create)(alice, ["rooms", "read"])
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    def boot(doc):
        body = json.dumps({"doc": doc, "instance": "host-1"})
        return http.post("/api/rindle/room-boot", body, content_type="application/json")

    first, second = await db(boot)(DOC), await db(boot)(DOC)
    assert first.status_code == 200, first.content
    body = first.json()
    assert (body["epoch"], second.json()["epoch"]) == (1, 2)
    assert body["flush"]["urls"] == {
        "apply": "/apply-row-change-txn",
        "claim": "/claim-room-epoch",
        "lmids": "/room-lmids",
    }
    (credential,) = body["flush"]["headers"].values()  # minted for the doc, not the bearer
    assert list(body["flush"]["headers"]) == ["X-Rindle-Room-Credential"]
    assert raw not in credential
    scopes = {s["table"]: s for s in body["scopes"]}
    assert set(scopes) == {"comment", "issue", "tag", "user"}
    assert scopes["user"]["writable"] == {"kind": "none"}  # a context table
    assert scopes["issue"]["footprintWhere"]["right"] == {"type": "literal", "value": ISSUE}
    assert scopes["comment"]["writable"] == {"kind": "predicate", "joinKeyCols": ["issueId"]}
    assert leases.verify(body["upstreamLeaseToken"]).args == {"doc": DOC}
    socket = Client(headers=[ORIGIN, (b"authorization", f"Bearer {raw}".encode())])
    assert await socket.connect()
    frame, rows = await hello(socket, 1, leaseToken=body["upstreamLeaseToken"])
    assert {t["name"] for t in frame["hello"]["tables"]} >= {"issue", "comment", "tag"}
    assert [r[0] for r in rows if r[0] == ISSUE] == [ISSUE]
    await socket.close()


@pytest.mark.parametrize(
    ("scopes", "body", "status", "code"),
    [
        (["rooms"], {"doc": "nope/1"}, 404, "unknown_room"),
        (["rooms"], {"doc": "issue"}, 404, "unknown_room"),
        (["rooms"], {"doc": 7}, 400, "invalid_request"),
        (["rooms"], {}, 400, "invalid_request"),
        (["read"], {"doc": DOC}, 403, "insufficient_scope"),
    ],
)
async def test_room_boot_refuses_bad_input_and_claims_nothing(alice, scopes, body, status, code):
    await db(refused_boot)(alice, scopes, body, status, code)


def refused_boot(alice, scopes, body, status, code):
    raw, _token = tokens.create(alice, scopes)
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    reply = http.post("/api/rindle/room-boot", json.dumps(body), content_type="application/json")
    assert reply.status_code == status, reply.content
    assert reply.json()["error"]["code"] == code
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM _rindle_room_placement")
        assert cursor.fetchone()[0] == 0
