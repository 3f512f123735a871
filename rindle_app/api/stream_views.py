"""
``GET /v1/stream``: the public change stream, a transactional outbox other systems
(search indexes, caches, analytics) consume with a cursor.

Each answer holds the committed change events after the cursor, up to the published
``safe_seq``, in seq order, and the cursor to continue from (``stream.page``). A
cursor that cannot continue (pruned past, another epoch, ahead) is 409
``resnapshot_required`` with its ``reason``: never a silent skip.

Three ways to wait for new events, all bounded by STREAM_LONG_POLL_MAX_SECONDS:

- ``wait=0`` (the default): answer at once;
- ``wait=N``: a long-poll; the answer comes as soon as there are events, or empty
  after N seconds. It holds its worker thread while it waits (a sync DRF view, under
  WSGI and under Daphne alike);
- ``Accept: text/event-stream``: server-sent events, one ``change`` event per row
  change with ``id:`` its cursor, on a ``StreamingHttpResponse`` that ends after the
  wait (the bound by default). Browsers' ``EventSource`` reconnects by itself and
  sends ``Last-Event-ID``, which is read as the cursor. Under ASGI (Daphne) the
  stream is an async generator: it waits on the event loop between reads and
  borrows the request's thread only for each read, so an idle stream holds no
  thread; under WSGI it is a plain generator on the worker thread.

A waiting request blocks on the runtime's doorbell (``stream/bell.py``) and reads
again when it rings, that is when the published safe_seq moves (the watermarker's
notification on PostgreSQL, the inotify commit watcher on SQLite), so an event
is answered within a notification's delay of its publication. It also reads every
max(STREAM_LONG_POLL_INTERVAL_SECONDS, WAKE_POLL_INTERVAL) as a safety net, and
every STREAM_LONG_POLL_INTERVAL_SECONDS where the bell has no source. At most
STREAM_LONG_POLL_MAX_WAITERS requests of a process wait at once (each holds a
thread or a task); past it a request that would wait is 503 ``stream_busy`` with
``Retry-After``, before anything is read or streamed (a ``wait=0`` read is always
served). A long-poll gives its place back when it answers, however; an event
stream when its body ends or Django closes the response, even unread.

The cursor, the filter and every bound are checked, and the first page read, before
anything streams, so every refusal is a proper status in the one error envelope.
"""

import asyncio
import json
import re
import time

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import BasePermission
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response

from ..conf import rindle_settings
from ..engine import get_engine
from ..exceptions import (
    INSUFFICIENT_SCOPE,
    INVALID_CURSOR,
    INVALID_PARAMETER,
    UNAUTHORIZED,
    InvalidInput,
    ResnapshotRequired,
    UnknownTable,
)
from ..models import RindleToken
from ..runtime import get_runtime
from ..stream import state as stream_state
from ..stream.page import MAX_SEQ, format_cursor, read_page
from .serializers import ErrorResponse
from .views import RindleView

SCOPE = "stream"
PARAMETERS = frozenset({"cursor", "tables", "limit", "wait"})
EPOCH_PATTERN = re.compile(r"[0-9A-Za-z_-]{1,64}")
SEQ_PATTERN = re.compile(r"[0-9]{1,19}")
WAIT_PATTERN = re.compile(r"[0-9]{1,6}(\.[0-9]{1,3})?")
MAX_TABLES = 64
# An idle event stream sends a comment this often, so proxies keep it open.
KEEPALIVE_SECONDS = 15.0
EVENT_STREAM = "text/event-stream"


class StreamAccess(BasePermission):
    """
    A token holding the ``stream`` scope (``admin`` holds it too), or a staff
    session. The stream carries every registered table's rows, whatever the
    adapter's read rules would show one user: it is a machine's and an operator's
    door, not a browser user's.
    """

    message = "GET /v1/stream takes a token with the stream scope or a staff session."
    code = UNAUTHORIZED

    def has_permission(self, request, view):
        token = request.auth
        if isinstance(token, RindleToken):
            self.message = "This token lacks the stream scope."
            self.code = INSUFFICIENT_SCOPE
            return token.has_scope(SCOPE)
        user = request.user
        return bool(user is not None and user.is_authenticated and user.is_staff)


class StreamEvent(serializers.Serializer):
    seq = serializers.IntegerField()
    table = serializers.CharField()
    op = serializers.ChoiceField(
        choices=["add", "edit", "remove", "ddl"],
        help_text="`ddl`: the table's definition changed here (a migration); "
        "`key` is empty and both images are null. Re-read its columns.",
    )
    key = serializers.ListField(child=serializers.JSONField(), help_text="Primary key values.")
    old = serializers.JSONField(allow_null=True, help_text="The row before (null for add).")
    new = serializers.JSONField(allow_null=True, help_text="The row after (null for remove).")
    created_at = serializers.DateTimeField(help_text="When it was captured; never an order.")


class StreamPage(serializers.Serializer):
    events = StreamEvent(many=True)
    cursor = serializers.CharField(help_text="`<epoch>:<seq>`: pass it as the next `cursor`.")
    epoch = serializers.CharField()
    safe_seq = serializers.IntegerField(help_text="Every seq at or below it is final.")
    horizon = serializers.IntegerField(help_text="The oldest seq still retained.")
    more = serializers.BooleanField(help_text="True: read again at once, there is more.")


def parse_cursor(raw):
    """``(epoch, seq)``, ``"now"``, or None for an absent cursor; 400 when malformed."""
    if raw is None:
        return None
    if raw == "now":
        return "now"
    epoch, sep, seq = raw.partition(":")
    if not sep or not EPOCH_PATTERN.fullmatch(epoch) or not SEQ_PATTERN.fullmatch(seq):
        raise InvalidInput(
            f"cursor must be '<epoch>:<seq>' (a seq from 0 to {MAX_SEQ}) or 'now', "
            f"not {raw[:80]!r}",
            code=INVALID_CURSOR,
        )
    if int(seq) > MAX_SEQ:
        raise InvalidInput(f"cursor seq {seq} is above {MAX_SEQ}", code=INVALID_CURSOR)
    return epoch, int(seq)


def parse_tables(raw, registered):
    """The tables filter as a tuple, or None for every table; unknown names are 400."""
    if raw is None:
        return None
    names = raw.split(",")
    if len(names) > MAX_TABLES or not all(names):
        raise InvalidInput(
            f"tables must be 1 to {MAX_TABLES} comma-separated table names",
            code=INVALID_PARAMETER,
        )
    unknown = [n for n in names if n not in registered]
    if unknown:
        raise UnknownTable(f"table {unknown[0][:100]!r} is not registered", table=unknown[0][:100])
    return tuple(dict.fromkeys(names))


def parse_bounded(name, raw, *, default, high, pattern, cast, low):
    if raw is None:
        return default
    if not pattern.fullmatch(raw) or not low <= cast(raw) <= high:
        raise InvalidInput(f"{name} must be a number from {low} to {high}", code=INVALID_PARAMETER)
    return cast(raw)


class StreamView(RindleView):
    """``GET /v1/stream``: committed change events after a cursor (module docstring)."""

    permission_classes = [StreamAccess]

    def perform_content_negotiation(self, request, force=False):
        # JSON always renders the answers; ``Accept: text/event-stream`` only asks for
        # the stream instead. No other Accept value is refused, and no ``format``
        # parameter switches renderers (it is an unknown parameter here).
        accepted = (
            m.split(";")[0].strip().lower() for m in request.headers.get("Accept", "").split(",")
        )
        media = EVENT_STREAM if EVENT_STREAM in accepted else JSONRenderer.media_type
        return JSONRenderer(), media

    @extend_schema(
        operation_id="rindle_stream",
        summary="Read the change stream",
        parameters=[
            OpenApiParameter(
                "cursor",
                OpenApiTypes.STR,
                description="`<epoch>:<seq>` from the last answer; absent: from the oldest "
                "retained event; `now`: from the current safe_seq. With `Accept: "
                "text/event-stream`, the `Last-Event-ID` header stands in for it.",
            ),
            OpenApiParameter(
                "tables", OpenApiTypes.STR, description="Comma-separated registered tables."
            ),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1},
                description="Most events (at most STREAM_PAGE_MAX_EVENTS, the default).",
            ),
            OpenApiParameter(
                "wait",
                {"type": "number", "minimum": 0},
                description="Seconds to wait for events (at most STREAM_LONG_POLL_MAX_SECONDS).",
            ),
        ],
        responses={
            200: OpenApiResponse(
                StreamPage, description="A page (or, for text/event-stream, the events)."
            ),
            **{
                status: OpenApiResponse(ErrorResponse, description=text)
                for status, text in (
                    (400, "A malformed cursor or parameter, or an unknown table."),
                    (401, "No credentials."),
                    (403, "Neither the stream scope nor a staff session."),
                    (409, "`resnapshot_required`, with `reason`."),
                    (
                        503,
                        "`stream_busy`: STREAM_LONG_POLL_MAX_WAITERS requests already wait "
                        "here (`Retry-After`).",
                    ),
                )
            },
        },
    )
    def get(self, request):
        params = request.query_params
        unknown = sorted(set(params) - PARAMETERS)
        if unknown:
            raise InvalidInput(f"unknown parameter(s) {unknown[:5]}", code=INVALID_PARAMETER)
        repeated = sorted(k for k in params if len(params.getlist(k)) > 1)
        if repeated:
            raise InvalidInput(f"parameter(s) given twice: {repeated}", code=INVALID_PARAMETER)
        sse = request.accepted_media_type == EVENT_STREAM
        raw_cursor = params.get("cursor")
        if raw_cursor is None and sse:
            raw_cursor = request.headers.get("Last-Event-ID") or None
        cursor = parse_cursor(raw_cursor)
        engine = get_engine()
        schema = engine.tables.by_name()
        tables = parse_tables(params.get("tables"), schema)
        page_max = int(rindle_settings.STREAM_PAGE_MAX_EVENTS)
        wait_max = float(rindle_settings.STREAM_LONG_POLL_MAX_SECONDS)
        limit = parse_bounded(
            "limit", params.get("limit"), default=page_max, high=page_max, low=1,
            pattern=SEQ_PATTERN, cast=int,
        )  # fmt: skip
        wait = parse_bounded(
            "wait", params.get("wait"), default=wait_max if sse else 0.0, high=wait_max,
            low=0.0, pattern=WAIT_PATTERN, cast=float,
        )  # fmt: skip
        reader = PageReader(engine.using, tables, limit, schema)
        bell = get_runtime(engine.using).bell if wait > 0 else None
        mark = None if bell is None else bell.mark()  # before the read: no ring is lost
        if cursor == "now":
            page = reader.now()
        elif cursor is None:
            page = reader.read(None, None)
        else:
            page = reader.read(*cursor)
        deadline = time.monotonic() + wait
        if sse:
            turn = None if bell is None else bell.enter(mark)
            return self.event_stream(request, EventFeed(reader, page, deadline, turn))
        if bell is not None and idle(page):
            with bell.enter(mark) as turn:
                while idle(page):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    turn.wait(page.epoch, page.safe_seq, min(reader.poll(turn), remaining))
                    page = reader.read(page.epoch, page.next_seq)
        return Response(page_body(page))

    def event_stream(self, request, feed):
        meter = self._flow_meter
        if isinstance(request._request, ASGIRequest):
            body = AsyncBody(feed, feed.run_async(meter))
        else:
            body = SyncBody(feed, feed.run_sync(meter))
        response = StreamingHttpResponse(body, content_type=EVENT_STREAM)
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
        return response

    def finalize_response(self, request, response, *args, **kwargs):
        if isinstance(response, Response):  # errors and pages are JSON, whatever was accepted
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


def idle(page):
    """True when a page has no events and nothing more is published after it."""
    return not page.events and page.next_seq >= page.safe_seq


def page_body(page):
    return {
        "events": page.events,
        "cursor": page.cursor,
        "epoch": page.epoch,
        "safe_seq": page.safe_seq,
        "horizon": page.horizon,
        "more": page.next_seq < page.safe_seq,
    }


class PageReader:
    """Reads pages of one request's stream with its filter and bounds."""

    def __init__(self, using, tables, limit, schema):
        self.using = using
        self.tables = tables
        self.limit = limit
        self.schema = schema
        self.scan = max(1, int(rindle_settings.STREAM_PAGE_SCAN_SEQS))
        self.interval = max(0.01, float(rindle_settings.STREAM_LONG_POLL_INTERVAL_SECONDS))
        self.safety = max(self.interval, float(rindle_settings.WAKE_POLL_INTERVAL))

    def poll(self, turn):
        """Seconds a waiter waits between reads: the safety net where the bell rings."""
        return self.safety if turn is not None and turn.bell.live else self.interval

    def read(self, epoch, after):
        return read_page(
            self.using,
            epoch=epoch,
            after=after,
            tables=self.tables,
            limit=self.limit,
            scan=self.scan,
            schema=self.schema,
        )

    def now(self):
        """An empty page at the current safe_seq (``cursor=now``)."""
        from django.db import connections

        with connections[self.using].cursor() as cursor:
            current = stream_state.read(cursor)
        return self.read(current.epoch, current.safe_seq)


class EventFeed:
    """
    One server-sent event stream: the pages it read, as ``text/event-stream``
    frames, until its deadline. The sync and async bodies share it; only how they
    wait differs.
    """

    def __init__(self, reader, page, deadline, turn=None):
        self.reader = reader
        self.page = page
        self.deadline = deadline
        self.turn = turn  # the place at the doorbell (None: it never waits)
        self.sent_id = None  # the last ``id:`` sent: what a reconnect resumes from
        self.last_write = time.monotonic()
        self.bytes_out = 0
        self.done = False

    def frames(self):
        """The current page as frames (and a ``cursor`` frame when only the cursor moved)."""
        page, out = self.page, []
        for event in page.events:
            cursor = format_cursor(page.epoch, event["seq"])
            data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
            out.append(f"id: {cursor}\nevent: change\ndata: {data}\n\n")
            self.sent_id = cursor
        if page.cursor != self.sent_id:
            data = json.dumps(page_body(page) | {"events": []}, separators=(",", ":"))
            out.append(f"id: {page.cursor}\nevent: cursor\ndata: {data}\n\n")
            self.sent_id = page.cursor
        if not out and time.monotonic() - self.last_write >= KEEPALIVE_SECONDS:
            out.append(": keepalive\n\n")
        return self._encode(out)

    def delay(self):
        """Seconds to wait before the next read, or None: the stream ends."""
        if self.done:
            return None
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        if self.turn is None:
            return None  # wait=0: never waits
        if self.page.next_seq < self.page.safe_seq:
            return 0.0  # more is already published: no wait
        return min(self.reader.poll(self.turn), remaining)

    def pull(self):
        """Read the next page; a cursor that cannot continue ends the stream with an error."""
        try:
            self.page = self.reader.read(self.page.epoch, self.page.next_seq)
        except ResnapshotRequired as exc:
            self.done = True
            data = json.dumps({"error": exc.as_dict()}, separators=(",", ":"))
            return self._encode([f"event: error\ndata: {data}\n\n"])
        return self.frames()

    def _encode(self, frames):
        if not frames:
            return b""
        chunk = "".join(frames).encode()
        self.bytes_out += len(chunk)
        self.last_write = time.monotonic()
        return chunk

    def run_sync(self, meter):
        try:
            yield b"retry: 1000\n\n" + self.frames()
            while (wait := self.delay()) is not None:
                if wait:
                    self.turn.wait(self.page.epoch, self.page.safe_seq, wait)
                chunk = self.pull()
                if chunk:
                    yield chunk
        finally:
            self.release()
            self._count(meter)

    async def run_async(self, meter):
        pull = sync_to_async(self.pull, thread_sensitive=True)
        try:
            yield b"retry: 1000\n\n" + self.frames()
            while (wait := self.delay()) is not None:
                if wait:
                    await self.turn.wait_async(self.page.epoch, self.page.safe_seq, wait)
                else:
                    await asyncio.sleep(0)
                chunk = await pull()
                if chunk:
                    yield chunk
        finally:
            self.release()
            self._count(meter)

    def release(self):
        """Give the doorbell's place back (idempotent): the stream waits no more."""
        if self.turn is not None:
            self.turn.release()

    def _count(self, meter):
        if meter is not None:
            meter.transfer(bytes_in=0, bytes_out=self.bytes_out)


class SyncBody:
    """
    An event stream's body under WSGI: the generator, and a ``close`` (Django calls
    it when the response ends, even one never iterated) that releases the feed's
    place at the doorbell.
    """

    def __init__(self, feed, generator):
        self.feed = feed
        self.generator = generator

    def __iter__(self):
        return self.generator

    def close(self):
        try:
            self.generator.close()
        finally:
            self.feed.release()


class AsyncBody:
    """``SyncBody`` for an async generator (ASGI): Django closes the response too."""

    def __init__(self, feed, generator):
        self.feed = feed
        self.generator = generator

    def __aiter__(self):
        return self.generator

    def close(self):
        self.feed.release()
