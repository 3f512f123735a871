"""
Client ids have owners over the websocket (issue 13, finding 4): a socket of another
principal can neither init nor push under a taken id, and its lmid query never shows
another principal's row.
"""

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.db import SessionStore
from django.db import connection
from django.test import Client as HttpClient

from project.demo.models import User
from rindle_app import tokens
from rindle_app.engine import mutator
from rindle_app.testing import outbox_high_water

from .conftest import ORIGIN, Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async
LEDGER = "_rindle_client_mutations"


@mutator("own_ws_addUser")
def add_user(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "x"})


@pytest.fixture
def anonymous_writes(live, settings):
    """The opt-in anonymous mutations need (issue 13, safe defaults); unknown before it."""
    settings.RINDLE = {**settings.RINDLE, "ALLOW_ANONYMOUS_MUTATIONS": True}
    return live


def push(client_id, mid, uid):
    envelope = {"clientID": client_id, "mid": mid, "name": "own_ws_addUser", "args": {"id": uid}}
    return {"t": "pushMutation", "envelope": envelope}


def frozen():
    """The ledger (owners included), the rows and the outbox: what a refusal leaves alone."""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT client_id, last_mutation_id, owner FROM {LEDGER} ORDER BY 1")
        ledger = cursor.fetchall()
    return ledger, sorted(User.objects.values_list("id", flat=True)), outbox_high_water()


def user_cookie(name):
    user = get_user_model().objects.create_user(name)
    http = HttpClient()
    http.force_login(user)
    return f"sessionid={http.cookies['sessionid'].value}"


def anonymous_cookie():
    session = SessionStore()
    session["seen"] = True
    session.save()
    return f"sessionid={session.session_key}"


async def socket(cookie=None, token=None):
    headers = [ORIGIN]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    client = Client(headers=headers)
    assert await client.connect()
    return client


async def lmid_rows(client, query_id=9):
    """Subscribe the lmid query; its seq-0 rows."""
    frame = {"t": "subscribe", "queryId": query_id, "name": "_rindle/clientLmid", "args": {}}
    await client.send({**frame, "mode": "normalized"})
    hello, snap, _progress = await client.recv_until("progress")
    assert hello["hello"]["tables"][0]["columns"] == ["client_id", "last_mutation_id"]
    return [op["row"] for op in snap["batch"]["ops"]]


async def confirmed(client):
    """The lmid ops of the next batch (after the progress that releases it)."""
    batch, _progress = await client.recv_until("progress")
    return [(op["op"], op.get("row") or op.get("new")) for op in batch["batch"]["ops"]]


async def claim(client, client_id, uid="a1"):
    await client.send({"t": "init", "clientID": client_id})
    assert await lmid_rows(client) == []
    await client.send(push(client_id, 1, uid))
    assert await confirmed(client) == [("add", [client_id, 1])]


async def assert_refused(client, frame, **extra):
    await client.send(frame)
    reply = await client.recv()
    assert reply["t"] == "error" and reply["code"] == "client_id_taken", reply
    assert reply.get("retryable") is False
    assert "lmid" not in reply
    for key, value in extra.items():
        assert reply[key] == value


async def still_open(client):
    """The socket answers the next frame as usual."""
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    frames = await client.recv_until("progress")
    assert frames[0]["t"] == "nhello"


async def test_another_user_cannot_init_under_a_taken_id(live):
    """B's init with A's id is refused; B sees no lmid of A's and A's next mid applies."""
    alice = await socket(await db(user_cookie)("alice"))
    await claim(alice, "cA")
    bob = await socket(await db(user_cookie)("bob"))
    before = await db(frozen)()
    await assert_refused(bob, {"t": "init", "clientID": "cA"})
    await still_open(bob)
    # Refused, the socket has no client: no lmid query, no push under the id.
    await bob.send({"t": "subscribe", "queryId": 9, "name": "_rindle/clientLmid", "args": {}})
    reply = await bob.recv()
    assert reply["t"] == "queryError" and reply["code"] == "invalid_args"
    await bob.send(push("cA", 2, "b2"))
    assert (await bob.recv())["code"] == "bad_frame"
    assert await db(frozen)() == before
    # A's real next mutation is applied, not absorbed.
    await alice.send(push("cA", 2, "a2"))
    assert await confirmed(alice) == [("edit", ["cA", 2])]
    assert await db(lambda: sorted(User.objects.values_list("id", flat=True)))() == ["a1", "a2"]
    await alice.close()
    await bob.close()


async def test_a_push_under_an_id_claimed_since_init_is_refused(live):
    """B inits a fresh id, A claims it first: B's push is refused, B's lmid query stays empty."""
    bob = await socket(await db(user_cookie)("bob"))
    await bob.send({"t": "init", "clientID": "cX"})
    assert await lmid_rows(bob) == []
    alice = await socket(await db(user_cookie)("alice"))
    await claim(alice, "cX")
    assert await bob.nothing()  # A's lmid row never reaches B
    before = await db(frozen)()
    await assert_refused(bob, push("cX", 2, "b2"), mid=2)
    await still_open(bob)
    assert await db(frozen)() == before
    await alice.send(push("cX", 2, "a2"))
    assert await confirmed(alice) == [("edit", ["cX", 2])]
    await alice.close()
    await bob.close()


async def test_the_owner_reconnecting_keeps_its_id(live):
    """A new socket of the same user inits, sees its lmid and continues the sequence."""
    cookie = await db(user_cookie)("alice")
    first = await socket(cookie)
    await claim(first, "cA")
    await first.close()
    again = await socket(cookie)
    await again.send({"t": "init", "clientID": "cA"})
    assert await lmid_rows(again) == [["cA", 1]]
    await again.send(push("cA", 2, "a2"))
    assert await confirmed(again) == [("edit", ["cA", 2])]
    await again.close()


async def test_a_token_and_its_user_are_different_owners(live):
    """A bearer token's ids are the token's: its own user's session cannot use them."""
    user = await db(get_user_model().objects.create_user)("alice")
    raw, _ = await db(tokens.create)(user, ["read", "mutate"])
    machine = await socket(token=raw)
    await claim(machine, "cT")
    http = HttpClient()
    await db(http.force_login)(user)
    browser = await socket(f"sessionid={http.cookies['sessionid'].value}")
    await assert_refused(browser, {"t": "init", "clientID": "cT"})
    other_raw, _ = await db(tokens.create)(user, ["read", "mutate"])
    other = await socket(token=other_raw)
    await assert_refused(other, {"t": "init", "clientID": "cT"})
    await machine.close()
    await browser.close()
    await other.close()


async def test_anonymous_clients_are_bound_by_their_session(anonymous_writes):
    """An anonymous session owns its ids; another session, or no session, is refused."""
    cookie = await db(anonymous_cookie)()
    first = await socket(cookie)
    await claim(first, "cS")
    for intruder in (
        await socket(await db(anonymous_cookie)()),
        await socket(),
        await socket(await db(user_cookie)("mallory")),
    ):
        await assert_refused(intruder, {"t": "init", "clientID": "cS"})
        await intruder.close()
    same = await socket(cookie)  # the same browser, a new socket
    await same.send({"t": "init", "clientID": "cS"})
    assert await lmid_rows(same) == [["cS", 1]]
    await first.close()
    await same.close()


async def test_a_sessionless_anonymous_id_is_protected_from_everyone_else(anonymous_writes):
    """Sessionless anonymous clients share one principal, which no user or session is."""
    first = await socket()
    await claim(first, "cN")
    user = await socket(await db(user_cookie)("alice"))
    await assert_refused(user, {"t": "init", "clientID": "cN"})
    session = await socket(await db(anonymous_cookie)())
    await assert_refused(session, {"t": "init", "clientID": "cN"})
    await first.close()
    await user.close()
    await session.close()


async def test_an_unowned_row_shows_until_another_principal_claims_it(live):
    """A row from before owners: its lmid shows to whoever inits with it, until claimed."""
    await db(lambda: live.mutate("old", 1, "own_ws_addUser", {"id": "o1"}))()  # no owner
    alice = await socket(await db(user_cookie)("alice"))
    bob = await socket(await db(user_cookie)("bob"))
    for client in (alice, bob):
        await client.send({"t": "init", "clientID": "old"})
        assert await lmid_rows(client) == [["old", 1]]
    await alice.send(push("old", 2, "a2"))
    assert await confirmed(alice) == [("edit", ["old", 2])]
    assert await confirmed(bob) == [("remove", ["old", 1])]  # claimed: gone, never mid 2
    await assert_refused(bob, push("old", 3, "b3"), mid=3)
    await alice.close()
    await bob.close()


async def test_the_flat_lmid_hello_has_exactly_the_two_columns(live):
    """Flat mode, as the flat client subscribes it: no owner in the schema or the rows."""
    alice = await socket(await db(user_cookie)("alice"))
    await claim(alice, "cF")
    frame = {"t": "subscribe", "queryId": 3, "name": "_rindle/clientLmid", "args": None}
    await alice.send(frame)
    hello, snap, _ = await alice.recv_until("progress")
    assert hello["t"] == "hello"
    assert hello["hello"]["schema"]["columns"] == ["client_id", "last_mutation_id"]
    assert "owner" not in str(snap) and "u:" not in str(snap)
    await alice.close()
