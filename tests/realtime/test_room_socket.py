"""
A room over Channels, as the published optimistic client drives one: once two
clients lease a labelled query's doc, the lease carries the room (its socket, token
and table scopes) and the fence streams; on the room socket a mutation reaches the
peer at once, its client's lmid moves when the flush made it durable, a mutation
the room does not apply gets its mutationOutcome first, and the database ends equal
to the room.
"""

import json
import time

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client as HttpClient
from rest_framework.test import APIClient

from project.demo import models as demo

from .conftest import ORIGIN, Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async
ISSUE = "i1"
DOC = f"issue/{ISSUE}"
ROOM_PATH = "/ws/rindle/room/?doc=issue%2Fi1"


@pytest.fixture
def rooms_on(settings):
    settings.RINDLE = {**settings.RINDLE, "ROOMS_ENABLED": True, "ROOM_FLUSH_INTERVAL": 0.05}


@pytest.fixture
def people(live, rooms_on):
    demo.User.objects.create(id="u1", name="Ursula")
    demo.Issue.objects.create(
        id=ISSUE, title="first", status="todo", priority="low", owner_id="u1", created_at=1,
        updated_at=1,
    )  # fmt: skip
    demo.Comment.objects.create(id="c1", issue_id=ISSUE, author_id="u1", body="b", created_at=2)
    make = get_user_model().objects.create_user
    return make("ada", password="pw"), make("bob", password="pw")


def lease(user, client_id):
    http = APIClient()
    http.force_authenticate(user)
    body = {"name": "issueDetail", "args": ISSUE, "clientId": client_id}
    reply = http.post("/api/rindle/query", json.dumps(body), content_type="application/json")
    assert reply.status_code == 200, reply.content
    return reply.json()


def issue_row():
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT "title", "status", "updatedAt" FROM "issue" WHERE "id" = %s', [ISSUE]
        )
        return cursor.fetchone()


def ledgers():
    with connection.cursor() as cursor:
        cursor.execute("SELECT client_id, last_mutation_id FROM _rindle_room_client_mutations")
        room = sorted(cursor.fetchall())
        cursor.execute("SELECT client_id, last_mutation_id FROM _rindle_client_mutations")
        return room, sorted(cursor.fetchall())


def outcomes():
    with connection.cursor() as cursor:
        cursor.execute("SELECT client_id, mid, kind FROM _rindle_room_mutation_outcomes")
        return sorted(cursor.fetchall())


async def room_socket(client_id, token, path=ROOM_PATH):
    client = Client(headers=[ORIGIN], path=path)
    assert await client.connect()
    await client.send({"t": "init", "clientID": client_id})
    await client.send({"t": "subscribe", "queryId": 1, "leaseToken": token, "mode": "normalized"})
    frames = await client.recv_until("progress")
    assert frames[0]["t"] == "nhello", frames
    await client.send({"t": "subscribe", "queryId": 0, "name": "_rindle/clientLmid"})
    lmid = await client.recv_until("progress")
    assert lmid[0]["t"] == "nhello", lmid
    return client, frames


def rows(frames, table):
    out = []
    for frame in frames:
        if frame["t"] == "nbatch":
            out += [
                op.get("row") or op.get("new")
                for op in frame["batch"]["ops"]
                if op["table"] == table
            ]
    return out


def push(mid, name, **args):
    return {
        "t": "pushMutation",
        "envelope": {"clientID": "A", "mid": mid, "name": name, "args": args},
    }


async def test_two_sessions_make_a_room_and_a_mutation_reaches_the_peer_at_once(people):
    ada, bob = people
    first = await db(lease)(ada, "A")
    assert "realtime" not in first and "fence" not in first["lifecycle"]  # alone: no room
    second = await db(lease)(bob, "B")
    rt = second["realtime"]
    assert rt["sourceKey"] == f"room:{DOC}" and rt["doc"] == DOC
    assert rt["wsEndpoint"].endswith(ROOM_PATH)
    assert {t["table"] for t in rt["tables"]} == {"issue", "comment", "tag", "user"}
    tables = [e["table"] for e in second["lifecycle"]["fence"]]
    assert tables == [
        "_rindle_room_watermark",
        "_rindle_room_client_mutations",
        "_rindle_room_mutation_outcomes",
    ]
    again = await db(lease)(ada, "A")  # A's doorbell re-lease now finds the room
    a, hydrated = await room_socket("A", again["realtime"]["roomToken"])
    b, joined = await room_socket("B", rt["roomToken"])  # shares A's view of the query
    assert [r[0] for r in rows(hydrated, "issue")] == [ISSUE]
    assert sorted(map(tuple, rows(joined, "issue"))) == sorted(map(tuple, rows(hydrated, "issue")))
    assert [r[0] for r in rows(joined, "comment")] == ["c1"]
    started = time.monotonic()
    await a.send(push(1, "editTitle", id=ISSUE, title="second", updatedAt=5))
    seen = await b.recv_until("nbatch")
    receipt = time.monotonic() - started
    assert [r[1] for r in rows(seen, "issue")] == ["second"], seen
    assert receipt < 0.5
    # A's lmid moves once a flush made mid 1 durable, and only then.
    frames = []
    while not any(f["t"] == "nbatch" and f["queryId"] == 0 for f in frames):
        frames.append(await a.recv())
    assert await db(issue_row)() == ("second", "todo", 5)
    room, slow = await db(ledgers)()
    assert room == [("A", 1)] and slow == []  # the slow-path ledger is never a room's
    await a.close()
    await b.close()


async def test_a_mutation_the_room_does_not_apply_gets_its_outcome_first(people):
    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    a, _ = await room_socket("A", (await db(lease)(ada, "A"))["realtime"]["roomToken"])
    await a.send(push(1, "editTitle", id=ISSUE, title="no spam", updatedAt=5))
    outcome = await a.recv_until("mutationOutcome")
    assert outcome[-1]["mid"] == 1 and outcome[-1]["kind"] == "rejected"
    await a.send(push(2, "deleteIssue", id=ISSUE))
    outcome = await a.recv_until("mutationOutcome")
    assert (outcome[-1]["mid"], outcome[-1]["kind"]) == (2, "deopt")
    await a.send(push(1, "editTitle", id=ISSUE, title="replayed", updatedAt=6))  # a replay
    await a.send(push(9, "editTitle", id=ISSUE, title="gap", updatedAt=7))
    error = await a.recv_until("error")
    assert (error[-1]["code"], error[-1]["mid"]) == ("mid_gap", 9), error
    deadline = time.monotonic() + 5
    while await db(outcomes)() != [("A", 1, "rejected"), ("A", 2, "deopt")]:
        assert time.monotonic() < deadline
        await a.recv()  # the flush's lmid frame
    assert (await db(issue_row)())[0] == "first"
    assert (await db(ledgers)())[0] == [("A", 2)]
    await a.close()
    assert rt


async def test_bad_room_sockets_and_frames_are_refused(people):
    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    for path in ("/ws/rindle/room/?doc=nope%2F1", "/ws/rindle/room/"):
        assert not await Client(headers=[ORIGIN], path=path).connect()
    other = Client(headers=[ORIGIN], path="/ws/rindle/room/?doc=issue%2Fi2")
    assert await other.connect()
    await other.send({"t": "init", "clientID": "B"})
    await other.send({"t": "subscribe", "queryId": 1, "leaseToken": rt["roomToken"]})
    refused = await other.recv()
    assert (refused["t"], refused["code"]) == ("queryError", "invalid_args"), refused
    for frame in (
        {"t": "subscribe", "queryId": 1, "name": "issueDetail", "args": ISSUE},
        {"t": "pushMutation", "envelope": {"clientID": "B", "mid": 1, "name": "x", "args": {}}},
        {"t": "nope"},
        "not json",
    ):
        await other.send(frame)
        reply = await other.recv()
        assert reply["t"] == "error" and reply["code"] == "bad_frame", reply
    await other.close()


async def test_rooms_off_serves_no_room(people, settings):
    settings.RINDLE = {**settings.RINDLE, "ROOMS_ENABLED": False}
    ada, bob = people
    await db(lease)(ada, "A")
    assert "realtime" not in await db(lease)(bob, "B")
    assert not await Client(headers=[ORIGIN], path=ROOM_PATH).connect()


async def test_a_token_of_another_user_is_refused_on_a_signed_in_room_socket(people):
    """A room socket with a session redeems only room tokens minted for its own user."""
    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]  # bob's room token
    http = HttpClient()
    await db(http.force_login)(ada)
    cookie = f"sessionid={http.cookies['sessionid'].value}".encode()
    socket = Client(headers=[ORIGIN, (b"cookie", cookie)], path=ROOM_PATH)
    assert await socket.connect()
    await socket.send({"t": "init", "clientID": "A"})
    await socket.send({"t": "subscribe", "queryId": 1, "leaseToken": rt["roomToken"]})
    reply = await socket.recv()
    assert (reply["t"], reply["code"]) == ("queryError", "lease_principal_mismatch"), reply
    await socket.close()


async def test_a_room_past_the_footprint_cap_is_refused_at_its_boot(people, settings):
    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    settings.RINDLE = {**settings.RINDLE, "WS_MAX_FOOTPRINT_ROWS": 2}  # the doc has 3 rows
    socket = Client(headers=[ORIGIN], path=ROOM_PATH)
    assert await socket.connect()
    await socket.send({"t": "init", "clientID": "B"})
    await socket.send({"t": "subscribe", "queryId": 1, "leaseToken": rt["roomToken"]})
    reply = await socket.recv()
    assert (reply["t"], reply["code"]) == ("queryError", "footprint_too_large"), reply
    await socket.close()


async def test_a_room_socket_that_stops_reading_is_closed_not_buffered(settings):
    """Past WS_MAX_QUEUED_MESSAGES undelivered batches the socket is closed (4503)."""
    import asyncio

    from rindle_app.realtime.room_consumer import RoomConsumer

    settings.RINDLE = {**settings.RINDLE, "WS_MAX_QUEUED_MESSAGES": 3}
    consumer = RoomConsumer()
    consumer._outbox = asyncio.Queue()
    closed = []

    async def close(code=None):
        closed.append(code)

    consumer.close = close
    for _ in range(10):  # what a room's broadcasts do while the client reads nothing
        consumer._enqueue(["frame"])
    await asyncio.sleep(0)
    assert consumer._outbox.qsize() == 3 and closed == [4503]


async def test_a_failed_downgrade_seal_is_logged_and_raises_nowhere(live, caplog):
    """The seal runs as a side effect of a subscription's hydrate: it must never raise."""
    from rindle_app.engine.errors import Unavailable
    from rindle_app.realtime.room_server import LiveRoom

    class Host:
        closed = None
        in_flight = False

        def seal(self):
            raise Unavailable("the database is down")

    room = LiveRoom(live, DOC, Host())
    room.draining = True
    room.seal_if_drained()
    assert room.draining is False and "downgrade seal failed" in caplog.text


# --- the room socket keeps the main socket's rules of who may do what --------------------


def token_lease(raw, client_id):
    http = APIClient()
    http.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = {"name": "issueDetail", "args": ISSUE, "clientId": client_id}
    reply = http.post("/api/rindle/query", json.dumps(body), content_type="application/json")
    assert reply.status_code == 200, reply.content
    return reply.json()


def bearer(raw):
    return [ORIGIN, (b"authorization", f"Bearer {raw}".encode())]


async def test_a_read_only_token_may_not_mutate_in_a_room(people):
    from rindle_app import tokens

    ada, bob = people
    await db(lease)(ada, "A")
    raw, _ = await db(tokens.create)(bob, ["read"])
    rt = (await db(token_lease)(raw, "B"))["realtime"]
    socket = Client(headers=bearer(raw), path=ROOM_PATH)
    assert await socket.connect()
    await socket.send({"t": "init", "clientID": "B"})
    await socket.send({"t": "subscribe", "queryId": 1, "leaseToken": rt["roomToken"]})
    assert (await socket.recv_until("progress"))[0]["t"] == "nhello"  # it may read
    envelope = {"clientID": "B", "mid": 1, "name": "editTitle"}
    args = {"id": ISSUE, "title": "by a reader", "updatedAt": 5}
    await socket.send({"t": "pushMutation", "envelope": {**envelope, "args": args}})
    reply = await socket.recv_until("error")
    assert (reply[-1]["code"], reply[-1]["mid"]) == ("unauthorized", 1), reply
    await socket.close()
    assert await db(issue_row)() == ("first", "todo", 1)
    assert (await db(ledgers)())[0] == []  # the room ledger never saw mid 1


async def test_a_signed_out_user_loses_the_room_socket(people, settings):
    settings.RINDLE = {**settings.RINDLE, "WS_AUTH_RECHECK_SECONDS": 0.1}
    ada, bob = people
    await db(lease)(bob, "B")
    rt = (await db(lease)(ada, "A"))["realtime"]
    http = HttpClient()
    await db(http.force_login)(ada)
    cookie = f"sessionid={http.cookies['sessionid'].value}".encode()
    socket = Client(headers=[ORIGIN, (b"cookie", cookie)], path=ROOM_PATH)
    assert await socket.connect()
    await socket.send({"t": "init", "clientID": "A"})
    await socket.send({"t": "subscribe", "queryId": 1, "leaseToken": rt["roomToken"]})
    assert (await socket.recv_until("progress"))[0]["t"] == "nhello"
    await db(http.logout)()
    while True:  # frames already queued may come first; then the close
        out = await socket.comm.receive_output(timeout=3)
        if out["type"] == "websocket.close":
            break
    assert out["code"] == 4401


async def test_room_sockets_count_under_their_principal_with_the_main_sockets(people, settings):
    settings.RINDLE = {**settings.RINDLE, "WS_MAX_SOCKETS_PER_PRINCIPAL": 1}
    main = Client(headers=[ORIGIN])  # an anonymous socket of the same address
    assert await main.connect()
    room = Client(headers=[ORIGIN], path=ROOM_PATH)
    assert await room.connect()
    closed = await room.comm.receive_output(timeout=3)
    assert closed == {"type": "websocket.close", "code": 4429}
    await main.close()
    again = Client(headers=[ORIGIN], path=ROOM_PATH)  # the main socket's slot is free again
    assert await again.connect()
    await again.nothing()
    await again.close()


async def test_a_room_sockets_bytes_count_under_its_namespace(people):
    from rindle_app import flow

    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]

    def today():
        return flow.get_ledger().today("anonymous", flow.now_ms())

    before = await db(today)()
    socket, frames = await room_socket("B", rt["roomToken"])
    await socket.close()
    after = await db(today)()
    grown_in = after.bytes_in - (before.bytes_in if before else 0)
    grown_out = after.bytes_out - (before.bytes_out if before else 0)
    assert grown_in > 0 and grown_out >= sum(len(json.dumps(f)) // 2 for f in frames)


async def test_a_rejection_with_field_errors_reaches_its_socket_with_the_details(people):
    """The demo's room mutators validate as the main path does: DRF's field errors."""
    ada, bob = people
    await db(lease)(ada, "A")
    await db(lease)(bob, "B")
    a, _ = await room_socket("A", (await db(lease)(ada, "A"))["realtime"]["roomToken"])
    await a.send(push(1, "editTitle", id=ISSUE, title="second", updatedAt="soon"))
    outcome = (await a.recv_until("mutationOutcome"))[-1]
    assert (outcome["mid"], outcome["kind"]) == (1, "rejected")
    assert outcome["reason"].startswith("invalid arguments")
    assert list(outcome["details"]) == ["updatedAt"] and outcome["details"]["updatedAt"]
    assert (await db(issue_row)())[0] == "first"
    await a.close()


def outside_writes(status):
    """A plain ORM write (another code path than the room) and a new comment."""
    demo.Issue.objects.filter(id=ISSUE).update(status=status, updated_at=9)
    demo.Comment.objects.create(id="c2", issue_id=ISSUE, author_id="u1", body="x", created_at=3)


async def until_rows(socket, table, predicate, seconds=5, seen=None):
    """
    Frames (after ``seen``) until one of ``table``'s rows in them satisfies
    ``predicate``; fails after ``seconds``.
    """
    import asyncio

    seen = [] if seen is None else seen
    deadline = time.monotonic() + seconds
    while not any(predicate(r) for r in rows(seen, table)):
        left = deadline - time.monotonic()
        try:
            seen.append(await asyncio.wait_for(socket.recv(), max(left, 0)))
        except TimeoutError:
            raise AssertionError(f"no {table} row matched in {seconds}s: {seen}") from None
    return seen


async def test_a_write_from_outside_the_room_reaches_the_room_at_once(people):
    """
    An open room follows what other code paths write to its footprint: an ORM update
    of the doc's row and a new row under it reach every room socket without a room
    mutation, and a later room mutation of the same row keeps the outside write.
    """
    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    a, _ = await room_socket("A", (await db(lease)(ada, "A"))["realtime"]["roomToken"])
    b, _ = await room_socket("B", rt["roomToken"])
    started = time.monotonic()
    await db(outside_writes)("review")
    for socket in (a, b):
        seen = await until_rows(socket, "issue", lambda r: r[2] == "review")
        await until_rows(socket, "comment", lambda r: r[0] == "c2", seen=seen)
    assert time.monotonic() - started < 2
    await a.send(push(1, "editTitle", id=ISSUE, title="after", updatedAt=10))
    await until_rows(b, "issue", lambda r: r[1] == "after" and r[2] == "review")
    deadline = time.monotonic() + 5
    while await db(issue_row)() != ("after", "review", 10):
        assert time.monotonic() < deadline, await db(issue_row)()
        await a.recv()
    await a.close()
    await b.close()


async def test_a_room_whose_footprint_query_ends_closes_its_sockets_to_retry(people):
    """A migration of a footprint table ends the room's feed: its sockets get 4503."""
    from rindle_app.runtime import get_runtime

    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    a, _ = await room_socket("A", (await db(lease)(ada, "A"))["realtime"]["roomToken"])
    await db(get_runtime().hub._on_schema_change)("comment")  # what a migration calls
    while True:
        out = await a.comm.receive_output(timeout=3)
        if out["type"] == "websocket.close":
            break
    assert out["code"] == 4503
    assert rt


async def test_each_confirmation_advances_the_rooms_progress(people):
    """
    A client releases a frame only with a progress past what it already applied, so
    the lmid confirmation of a flush carries a cv past the mutation's own progress,
    followed by a progress that releases it (the published client otherwise holds the
    confirmation, and its pending mutation, until the next edit in the room).
    """
    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    a, _ = await room_socket("A", (await db(lease)(ada, "A"))["realtime"]["roomToken"])
    b, _ = await room_socket("B", rt["roomToken"])
    for mid in (1, 2):
        await a.send(push(mid, "editTitle", id=ISSUE, title=f"t{mid}", updatedAt=5 + mid))
        applied, confirm, released = 0, None, None
        while released is None:
            frame = await a.recv()
            if frame["t"] == "progress" and confirm is None:
                applied = max(applied, frame["frame"]["cvMin"])
            elif frame["t"] == "nbatch" and frame["queryId"] == 0:
                confirm = frame["batch"]["cv"]
            elif frame["t"] == "progress" and frame["frame"]["cvMin"] >= confirm:
                released = frame["frame"]["cvMin"]
        assert applied and confirm > applied, (applied, confirm)
    await a.close()
    await b.close()


async def test_a_burst_of_mutations_applies_in_order_and_each_refusal_names_its_mid(people):
    """Pushes sent back to back are applied in arrival order, a gap refused with its mid."""
    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    a, _ = await room_socket("A", (await db(lease)(ada, "A"))["realtime"]["roomToken"])
    b, _ = await room_socket("B", rt["roomToken"])
    for mid in range(1, 41):
        await a.send(push(mid, "editTitle", id=ISSUE, title=f"burst {mid}", updatedAt=10 + mid))
    await a.send(push(45, "editTitle", id=ISSUE, title="gap", updatedAt=99))
    seen = await until_rows(b, "issue", lambda r: r[1] == "burst 40")
    titles = [r[1] for r in rows(seen, "issue")]
    assert titles == sorted(titles, key=lambda t: int(t.split()[1])), titles  # in order
    errors = []
    while not errors:
        frame = await a.recv()
        if frame["t"] == "error":
            errors.append((frame["code"], frame["mid"]))
    assert errors == [("mid_gap", 45)]
    deadline = time.monotonic() + 5
    while (await db(ledgers)())[0] != [("A", 40)]:
        assert time.monotonic() < deadline
        await a.recv()
    assert (await db(issue_row)())[0] == "burst 40"
    await a.close()
    await b.close()
