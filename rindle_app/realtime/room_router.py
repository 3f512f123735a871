"""
A fleet's rooms: every room socket of a doc is served by the ONE process whose room
holds the doc's placement epoch, the others relay through the channel layer.

A room that boots claims its epoch with this process's channel as the host
(``engine.rooms``: ``_rindle_room_placement.host``). A room socket that reaches a
process without the doc's room reads the placement first. If another process's
channel hosts it, the socket joins there: ``join`` goes to the host's channel and
the host answers within ``ATTACH_SECONDS``. Then the socket's room frames
(subscribe, the lmid stream, unsubscribe, pushMutation, leave) go to the host, which
serves them on its room with a ``RemoteSocket`` whose frames come back to this
process, in order. A host that does not answer is taken for gone: this process
boots the room itself, and its claim of the next epoch fences the old host. A boot
claims from the epoch it read (``claim_room_epoch(..., expect=epoch)``): of
processes racing to host a doc one wins, and the others route to it.

Each end does its own part of the rules. The relaying process authenticates the
socket, redeems its room token, resolves the query for its user (read rules
compiled in), checks scopes, quota and anonymous mutations, exactly as for a local
room. It sends the host only what passed. The host trusts its channel: the channel
layer is internal, like the database.

What can go wrong, and what happens:

- The host dies. A relaying process pings each host it relays to every
  ``PING_SECONDS``. With no answer within ``PING_TIMEOUT``, its sockets there are
  closed with 4503: their clients lease again, and the next join boots the room in
  a live process (the next epoch). Pings are answered at once, never queued behind
  the host's work, so a busy host is not taken for a dead one.
- The relaying process dies. The host pings it the same way, and drops the sockets
  it served for it from their rooms (a room whose last socket goes is flushed).
- The host's room closes (fenced, failed, drained): its remote sockets are closed
  with 4503 like local ones.
- A message cannot be sent (``ChannelFull``: the other end is not keeping up). A
  relayed socket is closed with 4503. Its unconfirmed mutations are re-sent by its
  client, and the room ledger absorbs those that were durable.
  A host that cannot send a remote socket its frames drops it from the room, and
  the next ping closes it.

The channel layer must reach every process (``channels_redis``). With the
in-memory layer, or none, each process hosts its own rooms, as without a fleet.
Messages to one channel are handled in order (answers, pings and frames at once,
the host's work one message at a time on a worker thread): a socket's frames never
overtake each other, at the cost of one relay queue per process.
"""

import asyncio
import itertools
import logging
import threading
import uuid

from ..exceptions import UNSUPPORTED, RindleError, RoomClosed
from ..ivm.ast import QueryError, parse, to_json
from . import wire, workers
from .room_server import LmidSub, lmid_shape

logger = logging.getLogger("rindle.rooms")

PREFIX = "rindle.rooms."
ATTACH_SECONDS = 2.0  # how long a host has to answer a join
PING_SECONDS = 2.0  # how often each end checks the other end of its relayed sockets
PING_TIMEOUT = 4.0  # how long a ping may go unanswered before the other end is gone
CLOSE_RETRY = 4503


def routing_layer():
    """The channel layer rooms route through, or None (in-memory or none: no fleet)."""
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    try:
        layer = get_channel_layer()
    except Exception:  # a misconfigured layer: the check that owns it says so
        logger.exception("rindle rooms: the channel layer did not load; rooms stay local")
        return None
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return None
    return layer


class RemoteSocket:
    """On the host: a room socket of another process, reached through its channel."""

    def __init__(self, router, reply, sid):
        self.router, self.reply, self.sid = router, reply, sid

    def deliver(self, frames):
        message = {"op": "frames", "sid": self.sid, "frames": [str(f) for f in frames]}
        self.router.post(self.reply, message, self._lost)

    def close_later(self, code):
        self.router.post(self.reply, {"op": "close", "sid": self.sid, "code": code})

    def _lost(self):
        self.router.drop_served(self.reply, self.sid)


class RemoteRoom:
    """
    On a relaying process: the doc's room as a socket sees it (``LiveRoom``'s calls
    the room consumer makes), each call sent to the host.
    """

    def __init__(self, router, host, sid, socket, doc):
        self.router, self.host, self.sid, self.socket, self.doc = router, host, sid, socket, doc

    def _send(self, op, **fields):
        message = {"op": op, "sid": self.sid, "reply": self.router.channel, **fields}
        self.router.post(self.host, message, lambda: self.socket.close_later(CLOSE_RETRY))

    def subscribe(self, socket, query_id, query, shape):
        self._send("subscribe", qid=query_id, ast=to_json(query))

    def subscribe_lmid(self, socket, query_id, shape, client_id):
        self._send("lmid", qid=query_id, client=client_id)

    def adopt_lmid(self, sub):
        self._send("adopt", qid=sub.query_id, client=sub.client_id, lmid=sub.lmid)

    def unsubscribe(self, socket, query_id):
        self._send("unsubscribe", qid=query_id)

    def mutate(self, socket, envelope):
        self._send("mutate", envelope=envelope)

    def leave(self):
        self.router.forget(self.sid)
        self._send("leave")

    def __repr__(self):
        return f"<RemoteRoom {self.doc!r} at {self.host}>"


class RoomRouter:
    """
    This process's end of the routing (one per ``RoomRegistry``): its channel, the
    sockets it relays (``RemoteRoom``) and those it serves for others
    (``RemoteSocket``). ``start(loop)`` runs it on an event loop (the server's).
    """

    def __init__(self, registry, layer):
        self.registry = registry
        self.layer = layer
        self.channel = None
        self.loop = None
        self._named = threading.Event()  # set once the channel exists
        self._outbox = None  # asyncio.Queue: what to send, in order (one sender task)
        self._work = None  # asyncio.Queue: the host's work, in order (one worker task)
        self._tasks = []
        self._tokens = itertools.count(1)
        self._answers = {}  # token -> asyncio.Future: replies to this process's requests
        self._relayed = {}  # sid -> RemoteRoom: sockets here, served by another host
        self._served = {}  # (reply channel, sid) -> (RemoteSocket, LiveRoom): served here

    # --- the loop -------------------------------------------------------------------------

    def start(self, loop):
        """Run on ``loop`` (idempotent; call it on that loop)."""
        if self.loop is not None:
            return
        self.loop = loop
        self._outbox = asyncio.Queue()
        self._work = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(self._run())]

    async def _run(self):
        try:
            self.channel = await self.layer.new_channel(PREFIX)
        except Exception:
            logger.exception("rindle rooms: no channel for routing; rooms stay local")
            self._named.set()
            return
        self._named.set()
        for loop in (self._send_loop, self._work_loop, self._ping_loop):
            self._tasks.append(asyncio.ensure_future(loop()))
        while True:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("rindle rooms: receiving a routed message failed")
                await asyncio.sleep(0.1)
                continue
            try:
                self._handle(message)
            except Exception:  # one bad message must not stop the routing
                logger.exception("rindle rooms: a routed %r failed", message.get("op"))

    def named(self, timeout=ATTACH_SECONDS):
        """This process's channel, waiting up to ``timeout`` for it (None: none)."""
        self._named.wait(timeout)
        return self.channel

    def close(self):
        for task in self._tasks:
            try:
                self.loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop has ended, and its tasks with it
                pass

    # --- sending ----------------------------------------------------------------------------

    def post(self, channel, message, on_failure=None):
        """Send ``message`` to ``channel`` after everything posted before (any thread)."""
        item = (channel, message, on_failure)
        try:
            self.loop.call_soon_threadsafe(self._outbox.put_nowait, item)
        except RuntimeError:  # the loop has ended: so has the server
            if on_failure is not None:
                on_failure()

    async def _send_loop(self):
        while True:
            channel, message, on_failure = await self._outbox.get()
            try:
                await self.layer.send(channel, {"type": "rindle.room", **message})
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning(
                    "rindle rooms: a %r to %s was not sent: %s", message["op"], channel, exc
                )
                if on_failure is not None:
                    on_failure()

    async def _request(self, channel, message, timeout=ATTACH_SECONDS):
        token = next(self._tokens)
        answer = self.loop.create_future()
        self._answers[token] = answer
        try:
            self.post(channel, {**message, "reply": self.channel, "token": token})
            return await asyncio.wait_for(answer, timeout)
        finally:
            self._answers.pop(token, None)

    # --- the relaying end -------------------------------------------------------------------

    def route(self, doc, socket):
        """
        A thread's question: ``(room, epoch)``: the ``RemoteRoom`` of ``doc`` for
        ``socket`` when another live process hosts it, else None and the epoch read
        (None: never claimed), which a boot here must claim from (a compare-and-swap:
        of processes racing to host the doc, one wins and the others route to it).
        Blocks up to ATTACH_SECONDS.
        """
        epoch, host = self.registry.engine.room_placement(doc)
        if self.named() is None or not host or host == self.channel:
            return None, epoch
        sid = uuid.uuid4().hex
        request = {"op": "join", "doc": doc, "sid": sid}
        future = asyncio.run_coroutine_threadsafe(self._request(host, request), self.loop)
        try:
            answer = future.result(ATTACH_SECONDS + 0.5)
        except Exception:  # no answer: the host is gone (or too slow to keep the room)
            future.cancel()
            self.post(host, {"op": "leave", "sid": sid, "reply": self.channel})
            logger.info("rindle rooms: %s did not answer for %r; booting it here", host, doc)
            return None, epoch
        if not answer.get("ok"):
            return None, epoch
        room = RemoteRoom(self, host, sid, socket, doc)
        self._relayed[sid] = room
        return room, epoch

    def forget(self, sid):
        self._relayed.pop(sid, None)

    async def _ping_loop(self):
        while True:
            await asyncio.sleep(PING_SECONDS)
            hosts, relays = {}, {}
            for room in list(self._relayed.values()):
                hosts.setdefault(room.host, []).append(room.sid)
            for reply, sid in list(self._served):
                relays.setdefault(reply, []).append(sid)
            for host, sids in hosts.items():
                asyncio.ensure_future(self._ping(host, "host", sids))
            for relay, sids in relays.items():
                asyncio.ensure_future(self._ping(relay, "relay", sids))

    async def _ping(self, channel, role, sids):
        """Ask ``channel`` (the ``role`` end of ``sids``) which it still has; end the rest."""
        request = {"op": "ping", "role": role, "sids": sids}
        try:
            answer = await self._request(channel, request, PING_TIMEOUT)
            gone = set(answer.get("gone") or ())
        except Exception:
            logger.warning("rindle rooms: %s %s did not answer a ping", role, channel)
            gone = set(sids)
        for sid in gone:
            if role == "host":
                room = self._relayed.pop(sid, None)
                if room is not None:
                    room.socket.close_later(CLOSE_RETRY)
            else:
                self.drop_served(channel, sid)

    # --- both ends: what arrives ------------------------------------------------------------

    def _handle(self, message):
        op = message.get("op")
        if op == "answer":
            answer = self._answers.get(message.get("token"))
            if answer is not None and not answer.done():
                answer.set_result(message)
            return
        if op == "frames":
            room = self._relayed.get(message["sid"])
            if room is not None:
                room.socket.deliver(message["frames"])
            return
        if op == "close":
            room = self._relayed.pop(message["sid"], None)
            if room is not None:
                room.socket.close_later(message["code"])
            return
        if op == "ping":
            if message.get("role") == "host":  # asked as the host of these sockets
                have = {sid for reply, sid in self._served if reply == message["reply"]}
            else:
                have = set(self._relayed)
            self._answer(message, gone=[sid for sid in message["sids"] if sid not in have])
            return
        self._work.put_nowait(message)

    async def _work_loop(self):
        """The host's work, in arrival order, one message at a time on a worker thread."""
        while True:
            message = await self._work.get()
            op = message.get("op")
            try:
                if op == "join":
                    ok = await workers.run_db(self._join, message)
                    self._answer(message, ok=ok)
                    continue
                handler = getattr(self, f"_on_{op}", None)
                served = self._served.get((message.get("reply"), message.get("sid")))
                if handler is not None and served is not None:  # else: no longer served here
                    await workers.run_db(handler, *served, message)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad message must not stop the routing
                logger.exception("rindle rooms: a routed %r failed", op)

    def _answer(self, request, **fields):
        self.post(request["reply"], {"op": "answer", "token": request["token"], **fields})

    # --- the host's end ---------------------------------------------------------------------

    def _join(self, message):
        room = self.registry.hosting(message["doc"])  # a claim made here may still be booting
        if room is None:
            return False
        remote = RemoteSocket(self, message["reply"], message["sid"])
        with room.lock:
            if room.closed:
                return False
            room.sockets.add(remote)
        self._served[(remote.reply, remote.sid)] = (remote, room)
        return True

    def drop_served(self, reply, sid):
        served = self._served.pop((reply, sid), None)
        if served is not None:
            workers.submit_db(self._leave_room, *served)

    def _leave_room(self, remote, room):
        try:
            self.registry.leave(remote, room)
        except Exception:
            logger.exception("rindle rooms: a remote socket's leave failed")

    def _on_leave(self, remote, room, message):
        self._served.pop((remote.reply, remote.sid), None)
        self.registry.leave(remote, room)

    def _on_subscribe(self, remote, room, message):
        engine = self.registry.engine
        query_id = message["qid"]
        try:
            query = parse(message["ast"], engine.tables)
            room.subscribe(remote, query_id, query, wire.NormalizedShape(query, engine.tables))
        except QueryError as exc:
            remote.deliver([wire.query_error(query_id, f"invalid query: {exc}", UNSUPPORTED)])
        except RoomClosed:
            remote.close_later(CLOSE_RETRY)
        except RindleError as exc:
            remote.deliver([wire.query_error(query_id, exc.message, exc.code)])

    def _on_lmid(self, remote, room, message):
        try:
            shape = lmid_shape(self.registry.engine, message["client"])
            room.subscribe_lmid(remote, message["qid"], shape, message["client"])
        except RoomClosed:
            remote.close_later(CLOSE_RETRY)

    def _on_adopt(self, remote, room, message):
        shape = lmid_shape(self.registry.engine, message["client"])
        sub = LmidSub(remote, message["qid"], 1, shape, message["client"], message["lmid"])
        room.adopt_lmid(sub)

    def _on_unsubscribe(self, remote, room, message):
        room.unsubscribe(remote, message["qid"])

    def _on_mutate(self, remote, room, message):
        envelope = message["envelope"]
        try:
            room.mutate(remote, envelope)
        except RoomClosed:
            remote.close_later(CLOSE_RETRY)
        except RindleError as exc:
            extra = {"mid": envelope.get("mid"), "retryable": exc.retryable}
            remote.deliver([wire.error(exc.message, exc.code, **extra)])
