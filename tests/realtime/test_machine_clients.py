"""
Who may open the socket without an ``Origin``: a bearer token admits a machine client,
a cookie never does, and a foreign page cannot ride a visitor's session.
"""

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client as HttpClient

from project.demo.models import User
from rindle_app import tokens
from tests.support.demo import create_issue

from .conftest import ORIGIN, Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async
FOREIGN = (b"origin", b"http://evil.example")


def authorization(raw):
    return (b"authorization", f"Bearer {raw}".encode())


@pytest.fixture
def alice(live):
    return get_user_model().objects.create_user("alice", password="pw")


@pytest.fixture
def bob(live):
    return get_user_model().objects.create_user("bob", password="pw")


async def session_cookie(user):
    http = HttpClient()
    await db(http.force_login)(user)
    return (b"cookie", f"sessionid={http.cookies['sessionid'].value}".encode())


async def my_issue_ids(client):
    """Subscribe ``myIssues``; the ids of the issues in its snapshot."""
    await client.send(
        {
            "t": "subscribe",
            "queryId": 1,
            "name": "myIssues",
            "args": {"limit": 10},
            "mode": "normalized",
        }
    )
    frames = await client.recv_until("progress")
    hello = frames[0]
    assert hello["t"] == "nhello", hello
    columns = next(t["columns"] for t in hello["hello"]["tables"] if t["name"] == "issue")
    ops = [op for f in frames if f["t"] == "nbatch" for op in f["batch"]["ops"]]
    return sorted(op["row"][columns.index("id")] for op in ops if op["table"] == "issue")


async def seed_issues():
    def write():
        User.objects.bulk_create([User(id="alice", name="Alice"), User(id="bob", name="Bob")])
        create_issue("a1", owner="alice")
        create_issue("b1", owner="bob")

    await db(write)()


async def test_a_bearer_token_without_an_origin_is_admitted_and_subscribes(alice):
    """A machine client (a token, no Origin) is accepted and gets its query's snapshot."""
    await seed_issues()
    raw, _ = await db(tokens.create)(alice, ["read"])
    client = Client(headers=[authorization(raw)])
    assert await client.connect()
    assert await my_issue_ids(client) == ["a1"]
    await client.close()


@pytest.mark.parametrize("raw", ["rdl_nope_nope", "garbage", ""])
async def test_an_invalid_bearer_token_without_an_origin_is_refused_at_the_handshake(live, raw):
    client = Client(headers=[authorization(raw)])
    assert not await client.connect()


async def test_another_auth_scheme_without_an_origin_is_refused(live):
    client = Client(headers=[(b"authorization", b"Basic YTpi")])
    assert not await client.connect()


async def test_a_session_cookie_without_an_origin_is_refused(alice):
    """A cookie is ambient authority: without an allowed Origin it opens nothing."""
    client = Client(headers=[await session_cookie(alice)])
    assert not await client.connect()


async def test_a_foreign_origin_with_a_victims_cookie_is_refused(alice):
    """The hijack: a foreign page's socket carrying its visitor's session."""
    client = Client(headers=[FOREIGN, await session_cookie(alice)])
    assert not await client.connect()


@pytest.mark.parametrize("raw", ["rdl_nope_nope", "garbage", ""])
async def test_a_bogus_bearer_does_not_carry_a_victims_cookie_past_a_foreign_origin(alice, raw):
    client = Client(headers=[FOREIGN, await session_cookie(alice), authorization(raw)])
    assert not await client.connect()


async def test_a_bearer_token_with_a_foreign_origin_is_the_token_and_never_the_cookie(alice, bob):
    """
    A token is not ambient authority (a page cannot set the header), so a foreign
    Origin does not refuse it; the cookie that came along is dropped, so the socket
    acts as the token's user and the session's user is never read.
    """
    await seed_issues()
    raw, _ = await db(tokens.create)(bob, ["read"])
    client = Client(headers=[FOREIGN, await session_cookie(alice), authorization(raw)])
    assert await client.connect()
    assert await my_issue_ids(client) == ["b1"]
    await client.close()


async def test_a_session_with_an_allowed_origin_is_still_the_sessions_user(alice):
    await seed_issues()
    client = Client(headers=[ORIGIN, await session_cookie(alice)])
    assert await client.connect()
    assert await my_issue_ids(client) == ["a1"]
    await client.close()


async def test_no_credentials_and_no_origin_is_still_refused(live):
    client = Client(headers=[])
    assert not await client.connect()


@pytest.mark.parametrize(
    "origin,kept",
    [(None, False), (FOREIGN, False), (ORIGIN, True)],
    ids=["no origin", "foreign origin", "allowed origin"],
)
async def test_a_bearer_connection_without_an_allowed_origin_loses_its_cookies(origin, kept):
    """What the consumer sees: the Cookie header only where the Origin is allowed."""
    from rindle_app.realtime.security import AllowedHostsOriginValidator

    seen = []

    async def inner(scope, receive, send):
        seen.append(dict(scope["headers"]))

    cookie, bearer = (b"cookie", b"sessionid=victim"), authorization("rdl_x_y")
    headers = [h for h in (origin, cookie, bearer) if h is not None]
    await AllowedHostsOriginValidator(inner)({"type": "websocket", "headers": headers}, None, None)
    assert (b"cookie" in seen[0]) is kept
    assert seen[0][b"authorization"] == bearer[1]
