"""
The websocket consumer at ``/ws/rindle/``: the rindle wire protocol (DESIGN §5).

Client frames: ``init``, ``subscribe`` (by name and args, or by lease token),
``unsubscribe``, ``pushMutation``. Every frame is checked for size, rate, JSON and
shape; a bad one is answered with ``error`` (or ``queryError`` for one query) and
changes nothing; the connection stays open. Server frames come straight from the
hub, in order (``RindleConsumer._deliver``).

Threading model. Everything here runs on the socket's event loop, except what goes
through ``sync_to_async``/``database_sync_to_async`` (the hub's locked calls, the
engine's writes, the database reads), which runs in worker threads: the loop never
waits for the writer (``Engine.write`` refuses to run on it). The hub hands frames
over with ``loop.call_soon_threadsafe``; one sender task per socket writes them.

Usage (``rindle_app.flow``): a socket counts under the namespace
``RindleAdapter.namespace`` names for its user or token, with the connection as
the session. Each accepted client frame is a transfer of its UTF-8 bytes in; each
batch the sender writes is a transfer of its bytes out. A refused frame is a
refusal by reason instead (its error reply is not counted), a refused bearer token
an auth failure under the namespace of nobody. Counting reads no database: the
ledger and the namespace's quota are set up at connect, in a worker thread. Over
quota, subscribe and pushMutation are refused with ``quota_exceeded``; the
subscriptions a socket already holds keep receiving their batches (cutting them
would leave the client's views torn; the socket's next subscribe is refused).
"""

import asyncio
import collections
import logging
import random
import time
import uuid

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import close_old_connections

from .. import leases, strictjson
from ..adapter import check_anonymous_mutation, get_adapter
from ..conf import rindle_settings
from ..engine.errors import AnonymousMutationsDisabled, MutationGap, RindleError
from ..engine.mutations import principal_key
from ..exceptions import (
    BAD_FRAME,
    FRAME_ERROR,
    FRAME_QUERY_ERROR,
    FRAME_TOO_LARGE,
    INTERNAL_ERROR,
    INVALID_ARGS,
    INVALID_QUERY,
    RATE_LIMITED,
    UNAUTHORIZED,
    UNSUPPORTED,
    to_frame,
)
from ..flow import quota
from ..ivm.ast import QueryError
from ..named import LMID_QUERY_NAME, QueryRefused, resolve
from . import limits, wire
from .hub import get_hub

logger = logging.getLogger("rindle.realtime")

MODES = ("flat", "normalized")
CLOSE_UNAUTHORIZED = 4401
CLOSE_SEND_FAILED = 4500
MAX_QUERY_ID = 2**31 - 1
MAX_CLIENT_ID = 128


class RindleConsumer(AsyncWebsocketConsumer):
    """
    Browsers authenticate with their Django session (``AuthMiddlewareStack``);
    machine clients send ``Authorization: Bearer <token>`` (``rindle_app.tokens``),
    whose scopes limit them ("read" to subscribe, "mutate" to push mutations). A
    bad token is refused before the socket is accepted. A socket with a token or a
    logged-in user re-checks its credentials at least every
    ``WS_AUTH_RECHECK_SECONDS``, so a revoked token or a deactivated user loses an
    open socket within that bound; an anonymous socket has nothing to re-check.
    """

    hub = None
    token = None
    # A socket without credentials is bound to the user of its first lease.
    _lease_principal = leases.UNBOUND
    meter = None
    _principal = None  # the key this socket is counted under (hub.sockets)
    # Set when the client frame being handled is refused (its bytes are not a transfer).
    _refused = False
    # Frames come straight from the hub (see hub.py), so the consumer listens on no
    # channel layer: no per-socket receive on Redis, and a Redis hiccup closes nothing.
    channel_layer_alias = None

    async def connect(self):
        self.channel_name = f"rindle.{uuid.uuid4().hex}"
        self.user = self.scope.get("user")
        self.client_id = None
        bearer = _bearer(self.scope)
        if bearer is not None:
            found = await database_sync_to_async(_authenticate)(bearer)
            if found is None:
                await sync_to_async(_auth_failure, thread_sensitive=False)()
                await self.close(code=CLOSE_UNAUTHORIZED)
                return
            self.user, self.token = found
        self.hub, self.meter = await sync_to_async(self._start, thread_sensitive=False)()
        if not await self._admit_principal():
            return
        self._outbox = collections.deque()  # hub batches the sender task has yet to write
        self._idle = None  # the future the sender task waits on while the outbox is empty
        self._broken = False  # a write failed: the socket is going away
        self._sender = asyncio.ensure_future(self._send_batches())
        self.conn = await sync_to_async(self.hub.connect, thread_sensitive=False)(
            self.channel_name, asyncio.get_running_loop(), self._deliver, self.user
        )
        self._tokens = float(rindle_settings.WS_BURST)
        self._refill = time.monotonic()
        await self.accept()
        if self.token is not None or getattr(self.user, "is_authenticated", False):
            # An anonymous socket has nothing to revoke, so it runs no re-check.
            self._recheck = asyncio.ensure_future(self._recheck_credentials())

    async def _admit_principal(self):
        """Count the socket under its principal; over the cap it is closed with 4429."""
        key = limits.principal(self.scope, self.user, self.token)
        if self.hub.sockets.acquire(key):
            self._principal = key
            return True
        await self.accept()  # a close code reaches the client only after the handshake
        await self.close(code=limits.CLOSE_TOO_MANY_SOCKETS)
        return False

    def _start(self):
        """The hub, and the socket's meter with its quota seeded (may read the store)."""
        try:
            meter = quota.meter(
                get_adapter().namespace(self.user, self.token), session=self.channel_name
            )
            meter.seed()
        finally:
            close_old_connections()  # a shared worker thread: release what the read opened
        return get_hub(), meter

    async def disconnect(self, code):
        for task in (getattr(self, "_recheck", None), getattr(self, "_sender", None)):
            if task is not None:
                task.cancel()
        if self._principal is not None:
            self.hub.sockets.release(self._principal)
            self._principal = None
        if self.hub is not None:
            await sync_to_async(self.hub.disconnect, thread_sensitive=False)(self.channel_name)

    async def _recheck_credentials(self):
        interval = float(rindle_settings.WS_AUTH_RECHECK_SECONDS)
        # The first check comes at a random point of the second half of the interval:
        # sockets that connected together (a deploy, a reconnect storm) do not all
        # query the database in the same instant thereafter. The bound still holds.
        wait = interval * random.uniform(0.5, 1.0)
        while True:
            await asyncio.sleep(wait)
            wait = interval
            try:
                if await database_sync_to_async(self._still_authorized)():
                    continue
            except Exception:  # a database hiccup is not a revocation; check again later
                logger.exception("rindle consumer: credential re-check failed")
                continue
            self.meter.auth_failure()
            for query_id in sorted(self.conn.subs):
                await self.send(
                    text_data=wire.query_error(query_id, "credentials revoked", UNAUTHORIZED, False)
                )
            await self.close(code=CLOSE_UNAUTHORIZED)
            return

    def _still_authorized(self):
        user = self.user
        if self.token is not None:
            token = type(self.token).objects.filter(pk=self.token.pk).first()
            if token is None or not token.is_active():
                return False
        if user is None or not getattr(user, "is_authenticated", False):
            return True  # anonymous stays anonymous
        from django.contrib.auth import get_user_model

        fresh = get_user_model().objects.filter(pk=user.pk, is_active=True).exists()
        if not fresh:
            return False
        session = self.scope.get("session")
        if self.token is None and session is not None and session.session_key:
            return session.exists(session.session_key)
        return True

    def _may(self, scope):
        return self.token is None or self.token.has_scope(scope)

    # --- from the hub ------------------------------------------------------------------

    def _deliver(self, frames):
        """
        Queue one hub batch for this socket's sender task, on this socket's event loop.

        The hub hands a loop all of its sockets' batches in one callback, which calls
        this for each socket in turn: it appends and, when the sender task waits for
        work, resolves the future it waits on. Each socket writes in its own task, so
        one whose writes wait for it (a server's back-pressure) holds up no other,
        and its batches stay in order behind each other.
        """
        self._outbox.append(frames)
        idle = self._idle
        if idle is not None:
            self._idle = None
            # A closing socket's sender task is cancelled with its future, and the
            # hub may still hand it a batch before it hears of the disconnect.
            if not idle.done():
                idle.set_result(None)

    async def _send_batches(self):
        """The socket's sender task: writes the queued batches in order, then waits."""
        loop = asyncio.get_running_loop()
        outbox = self._outbox
        try:
            while True:
                while outbox:
                    await self._write(outbox.popleft())
                self._idle = loop.create_future()
                await self._idle
        finally:
            self._idle = None

    async def _write(self, frames):
        """Each frame to the socket in order; the batch is one transfer out."""
        send = self.base_send
        sent = 0
        try:
            for frame in () if self._broken else frames:  # a broken socket drops them
                await send({"type": "websocket.send", "text": frame})
                sent += len(frame) if frame.isascii() else len(frame.encode())
        except Exception:  # the frames that follow would tear the client's views
            logger.exception("rindle consumer: a frame could not be written; closing")
            self._broken = True
            asyncio.ensure_future(self.close(code=CLOSE_SEND_FAILED))
        finally:
            self.conn.sent += 1
            if sent:
                self.meter.transfer(bytes_out=sent)

    # --- from the client ---------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        self._refused = False
        await self._handle(text_data)
        if not self._refused:
            size = len(text_data) if text_data.isascii() else len(text_data.encode())
            self.meter.transfer(bytes_in=size)

    async def _handle(self, text_data):
        if text_data is None:
            return await self._error("frames are JSON text; binary frames are not accepted")
        if len(text_data) > int(rindle_settings.WS_MAX_FRAME_BYTES):
            return await self._error(
                f"frame of {len(text_data)} characters exceeds the limit of "
                f"{rindle_settings.WS_MAX_FRAME_BYTES}",
                code=FRAME_TOO_LARGE,
            )
        if not self._admit():
            return await self._error("too many frames; slow down", code=RATE_LIMITED)
        try:
            msg = strictjson.loads(text_data)
        except strictjson.BadJSON as exc:
            return await self._error(str(exc), code=BAD_FRAME)
        if not isinstance(msg, dict):
            return await self._error("a frame is a JSON object", code=BAD_FRAME)
        kind = msg.get("t")
        handler = (
            {
                "init": self._init,
                "subscribe": self._subscribe,
                "unsubscribe": self._unsubscribe,
                "pushMutation": self._push_mutation,
                "mutate": self._raw_mutate,
            }.get(kind)
            if isinstance(kind, str)
            else None
        )
        if handler is None:
            return await self._error(f"unknown frame type {kind!r}", code=BAD_FRAME)
        try:
            await handler(msg)
        except Exception:  # a server bug: answered, logged, and the socket stays open
            logger.exception("rindle consumer: %s frame failed", kind)
            await self._error(f"the server failed to handle this {kind} frame", INTERNAL_ERROR)

    def _admit(self):
        now = time.monotonic()
        rate = float(rindle_settings.WS_RATE)
        burst = float(rindle_settings.WS_BURST)
        self._tokens = min(burst, self._tokens + (now - self._refill) * rate)
        self._refill = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def _init(self, msg):
        client_id = msg.get("clientID")
        if not isinstance(client_id, str) or not 0 < len(client_id) <= MAX_CLIENT_ID:
            return await self._error(
                f"init needs a clientID string of 1..{MAX_CLIENT_ID} characters", code=BAD_FRAME
            )
        if self.client_id is not None and self.client_id != client_id:
            return await self._error(
                "this connection already identified as another client", code=BAD_FRAME
            )
        try:  # an id another principal owns is refused; its lmid row stays unseen
            await database_sync_to_async(self.hub.engine.check_owner)(client_id, self._owner())
        except RindleError as exc:
            return await self._answer(exc, kind=FRAME_ERROR, retryable=exc.retryable)
        self.client_id = client_id
        self.conn.client_id = client_id

    def _owner(self):
        """The principal key the socket's client ids are bound to (``principal_key``)."""
        session = self.scope.get("session")
        session_key = getattr(session, "session_key", None) if session is not None else None
        return principal_key(self.user, self.token, session_key)

    async def _subscribe(self, msg):
        query_id = msg.get("queryId")
        if not _is_query_id(query_id):
            return await self._error(
                f"queryId must be an integer in 0..{MAX_QUERY_ID}", code=BAD_FRAME
            )
        if not self._may("read"):
            return await self._query_error(
                query_id, "this token may not read (scope 'read')", UNAUTHORIZED
            )
        mode = msg.get("mode", "flat")
        if mode is None:
            mode = "flat"
        if mode not in MODES:
            return await self._error(
                f"mode must be one of {', '.join(MODES)}", code=BAD_FRAME, query_id=query_id
            )
        if "leaseToken" in msg:
            token = msg.get("leaseToken")
            if not isinstance(token, str) or "name" in msg:
                return await self._error(
                    "subscribe takes either a leaseToken string or name and args",
                    code=BAD_FRAME,
                    query_id=query_id,
                )
            if await self._over_quota(query_id):
                return
            try:
                name, args, user = await database_sync_to_async(self._lease)(token)
            except leases.LeaseError as exc:  # answered as not retryable, whatever the lease
                return await self._answer(exc, query_id, kind=FRAME_QUERY_ERROR, retryable=False)
        else:
            name, args, user = msg.get("name"), msg.get("args"), self.user
            if not isinstance(name, str):
                return await self._error(
                    "subscribe needs a query name (or a leaseToken)",
                    code=BAD_FRAME,
                    query_id=query_id,
                )
            if await self._over_quota(query_id):
                return
        try:
            await database_sync_to_async(self._attach)(query_id, name, args, user, mode)
        except QueryRefused as exc:
            await self._answer(exc, query_id, kind=FRAME_QUERY_ERROR, retryable=False)
        except QueryError as exc:
            await self._query_error(query_id, f"invalid query: {exc}", INVALID_QUERY)
        except Exception:  # a named query's or a read rule's bug: never silence
            logger.exception("rindle consumer: subscribe to %r failed", name)
            await self._query_error(query_id, f"the server failed to run {name!r}", INTERNAL_ERROR)

    async def _over_quota(self, query_id=None, mid=None):
        """Refuse the frame if the socket's namespace is over quota (memory only)."""
        try:
            self.meter.check(seed=False)
        except quota.QuotaExceeded as exc:
            if mid is None:
                await self._answer(
                    exc, query_id, kind=FRAME_QUERY_ERROR, retry_after_ms=exc.retry_after_ms
                )
            else:
                retry = {"retryable": True, "retryAfterMs": exc.retry_after_ms}
                await self._answer(exc, kind=FRAME_ERROR, mid=mid, **retry)
            return True
        return False

    def _lease(self, token):
        """
        A lease's query and the user it acts as: the socket's own principal, or for
        a socket without credentials the user of its first lease (see ``leases``).
        """
        if self.token is not None or getattr(self.user, "is_authenticated", False):
            lease = leases.redeem(token, self.user, self.token)
            return lease.name, lease.args, self.user
        lease = leases.redeem_as_credential(token, self._lease_principal)
        user = leases.lease_user(lease)
        self._lease_principal = lease.user_id
        return lease.name, lease.args, user

    def _attach(self, query_id, name, args, user, mode):
        if name == LMID_QUERY_NAME and self.client_id is None:
            raise QueryRefused(f"{LMID_QUERY_NAME} needs an init frame first", INVALID_ARGS)
        limits.check_subscriptions(self.conn, query_id)  # before any work (the hub re-checks)
        ast = resolve(name, args, user, client_id=self.client_id, owner=self._owner())
        self.hub.subscribe(self.conn, query_id, ast, mode)

    async def _unsubscribe(self, msg):
        query_id = msg.get("queryId")
        if not _is_query_id(query_id):
            return await self._error(
                f"queryId must be an integer in 0..{MAX_QUERY_ID}", code=BAD_FRAME
            )
        await sync_to_async(self.hub.unsubscribe, thread_sensitive=False)(self.conn, query_id)

    async def _push_mutation(self, msg):
        envelope = msg.get("envelope")
        problem = _envelope_problem(envelope)
        if problem:
            return await self._error(problem, code=BAD_FRAME)
        if self.client_id is None:
            return await self._error("send init before pushMutation", code=BAD_FRAME)
        if not self._may("mutate"):
            return await self._error(
                "this token may not mutate (scope 'mutate')", code=UNAUTHORIZED
            )
        if envelope["clientID"] != self.client_id:
            return await self._error(
                "the envelope's clientID is not this connection's", code=BAD_FRAME
            )
        if not getattr(self.user, "is_authenticated", False):
            try:  # the adapter's hook may read the database
                await database_sync_to_async(check_anonymous_mutation)(self.user)
            except AnonymousMutationsDisabled as exc:
                return await self._answer(exc, kind=FRAME_ERROR, mid=envelope["mid"])
        if await self._over_quota(mid=envelope["mid"]):
            return
        engine = self.hub.engine
        # Frames for this connection wait while its mutation runs, so an outcome
        # frame goes out before the lmid row that confirms the mid.
        # hold/release take the hub's lock, which a hydrating subscription can keep for a
        # while: they run off the event loop so no other socket waits for it.
        await sync_to_async(self.hub.hold, thread_sensitive=False)(self.conn)
        outcome = ()
        try:
            result = await database_sync_to_async(engine.mutate)(
                envelope["clientID"],
                envelope["mid"],
                envelope["name"],
                envelope.get("args"),
                self.user,
                owner=self._owner(),
            )
        except MutationGap as exc:
            self._refuse(exc.code, exc.status)
            outcome = (to_frame(exc, kind=FRAME_ERROR, mid=envelope["mid"], lmid=exc.lmid),)
        except RindleError as exc:
            self._refuse(exc.code, exc.status)
            extra = {"mid": envelope["mid"], "retryable": exc.retryable}
            outcome = (to_frame(exc, kind=FRAME_ERROR, **extra),)
        except Exception:  # a mutator's or an adapter's bug: answered, with the traceback logged
            logger.exception("rindle consumer: mutation %r failed", envelope["name"])
            self._refuse(INTERNAL_ERROR)
            message = f"the server failed to run mutation {envelope['name']!r}"
            outcome = (wire.error(message, INTERNAL_ERROR, mid=envelope["mid"], retryable=False),)
        else:
            if result.status == "rejected":
                reason = result.reason or result.code or "rejected"
                frame = {"t": "mutationOutcome", "mid": envelope["mid"], "kind": "rejected"}
                outcome = (wire.dumps({**frame, "reason": reason}),)
        finally:
            await sync_to_async(self.hub.release, thread_sensitive=False)(self.conn, outcome)

    async def _raw_mutate(self, msg):
        await self._error(
            "raw mutate frames are not accepted; send pushMutation with a named mutator",
            code=UNSUPPORTED,
        )

    async def _error(self, message, code=BAD_FRAME, query_id=None, **extra):
        """Refuse the client frame being handled with an ``error`` frame."""
        await self._answer(RindleError(message, code=code), query_id, kind=FRAME_ERROR, **extra)

    async def _query_error(self, query_id, message, code, retryable=False):
        """Refuse a subscribe with a ``queryError`` frame."""
        exc = RindleError(message, code=code)
        await self._answer(exc, query_id, kind=FRAME_QUERY_ERROR, retryable=retryable)

    async def _answer(self, exc, query_id=None, *, kind, **extra):
        """Refuse the client frame being handled: ``exc`` as a frame (``to_frame``)."""
        self._refuse(exc.code)
        await self.send(text_data=to_frame(exc, query_id, kind=kind, **extra))

    def _refuse(self, code, status=None):
        self._refused = True
        self.meter.refuse(quota.refusal_for(code, status))


def _bearer(scope):
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            if kind.lower() == "bearer":
                return token.strip()
            return ""  # some other scheme: refused, not ignored
    return None


def _authenticate(raw):
    from ..tokens import authenticate

    return authenticate(raw) if raw else None


def _auth_failure():
    """Count a refused bearer token (the first meter of a process reads the store)."""
    try:
        quota.meter(get_adapter().namespace(None, None)).auth_failure()
    finally:
        close_old_connections()


def _is_query_id(value):
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_QUERY_ID


def _envelope_problem(envelope):
    if not isinstance(envelope, dict):
        return "pushMutation needs an envelope object {clientID, mid, name, args}"
    if not isinstance(envelope.get("clientID"), str) or not envelope["clientID"]:
        return "envelope.clientID must be a non-empty string"
    mid = envelope.get("mid")
    if not isinstance(mid, int) or isinstance(mid, bool) or not 0 < mid < 2**53:
        return "envelope.mid must be a positive integer"
    if not isinstance(envelope.get("name"), str) or not envelope["name"]:
        return "envelope.name must be a non-empty string"
    return None
