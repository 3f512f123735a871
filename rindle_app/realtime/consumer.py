"""
The websocket consumer at ``/ws/rindle/``: the rindle wire protocol (DESIGN §5).

Client frames: ``init``, ``subscribe`` (by name and args, or by lease token),
``unsubscribe``, ``pushMutation``. Every frame is checked for size, rate, JSON and
shape; a bad one is answered with ``error`` (or ``queryError`` for one query) and
changes nothing; the connection stays open. Server frames come straight from the
hub, in order (``RindleConsumer._deliver``).

Threading model. Everything here runs on the socket's event loop, except the
blocking calls, which run in the consumer's own worker threads
(``rindle_app.realtime.workers``): ``run_db`` for the database (tokens, leases, named
queries, mutations), ``run_hub`` for the calls that take the hub's lock. None runs on
asgiref's one thread-sensitive thread (``database_sync_to_async``), where every
socket's call would queue behind every other's: a socket's slow subscribe (a new
query built under the hub's lock) delays no other socket's frame that does not need
that lock. The loop never waits for the writer (``Engine.write`` refuses to run on
it). The hub hands frames over with ``loop.call_soon_threadsafe``; one sender task
per socket writes them.

Start-up and frames. The handshake waits for nothing that loads: after its bearer
token (if any) and its place under ``WS_MAX_SOCKETS_PER_PRINCIPAL`` it is accepted.
In the background the socket's quota meter is made, and its session opens: the hub
(``Runtime.hub_ready()``, the one shared start of the process), then its connection
there. Client frames go into the socket's inbox, and one worker task per socket
handles them one at a time, in the order they came, once the meter counts; a frame
that needs the hub (init, subscribe, unsubscribe, pushMutation) first waits for the
session, one that does not (a bad frame's error) is answered without it. So a
subscribe sent while the hub still hydrates is answered when the data is ready,
never dropped (if the hub cannot start, the socket is closed with 4503 and the
error logged; the next socket tries the start again). Because a frame is only
queued when it arrives, the consumer is always ready for the next message, so a
socket that goes away is released at once, however long its frames take.

However it ends (a close, a reset, an error, or Daphne cancelling it
``application_close_timeout`` seconds after its socket closed, when no disconnect
handler runs), the consumer leaves with no count under its principal and no
connection in the hub (``_end``, called from ``__call__``). The "accepted but never
answered" hang of issue 16 came from the old order: connect waited for the hub's
start in a worker thread, a handshake reset meanwhile queued its disconnect behind
that connect, and when the load ended the dead handshakes all resumed and counted
under their principal before their disconnects ran, so a live socket accepted in
that moment was over the cap and closed with 4429 right after its accept.

Usage (``rindle_app.flow``): a socket counts under the namespace
``RindleAdapter.namespace`` names for its user or token, with the connection as
the session. Each accepted client frame is a transfer of its UTF-8 bytes in; each
batch the sender writes is a transfer of its bytes out. A refused frame is a
refusal by reason instead (its error reply is not counted), a refused bearer token
an auth failure under the namespace of nobody. Counting reads no database: the
ledger and the namespace's quota are set up when the socket opens, in a worker
thread, before its first frame is handled. Over
quota, subscribe and pushMutation are refused with ``quota_exceeded``; the
subscriptions a socket already holds keep receiving their batches (cutting them
would leave the client's views torn; the socket's next subscribe is refused).
"""

import asyncio
import collections
import logging
import threading
import time
import uuid

from channels.consumer import get_handler_name
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import close_old_connections

from .. import leases, strictjson
from ..adapter import check_anonymous_mutation, get_adapter
from ..conf import rindle_settings
from ..engine.errors import AnonymousMutationsDisabled, MutationGap, RindleError
from ..engine.mutations import MutationRequest, principal_key
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
from ..named import LMID_QUERY_NAME, ROOM_QUERY_NAME, QueryRefused, realtime_doc, resolve
from ..runtime import get_runtime
from . import limits, wire, workers
from .auth import still_authorized, watch_credentials
from .security import bearer_token as _bearer  # one reading of the header for the validator too

logger = logging.getLogger("rindle.realtime")

MODES = ("flat", "normalized")
CLOSE_UNAUTHORIZED = 4401
CLOSE_SEND_FAILED = 4500
CLOSE_UNAVAILABLE = 4503  # the hub (or the quota meter) could not start: reconnect
CLOSE_INTERNAL_ERROR = 1011
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
    conn = None
    token = None
    # A socket without credentials is bound to the user of its first lease.
    _lease_principal = leases.UNBOUND
    meter = None
    _runtime = None
    _principal = None  # the key this socket is counted under (runtime.sockets)
    # Set when the client frame being handled is refused (its bytes are not a transfer).
    _refused = False
    # Tasks: the meter's start, the session (the hub, the socket's connection there),
    # the frame worker, the sender, the re-check.
    _metering = None
    _session = None
    _worker = None
    _sender = None
    _recheck = None
    _inbox = None  # (text, receipt time) frames not yet handled
    _waiting = None  # the future the worker waits on while the inbox is empty
    # The hub registration and the end race from two threads: under this lock,
    # exactly one of them disconnects (see _register and _end).
    _registration = None
    _registered = None  # the hub the connection is registered in
    _ended = False
    _left = None  # the hub's disconnect, once queued
    # Frames come straight from the hub (see hub.py), so the consumer listens on no
    # channel layer: no per-socket receive on Redis, and a Redis hiccup closes nothing.
    channel_layer_alias = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Whichever way the consumer ends: a disconnect, an error, or Daphne
            # cancelling it (then no disconnect handler runs). No await here: a
            # second cancellation cannot cut it short.
            self._end()

    async def dispatch(self, message):
        """
        Channels' ``dispatch`` first runs ``close_old_connections`` through
        ``sync_to_async`` on the one thread-sensitive thread, for every message of
        every socket: each would wait there behind whatever another socket runs on
        it. This consumer's database calls close their connections in their own
        threads (``workers``), so it dispatches directly.
        """
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def connect(self):
        self.channel_name = f"rindle.{uuid.uuid4().hex}"
        self._registration = threading.Lock()
        self.user = self.scope.get("user")
        self.client_id = None
        bearer = _bearer(self.scope)
        if bearer is not None:
            found = await workers.run_db(_authenticate, bearer)
            if found is None:
                await workers.run_db(_auth_failure)
                await self.close(code=CLOSE_UNAUTHORIZED)
                return
            self.user, self.token = found
        self._runtime = get_runtime(None)  # None: RINDLE["DATABASE"], as get_hub()
        if not await self._admit_principal():
            return
        self._outbox = collections.deque()  # hub batches the sender task has yet to write
        self._idle = None  # the future the sender task waits on while the outbox is empty
        self._broken = False  # a write failed: the socket is going away
        self._inbox = collections.deque()
        self._budget = limits.FrameBudget(time.monotonic())
        self._sender = asyncio.ensure_future(self._send_batches())
        self._metering = asyncio.ensure_future(workers.run_db(self._make_meter))
        self._session = asyncio.ensure_future(self._open())
        for task in (self._metering, self._session):  # a failure is logged where it happens
            task.add_done_callback(_retrieve)
        self._worker = asyncio.ensure_future(self._work())
        await self.accept(wire.subprotocol(self.scope))
        if self.token is not None or getattr(self.user, "is_authenticated", False):
            # An anonymous socket has nothing to revoke, so it runs no re-check.
            self._recheck = asyncio.ensure_future(self._recheck_credentials())

    async def _admit_principal(self):
        """Count the socket under its principal; over the cap it is closed with 4429."""
        key = limits.principal(self.scope, self.user, self.token)
        if self._runtime.sockets.acquire(key):
            self._principal = key
            return True
        # A close code reaches the client only after the handshake.
        await self.accept(wire.subprotocol(self.scope))
        await self.close(code=limits.CLOSE_TOO_MANY_SOCKETS)
        return False

    # --- the session: meter, hub, connection ----------------------------------------------

    async def _open(self):
        """
        The hub once it runs, then the socket's connection there. If either fails the
        socket is closed with 4503 (its client reconnects; the next socket's session
        starts the hub again) and the frames waiting for it are not handled.
        """
        try:
            # The start is shared by every socket: shielded, so this socket going
            # away cancels its own wait and never the start.
            hub = await asyncio.shield(asyncio.wrap_future(self._runtime.hub_ready()))
            self.hub = hub
            self.conn = await workers.run_hub(self._register, hub, asyncio.get_running_loop())
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("rindle consumer: the socket's session did not open; closing")
            await self.close(code=CLOSE_UNAVAILABLE)
            raise

    def _make_meter(self):
        """The socket's meter with its quota seeded (may read the store; a worker thread)."""
        meter = quota.meter(
            get_adapter().namespace(self.user, self.token), session=self.channel_name
        )
        meter.seed()
        return meter

    def _register(self, hub, loop):
        """
        Connect to ``hub`` (a worker thread). The consumer may have ended while this
        waited for the hub's lock: then nobody else will disconnect, so this does.
        """
        conn = hub.connect(self.channel_name, loop, self._deliver, self.user)
        with self._registration:
            ended = self._ended
            if not ended:
                self._registered = hub
        if ended:
            hub.disconnect(self.channel_name)
            return None
        return conn

    def _end(self):
        """
        Release everything the socket holds; idempotent, never blocks. Returns the
        hub's queued disconnect (a ``concurrent.futures.Future``) or None.
        """
        for task in (self._recheck, self._sender, self._worker, self._session, self._metering):
            if task is not None:
                task.cancel()
        if self._principal is not None:
            self._runtime.sockets.release(self._principal)
            self._principal = None
        if self._registration is None:  # connect never began
            return None
        with self._registration:
            if self._ended:
                return self._left
            self._ended = True
            hub = self._registered
        if hub is not None:
            self._left = workers.submit_hub(hub.disconnect, self.channel_name)
        return self._left

    async def disconnect(self, code):
        left = self._end()
        if left is not None:  # done when the hub has dropped the socket's subscriptions
            await asyncio.shield(asyncio.wrap_future(left))

    async def _recheck_credentials(self):
        await watch_credentials(
            lambda: workers.run_db(self._still_authorized),
            float(rindle_settings.WS_AUTH_RECHECK_SECONDS),
            self._revoked,
        )

    async def _revoked(self):
        if self.meter is not None:
            self.meter.auth_failure()
        for query_id in sorted(self.conn.subs if self.conn is not None else ()):
            await self.send(
                text_data=wire.query_error(query_id, "credentials revoked", UNAUTHORIZED, False)
            )
        await self.close(code=CLOSE_UNAUTHORIZED)

    def _still_authorized(self):
        return still_authorized(self.user, self.token, self.scope.get("session"))

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
        """Queue the frame for the socket's worker, so the next message is taken at once."""
        if self._inbox is None:  # refused at connect and being closed
            return
        self._inbox.append((text_data, time.monotonic()))
        waiting = self._waiting
        if waiting is not None:
            self._waiting = None
            if not waiting.done():
                waiting.set_result(None)

    async def _work(self):
        """
        The worker task: the socket's frames one at a time, in the order they came.
        A frame that needs the hub waits for the session (``_ready``); one that does
        not (a bad frame's error) is answered without it, once the meter counts.
        """
        loop = asyncio.get_running_loop()
        inbox = self._inbox
        try:
            self.meter = await asyncio.shield(self._metering)
            while True:
                while inbox:
                    await self._take(*inbox.popleft())
                self._waiting = loop.create_future()
                await self._waiting
        except asyncio.CancelledError:
            raise
        except _Unavailable:
            return  # the session did not open, and closed the socket (_open)
        except Exception:  # nothing here may go silent: the client is told, by the close
            logger.exception("rindle consumer: the socket cannot be served; closing")
            await self.close(code=CLOSE_UNAVAILABLE)
        finally:
            self._waiting = None

    async def _ready(self):
        """Wait until the hub runs and the socket is connected there (``_open``)."""
        try:
            await asyncio.shield(self._session)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise _Unavailable("the socket's session did not open") from exc

    async def _take(self, text_data, at):
        """Handle one client frame received at ``at`` (``time.monotonic()``)."""
        self._refused = False
        await self._handle(text_data, at)
        if not self._refused:
            size = len(text_data) if text_data.isascii() else len(text_data.encode())
            self.meter.transfer(bytes_in=size)

    async def _handle(self, text_data, at):
        if text_data is None:
            return await self._error("frames are JSON text; binary frames are not accepted")
        if len(text_data) > int(rindle_settings.WS_MAX_FRAME_BYTES):
            return await self._error(
                f"frame of {len(text_data)} characters exceeds the limit of "
                f"{rindle_settings.WS_MAX_FRAME_BYTES}",
                code=FRAME_TOO_LARGE,
            )
        if not self._budget.admit(at):
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
        except _Unavailable:
            raise  # the socket cannot be served: _work closes it
        except Exception:  # a server bug: answered, logged, and the socket stays open
            logger.exception("rindle consumer: %s frame failed", kind)
            await self._error(f"the server failed to handle this {kind} frame", INTERNAL_ERROR)

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
        await self._ready()
        try:  # an id another principal owns is refused; its lmid row stays unseen
            await workers.run_db(self.hub.engine.check_owner, client_id, self._owner())
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
            await self._ready()
            try:
                name, args, user = await workers.run_db(self._lease, token)
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
            await self._ready()
        try:
            ast = await workers.run_db(self._resolve, query_id, name, args, user)
            await workers.run_hub(self.hub.subscribe, self.conn, query_id, ast, mode)
            if rindle_settings.ROOMS_ENABLED and self._runtime.running_rooms is not None:
                await workers.run_db(self._hydrated, name, args)
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

    def _hydrated(self, name, args):
        """
        A labelled query hydrated here: a drained room of its doc seals its fence. A
        side effect only: whatever fails here is logged, never the subscription's.
        """
        try:
            doc = realtime_doc(name, args)
            if doc is not None:
                self._runtime.running_rooms.hydrated(doc)
        except QueryRefused:
            return
        except Exception:
            logger.exception("rindle consumer: sealing the room of %r failed", name)

    def _resolve(self, query_id, name, args, user):
        """The AST of the named query (a worker thread: it may read the database)."""
        if name == LMID_QUERY_NAME and self.client_id is None:
            raise QueryRefused(f"{LMID_QUERY_NAME} needs an init frame first", INVALID_ARGS)
        if name == ROOM_QUERY_NAME and not (self.token and self.token.has_scope("rooms")):
            # A room's footprint is the room host's upstream, not a browser's query.
            raise QueryRefused(f"{ROOM_QUERY_NAME} needs a token with scope 'rooms'", UNAUTHORIZED)
        limits.check_subscriptions(self.conn, query_id)  # before any work (the hub re-checks)
        return resolve(name, args, user, client_id=self.client_id, owner=self._owner())

    async def _unsubscribe(self, msg):
        query_id = msg.get("queryId")
        if not _is_query_id(query_id):
            return await self._error(
                f"queryId must be an integer in 0..{MAX_QUERY_ID}", code=BAD_FRAME
            )
        await self._ready()
        await workers.run_hub(self.hub.unsubscribe, self.conn, query_id)

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
                await workers.run_db(check_anonymous_mutation, self.user)
            except AnonymousMutationsDisabled as exc:
                return await self._answer(exc, kind=FRAME_ERROR, mid=envelope["mid"])
        if await self._over_quota(mid=envelope["mid"]):
            return
        await self._ready()
        engine = self.hub.engine
        # Frames for this connection wait while its mutation runs, so an outcome
        # frame goes out before the lmid row that confirms the mid.
        # hold/release take the hub's lock, which a hydrating subscription can keep for a
        # while: they run off the event loop so no other socket waits for it.
        await workers.run_hub(self.hub.hold, self.conn)
        outcome = ()
        try:
            result = await workers.run_db(
                engine.mutate,
                envelope["clientID"],
                envelope["mid"],
                envelope["name"],
                envelope.get("args"),
                self.user,
                owner=self._owner(),
                request=MutationRequest(user=self.user, auth=self.token),
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
                frame.update(reason=reason, code=result.code)
                if result.details is not None:
                    frame["details"] = result.details
                outcome = (wire.dumps(frame),)
        finally:
            await workers.run_hub(self.hub.release, self.conn, outcome)

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


class _Unavailable(Exception):
    """The socket's session (the hub, its connection there) could not open."""


def _retrieve(future):
    """Mark a background future's exception as seen (it was logged, or is awaited)."""
    if not future.cancelled():
        future.exception()


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
