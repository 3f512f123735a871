"""Who is on the socket: bearer tokens with scopes, sessions, and revocation of open sockets."""

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client as HttpClient

from rindle_app import tokens

from .conftest import ORIGIN, Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async


def bearer(raw):
    return [ORIGIN, (b"authorization", f"Bearer {raw}".encode())]


@pytest.fixture
def alice(live):
    return get_user_model().objects.create_user("alice", password="pw")


async def subscribe(client):
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    return await client.recv_until("progress")


@pytest.mark.parametrize("raw", ["rdl_nope_nope", "garbage", ""])
async def test_a_bad_token_is_refused_before_accept(live, raw):
    client = Client(headers=bearer(raw))
    assert not await client.connect()


async def test_another_auth_scheme_is_refused(live):
    client = Client(headers=[ORIGIN, (b"authorization", b"Basic YTpi")])
    assert not await client.connect()


async def test_token_scopes_limit_what_a_socket_may_do(alice):
    raw, _ = await db(tokens.create)(alice, ["read"])
    client = Client(headers=bearer(raw))
    assert await client.connect()
    frames = await subscribe(client)
    assert frames[0]["t"] == "nhello"
    await client.send({"t": "init", "clientID": "c1"})
    env = {"clientID": "c1", "mid": 1, "name": "setStatus", "args": {}}
    await client.send({"t": "pushMutation", "envelope": env})
    reply = await client.recv()
    assert reply["t"] == "error" and reply["code"] == "unauthorized"
    assert await db(lambda: live_lmid("c1"))() == 0
    await client.close()


def live_lmid(client_id):
    from rindle_app.engine import get_engine

    return get_engine().client_lmid(client_id)


async def test_a_token_without_read_scope_cannot_subscribe(alice):
    raw, _ = await db(tokens.create)(alice, ["mutate"])
    client = Client(headers=bearer(raw))
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    reply = await client.recv()
    assert reply["t"] == "queryError" and reply["code"] == "unauthorized"
    await client.close()


async def test_revoking_a_token_closes_its_open_sockets(alice, settings):
    settings.RINDLE = {**settings.RINDLE, "WS_AUTH_RECHECK_SECONDS": 0.1}
    raw, token = await db(tokens.create)(alice, ["read"])
    client = Client(headers=bearer(raw))
    assert await client.connect()
    await subscribe(client)
    await db(tokens.revoke)(token.prefix)
    reply = await client.recv(timeout=3)
    assert reply["t"] == "queryError" and reply["code"] == "unauthorized"
    closed = await client.comm.receive_output(timeout=3)
    assert closed == {"type": "websocket.close", "code": 4401}


async def test_a_session_user_is_the_socket_user_until_logged_out(alice, settings):
    settings.RINDLE = {**settings.RINDLE, "WS_AUTH_RECHECK_SECONDS": 0.1}
    http = HttpClient()
    await db(http.force_login)(alice)
    cookie = f"sessionid={http.cookies['sessionid'].value}".encode()
    client = Client(headers=[ORIGIN, (b"cookie", cookie)])
    assert await client.connect()
    await client.send(
        {
            "t": "subscribe",
            "queryId": 1,
            "name": "myIssues",
            "args": {"limit": 5},
            "mode": "normalized",
        }
    )
    hello, snap, _ = await client.recv_until("progress")
    assert hello["t"] == "nhello"
    await db(http.logout)()
    reply = await client.recv(timeout=3)
    assert reply["t"] == "queryError" and reply["code"] == "unauthorized"


async def test_only_sockets_with_credentials_re_check_them(alice, settings, monkeypatch):
    """An anonymous socket has nothing to revoke: it runs no periodic database check."""
    import asyncio

    from rindle_app.realtime.consumer import RindleConsumer

    settings.RINDLE = {**settings.RINDLE, "WS_AUTH_RECHECK_SECONDS": 0.05}
    checked = []
    real = RindleConsumer._still_authorized

    def still_authorized(self):
        checked.append(self.token is not None)
        return real(self)

    monkeypatch.setattr(RindleConsumer, "_still_authorized", still_authorized)
    anonymous = Client()
    assert await anonymous.connect()
    await asyncio.sleep(0.3)
    assert checked == []
    raw, _ = await db(tokens.create)(alice, ["read"])
    machine = Client(headers=bearer(raw))
    assert await machine.connect()
    await asyncio.sleep(0.3)
    assert checked and all(checked)  # the token socket re-checked, the anonymous one never
    await anonymous.close()
    await machine.close()


async def session_socket(user):
    http = HttpClient()
    await db(http.force_login)(user)
    client = Client(
        headers=[ORIGIN, (b"cookie", f"sessionid={http.cookies['sessionid'].value}".encode())]
    )
    assert await client.connect()
    return client


async def lease_reply(client, lease):
    await client.send({"t": "subscribe", "queryId": 7, "leaseToken": lease, "mode": "normalized"})
    return await client.recv()


async def test_a_lease_is_redeemed_only_by_the_principal_it_was_minted_for(alice):
    """
    A lease minted for alice's session, for alice's token or for nobody subscribes
    on a socket of that same principal; a socket authenticated as anyone else gets a
    queryError lease_principal_mismatch and no subscription, and stays open.
    """
    from rindle_app import leases

    bob = await db(get_user_model().objects.create_user)("bob")
    raw1, t1 = await db(tokens.create)(alice, ["read"])
    raw2, _t2 = await db(tokens.create)(alice, ["read"])
    for_session = leases.mint("users", None, alice)[0]
    for_token = leases.mint("users", None, alice, token=t1)[0]
    for_nobody = leases.mint("users", None, None)[0]
    sockets = {
        "alice": await session_socket(alice),
        "bob": await session_socket(bob),
        "token 1": Client(headers=bearer(raw1)),
        "token 2": Client(headers=bearer(raw2)),
    }
    for name in ("token 1", "token 2"):
        assert await sockets[name].connect()
    allowed = {("alice", for_session), ("token 1", for_token)}
    for name, client in sockets.items():
        for lease in (for_session, for_token, for_nobody):
            reply = await lease_reply(client, lease)
            if (name, lease) in allowed:
                assert reply["t"] == "nhello", (name, reply)
                await client.recv_until("progress")
                await client.send({"t": "unsubscribe", "queryId": 7})
            else:
                assert reply["t"] == "queryError", (name, reply)
                assert (reply["queryId"], reply["code"]) == (7, "lease_principal_mismatch")
    for client in sockets.values():
        await client.close()


async def test_a_socket_without_credentials_is_bound_to_its_first_lease(alice):
    """
    A socket with no session or token may present a session user's lease as its
    credential (the daemon deployment, where the browser holds only leases). Its
    first lease binds it: a lease of another user, or one minted for a bearer token,
    is refused with lease_principal_mismatch, and the socket stays open.
    """
    from rindle_app import leases

    bob = await db(get_user_model().objects.create_user)("bob")
    _raw, t1 = await db(tokens.create)(alice, ["read"])
    for_alice = leases.mint("users", None, alice)[0]
    for_bob = leases.mint("users", None, bob)[0]
    for_token = leases.mint("users", None, alice, token=t1)[0]
    for_nobody = leases.mint("users", None, None)[0]

    client = Client()
    assert await client.connect()
    for lease, accepted in (
        (for_token, False),
        (for_alice, True),
        (for_bob, False),
        (for_nobody, False),
        (for_alice, True),
    ):
        reply = await lease_reply(client, lease)
        if accepted:
            assert reply["t"] == "nhello", reply
            await client.recv_until("progress")
            await client.send({"t": "unsubscribe", "queryId": 7})
        else:
            assert (reply["t"], reply["code"]) == ("queryError", "lease_principal_mismatch")
    await client.close()

    anonymous = Client()
    assert await anonymous.connect()
    for lease, accepted in ((for_nobody, True), (for_alice, False)):
        reply = await lease_reply(anonymous, lease)
        assert reply["t"] == ("nhello" if accepted else "queryError"), reply
        if accepted:
            await anonymous.recv_until("progress")
            await anonymous.send({"t": "unsubscribe", "queryId": 7})
    await anonymous.close()
