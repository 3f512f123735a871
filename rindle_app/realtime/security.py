"""
Which sockets may open: the ``Origin`` rule, and the machine clients it does not bind.

The ``Origin`` check stops cross-site websocket hijacking: a foreign page opening
``/ws/rindle/`` in a visitor's browser, which sends that visitor's cookies along.
Its threat is ambient authority, a credential the browser attaches by itself. A
bearer token is not one: a page cannot set the ``Authorization`` header of a
websocket, so a connection carrying one was built by a program that holds the
token, and the token is all the authority it gets.

``AllowedHostsOriginValidator`` here is Channels' validator (``ALLOWED_HOSTS``
patterns) with one difference, for a connection that sends
``Authorization: Bearer`` and no allowed ``Origin`` (none, or a foreign one): it
is passed on to the consumer with its ``Cookie`` header removed, so the session
is never read and the socket is the token's or nobody's. The consumer then checks
the token before accepting and refuses a bad one with 4401, before the handshake
completes (a 403 to the client). Every other connection is judged as by Channels:
an allowed ``Origin`` passes untouched, anything else is refused at the handshake.

The published rindle clients define no subprotocol that carries a token (they
offer ``rindle.v1`` and an ``aff.<ticket>`` placement ticket, which is placement,
not authorization), so the header is the only bearer a socket can present.
"""

from urllib.parse import urlparse

from channels.security.websocket import OriginValidator
from django.conf import settings


def bearer_token(scope):
    """
    The token of the scope's first ``Authorization`` header: the text after
    ``Bearer``, ``""`` for another scheme (refused, not ignored), None without one.
    """
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            if kind.lower() == "bearer":
                return token.strip()
            return ""
    return None


def origin(scope):
    """The scope's ``Origin`` header, parsed as Channels parses it (None if absent)."""
    parsed = None
    for name, value in scope.get("headers") or ():
        if name == b"origin":
            try:
                parsed = urlparse(value.decode("latin1"))
            except UnicodeDecodeError:
                pass
    return parsed


class SocketOriginValidator(OriginValidator):
    """
    Channels' ``OriginValidator``, except that a connection presenting a bearer
    token without an allowed ``Origin`` goes on to the consumer without its
    cookies (the consumer authenticates the token or refuses the socket).
    """

    async def __call__(self, scope, receive, send):
        if (
            scope["type"] == "websocket"
            and bearer_token(scope) is not None
            and not self.valid_origin(origin(scope))
        ):
            headers = [(n, v) for n, v in scope.get("headers") or () if n != b"cookie"]
            return await self.application({**scope, "headers": headers}, receive, send)
        return await super().__call__(scope, receive, send)


def AllowedHostsOriginValidator(application):  # noqa: N802 (named like the Channels factory)
    """``SocketOriginValidator`` over ``ALLOWED_HOSTS``, with Channels' DEBUG default."""
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return SocketOriginValidator(application, allowed_hosts)


__all__ = ["AllowedHostsOriginValidator", "SocketOriginValidator", "bearer_token", "origin"]
