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

from channels.auth import AuthMiddleware
from channels.sessions import CookieMiddleware, InstanceSessionWrapper, SessionMiddleware


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


__all__ = ["AuthMiddlewareStack", "SocketSessionMiddleware"]
