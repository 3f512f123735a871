"""
The websocket consumer at ``/ws/rindle/``: the rindle wire protocol (DESIGN §5).

Client frames: ``init``, ``subscribe`` (by name and args, or by lease token),
``unsubscribe``, ``pushMutation``. Every frame is checked for size, rate, JSON and
shape; a bad one is answered with ``error`` (or ``queryError`` for one query) and
changes nothing; the connection stays open. Server frames come from the hub
(``rindle.frames`` messages on this consumer's channel), in order.
"""

import json
import time

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from ..conf import rindle_settings
from ..engine.errors import MutationGap, RindleError
from ..ivm.ast import QueryError
from ..named import LMID_QUERY_NAME, QueryRefused, resolve
from . import wire
from .hub import get_hub

MODES = ("flat", "normalized")
MAX_QUERY_ID = 2**31 - 1
MAX_CLIENT_ID = 128


class RindleConsumer(AsyncWebsocketConsumer):
    async def connect(self):
        self.user = self.scope.get("user")
        self.client_id = None
        self.hub = await sync_to_async(get_hub, thread_sensitive=False)()
        self.conn = self.hub.connect(self.channel_name, self._loop(), self.user)
        self._tokens = float(rindle_settings.WS_BURST)
        self._refill = time.monotonic()
        await self.accept()

    def _loop(self):
        import asyncio

        return asyncio.get_running_loop()

    async def disconnect(self, code):
        hub = getattr(self, "hub", None)
        if hub is not None:
            await sync_to_async(hub.disconnect, thread_sensitive=False)(self.channel_name)

    # --- from the hub ------------------------------------------------------------------

    async def rindle_frames(self, event):
        try:
            for frame in event["frames"]:
                await self.send(text_data=frame)
        finally:
            self.hub.taken(self.channel_name)

    # --- from the client ---------------------------------------------------------------

    async def receive(self, text_data=None, bytes_data=None):
        if text_data is None:
            return await self._error("frames are JSON text; binary frames are not accepted")
        if len(text_data) > int(rindle_settings.WS_MAX_FRAME_BYTES):
            return await self._error(
                f"frame of {len(text_data)} characters exceeds the limit of "
                f"{rindle_settings.WS_MAX_FRAME_BYTES}",
                code="frame_too_large",
            )
        if not self._admit():
            return await self._error("too many frames; slow down", code="rate_limited")
        try:
            msg = json.loads(text_data)
        except ValueError as exc:
            return await self._error(f"malformed JSON: {exc}", code="bad_frame")
        if not isinstance(msg, dict):
            return await self._error("a frame is a JSON object", code="bad_frame")
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
            return await self._error(f"unknown frame type {kind!r}", code="bad_frame")
        await handler(msg)

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
                f"init needs a clientID string of 1..{MAX_CLIENT_ID} characters", code="bad_frame"
            )
        if self.client_id is not None and self.client_id != client_id:
            return await self._error(
                "this connection already identified as another client", code="bad_frame"
            )
        self.client_id = client_id
        self.conn.client_id = client_id

    async def _subscribe(self, msg):
        query_id = msg.get("queryId")
        if not _is_query_id(query_id):
            return await self._error(
                f"queryId must be an integer in 0..{MAX_QUERY_ID}", code="bad_frame"
            )
        mode = msg.get("mode", "flat")
        if mode is None:
            mode = "flat"
        if mode not in MODES:
            return await self._error(
                f"mode must be one of {', '.join(MODES)}", code="bad_frame", query_id=query_id
            )
        if "leaseToken" in msg:
            token = msg.get("leaseToken")
            if not isinstance(token, str) or "name" in msg:
                return await self._error(
                    "subscribe takes either a leaseToken string or name and args",
                    code="bad_frame",
                    query_id=query_id,
                )
            try:
                name, args, user = await database_sync_to_async(self._lease)(token)
            except _Refused as exc:
                return await self.send(
                    text_data=wire.query_error(query_id, exc.message, exc.code, False)
                )
        else:
            name, args, user = msg.get("name"), msg.get("args"), self.user
            if not isinstance(name, str):
                return await self._error(
                    "subscribe needs a query name (or a leaseToken)",
                    code="bad_frame",
                    query_id=query_id,
                )
        try:
            await database_sync_to_async(self._attach)(query_id, name, args, user, mode)
        except QueryRefused as exc:
            await self.send(text_data=wire.query_error(query_id, exc.message, exc.code, False))
        except QueryError as exc:
            await self.send(
                text_data=wire.query_error(query_id, f"invalid query: {exc}", "invalid_query")
            )

    def _lease(self, token):
        from django.contrib.auth import get_user_model

        try:
            from .. import leases
        except ImportError:  # pragma: no cover - the lease module ships with the HTTP API
            raise _Refused("lease tokens are not supported here", "unauthorized") from None
        try:
            lease = leases.verify(token)
        except leases.LeaseExpired as exc:
            raise _Refused(str(exc) or "the lease has expired", "lease_expired") from None
        except leases.LeaseInvalid as exc:
            raise _Refused(str(exc) or "invalid lease", "unauthorized") from None
        user = None
        if lease.user_id is not None:
            user = get_user_model().objects.filter(pk=lease.user_id).first()
            if user is None or not user.is_active:
                raise _Refused("the lease's user no longer exists", "unauthorized")
        return lease.name, lease.args, user

    def _attach(self, query_id, name, args, user, mode):
        if name == LMID_QUERY_NAME and self.client_id is None:
            raise QueryRefused(f"{LMID_QUERY_NAME} needs an init frame first", "invalid_args")
        ast = resolve(name, args, user, client_id=self.client_id)
        self.hub.subscribe(self.conn, query_id, ast, mode)

    async def _unsubscribe(self, msg):
        query_id = msg.get("queryId")
        if not _is_query_id(query_id):
            return await self._error(
                f"queryId must be an integer in 0..{MAX_QUERY_ID}", code="bad_frame"
            )
        await sync_to_async(self.hub.unsubscribe, thread_sensitive=False)(self.conn, query_id)

    async def _push_mutation(self, msg):
        envelope = msg.get("envelope")
        problem = _envelope_problem(envelope)
        if problem:
            return await self._error(problem, code="bad_frame")
        if self.client_id is None:
            return await self._error("send init before pushMutation", code="bad_frame")
        if envelope["clientID"] != self.client_id:
            return await self._error(
                "the envelope's clientID is not this connection's", code="bad_frame"
            )
        engine = self.hub.engine
        try:
            result = await database_sync_to_async(engine.mutate)(
                envelope["clientID"],
                envelope["mid"],
                envelope["name"],
                envelope.get("args"),
                self.user,
            )
        except MutationGap as exc:
            return await self._error(
                str(exc), code="mid_gap", mid=envelope["mid"], lmid=getattr(exc, "lmid", None)
            )
        except RindleError as exc:
            return await self._error(
                str(exc), code=exc.code, mid=envelope["mid"], retryable=exc.retryable
            )
        if getattr(result, "status", None) == "rejected":
            # Out of band, before the lmid row that confirms the mid is released.
            await self.send(
                text_data=wire.dumps(
                    {
                        "t": "mutationOutcome",
                        "mid": envelope["mid"],
                        "kind": "rejected",
                        "reason": result.reason or result.code or "rejected",
                    }
                )
            )

    async def _raw_mutate(self, msg):
        await self._error(
            "raw mutate frames are not accepted; send pushMutation with a named mutator",
            code="unsupported",
        )

    async def _error(self, message, code="bad_frame", query_id=None, **extra):
        await self.send(text_data=wire.error(message, code, query_id, **extra))


class _Refused(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.message = message
        self.code = code


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
