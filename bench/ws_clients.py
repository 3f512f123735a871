#!/usr/bin/env python
"""
The client side of bench/ws.py: many websocket connections in one asyncio process.

    .venv/bin/python bench/ws_clients.py      # started by bench/ws.py, not by hand

It reads one JSON command per line on stdin and answers each with one JSON line on
stdout (``open``, ``wait``, ``collect``, ``close``, ``quit``); see ``Controller``.
A connection stamps every frame with ``time.monotonic()`` when its bytes arrive,
before any parsing; on Linux that clock is the same in every process, so the bench
process can subtract its commit times from it.

The websocket client is a small RFC 6455 implementation on ``asyncio.Protocol``
(text frames, fragmentation, ping/pong, close): the per-frame cost of the measuring
side stays low enough for 1,000 connections on a 2-core machine, and a connection
can stop reading its socket on request (the slow-client test).
"""

import asyncio
import base64
import gc
import hashlib
import json
import os
import socket
import sys
import time

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
CONNECT_CONCURRENCY = 50  # Twisted listens with a backlog of 50
SLOW_RCVBUF = 4096  # the kernel doubles it; small, so the stall reaches the server soon


# --- the websocket protocol -------------------------------------------------------------


def handshake_request(host, port, path, key):
    return (
        f"GET {path} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\n"
        "Sec-WebSocket-Version: 13\r\n"
        f"Origin: http://{host}:{port}\r\n"
        "\r\n"
    ).encode("ascii")


def accept_value(key):
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + GUID).digest()).decode("ascii")


def check_handshake(head, key):
    """Raises ``ConnectionError`` unless ``head`` (the response headers) accepts ``key``."""
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or status[1] != "101":
        raise ConnectionError(f"handshake refused: {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("sec-websocket-accept") != accept_value(key):
        raise ConnectionError(f"handshake: wrong Sec-WebSocket-Accept in {head!r}")


def encode_frame(payload, opcode=0x1):
    """A masked client frame (every client frame is masked, RFC 6455 §5.3)."""
    n = len(payload)
    head = bytearray([0x80 | opcode])
    if n < 126:
        head.append(0x80 | n)
    elif n < 1 << 16:
        head.append(0x80 | 126)
        head += n.to_bytes(2, "big")
    else:
        head.append(0x80 | 127)
        head += n.to_bytes(8, "big")
    mask = os.urandom(4)
    head += mask
    if n:
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        payload = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")
    return bytes(head) + payload


class FrameReader:
    """Server frames (never masked) out of a byte stream: complete messages only."""

    def __init__(self):
        self.buf = bytearray()
        self.parts = []
        self.opcode = None

    def feed(self, data):
        buf = self.buf
        buf += data
        out = []
        pos, end_of_data = 0, len(buf)
        while end_of_data - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            if b1 & 0x80:
                raise ConnectionError("the server sent a masked frame")
            length, head = b1 & 0x7F, 2
            if length == 126:
                if end_of_data - pos < 4:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
            elif length == 127:
                if end_of_data - pos < 10:
                    break
                length, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
            end = pos + head + length
            if end > end_of_data:
                break
            payload = bytes(buf[pos + head : end])
            pos = end
            opcode = b0 & 0x0F
            if opcode >= 0x8:  # control frames are never fragmented
                out.append((opcode, payload))
                continue
            if opcode:
                self.opcode, self.parts = opcode, [payload]
            else:
                self.parts.append(payload)
            if b0 & 0x80:
                out.append((self.opcode, b"".join(self.parts)))
                self.parts = []
        del buf[:pos]
        return out


class WebSocket(asyncio.Protocol):
    """One client connection; ``on_text(t, payload)`` is called for each text message."""

    def __init__(self, host, port, path, on_text):
        self.host, self.port, self.path = host, port, path
        self.on_text = on_text
        self.key = base64.b64encode(os.urandom(16)).decode("ascii")
        self.head = b""
        self.open = asyncio.get_running_loop().create_future()
        self.lost = asyncio.get_running_loop().create_future()
        self.reader = FrameReader()
        self.transport = None
        self.closing = False

    def connection_made(self, transport):
        self.transport = transport
        transport.write(handshake_request(self.host, self.port, self.path, self.key))

    def data_received(self, data):
        t = time.monotonic()
        if not self.open.done():
            self.head += data
            head, sep, rest = self.head.partition(b"\r\n\r\n")
            if not sep:
                return
            try:
                check_handshake(head, self.key)
            except ConnectionError as exc:
                self.open.set_exception(exc)
                self.transport.close()
                return
            self.open.set_result(True)
            self.head = b""
            data = rest
            if not data:
                return
        for opcode, payload in self.reader.feed(data):
            if opcode == 0x1:
                self.on_text(t, payload)
            elif opcode == 0x9:
                self.transport.write(encode_frame(payload, 0xA))
            elif opcode == 0x8:
                if not self.closing:
                    self.closing = True
                    self.transport.write(encode_frame(payload[:2], 0x8))
                self.transport.close()

    def connection_lost(self, exc):
        if not self.open.done():
            self.open.set_exception(exc or ConnectionError("closed during the handshake"))
        if not self.lost.done():
            self.lost.set_result(exc)

    def send_text(self, text):
        self.transport.write(encode_frame(text.encode("utf-8")))

    def close(self):
        if self.transport is None or self.transport.is_closing():
            return
        if not self.closing:
            self.closing = True
            self.transport.write(encode_frame((1000).to_bytes(2, "big"), 0x8))
        self.transport.close()


async def connect(host, port, path, on_text, *, rcvbuf=None, timeout=10.0):
    loop = asyncio.get_running_loop()
    sock = None
    if rcvbuf:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
        _, ws = await loop.create_connection(
            lambda: WebSocket(host, port, path, on_text), sock=sock
        )
    else:
        _, ws = await asyncio.wait_for(
            loop.create_connection(lambda: WebSocket(host, port, path, on_text), host, port),
            timeout,
        )
    await asyncio.wait_for(ws.open, timeout)
    return ws


class BlockingWebSocket:
    """A write-only client on a blocking socket: the bench process's group publisher."""

    def __init__(self, host, port, path, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        key = base64.b64encode(os.urandom(16)).decode("ascii")
        self.sock.sendall(handshake_request(host, port, path, key))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            head += chunk
        check_handshake(head.partition(b"\r\n\r\n")[0], key)

    def send_text(self, text):
        self.sock.sendall(encode_frame(text.encode("utf-8")))

    def close(self):
        try:
            self.sock.sendall(encode_frame((1000).to_bytes(2, "big"), 0x8))
        except OSError:
            pass
        self.sock.close()


# --- subscribers ------------------------------------------------------------------------


class Subscriber:
    """
    One connection's view of the stream: every ``nbatch`` with its receipt time, the
    hello, progress count and errors. Frames identical across connections (the same
    queryId, epoch and seq of a shared query) are parsed once per phase.

    Like a real client, a fast subscriber told ``shed`` (retryable) subscribes again
    after ``retryAfterMs``; the new epoch starts with a fresh seq 0. The slow one
    stops reading its socket once ready, until ``collect``.
    """

    def __init__(self, index, cache, subscribe=None, slow=False):
        self.index = index
        self.cache = cache
        self.subscribe = subscribe  # the subscribe frame (rindle) or None (group)
        self.slow = slow
        self.ws = None
        self.hello = None
        self.batches = []  # (t, epoch, seq, cv, ops)
        self.last_cv = -1
        self.progress = 0
        self.sheds = 0
        self.errors = []  # queryError / error frames other than a shed
        self.other = []  # anything else, for the report
        self.ready = asyncio.get_running_loop().create_future()
        self.bytes = 0
        self.frames = 0

    def start(self):
        if self.subscribe is not None:
            self.ws.send_text(json.dumps({"t": "init", "clientID": f"bench-{self.index}"}))
            self.ws.send_text(self.subscribe)

    def on_text(self, t, payload):
        if self.ready.done():  # the increments only, not the hello and seq 0
            self.frames += 1
            self.bytes += len(payload)
        frame = self.cache.get(payload)
        if frame is None:
            frame = json.loads(payload)
            self.cache[payload] = frame
        kind = frame.get("t")
        if kind == "nbatch":
            batch = frame["batch"]
            self.batches.append((t, batch["epoch"], batch["seq"], batch["cv"], batch["ops"]))
            self.last_cv = batch["cv"]
        elif kind == "progress":
            self.progress += 1
            if not self.ready.done():
                self.ready.set_result(t)
                if self.slow:
                    self.ws.transport.pause_reading()
        elif kind == "nhello":
            self.hello = frame["hello"]
        elif kind == "joined":
            if not self.ready.done():
                self.ready.set_result(t)
        elif kind == "queryError" and frame.get("code") == "shed":
            self.sheds += 1
            if not self.slow and self.subscribe is not None:
                delay = frame.get("retryAfterMs", 1000) / 1000
                asyncio.get_running_loop().call_later(delay, self.resubscribe)
        elif kind in ("queryError", "error"):
            self.errors.append(frame)
        else:
            self.other.append(frame)

    def resubscribe(self):
        if self.ws is not None and not self.ws.lost.done():
            self.ws.send_text(self.subscribe)

    def fold(self):
        """The client replica, {table: {pk: cells}}: the last seq 0 and the increments
        after it."""
        tables = {t["name"]: t for t in (self.hello or {}).get("tables", [])}
        view, problems = {}, []
        for _t, epoch, seq, _cv, ops in self.batches:
            if seq == 0:
                view = {}
            for op in ops:
                spec = tables.get(op["table"])
                if spec is None:
                    problems.append(f"seq {seq}: op on table {op['table']!r} not in the hello")
                    continue
                rows = view.setdefault(op["table"], {})
                pk = spec["primaryKey"]
                if op["op"] == "add":
                    rows[tuple(op["row"][i] for i in pk)] = op["row"]
                elif op["op"] == "remove":
                    if rows.pop(tuple(op["row"][i] for i in pk), None) is None:
                        problems.append(f"epoch {epoch} seq {seq}: remove of a row not held")
                elif op["op"] == "edit":
                    if rows.pop(tuple(op["old"][i] for i in pk), None) is None:
                        problems.append(f"epoch {epoch} seq {seq}: edit of a row not held")
                    rows[tuple(op["new"][i] for i in pk)] = op["new"]
                else:
                    problems.append(f"seq {seq}: unknown op {op['op']!r}")
        return view, problems

    def summary(self, first_seq):
        """Receipts as [epoch, seq, cv, t]; a gap is a seq that does not follow the one
        before it in its epoch (each epoch starts at ``first_seq``)."""
        gap, previous = False, None
        for _t, epoch, seq, _cv, _ops in self.batches:
            if previous is None or epoch != previous[0]:
                gap |= seq != first_seq or (previous is not None and epoch < previous[0])
            else:
                gap |= seq != previous[1] + 1
            previous = (epoch, seq)
        cvs = [b[3] for b in self.batches]
        return {
            "index": self.index,
            "slow": self.slow,
            "receipts": [[e, seq, cv, round(t, 6)] for t, e, seq, cv, _ops in self.batches],
            "seq_gap": gap,
            "cv_backwards": any(b < a for a, b in zip(cvs, cvs[1:])),
            "progress": self.progress,
            "sheds": self.sheds,
            "errors": self.errors[:5],
            "other": self.other[:5],
            "frames": self.frames,
            "bytes": self.bytes,
            "closed": self.ws is None or self.ws.lost.done(),
        }


# --- the controller --------------------------------------------------------------------


class Controller:
    """
    Commands (one JSON object per line), each answered with one JSON line:

    - ``open``: ``{kind: rindle|group, n, slow, host, port, path, subscribe}`` opens
      ``n`` connections (plus one slow one when ``slow``); a rindle connection sends
      ``init`` and ``subscribe`` and is ready at its first ``progress``; a group
      connection is ready at the server's ``joined``. The slow connection stops
      reading its socket once ready.
    - ``wait``: ``{cv, stall, timeout}`` until every fast connection holds a batch of
      ``cv`` (or nothing arrived for ``stall`` seconds).
    - ``collect``: ``{path, drain}`` resumes the slow connection (up to ``drain`` s
      for a ``shed`` or the last batch), folds every replica and writes them, with
      receipts, to ``path``.
    - ``close``, ``quit``.
    """

    def __init__(self):
        self.subs = []
        self.slow = None
        self.cache = {}
        self.kind = None

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
            except Exception as exc:  # reported to the bench process, which stops
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            cpu = os.times()
            reply["cpu"] = cpu.user + cpu.system
            reply["t"] = time.monotonic()
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
            if msg["cmd"] == "quit":
                return

    async def cmd_open(self, msg):
        gc.collect()
        self.kind, self.cache = msg["kind"], {}
        host, port, path = msg["host"], msg["port"], msg["path"]
        gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
        failures = []

        subscribe = None
        if self.kind == "rindle":
            subscribe = json.dumps({"t": "subscribe", **msg["subscribe"]})

        async def one(i, slow):
            sub = Subscriber(i, self.cache, subscribe, slow)
            async with gate:
                try:
                    sub.ws = await connect(
                        host, port, path, sub.on_text, rcvbuf=SLOW_RCVBUF if slow else None
                    )
                except (TimeoutError, OSError, ConnectionError) as exc:
                    failures.append(f"connection {i}: {type(exc).__name__}: {exc}")
                    return None
                sub.start()
            try:
                await asyncio.wait_for(sub.ready, 60)
            except TimeoutError:
                failures.append(f"connection {i}: not ready after 60 s: {sub.errors[:1]}")
            return sub

        started = time.monotonic()
        n = msg["n"]
        jobs = [one(i, False) for i in range(n)]
        if msg.get("slow"):
            jobs.append(one(n, True))
        subs = [s for s in await asyncio.gather(*jobs) if s is not None]
        self.subs = [s for s in subs if not s.slow]
        self.slow = next((s for s in subs if s.slow), None)
        gc.disable()  # no collector pauses inside the measured phase
        return {
            "ok": not failures,
            "opened": len(subs),
            "failures": failures[:10],
            "seconds": time.monotonic() - started,
        }

    async def cmd_wait(self, msg):
        """Until every fast connection holds ``cv``, or nothing arrived for ``stall``
        seconds, or ``timeout`` passed."""
        started = time.monotonic()
        cv, stall, timeout = msg["cv"], msg["stall"], msg["timeout"]
        seen, last_change = -1, started
        while True:
            now = time.monotonic()
            behind = sum(1 for s in self.subs if s.last_cv < cv)
            count = sum(len(s.batches) for s in self.subs)
            if count != seen:
                seen, last_change = count, now
            if not behind or now - last_change > stall or now - started > timeout:
                return {"ok": True, "behind": behind, "seconds": now - started}
            await asyncio.sleep(0.005)

    async def cmd_collect(self, msg):
        slow = None
        if self.slow is not None:
            s = self.slow
            paused_cv = s.last_cv
            s.ws.transport.resume_reading()
            deadline = time.monotonic() + msg["drain"]
            while time.monotonic() < deadline and not s.sheds and s.last_cv < msg["cv"]:
                await asyncio.sleep(0.01)
            slow = {**s.summary(0), "cv_when_paused": paused_cv, "shed": s.sheds > 0}
            if self.kind == "rindle":
                _view, slow["fold_problems"] = s.fold()
        gc.enable()
        first = 0 if self.kind == "rindle" else 1
        views = {}  # canonical view -> connection indexes holding it
        conns = []
        for s in self.subs:
            entry = s.summary(first)
            if self.kind == "rindle":
                view, problems = s.fold()
                entry["fold_problems"] = problems[:5]
                canon = json.dumps(
                    sorted([table, row] for table, rows in view.items() for row in rows.values()),
                    separators=(",", ":"),
                )
                views.setdefault(canon, []).append(s.index)
            conns.append(entry)
        with open(msg["path"], "w") as f:
            json.dump(
                {
                    "connections": conns,
                    "slow": slow,
                    "views": [{"rows": json.loads(k), "holders": v} for k, v in views.items()],
                },
                f,
            )
        return {"ok": True, "path": msg["path"]}

    async def cmd_close(self, msg):
        subs = self.subs + ([self.slow] if self.slow else [])
        for s in subs:
            if s.ws is not None:
                s.ws.close()
        lost = [s.ws.lost for s in subs if s.ws is not None]
        if lost:
            await asyncio.wait(lost, timeout=10)
        self.subs, self.slow, self.cache = [], None, {}
        gc.enable()
        gc.collect()
        return {"ok": True}

    async def cmd_quit(self, msg):
        await self.cmd_close(msg)
        return {"ok": True}


def main():
    asyncio.run(Controller().run())


if __name__ == "__main__":
    main()
