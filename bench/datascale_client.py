#!/usr/bin/env python
"""
The websocket side of bench/datascale.py: a few sockets, many subscriptions, in one
asyncio process. Started by bench/datascale.py, which sends one JSON command per line
on stdin and reads one JSON answer per line on stdout (see ``Controller``).

Every socket authenticates with ``Authorization: Bearer <token>`` (the ``read``
scope, user ``ada``), sends ``init`` and then ``subscribe`` frames in the normalized
mode, and folds each subscription's ``nbatch`` frames into a replica keyed by
primary key, as the published clients do. Frames are stamped with
``time.monotonic()`` when their bytes arrive (the same clock in every process on
Linux, so the bench process compares it with its own and the writer's stamps).

A "ping" is a frame of an unknown type: the server answers it at once with an
``error`` frame, from the event loop, so its round trip says how long that loop
made a socket wait. Watcher sockets ping in a closed loop, at most one ping in
flight and at most one every ``PING_PERIOD`` s (under the server's 50 frames/s).
Every second watcher sends "lock pings" instead: it subscribes a small query the
server holds again (queryId ``LOCK_QUERY_ID``, kept out of the replicas), a cached
shape whose seq 0 the hub builds under its lock, so its round trip says how long
the hub's lock made a socket wait. (Not both from one socket: a ping loop stuck
behind its own lock ping would send no pings while the lock is held.)
"""

import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ws_clients import WebSocket, handshake_request  # noqa: E402

PING = json.dumps({"t": "datascale-ping"})
PING_PERIOD = 0.025
LOCK_QUERY_ID = 9999
HANDSHAKE_TIMEOUT = 30.0  # longer than Daphne's own 5 s, so Daphne's reset is what we see


class AuthSocket(WebSocket):
    """``bench.ws_clients.WebSocket`` with a bearer token on its handshake."""

    def __init__(self, host, port, path, on_text, token):
        super().__init__(host, port, path, on_text)
        self.token = token

    def connection_made(self, transport):
        self.transport = transport
        request = handshake_request(self.host, self.port, self.path, self.key)
        extra = f"Authorization: Bearer {self.token}\r\n\r\n".encode("ascii")
        transport.write(request[:-2] + extra)


class Sub:
    """One subscription's replica: {table: {pk: cells}} folded from its nbatch frames."""

    def __init__(self, query_id, name, args):
        self.query_id, self.name, self.args = query_id, name, args
        self.tables = {}  # from the nhello
        self.rows = {}
        self.problems = []
        self.error = None  # the queryError frame, if any
        self.t_sent = None
        self.t_seq0 = None
        self.last_cv = None
        self.answered = asyncio.get_running_loop().create_future()

    def apply(self, t, batch, edits):
        if batch["seq"] == 0:
            self.rows = {}
            if self.t_seq0 is None:
                self.t_seq0 = t
        self.last_cv = batch["cv"]
        for op in batch["ops"]:
            spec = self.tables.get(op["table"])
            if spec is None:
                self.problems.append(f"op on table {op['table']!r} not in the hello")
                continue
            rows = self.rows.setdefault(op["table"], {})
            pk = spec["primaryKey"]
            kind = op["op"]
            if kind == "add":
                rows[tuple(op["row"][i] for i in pk)] = op["row"]
            elif kind == "remove":
                if rows.pop(tuple(op["row"][i] for i in pk), None) is None:
                    self.problems.append(f"seq {batch['seq']}: remove of a row not held")
            elif kind == "edit":
                if rows.pop(tuple(op["old"][i] for i in pk), None) is None:
                    self.problems.append(f"seq {batch['seq']}: edit of a row not held")
                rows[tuple(op["new"][i] for i in pk)] = op["new"]
                if op["table"] == "issue":
                    title = op["new"][spec["columns"].index("title")]
                    edits.setdefault(title, t)
            else:
                self.problems.append(f"unknown op {kind!r}")
        if not self.answered.done():
            self.answered.set_result(t)

    def dump(self):
        return {
            "name": self.name,
            "args": self.args,
            "tables": list(self.tables.values()),
            "rows": [
                [table, cells] for table, rows in self.rows.items() for cells in rows.values()
            ],
            "problems": self.problems[:10],
            "error": self.error,
            "seq0": self.t_seq0 is not None,
        }


class Conn:
    """One socket: its subscriptions by queryId, and its pings."""

    def __init__(self, controller, name):
        self.controller, self.name = controller, name
        self.ws = None
        self.tcp = None  # when its TCP connection was accepted
        self.subs = {}
        self.pong = None
        self.lock_pong = None
        self.errors = []

    def on_text(self, t, payload):
        frame = json.loads(payload)
        kind = frame.get("t")
        if frame.get("queryId") == LOCK_QUERY_ID and kind in ("nbatch", "queryError", "error"):
            if self.lock_pong is not None and not self.lock_pong.done():
                self.lock_pong.set_result(t)
            if kind != "nbatch":
                self.errors.append(frame)
            return
        if kind == "nbatch":
            sub = self.subs.get(frame["queryId"])
            if sub is not None:
                sub.apply(t, frame["batch"], self.controller.edits)
        elif kind == "nhello":
            sub = self.subs.get(frame["queryId"])
            if sub is not None:
                sub.tables = {x["name"]: x for x in frame["hello"]["tables"]}
        elif kind == "queryError":
            sub = self.subs.get(frame.get("queryId"))
            if sub is not None:
                sub.error = frame
                if not sub.answered.done():
                    sub.answered.set_result(t)
        elif kind == "error":
            sub = self.subs.get(frame.get("queryId"))
            if sub is not None and not sub.answered.done():  # a subscribe refused as a frame
                sub.error = frame
                sub.answered.set_result(t)
            elif self.pong is not None and not self.pong.done():
                self.pong.set_result(t)
            else:
                self.errors.append(frame)
        elif kind != "progress":
            self.errors.append(frame)

    def subscribe(self, spec):
        sub = Sub(spec["queryId"], spec["name"], spec.get("args"))
        self.subs[sub.query_id] = sub
        frame = {"t": "subscribe", "mode": "normalized", **spec}
        sub.t_sent = time.monotonic()
        self.ws.send_text(json.dumps(frame))
        return sub

    async def ping(self):
        self.pong = asyncio.get_running_loop().create_future()
        t = time.monotonic()
        self.ws.send_text(PING)
        got = await asyncio.wait_for(self.pong, 60)
        return t, got - t

    async def lock_ping(self, spec):
        """Subscribe ``spec`` (a query the server holds) again: -> its seq 0."""
        self.lock_pong = asyncio.get_running_loop().create_future()
        frame = {"t": "subscribe", "mode": "normalized", **spec, "queryId": LOCK_QUERY_ID}
        t = time.monotonic()
        self.ws.send_text(json.dumps(frame))
        got = await asyncio.wait_for(self.lock_pong, 60)
        return t, got - t


def answer(sub):
    out = {"queryId": sub.query_id, "name": sub.name, "t_sent": sub.t_sent}
    if sub.answered.done():
        out["t_answer"] = sub.answered.result()  # the seq 0 or the refusal
    if sub.error is not None:
        out.update(kind="queryError", code=sub.error.get("code"), message=sub.error.get("message"))
    elif sub.t_seq0 is not None:
        out.update(kind="nbatch", t_seq0=sub.t_seq0, rows=sum(len(r) for r in sub.rows.values()))
    else:
        out.update(kind="none")
    return out


class Controller:
    """
    Commands, each answered with one JSON line (``ok`` plus its fields):

    - ``start {host, port, path, token, name, sub, deadline}``: connect again and again
      until a handshake is accepted (counting connections refused, and handshakes
      reset or closed by the server), then subscribe ``sub`` and wait for its seq 0;
      a subscribe unanswered for ``answer_timeout`` s is counted and retried on a new
      socket. Times are ``time.monotonic()``.
    - ``open {conns: [{name, subs}], timeout}``: more sockets, opened together, each
      with its subscriptions, until each has its seq 0 or a queryError.
    - ``close {conns}``: close these sockets.
    - ``subscribe {conn, sub, timeout}``: one subscription on an open socket.
    - ``watch {conns, lock_sub}`` / ``unwatch``: start / stop the ping loops (with
      ``lock_sub``, {name, args}: every second socket lock-pings with it instead);
      ``unwatch`` returns every ping
      as [conn, t_sent, rtt, "ping" | "lock"].
    - ``edits``: {title: first receipt time} of every issue edit seen.
    - ``dump {path}``: every subscription's replica, to ``path``.
    - ``quit``.
    """

    def __init__(self):
        self.conns = {}
        self.edits = {}
        self.host = self.port = self.path = self.token = None
        self.watchers = []
        self.watching = False
        self.pings = []

    async def run(self):
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 24)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while True:
            line = await reader.readline()
            if not line:
                return
            msg = json.loads(line)
            try:
                reply = await getattr(self, "cmd_" + msg["cmd"])(msg)
                reply.setdefault("ok", True)
            except Exception as exc:  # reported to the bench process, which stops
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
            if msg["cmd"] == "quit":
                return

    async def connect(self, conn):
        """TCP connect (``ConnectionRefusedError`` while nothing listens), then the
        handshake (``ConnectionError``/``TimeoutError`` when it is reset or refused)."""
        loop = asyncio.get_running_loop()
        _, ws = await loop.create_connection(
            lambda: AuthSocket(self.host, self.port, self.path, conn.on_text, self.token),
            self.host,
            self.port,
        )
        conn.tcp = time.monotonic()
        try:
            await asyncio.wait_for(ws.open, HANDSHAKE_TIMEOUT)
        except BaseException:
            ws.close()
            raise
        conn.ws = ws
        ws.send_text(json.dumps({"t": "init", "clientID": f"datascale-{conn.name}-{os.getpid()}"}))

    async def cmd_start(self, msg):
        self.host, self.port, self.path = msg["host"], msg["port"], msg["path"]
        self.token = msg["token"]
        deadline = time.monotonic() + msg["deadline"]
        refused = resets = unanswered = 0
        t_listen = None
        failures = []
        while time.monotonic() < deadline:
            conn = Conn(self, msg["name"])
            try:
                await self.connect(conn)
            except ConnectionRefusedError:  # nothing listens yet: not a handshake
                refused += 1
                await asyncio.sleep(0.02)
                continue
            except (OSError, ConnectionError, TimeoutError) as exc:
                resets += 1  # the TCP connection was accepted, its handshake was not
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
                t_listen = t_listen or conn.tcp
                continue
            t_listen = t_listen or conn.tcp
            t_accept = time.monotonic()
            sub = conn.subscribe(msg["sub"])
            left = max(0.1, min(msg["answer_timeout"], deadline - time.monotonic()))
            try:
                await asyncio.wait_for(asyncio.shield(sub.answered), left)
            except TimeoutError:
                unanswered += 1
                failures.append(f"subscribe unanswered for {left:.0f} s")
                conn.ws.close()
                continue
            self.conns[conn.name] = conn
            return {
                "t_listen": t_listen,
                "t_accept": t_accept,
                "refused": refused,
                "resets": resets,
                "unanswered": unanswered,
                "failures": failures[:10],
                "answer": answer(sub),
            }
        return {
            "ok": False,
            "error": f"no answered subscription before the deadline: {failures[:5]}",
            "refused": refused,
            "resets": resets,
            "unanswered": unanswered,
        }

    async def wait_subs(self, subs, timeout):
        pending = [s.answered for s in subs if not s.answered.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    async def cmd_open(self, msg):
        """``conns`` [{name, subs}]: sockets opened together, each with its subscriptions."""

        async def one(spec):
            conn = Conn(self, spec["name"])
            await self.connect(conn)
            self.conns[conn.name] = conn
            return [conn.subscribe(s) for s in spec["subs"]]

        subs = [s for group in await asyncio.gather(*map(one, msg["conns"])) for s in group]
        await self.wait_subs(subs, msg["timeout"])
        return {"answers": [answer(s) for s in subs]}

    async def cmd_close(self, msg):
        """Close the sockets ``conns`` (their subscriptions leave the dump)."""
        conns = [self.conns.pop(n) for n in msg["conns"]]
        for conn in conns:
            conn.ws.close()
        await asyncio.wait([c.ws.lost for c in conns], timeout=10)
        return {}

    async def cmd_subscribe(self, msg):
        conn = self.conns[msg["conn"]]
        sub = conn.subscribe(msg["sub"])
        await self.wait_subs([sub], msg["timeout"])
        return {"answer": answer(sub)}

    async def ping_loop(self, conn, offset, lock_sub):
        await asyncio.sleep(offset)
        # Not ``while True``: asyncio.wait_for (3.11) swallows a cancel that arrives
        # as its future completes, and the loop would go on pinging forever.
        while self.watching:
            if lock_sub is not None:
                t, rtt = await conn.lock_ping(lock_sub)
                self.pings.append([conn.name, t, rtt, "lock"])
            else:
                t, rtt = await conn.ping()
                self.pings.append([conn.name, t, rtt, "ping"])
            await asyncio.sleep(max(0.0, PING_PERIOD - rtt))

    async def cmd_watch(self, msg):
        self.pings = []
        self.watching = True
        names = msg["conns"]
        self.watchers = [
            asyncio.ensure_future(
                self.ping_loop(
                    self.conns[n],
                    i * PING_PERIOD / len(names),
                    msg.get("lock_sub") if i % 2 else None,
                )
            )
            for i, n in enumerate(names)
        ]
        return {}

    async def cmd_unwatch(self, msg):
        self.watching = False
        for task in self.watchers:
            task.cancel()
        await asyncio.gather(*self.watchers, return_exceptions=True)
        self.watchers = []
        return {"pings": self.pings}

    async def cmd_edits(self, msg):
        return {"edits": self.edits}

    async def cmd_dump(self, msg):
        out = {
            name: {str(qid): sub.dump() for qid, sub in conn.subs.items()}
            for name, conn in self.conns.items()
        }
        Path(msg["path"]).write_text(json.dumps(out))
        return {"path": msg["path"]}

    async def cmd_quit(self, msg):
        self.watching = False
        for task in self.watchers:
            task.cancel()
        for conn in self.conns.values():
            if conn.ws is not None:
                conn.ws.close()
        return {}


def main():
    asyncio.run(Controller().run())


if __name__ == "__main__":
    main()
