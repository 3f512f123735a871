"""
The live rooms of this process: each doc's ``RoomHost`` (the write authority) with
the room's rows in a ``MemoryStore``, the room-served views over them, and the
sockets subscribed to them.

A room boots on its first subscription (``RoomRegistry.join``): the host claims the
next epoch and loads the footprint, and the store takes the host's rows. Then, for
each mutation, in arrival order under the room's lock:

- the host applies it in memory; an applied one's row changes go into the store,
  every room-served view applies them, and each subscribed socket gets one
  ``nbatch`` per view that changed and a ``progress`` (the room's own version);
- a mutation the host did not apply gets a ``mutationOutcome`` on its socket at
  once (``rejected``, or ``deopt``: send it on the slow path);
- a client's lmid is confirmed on its lmid subscription only when a flush made it
  durable, so a room host that dies unflushed loses nothing a client was told: the
  client re-sends its unconfirmed mutations, with their mids, to the next host.

The registry's flusher thread (owned by the runtime, started with the first room)
flushes as soon as a mutation is pending, group-commit style: what arrives during a
flush goes in the next one, so a flush costs one transaction however fast people
type, and confirmation waits one flush. It also wakes every ``ROOM_FLUSH_INTERVAL``
seconds (a batch an unavailable database kept pending is retried then). A room is
flushed and dropped when its last socket leaves. A flush's
corrections (a CAS miss the host rebased) reach the views like mutations, and a
verdict it changed reaches its client as a ``mutationOutcome``. A fenced or failed
host closes its room: the sockets are closed with 4503 (retry), and their clients'
next lease boots a new host, which absorbs what is durable.

A room follows what other writers commit to its footprint (``LiveRoom.following``):
the footprint is a live query of the process's hub, whose rows at boot are the
room's load and whose later row changes the hub hands over as they commit. The
flusher applies them between flushes (``RoomHost.absorb``) and broadcasts them
like mutations: a plain ORM save, an admin edit or a main-path mutation of a row in
the room reaches the room's sockets within a hub step. If the hub drops the query
(a schema change, a resnapshot) the room closes, so its clients lease again.

A room lives in ONE process. In a fleet the room's claim names this process's
channel, and other processes relay their sockets of the doc to it
(``realtime.room_router``). Without a channel layer that reaches them, two
processes serving one doc fence each other in turn (correct, since every flush is
fenced and CAS-checked, but slow).
"""

import collections
import logging
import threading
import time

from ..conf import rindle_settings
from ..engine.rooms import ANY_EPOCH
from ..exceptions import RindleError, RoomBusy, RoomClosed
from ..ivm.ast import query_key
from ..ivm.store import MemoryStore
from ..ivm.view import View
from . import wire
from .room_host import APPLIED, REPLAY, ClaimLost, RoomHost

logger = logging.getLogger("rindle.rooms")

CLOSE_RETRY = 4503
# Seconds the flusher waits for a burst of mutations to end, and at most, before
# it flushes them as one batch.
COALESCE = 0.002
COALESCE_MAX = 0.02
# Seconds a drained room waits for its downgrading client's main-socket subscription
# before it commits the fence anyway (see RoomRegistry.drain).
SEAL_WAIT = 1.0
# Times a socket's join routes again after another process claimed the doc first.
CLAIM_ATTEMPTS = 3
LEDGER = "_rindle_client_mutations"  # the lmid stream's table, as on the main socket


class SharedView:
    """One room-served query's view, shared by every subscription of the same query."""

    def __init__(self, view, shape):
        self.view = view
        self.shape = shape
        self.subs = set()


class RoomSub:
    """One room-served subscription of one socket."""

    def __init__(self, socket, query_id, epoch, shared, key):
        self.socket = socket
        self.query_id = query_id
        self.epoch = epoch
        self.shared = shared
        self.key = key
        self.seq = 0


class LmidSub:
    """A socket's subscription to its client's room lmid (the reserved query id 0)."""

    def __init__(self, socket, query_id, epoch, shape, client_id, lmid):
        self.socket = socket
        self.query_id = query_id
        self.epoch = epoch
        self.shape = shape
        self.client_id = client_id
        self.lmid = lmid
        self.seq = 0


def lmid_shape(engine, client_id):
    """The wire shape of ``client_id``'s room lmid stream (``_rindle/clientLmid``)."""
    from .. import named
    from ..ivm.ast import parse

    return wire.NormalizedShape(parse(named.lmid_ast(client_id), engine.tables), engine.tables)


def open_lmid(socket, query_id, shape, client_id, lmid, engine):
    """A lmid stream answered before its socket joined a room: hello and seq 0 now."""
    sub = LmidSub(socket, query_id, 1, shape, client_id, lmid)
    rows = [] if not lmid else [{"op": "add", "table": LEDGER, "row": _lmid(sub)}]
    socket.deliver(
        [
            wire.nhello(query_id, 1, shape, engine.boot_id),
            wire.nbatch(query_id, 1, 0, shape.fp, wire.dumps(shape.ops(rows)), 0),
            wire.progress(0),
        ]
    )
    return sub


class LiveRoom:
    """One doc's host, rows, views and subscribers; every method holds its lock."""

    def __init__(self, engine, doc, host, wake=None):
        self.engine = engine
        self.wake = wake  # called when a mutation is pending: the flusher's doorbell
        self.doc = doc
        self.host = host
        self.lock = threading.RLock()
        self._landed = threading.Condition(self.lock)  # notified when a flight ends
        self.store = MemoryStore(engine.tables)
        self.version = 0  # the room's progress: one step per change it broadcast
        self.subs = {}  # (socket, query id) -> RoomSub
        self.views = {}  # query key -> SharedView
        self.lmid_subs = {}  # (socket, query id) -> LmidSub
        self.sockets = set()
        self.closed = False
        self.flushed = None  # the offset of this host's last committed flush
        self.draining = False  # a downgrade fences on the next flush (see drain)
        self.seal_by = None
        self._outside = collections.deque()  # (ops, version) fed by the hub; None: it ended
        self._unfollow = None

    def following(self, follow):
        """
        A host ``load`` that follows the footprint: ``follow(feed)`` returns the
        footprint's rows ``{table: [rows]}`` and a function that ends the feed; the
        feed queues what the hub hands over (on the hub's thread, under its lock).
        """

        def load(engine):
            rows, self._unfollow = follow(self._feed)
            return rows

        return load

    def _feed(self, ops, version):
        self._outside.append(None if ops is None else (ops, version))
        if self.wake is not None:
            self.wake()

    def absorb(self):
        """Apply and broadcast what other writers changed in the footprint (not mid-flush)."""
        if self._outside:
            with self.lock:
                self._absorb()

    def _absorb(self):
        while self._outside and not self.closed and not self.host.in_flight:
            item = self._outside.popleft()
            if item is None:
                logger.info("rindle room %r: its footprint query ended; closing", self.doc)
                self._close()
                return
            try:
                result = self.host.absorb(*item)
            except RoomClosed:
                self._close()
                return
            self._after_flush(result)

    def stop_following(self):
        unfollow, self._unfollow = self._unfollow, None
        if unfollow is not None:
            try:
                unfollow()
            except Exception:
                logger.exception("rindle room %r: ending its feed failed", self.doc)

    def boot(self, tables):
        self.host.boot()
        for table in tables:
            self.store.load(table, self.host.rows(table))

    # --- subscriptions ------------------------------------------------------------------

    def subscribe(self, socket, query_id, query, shape):
        """
        Serve ``query`` over the room's rows to ``socket``: hello, seq 0, progress.
        Subscriptions of the same query share one view, maintained once per change.
        """
        with self.lock:
            self._open()
            epoch = self._drop_sub(socket, query_id) + 1
            key = query_key(query)
            shared = self.views.get(key)
            if shared is None:
                view = View(query, self.store)
                ops = view.hydrate()
                shared = self.views[key] = SharedView(view, shape)
            else:
                ops = [{"op": "add", "table": t, "row": r} for t, r in shared.view.footprint_rows()]
            sub = self.subs[(socket, query_id)] = RoomSub(socket, query_id, epoch, shared, key)
            shared.subs.add(sub)
            socket.deliver(
                [
                    wire.nhello(query_id, epoch, shape, self.engine.boot_id),
                    wire.nbatch(
                        query_id, epoch, 0, shape.fp, wire.dumps(shape.ops(ops)), self.version
                    ),
                    wire.progress(self.version),
                ]
            )
            return sub

    def subscribe_lmid(self, socket, query_id, shape, client_id):
        """The room lmid of ``client_id`` as the lmid stream's seq 0 (durable only)."""
        with self.lock:
            self._open()
            epoch = self._drop_sub(socket, query_id) + 1
            lmid = self.host.durable_lmid(client_id)
            if lmid is None:
                lmid = self.engine.room_lmids(self.doc, [client_id]).get(client_id, 0)
            sub = LmidSub(socket, query_id, epoch, shape, client_id, lmid)
            self.lmid_subs[(socket, query_id)] = sub
            rows = [] if not lmid else [{"op": "add", "table": LEDGER, "row": _lmid(sub)}]
            socket.deliver(
                [
                    wire.nhello(query_id, epoch, shape, self.engine.boot_id),
                    wire.nbatch(
                        query_id, epoch, 0, shape.fp, wire.dumps(shape.ops(rows)), self.version
                    ),
                    wire.progress(self.version),
                ]
            )

    def adopt_lmid(self, sub):
        """Take over a lmid stream the socket opened before it joined (no new hello)."""
        with self.lock:
            self.lmid_subs[(sub.socket, sub.query_id)] = sub
            lmid = self.host.durable_lmid(sub.client_id)
            if lmid is not None and lmid > sub.lmid:
                self._confirm(sub, lmid)

    def unsubscribe(self, socket, query_id):
        with self.lock:
            self._drop_sub(socket, query_id)

    def _drop_sub(self, socket, query_id):
        old = self.subs.pop((socket, query_id), None)
        if old is not None:
            old.shared.subs.discard(old)
            if not old.shared.subs:
                del self.views[old.key]
        else:
            old = self.lmid_subs.pop((socket, query_id), None)
        return 0 if old is None else old.epoch

    def leave(self, socket):
        """Forget ``socket``; True when it was the room's last."""
        with self.lock:
            self.sockets.discard(socket)
            for sock, query_id in [k for k in self.subs if k[0] is socket]:
                self._drop_sub(sock, query_id)
            for key in [k for k in self.lmid_subs if k[0] is socket]:
                del self.lmid_subs[key]
            return not self.sockets

    # --- mutations and flushes ----------------------------------------------------------

    def mutate(self, socket, envelope):
        """Apply one mutation of ``socket``'s client; raises the host's refusals."""
        with self.lock:
            self._open()
            try:
                result = self.host.mutate(
                    envelope["clientID"], envelope["mid"], envelope["name"], envelope.get("args")
                )
            except RoomClosed:
                self._close()
                raise
            if result.flush is not None:
                self._after_flush(result.flush)
            if result.verdict != REPLAY and self.wake is not None:
                self.wake()
            if result.verdict == APPLIED:
                self._broadcast(result.changes)
            elif result.verdict != REPLAY:
                frame = _outcome(
                    result.mid, result.verdict, result.reason, envelope, result.details
                )
                socket.deliver([frame])
            return result

    def flush(self, *, wait=False):
        """
        Flush the host's pending mutations (a no-op without any). The database write
        runs WITHOUT the room's lock (``RoomHost.send``): mutations arriving meanwhile
        are applied and broadcast at once, and pending for the next flush. A flush
        already in flight makes this a no-op, unless ``wait``: then it waits for that
        one to land and flushes what is left.
        """
        with self.lock:
            if wait:
                self._settle()
            if self.closed or not self.host.pending or self.host.in_flight:
                return None
            try:
                flight = self.host.begin_flush()
            except RoomClosed:
                logger.warning("rindle room %r closed at a flush", self.doc, exc_info=True)
                self._close()
                return None
        try:
            self.host.send(flight)
        finally:
            with self.lock:
                try:
                    result = self.host.end_flush(flight)
                except RoomClosed:
                    logger.warning("rindle room %r closed at a flush", self.doc, exc_info=True)
                    self._close()
                    result = None
                finally:
                    self._landed.notify_all()
                if result is not None:
                    self._after_flush(result)
                self._absorb()
        return result

    def _settle(self):
        """Wait (the lock released meanwhile) until no flush of this room is in flight."""
        while self.host.in_flight and not self.closed:
            self._landed.wait(1.0)

    def drain(self):
        """Flush, and promise the fence of a downgrade: the next flush's offset (None: closed)."""
        with self.lock:
            if self.closed:
                return None
            self.flush(wait=True)
            self._settle()
            if self.closed:
                return None
            self.draining = True
            self.seal_by = time.monotonic() + SEAL_WAIT
            return self.host.next_offset()

    def seal_if_drained(self):
        """Commit the drained room's promised fence (an empty flush if nothing is pending)."""
        with self.lock:
            self._settle()
            if self.host.closed is not None or not self.draining:
                return
            self.draining = False
            try:
                self.flushed = self.host.seal()
            except RoomClosed:
                logger.warning("rindle room %r closed at its seal", self.doc, exc_info=True)
                self._close()
            except Exception:  # the database: the ghost waits for the next flush instead
                logger.exception("rindle room %r: its downgrade seal failed", self.doc)

    def _after_flush(self, result):
        if result.corrections:
            self._broadcast(result.corrections)
        for change in result.verdicts:
            if change.after != APPLIED:
                for sub in self.lmid_subs.values():
                    if sub.client_id == change.client_id:
                        frame = _outcome(
                            change.mid, change.after, change.reason, None, change.details
                        )
                        sub.socket.deliver([frame])
        if result.flushed:
            self.flushed = int(result.offset)
            for sub in self.lmid_subs.values():
                lmid = result.lmids.get(sub.client_id)
                if lmid is not None and lmid > sub.lmid:
                    self._confirm(sub, lmid)

    def _confirm(self, sub, lmid):
        """
        Move ``sub``'s lmid row to ``lmid`` (durable), with a releasing progress. The
        confirmation takes a version of its own: a client releases a frame only with
        a progress past the one it already applied, so one tagged with the room's
        current version would wait for the room's next change.
        """
        old, sub.lmid = _lmid(sub), lmid
        op = {"op": "edit", "table": LEDGER, "old": old, "new": _lmid(sub)}
        if not old["last_mutation_id"]:
            op = {"op": "add", "table": LEDGER, "row": _lmid(sub)}
        sub.seq += 1
        self.version += 1
        text = wire.dumps(sub.shape.ops([op]))
        batch = wire.nbatch(sub.query_id, sub.epoch, sub.seq, sub.shape.fp, text, self.version)
        sub.socket.deliver([batch, wire.progress(self.version)])

    def _broadcast(self, changes):
        triples = []
        for op in changes:
            table = op["table"]
            if op["op"] == "add":
                old, new = None, op["row"]
            elif op["op"] == "remove":
                old, new = op["row"], None
            else:
                old, new = op["old"], op["new"]
            self.store.apply(table, old, new)
            triples.append((table, old, new))
        if not triples:
            return
        self.version += 1
        v = self.version
        for shared in self.views.values():
            ops = shared.view.apply(triples)
            if not ops:
                continue
            text, fp = wire.dumps(shared.shape.ops(ops)), shared.shape.fp  # encoded once
            for sub in shared.subs:
                sub.seq += 1
                sub.socket.deliver([wire.nbatch(sub.query_id, sub.epoch, sub.seq, fp, text, v)])
        for socket in self.sockets:
            socket.deliver([wire.progress(self.version)])

    def _open(self):
        if self.closed:
            raise RoomClosed(f"the room {self.doc!r} closed; lease again")

    def _close(self):
        if self.closed:
            return
        self.closed = True
        self.stop_following()
        for socket in list(self.sockets):
            socket.close_later(CLOSE_RETRY)


def last_flush(engine, doc):
    """The downgrade watermark of ``doc`` (its last committed flush's offset; 0: none)."""
    from django.db import connections

    from ..engine.rooms import ROOM_WATERMARK

    with connections[engine.using].cursor() as cursor:
        cursor.execute(f"SELECT flush_seq FROM {ROOM_WATERMARK} WHERE doc = %s", [doc])
        row = cursor.fetchone()
    return int(row[0]) if row and str(row[0]).isdigit() else 0


def _lmid(sub):
    return {"client_id": sub.client_id, "last_mutation_id": sub.lmid}


def _outcome(mid, kind, reason, envelope, details=None):
    frame = {"t": "mutationOutcome", "mid": mid, "kind": kind}
    if reason is not None:
        frame["reason"] = reason
    if details is not None:
        frame["details"] = details
    if envelope is not None:
        frame["name"] = envelope["name"]
        frame["args"] = envelope.get("args")
    return wire.dumps(frame)


class RoomRegistry:
    """
    The live rooms of one runtime, by doc, and the thread that flushes them. A room
    boots on its first socket and is flushed and dropped with its last.
    """

    def __init__(self, engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._rooms = {}
        self._sealing = {}  # doc -> a drained room gone from _rooms, its fence not yet sealed
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = None
        self.router = None  # room_router.RoomRouter, once a socket started it

    def start_routing(self, loop):
        """
        Route rooms through the channel layer, on ``loop`` (the server's; call it on
        that loop). Without a layer that reaches other processes, rooms stay local.
        """
        router = self.router
        if router is not None and not router.loop.is_closed():
            return
        from .room_router import RoomRouter, routing_layer

        layer = routing_layer()
        if layer is not None:
            router = RoomRouter(self, layer)
            router.start(loop)
            self.router = router

    def join(self, socket, doc, profile, key, mutators, load, tables, follow=None):
        """
        The doc's live room with ``socket`` in it, booting it if needed: from
        ``load(engine)``, or following the footprint with ``follow`` (see
        ``LiveRoom.following``) when given. In a fleet, the doc's room in another
        process (a ``room_router.RemoteRoom``) when that process hosts it.
        """
        router = self.router
        for _attempt in range(CLAIM_ATTEMPTS):
            room = self._rooms.get(doc)
            expect = ANY_EPOCH
            if router is not None and (room is None or room.closed):
                # Boot from the epoch read, or route again to whoever claimed first.
                remote, expect = router.route(doc, socket)
                if remote is not None:
                    return remote
            with self._lock:
                room = self._rooms.get(doc)
                if room is None or room.closed:
                    room = LiveRoom(self.engine, doc, None, wake=self._wake.set)
                    if follow is not None:
                        load = room.following(follow)
                    room.host = RoomHost(
                        self.engine,
                        doc,
                        mutators=mutators,
                        load=load,
                        host=router.named() if router is not None else None,
                        expect=expect,
                    )
                    try:
                        room.boot(tables)
                    except ClaimLost:
                        room.stop_following()
                        continue
                    except BaseException:
                        room.stop_following()
                        raise
                    self._rooms[doc] = room
                    self._start()
                with room.lock:
                    room.sockets.add(socket)
                return room
        raise RoomBusy(f"the room of {doc!r} is being placed elsewhere; lease again")

    def leave(self, socket, room):
        """``socket`` went away; the room's last socket flushes (seals) and drops it."""
        if not isinstance(room, LiveRoom):  # served by another process: tell it
            room.leave()
            return
        if not room.leave(socket):
            return
        room.flush(wait=True)
        if room.draining:
            self._sealing[room.doc] = room  # sealed by the hydrate, or by the flusher
        with self._lock:
            with room.lock:
                if room.sockets:
                    return  # someone joined meanwhile
                room.closed = True
                room.stop_following()
            if self._rooms.get(room.doc) is room:
                del self._rooms[room.doc]

    def get(self, doc):
        return self._rooms.get(doc)

    def hosting(self, doc):
        """The doc's open room here (None: none), after any boot of it in progress."""
        with self._lock:
            room = self._rooms.get(doc)
        return None if room is None or room.closed else room

    def drain(self, doc):
        """
        The ``finalFlushSeq`` a downgrade of ``doc`` fences on. A room living here is
        flushed, and the fence is the offset of its NEXT flush, committed (empty if
        need be) when its last socket leaves: the downgrading client closes its room
        socket after it subscribed the query on the main socket, so the watermark the
        ghost waits for reaches it after that subscription's rows, not before. With
        no room here, the doc's last committed flush.
        """
        room = self._rooms.get(doc)
        if room is not None:
            final = room.drain()
            if final is not None:
                return final
        return last_flush(self.engine, doc)

    def hydrated(self, doc):
        """
        A main-socket subscription of ``doc``'s query hydrated: a drained room commits
        its fence now, after those rows (the ghost on the client waits for it).
        """
        room = self._rooms.get(doc) or self._sealing.get(doc)
        if room is not None and room.draining:
            room.seal_if_drained()
            self._sealing.pop(doc, None)

    def _start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._flusher, name="rindle-rooms", daemon=True)
            self._thread.start()

    def _flusher(self):
        interval = float(rindle_settings.ROOM_FLUSH_INTERVAL)
        while not self._stop.is_set():
            if self._wake.wait(interval):
                self._coalesce()
            now = time.monotonic()
            for room in [*self._rooms.values(), *self._sealing.values()]:
                if room.draining and room.seal_by is not None and now >= room.seal_by:
                    room.seal_if_drained()
                    self._sealing.pop(room.doc, None)
            for room in list(self._rooms.values()):
                try:
                    room.absorb()
                    room.flush()
                except RindleError:
                    logger.warning("rindle room %r: a flush failed", room.doc, exc_info=True)
                except Exception:
                    logger.exception("rindle room %r: a flush failed", room.doc)

    def _coalesce(self):
        """
        Let a burst finish before flushing: wait while mutations keep coming less
        than COALESCE apart, for at most COALESCE_MAX. A lone mutation waits
        COALESCE; a burst flushes as one batch.
        """
        deadline = time.monotonic() + COALESCE_MAX
        self._wake.clear()
        while time.monotonic() < deadline and self._wake.wait(COALESCE):
            self._wake.clear()

    def close(self):
        """Stop the flusher, flush every room (their last chance) and drop them."""
        if self.router is not None:
            self.router.close()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            rooms, self._rooms = list(self._rooms.values()), {}
            sealing, self._sealing = list(self._sealing.values()), {}
        for room in sealing:
            room.seal_if_drained()
        for room in rooms:
            try:
                room.flush(wait=True)
                room.seal_if_drained()
            except Exception:
                logger.exception("rindle room %r: the final flush failed", room.doc)
            room._close()
