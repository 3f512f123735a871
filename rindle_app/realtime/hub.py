"""
The drain: live queries of this process → per-connection frames.

One ``Hub`` per engine keeps the catalog (``LiveQueries``) current and owns every
websocket subscription of the process. A thread advances the catalog: it wakes on
each commit of this process's engine and polls the outbox every ``POLL_INTERVAL``
for writes of other processes. For each commit it encodes each changed query's ops
once, wraps them per subscriber (queryId, epoch, seq), appends one ``progress``
per connection that received data, and hands each connection its frames, in
order, through the channel layer.

Every frame to a connection goes through its own delivery queue, under the hub's
lock, in catalog-version order: a subscription's seq 0 and the increments after it
cannot overtake each other, and a ``progress`` never precedes the data it releases.

Rules kept here (DESIGN §5): seq 0 is always sent and followed by a progress; an
empty commit sends nothing and consumes no seq; re-subscribing a queryId bumps its
epoch; only connections whose data changed get a progress (lmid is data, through
the connection's ``_rindle/clientLmid`` query). A connection whose queue overflows
is shed: its subscriptions are dropped and each is told ``shed`` (retryable), so it
re-subscribes later; nobody else waits for it.
"""

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.db import close_old_connections, connections

from ..conf import rindle_settings
from ..ivm.ast import QueryError
from ..ivm.live import LiveQueries
from ..stream.notify import Listener
from . import wire

logger = logging.getLogger("rindle.realtime")

MESSAGE_TYPE = "rindle.frames"


@dataclass(eq=False)
class Sub:
    """One subscription: a connection's queryId on a shared query."""

    conn: object
    query_id: int
    epoch: int
    mode: str
    key: str
    seq: int = 0


@dataclass(eq=False)
class Conn:
    channel: str
    loop: object
    user: object = None
    client_id: str = None
    subs: dict = field(default_factory=dict)  # queryId -> Sub
    epochs: dict = field(default_factory=dict)  # queryId -> last epoch
    queue: deque = field(default_factory=deque)  # messages waiting for the channel layer
    inflight: int = 0  # messages handed to the layer, not yet taken by the consumer
    flushing: bool = False
    shed: dict = field(default_factory=dict)  # queryId -> epoch, told "shed" once delivered
    closed: bool = False


@dataclass(eq=False)
class _Encoded:
    """One shared query's wire form: its hello shape, and the flat encoder if used."""

    shape: object
    flat: object = None
    flat_tree: object = None


class Hub:
    def __init__(self, engine):
        self.engine = engine
        self.lock = threading.RLock()
        self.live = None
        self.conns = {}
        self._encoded = {}  # query key -> _Encoded
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self._listener = None
        self.max_inflight = int(rindle_settings.WS_MAX_QUEUED_MESSAGES)
        self.poll_interval = float(rindle_settings.POLL_INTERVAL)

    # --- lifecycle -----------------------------------------------------------------

    def start(self):
        with self.lock:
            if self.live is not None:
                return self
            self.live = LiveQueries(self.engine, handoff=True).start()
            self.engine.add_commit_listener(self._on_commit)
            self.engine.add_schema_listener(self._on_schema_change)
            if self.engine.vendor == "postgresql":
                # Other processes' commits arrive as notifications; the poll is a safety net.
                self._listener = Listener(self.engine.using, self._wake.set).start()
                self.poll_interval = max(self.poll_interval, 1.0)
            self._thread = threading.Thread(target=self._run, name="rindle-hub", daemon=True)
            self._thread.start()
        return self

    def close(self):
        self._stop.set()
        self._wake.set()
        self.engine.remove_commit_listener(self._on_commit)
        self.engine.remove_schema_listener(self._on_schema_change)
        if self.live is not None:
            self.live.stop()
        if self._listener is not None:
            self._listener.close()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)

    @property
    def catalog(self):
        return self.live.catalog

    def _on_commit(self, cv):
        self._wake.set()

    def _on_schema_change(self, table):
        """
        Registered tables changed (a migration): the store is rebuilt from a fresh
        snapshot, and every subscription is told ``schema_changed`` (retryable), so
        clients re-subscribe and get hellos of the new shape.
        """
        with self.lock:
            message = f"the schema of {table!r} changed; re-subscribe"
            for conn in list(self.conns.values()):
                frames = [
                    wire.query_error(qid, message, "schema_changed", True, retry_after_ms=0)
                    for qid in sorted(conn.subs)
                ]
                conn.subs.clear()  # the old catalog and its subscribers are dropped whole
                self._deliver(conn, frames)
            self._encoded.clear()
            self.live.stop()
            self.live = LiveQueries(self.engine, handoff=True).start()

    def _run(self):
        try:
            while not self._stop.is_set():
                self._wake.wait(self.poll_interval)
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    self.step()
                except Exception:  # keep serving; the next step retries from the same version
                    logger.exception("rindle hub: step failed")
                    close_old_connections()
                    time.sleep(self.poll_interval)
        finally:
            connections.close_all()

    # --- connections ---------------------------------------------------------------

    def connect(self, channel, loop, user=None):
        self.start()
        with self.lock:
            conn = Conn(channel, loop, user)
            self.conns[channel] = conn
            return conn

    def disconnect(self, channel):
        with self.lock:
            conn = self.conns.pop(channel, None)
            if conn is None:
                return
            conn.closed = True
            for sub in list(conn.subs.values()):
                self._drop(sub)
            conn.subs.clear()

    def subscribe(self, conn, query_id, ast, mode):
        """
        Attach ``conn``'s ``query_id`` to the shared query of ``ast`` and queue its
        hello, seq 0 and a releasing progress. A re-subscribe of the same queryId
        replaces the old subscription under the next epoch. Raises ``QueryError``.
        """
        with self.lock:
            if conn.closed:
                return None
            old = conn.subs.pop(query_id, None)
            if old is not None:
                self._drop(old)
            conn.shed.pop(query_id, None)
            epoch = conn.epochs.get(query_id, 0) + 1
            conn.epochs[query_id] = epoch
            shared = self.catalog.register(ast)
            encoded = self._encoding(shared)
            sub = Sub(conn, query_id, epoch, mode, shared.key)
            ops = self.catalog.attach(shared.key, sub)
            conn.subs[query_id] = sub
            cv = self.catalog.version
            boot = self.engine.boot_id
            if mode == "flat":
                flat = self._flat(shared, encoded)
                hello = wire.hello(query_id, wire.dumps(flat.hello(epoch)), boot)
                events = flat.snapshot_events(encoded.flat_tree)
                data = wire.batch(query_id, epoch, 0, flat.schema_fp, wire.dumps(events), cv)
            else:
                hello = wire.nhello(query_id, epoch, encoded.shape, boot)
                ops_json = wire.dumps(encoded.shape.ops(ops))
                data = wire.nbatch(query_id, epoch, 0, encoded.shape.fp, ops_json, cv)
            self._deliver(conn, [hello, data, wire.progress(cv)])
            return sub

    def unsubscribe(self, conn, query_id):
        with self.lock:
            conn.shed.pop(query_id, None)
            sub = conn.subs.pop(query_id, None)
            if sub is not None:
                self._drop(sub)
            return sub is not None

    def taken(self, channel):
        """The consumer took one message off its channel."""
        with self.lock:
            conn = self.conns.get(channel)
            if conn is not None and conn.inflight > 0:
                conn.inflight -= 1
                if conn.shed and not conn.flushing:
                    self._send_shed(conn)

    # --- commits -------------------------------------------------------------------

    def step(self):
        """Apply every commit after the catalog's version; deliver the frames it makes."""
        with self.lock:
            version, outputs, faults = self.live.poll()
            if not outputs and not faults:
                return version
            per_conn = {}
            for key, ops in outputs.items():
                shared = self.catalog.queries.get(key)
                if shared is None or not shared.subscribers:
                    continue
                self._fan_out(shared, ops, version, per_conn)
            for fault in faults:
                self._encoded.pop(fault.key, None)
                for sub in fault.subscribers:
                    conn = sub.conn
                    if conn.subs.get(sub.query_id) is sub:
                        del conn.subs[sub.query_id]
                        frame = wire.query_error(
                            sub.query_id, fault.message, "faulted", True, retry_after_ms=500
                        )
                        per_conn.setdefault(conn, []).append(frame)
            for conn, frames in per_conn.items():
                frames.append(wire.progress(version))
                self._deliver(conn, frames)
            return version

    def _fan_out(self, shared, ops, version, per_conn):
        encoded = self._encoding(shared)
        payloads = {}  # mode -> (fingerprint, JSON body) or None when nothing to send
        for sub in shared.subscribers:
            if sub.mode not in payloads:
                payloads[sub.mode] = self._payload(shared, encoded, sub.mode, ops)
            payload = payloads[sub.mode]
            if payload is None:
                continue  # nothing this mode shows changed: no batch, no seq
            sub.seq += 1
            fp, body = payload
            make = wire.batch if sub.mode == "flat" else wire.nbatch
            frame = make(sub.query_id, sub.epoch, sub.seq, fp, body, version)
            per_conn.setdefault(sub.conn, []).append(frame)
        if "flat" not in payloads and encoded.flat is not None:
            # no flat subscriber took this commit: keep the tree current for later ones
            encoded.flat_tree = encoded.flat.render(shared.view, self.catalog.store)

    def _payload(self, shared, encoded, mode, ops):
        if mode != "flat":
            return encoded.shape.fp, wire.dumps(encoded.shape.ops(ops))
        flat = self._flat(shared, encoded)
        tree = flat.render(shared.view, self.catalog.store)
        events = flat.diff_events(encoded.flat_tree, tree)
        encoded.flat_tree = tree
        return (flat.schema_fp, wire.dumps(events)) if events else None

    # --- encodings -----------------------------------------------------------------

    def _encoding(self, shared):
        encoded = self._encoded.get(shared.key)
        if encoded is None:
            encoded = self._encoded[shared.key] = _Encoded(
                wire.NormalizedShape(shared.query, self.catalog.schema)
            )
        return encoded

    def _flat(self, shared, encoded):
        if encoded.flat is None:
            from .flat import FlatEncoder

            encoded.flat = FlatEncoder(shared.query, self.catalog.schema)
            encoded.flat_tree = encoded.flat.render(shared.view, self.catalog.store)
        return encoded.flat

    def _drop(self, sub):
        self.catalog.detach(sub)
        shared = self.catalog.queries.get(sub.key)
        if shared is not None and not shared.subscribers:
            self.catalog.destroy(sub.key)
            self._encoded.pop(sub.key, None)

    # --- delivery ------------------------------------------------------------------

    def _deliver(self, conn, frames):
        """Queue ``frames`` for ``conn`` (under the lock); a flush on its loop sends them."""
        if conn.closed or not frames:
            return
        conn.queue.append({"type": MESSAGE_TYPE, "frames": frames})
        self._schedule(conn)

    def _schedule(self, conn):
        if conn.flushing:
            return
        conn.flushing = True
        try:
            conn.loop.call_soon_threadsafe(_spawn, self._flush(conn))
        except RuntimeError:  # the connection's loop is gone
            conn.flushing = False
            conn.closed = True

    async def _flush(self, conn):
        layer = get_channel_layer()
        try:
            while True:
                with self.lock:
                    if conn.closed or not conn.queue:
                        conn.flushing = False
                        return
                    if conn.inflight >= self.max_inflight:
                        self._shed(conn)
                        conn.flushing = False
                        return
                    message = conn.queue.popleft()
                    conn.inflight += 1
                try:
                    await layer.send(conn.channel, message)
                except ChannelFull:
                    with self.lock:
                        conn.inflight -= 1
                        self._shed(conn)
                        conn.flushing = False
                    return
        except BaseException:
            with self.lock:
                conn.flushing = False
            raise

    def _shed(self, conn):
        """Drop every subscription of a connection that cannot keep up (under the lock)."""
        logger.warning("rindle hub: shedding slow connection %s", conn.channel)
        for query_id, sub in list(conn.subs.items()):
            conn.shed[query_id] = sub.epoch
            self._drop(sub)
        conn.subs.clear()
        conn.queue.clear()

    def _send_shed(self, conn):
        frames = [
            wire.query_error(
                qid,
                "the connection fell behind; re-subscribe",
                "shed",
                True,
                retry_after_ms=int(rindle_settings.WS_SHED_RETRY_MS),
            )
            for qid in sorted(conn.shed)
        ]
        conn.shed.clear()
        conn.queue.append({"type": MESSAGE_TYPE, "frames": frames})
        self._schedule(conn)


def _spawn(coro):
    asyncio.ensure_future(coro)


_hubs = {}
_hubs_lock = threading.Lock()


def get_hub(engine=None):
    """The hub of ``engine`` (the default engine), started on first use."""
    if engine is None:
        from ..engine import get_engine

        engine = get_engine()
    with _hubs_lock:
        hub = _hubs.get(id(engine))
        if hub is None or hub.engine is not engine:
            hub = _hubs[id(engine)] = Hub(engine)
    return hub.start()


def shutdown_hubs():
    with _hubs_lock:
        hubs = list(_hubs.values())
        _hubs.clear()
    for hub in hubs:
        hub.close()


__all__ = ["Hub", "QueryError", "get_hub", "shutdown_hubs"]
