"""
The room socket, ``/ws/rindle/room/?doc=<profile>/<key>``: what a room-served lease's
``realtime.wsEndpoint`` names, speaking the normalized protocol of ``/ws/rindle/``
for one room (``realtime.room_server``).

Client frames:

- ``init {clientID}``.
- ``subscribe {queryId, name: "_rindle/clientLmid"}``: the client's ROOM lmid, which
  moves only when a flush made it durable.
- ``subscribe {queryId, leaseToken}`` with the lease's ``realtime.roomToken``: the
  token names the doc and the labelled query; the query is resolved again for the
  token's user (its read rules compiled in), must derive this doc and read only the
  footprint's tables, and is then served from the room's rows. A socket with a
  session or a bearer token (scope ``read``) redeems only tokens minted for itself;
  one without credentials is bound to its first token's user, as leases are on
  ``/ws/rindle/``.
- ``unsubscribe {queryId}``.
- ``pushMutation {envelope}``: one room mutation of the socket's client, applied by
  the room host in arrival order.

Frames are rate limited like the main socket's (``WS_RATE``, ``WS_BURST``) and capped
at ``WS_MAX_FRAME_BYTES``; a socket with ``WS_MAX_QUEUED_MESSAGES`` undelivered
batches is closed with 4503 (its client reconnects). Bad frames get an ``error``
(the socket stays open); an unknown doc, a room socket with rooms off
(``ROOMS_ENABLED``) or a doc without a profile is refused at the
handshake.

The room socket is held to the main socket's rules of who may do what:

- it counts under its principal with the main sockets (``WS_MAX_SOCKETS_PER_PRINCIPAL``;
  past it, closed with 4429 right after the accept);
- a socket with a token or a signed-in user re-checks them every
  ``WS_AUTH_RECHECK_SECONDS`` and is closed with 4401 once they are revoked;
- ``pushMutation`` needs a token's scope ``mutate``; a socket acting as nobody (no
  credentials, and a room token minted for nobody) passes the adapter's
  ``check_anonymous_mutation``, as on ``/ws/rindle/``;
- its bytes in and out are metered under the principal's usage namespace
  (``rindle_app.flow``), and a namespace over its quota has its mutations refused
  (``quota_exceeded``, retryable).
"""

import asyncio
import logging
import time
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncWebsocketConsumer

from .. import leases, named, rooms, strictjson
from ..adapter import check_anonymous_mutation, get_adapter
from ..conf import rindle_settings
from ..engine.errors import AnonymousMutationsDisabled
from ..engine.mutations import principal_key
from ..exceptions import (
    BAD_FRAME,
    FRAME_TOO_LARGE,
    INTERNAL_ERROR,
    INVALID_ARGS,
    RATE_LIMITED,
    UNAUTHORIZED,
    UNSUPPORTED,
    QueryRefused,
    RindleError,
    RoomClosed,
)
from ..flow import quota
from ..ivm.ast import QueryError, parse
from ..runtime import get_runtime
from . import limits, wire, workers
from .auth import still_authorized, watch_credentials
from .consumer import (
    CLOSE_UNAUTHORIZED,
    _auth_failure,
    _authenticate,
    _bearer,
    _envelope_problem,
    _is_query_id,
)
from .room_server import lmid_shape, open_lmid

logger = logging.getLogger("rindle.rooms")

CLOSE_RETRY = 4503
MAX_CLIENT_ID = 128


class RoomConsumer(AsyncWebsocketConsumer):
    # No channel layer: a room's frames go straight to its sockets (room_server), so a
    # socket needs no channel of its own (with Redis, a channel and a receive loop).
    channel_layer_alias = None
    room = None
    _sender = None
    client_id = None
    _principal = leases.UNBOUND
    _profile = None
    _key = None
    _early_lmid = None  # a lmid stream opened before the socket joined its room
    _shed = False
    _runtime = None
    _counted = None  # the key this socket is counted under (runtime.sockets)
    _recheck = None
    meter = None
    # Who the socket's mutations act as: its own user, or for a socket without
    # credentials the user its first room token was minted for (None: nobody).
    _acting = None

    async def connect(self):
        doc = (parse_qs(self.scope.get("query_string", b"").decode("latin-1")).get("doc") or [""])[
            0
        ]
        if not rindle_settings.ROOMS_ENABLED:
            await self.close()
            return
        try:
            self._profile, self._key = rooms.split_doc(doc)
        except RindleError:
            await self.close()
            return
        self.doc = doc
        self.user, self.token = self.scope.get("user"), None
        bearer = _bearer(self.scope)
        if bearer is not None:  # a machine client: its token, as on the main socket
            found = await workers.run_db(_authenticate, bearer)
            if found is None or not found[1].has_scope("read"):
                if found is None:
                    await workers.run_db(_auth_failure)
                await self.close()
                return
            self.user, self.token = found
        self._runtime = get_runtime(None)
        key = limits.principal(self.scope, self.user, self.token)
        if not self._runtime.sockets.acquire(key):
            # A close code reaches the client only after the handshake.
            await self.accept(wire.subprotocol(self.scope))
            await self.close(code=limits.CLOSE_TOO_MANY_SOCKETS)
            return
        self._counted = key
        try:
            self.meter = await workers.run_db(self._make_meter)
        except Exception:
            logger.exception("rindle room socket: the quota meter did not start; closing")
            await self.close(code=CLOSE_RETRY)
            return
        self._loop = asyncio.get_running_loop()
        self._runtime.rooms.start_routing(self._loop)
        self._outbox = asyncio.Queue()
        self._budget = limits.FrameBudget(time.monotonic())
        self._sender = asyncio.ensure_future(self._send_frames())
        await self.accept(wire.subprotocol(self.scope))
        if self.token is not None or getattr(self.user, "is_authenticated", False):
            self._recheck = asyncio.ensure_future(
                watch_credentials(
                    lambda: workers.run_db(
                        still_authorized, self.user, self.token, self.scope.get("session")
                    ),
                    float(rindle_settings.WS_AUTH_RECHECK_SECONDS),
                    self._revoked,
                )
            )

    def _make_meter(self):
        """The socket's meter, its quota seeded (may read the store; a worker thread)."""
        namespace = get_adapter().namespace(self.user, self.token)
        meter = quota.meter(namespace, session=f"room.{id(self):x}")
        meter.seed()
        return meter

    async def _revoked(self):
        if self.meter is not None:
            self.meter.auth_failure()
        await self.close(code=CLOSE_UNAUTHORIZED)
        await self._leave()  # at once: the client may be slow to hang up

    async def disconnect(self, code):
        for task in (self._sender, self._recheck):
            if task is not None:
                task.cancel()
        if self._counted is not None:
            self._runtime.sockets.release(self._counted)
            self._counted = None
        await self._leave()

    async def _leave(self):
        room = self.room
        if room is not None:
            self.room = None
            await workers.run_db(self._runtime.rooms.leave, self, room)

    # --- what the room calls (from any thread) ------------------------------------------

    def deliver(self, frames):
        self._call(self._enqueue, frames)

    def _enqueue(self, frames):
        """On the loop: queue ``frames``; a socket that stopped reading is closed (4503)."""
        if self._outbox.qsize() >= int(rindle_settings.WS_MAX_QUEUED_MESSAGES):
            if not self._shed:
                self._shed = True  # its client reconnects and hydrates again
                asyncio.ensure_future(self.close(code=CLOSE_RETRY))
            return
        self._outbox.put_nowait(frames)

    def close_later(self, code):
        self._call(lambda: asyncio.ensure_future(self.close(code=code)))

    def _call(self, fn, *args):
        """Run ``fn(*args)`` on the socket's loop; a loop that has ended has no socket left."""
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: the server has gone
            pass

    async def _send_frames(self):
        while True:
            sent = 0
            for frame in await self._outbox.get():
                await self.send(text_data=frame)
                sent += _size(frame)
            if sent:
                self.meter.transfer(bytes_out=sent)

    # --- client frames ------------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        if self._sender is None:  # refused at connect and being closed
            return
        if text_data is None:
            return await self._error("frames are JSON text", BAD_FRAME)
        if len(text_data) > int(rindle_settings.WS_MAX_FRAME_BYTES):
            return await self._error(
                f"a frame may be at most {rindle_settings.WS_MAX_FRAME_BYTES} bytes",
                FRAME_TOO_LARGE,
            )
        if not self._budget.admit(time.monotonic()):
            return await self._error("too many frames; slow down", RATE_LIMITED)
        self.meter.transfer(bytes_in=_size(text_data))
        try:
            msg = strictjson.loads(text_data)
        except strictjson.BadJSON as exc:
            return await self._error(str(exc), BAD_FRAME)
        kind = msg.get("t") if isinstance(msg, dict) else None
        handler = {
            "init": self._init,
            "subscribe": self._subscribe,
            "unsubscribe": self._unsubscribe,
            "pushMutation": self._push,
        }.get(kind)
        if handler is None:
            return await self._error(f"unknown frame type {kind!r}", BAD_FRAME)
        try:
            await handler(msg)
        except RoomClosed:
            await self.close(code=CLOSE_RETRY)
        except RindleError as exc:
            await self._error(exc.message, exc.code, retryable=exc.retryable)
        except Exception:  # a server bug: answered, logged, and the socket stays open
            logger.exception("rindle room socket: %s frame failed", kind)
            await self._error(f"the server failed to handle this {kind} frame", INTERNAL_ERROR)

    async def _init(self, msg):
        client_id = msg.get("clientID")
        if not isinstance(client_id, str) or not 0 < len(client_id) <= MAX_CLIENT_ID:
            return await self._error(
                f"init needs a clientID string of 1..{MAX_CLIENT_ID} characters", BAD_FRAME
            )
        if self.client_id not in (None, client_id):
            return await self._error("this connection already identified as another", BAD_FRAME)
        self.client_id = client_id

    async def _subscribe(self, msg):
        query_id = msg.get("queryId")
        if not _is_query_id(query_id):
            return await self._error("queryId must be a non-negative integer", BAD_FRAME)
        if msg.get("name") == named.LMID_QUERY_NAME and "leaseToken" not in msg:
            if self.client_id is None:
                return await self._query_error(query_id, "send init first", INVALID_ARGS)
            return await workers.run_db(self._lmid, query_id)
        token = msg.get("leaseToken")
        if not isinstance(token, str) or "name" in msg:
            return await self._error(
                "a room socket subscribes a room token (leaseToken) or the room lmid", BAD_FRAME
            )
        try:
            await workers.run_db(self._serve, query_id, token)
        except QueryError as exc:
            await self._query_error(query_id, f"invalid query: {exc}", UNSUPPORTED)
        except RoomClosed:
            raise
        except RindleError as exc:  # a refused token or query, a room that cannot boot
            await self._query_error(query_id, exc.message, exc.code)

    def _lmid(self, query_id):
        """
        The client's room lmid stream. Before the socket joined its room (a client
        subscribes it first) it is answered from the room ledger and handed to the
        room when a room token joins it.
        """
        engine = self._runtime.engine
        shape = lmid_shape(engine, self.client_id)
        if self.room is not None:
            return self.room.subscribe_lmid(self, query_id, shape, self.client_id)
        lmid = engine.room_lmids(self.doc, [self.client_id]).get(self.client_id, 0)
        self._early_lmid = open_lmid(self, query_id, shape, self.client_id, lmid, engine)

    def _serve(self, query_id, token):
        """Verify the room token, resolve its query for its user, join and serve (a thread)."""
        if self.token is not None or getattr(self.user, "is_authenticated", False):
            lease = leases.redeem(token, self.user, self.token)  # minted for this principal
            user = self.user
        else:  # no credentials of its own: the first token binds the socket to its user
            lease = leases.redeem_as_credential(token, self._principal)
            user = leases.lease_user(lease)
            self._principal = lease.user_id
        self._acting = user
        args = lease.args if isinstance(lease.args, dict) else {}
        parent = args.get("parent") if isinstance(args.get("parent"), dict) else {}
        if lease.name != rooms.ROOM_SERVE_QUERY_NAME or args.get("doc") != self.doc:
            raise QueryRefused("this token is not a room token of this doc", INVALID_ARGS)
        if self.client_id is not None:  # an id another principal owns is refused
            session = self.scope.get("session")
            key = getattr(session, "session_key", None) if session is not None else None
            owner = principal_key(self.user, self.token, key)  # as the main socket's
            self._runtime.engine.check_owner(self.client_id, owner)
        ast = named.resolve(parent.get("name"), parent.get("args"), user, client_id=self.client_id)
        if named.realtime_doc(parent["name"], parent.get("args")) != self.doc:
            raise QueryRefused(f"{parent['name']!r} does not derive this room", INVALID_ARGS)
        engine = self._runtime.engine
        query = parse(ast, engine.tables)
        footprint = rooms.footprint_tables(self._profile, self._key)
        outside = rooms.query_tables(query) - footprint
        if outside or rooms.has_aggregate(query):
            what = f"reads {', '.join(sorted(outside))} outside" if outside else "aggregates over"
            raise QueryRefused(f"{parent['name']!r} {what} the room's footprint", UNSUPPORTED)
        shape = wire.NormalizedShape(query, engine.tables)
        if self.room is None:
            profile = self._profile
            self.room = self._runtime.rooms.join(
                self,
                self.doc,
                profile,
                self._key,
                rooms.mutators_of(profile.name),
                lambda e: rooms.load_footprint(e, profile, self._key),
                footprint,
                follow=self._follower(footprint),
            )
        self.room.subscribe(self, query_id, query, shape)
        early, self._early_lmid = self._early_lmid, None
        if early is not None:
            self.room.adopt_lmid(early)

    def _follower(self, footprint):
        """
        ``follow(feed)`` for the room's boot: the footprint as a live query of this
        process's hub (``Hub.follow``), its rows by table and the end of the feed.
        """
        hub = self._runtime.hub
        ast = rooms.footprint_for(self._profile, self._key, None)

        def follow(feed):
            key, pairs, _version = hub.follow(ast, feed)
            rows = {table: [] for table in footprint}
            for table, row in pairs:
                rows.setdefault(table, []).append(row)
            return rows, lambda: hub.unfollow(key, feed)

        return follow

    async def _unsubscribe(self, msg):
        query_id = msg.get("queryId")
        if not _is_query_id(query_id):
            return await self._error("queryId must be a non-negative integer", BAD_FRAME)
        if self.room is not None:
            await workers.run_db(self.room.unsubscribe, self, query_id)

    async def _push(self, msg):
        envelope = msg.get("envelope")
        problem = _envelope_problem(envelope)
        if problem:
            return await self._error(problem, BAD_FRAME)
        if self.client_id is None or envelope["clientID"] != self.client_id:
            return await self._error("the envelope's clientID is not this connection's", BAD_FRAME)
        if self.token is not None and not self.token.has_scope("mutate"):
            return await self._error(
                "this token may not mutate (scope 'mutate')", UNAUTHORIZED, mid=envelope["mid"]
            )
        if self.room is None:
            return await self._error("subscribe a room token before mutating", BAD_FRAME)
        if not getattr(self._acting, "is_authenticated", False):
            try:  # the adapter's hook may read the database
                await workers.run_db(check_anonymous_mutation, self._acting)
            except AnonymousMutationsDisabled as exc:
                return await self._error(exc.message, exc.code, mid=envelope["mid"])
        try:
            self.meter.check(seed=False)
        except quota.QuotaExceeded as exc:
            return await self._error(
                exc.message,
                exc.code,
                mid=envelope["mid"],
                retryable=True,
                retryAfterMs=exc.retry_after_ms,
            )
        try:
            await workers.run_db(self.room.mutate, self, envelope)
        except RindleError as exc:
            extra = {"mid": envelope["mid"]}
            await self._error(exc.message, exc.code, retryable=exc.retryable, **extra)

    # --- answers ------------------------------------------------------------------------

    async def _error(self, message, code, **extra):
        self.deliver([wire.error(message, code, **extra)])

    async def _query_error(self, query_id, message, code):
        self.deliver([wire.query_error(query_id, message, code)])


def _size(text):
    """The UTF-8 length of a frame, without encoding an ASCII one."""
    return len(text) if text.isascii() else len(text.encode())
