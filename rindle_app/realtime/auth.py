"""
Session authentication for sockets, without a wrapper around every frame sent.

Channels' ``AuthMiddlewareStack`` resolves the Django session and user from the
cookie, and its session middleware also wraps the server's ``send`` so that an
HTTP response can save a modified session and set its cookie. A websocket frame
carries no cookie and that wrapper never saves on one, yet every frame sent still
passes through it (two lazy session lookups per frame). At a thousand
subscribers that is a visible share of the server's CPU per commit
(``docs/benchmarks.md``, W3).

``AuthMiddlewareStack`` here is Channels' stack with one difference: on a
websocket scope the inner application gets the server's own ``send``. The scope
carries the same ``session`` and ``user``; HTTP scopes are wrapped as before. As
with Channels, a consumer that changes the session saves it itself
(``scope["session"].save()``).
"""

import asyncio
import logging
import random

from channels.auth import AuthMiddleware
from channels.sessions import CookieMiddleware, InstanceSessionWrapper, SessionMiddleware

logger = logging.getLogger("rindle.realtime")


class SocketSessionMiddleware(SessionMiddleware):
    """``SessionMiddleware`` that leaves a websocket's ``send`` unwrapped."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket":
            return await super().__call__(scope, receive, send)
        session = InstanceSessionWrapper(scope, send)
        await session.resolve_session()
        return await self.inner(session.scope, receive, send)


def AuthMiddlewareStack(inner):  # noqa: N802 (named like the Channels stack it replaces)
    """Cookie, session and user middleware, as Channels', for sockets and HTTP."""
    return CookieMiddleware(SocketSessionMiddleware(AuthMiddleware(inner)))


def still_authorized(user, token, session):
    """
    Whether a socket's credentials still hold (a database read: a worker thread). A
    token must exist and be active; a signed-in user must exist and be active, and a
    socket that came in with a session (no token) needs that session still to exist,
    so a logout ends it. Anonymous stays anonymous.
    """
    if token is not None:
        token = type(token).objects.filter(pk=token.pk).first()
        if token is None or not token.is_active():
            return False
    if user is None or not getattr(user, "is_authenticated", False):
        return True
    from django.contrib.auth import get_user_model

    if not get_user_model().objects.filter(pk=user.pk, is_active=True).exists():
        return False
    if token is None and session is not None and session.session_key:
        return session.exists(session.session_key)
    return True


async def watch_credentials(check, interval, on_revoked):
    """
    Run ``check()`` (a coroutine function) every ``interval`` seconds until it says
    False, then ``await on_revoked()``. The first check comes at a random point of
    the second half of the interval, so sockets that connected together (a deploy,
    a reconnect storm) do not all read the database in the same instant; the bound
    still holds. A failing check (a database hiccup) is not a revocation.
    """
    wait = interval * random.uniform(0.5, 1.0)
    while True:
        await asyncio.sleep(wait)
        wait = interval
        try:
            if await check():
                continue
        except Exception:
            logger.exception("rindle socket: credential re-check failed")
            continue
        await on_revoked()
        return


__all__ = [
    "AuthMiddlewareStack",
    "SocketSessionMiddleware",
    "still_authorized",
    "watch_credentials",
]
