"""rindle_app.realtime.auth: Channels' session auth, minus the per-frame send wrapper on sockets."""

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client as HttpClient

from rindle_app.realtime.auth import AuthMiddlewareStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def scope_for(kind, cookie=b""):
    headers = [(b"cookie", cookie)] if cookie else []
    return {"type": kind, "path": "/", "headers": headers, "query_string": b""}


async def run(kind, cookie=b""):
    seen = {}

    async def inner(scope, receive, send):
        seen["scope"], seen["send"] = scope, send

    async def server_send(message):
        pass

    async def receive():
        return {}

    await AuthMiddlewareStack(inner)(scope_for(kind, cookie), receive, server_send)
    return seen, server_send


async def test_a_socket_gets_the_servers_own_send_and_the_session_user():
    alice = await database_sync_to_async(get_user_model().objects.create_user)("alice")
    http = HttpClient()
    await database_sync_to_async(http.force_login)(alice)
    cookie = f"sessionid={http.cookies['sessionid'].value}".encode()
    seen, server_send = await run("websocket", cookie)
    assert seen["send"] is server_send
    user = seen["scope"]["user"]
    assert await database_sync_to_async(lambda: user.pk)() == alice.pk
    assert seen["scope"]["session"].session_key == http.cookies["sessionid"].value


async def test_a_socket_without_a_cookie_is_anonymous():
    seen, _ = await run("websocket")
    assert not await database_sync_to_async(lambda: seen["scope"]["user"].is_authenticated)()


async def test_http_keeps_the_wrapper_that_saves_the_session():
    seen, server_send = await run("http")
    assert seen["send"] is not server_send
