"""
bench/room_live.py's raw workload: the server's own capacity, without a client
library's queue. Two raw websocket clients (bench/ws_clients.py's) hold the doc:
A sends ``n`` ``editTitle`` mutations, at most ``WINDOW`` past its confirmed lmid
(as a client's queue does), B watches the issue row. Over
the room socket (``via="room"``) or the main socket (``via="main"``, the slow path:
each mutation its own engine transaction, reaching B through the outbox and the
hub). Measured: mutations/s until B saw the last, each mutation's send -> B's
receipt (p50/p99), and until A's lmid confirmed the last (durable).
"""

import asyncio
import json
import statistics
import time
import urllib.request

from bench.common import BenchError, pct
from bench.ws_clients import WebSocket, encode_frame

CSRF = "k" * 32
ISSUE = "i1"
WINDOW = 64  # mutations in flight past the confirmed lmid


def lease(port, cookie, client_id):
    body = json.dumps({"name": "issueDetail", "args": ISSUE, "clientId": client_id}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/rindle/query",
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-CSRFToken": CSRF,
            "Cookie": f"{cookie}; csrftoken={CSRF}",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


class CookieSocket(WebSocket):
    """The bench's raw client, with a session cookie on the handshake."""

    cookie = ""

    def connection_made(self, transport):
        self.transport = transport
        transport.write(
            (
                f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {self.key}\r\nSec-WebSocket-Version: 13\r\n"
                f"Origin: http://{self.host}:{self.port}\r\nCookie: {self.cookie}\r\n\r\n"
            ).encode("latin-1")
        )


class Peer:
    def __init__(self, name):
        self.name = name
        self.frames = asyncio.Queue()
        self.seen = {}  # title -> receipt time
        self.lmid = 0
        self.lmid_at = None

    def on_text(self, t, payload):
        msg = json.loads(payload)
        if msg.get("t") == "nbatch":
            for op in msg["batch"]["ops"]:
                row = op.get("row") or op.get("new")
                if op["table"] == "issue" and row:
                    self.seen.setdefault(row[1], t)
                elif op["table"] == "_rindle_client_mutations" and row:
                    self.lmid, self.lmid_at = row[1], t
        elif msg.get("t") in ("error", "queryError"):
            raise BenchError(f"{self.name}: {msg}")
        self.frames.put_nowait(msg)

    async def until(self, kind, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            msg = await asyncio.wait_for(self.frames.get(), max(0.01, deadline - time.monotonic()))
            if msg.get("t") == kind:
                return msg


async def open_socket(port, path, peer, cookie=""):
    loop = asyncio.get_running_loop()

    def make():
        ws = CookieSocket("127.0.0.1", port, path, peer.on_text)
        ws.cookie = cookie
        return ws

    _, ws = await loop.create_connection(make, "127.0.0.1", port)
    await asyncio.wait_for(ws.open, 10)
    return ws


def send(ws, frame):
    ws.transport.write(encode_frame(json.dumps(frame).encode()))


async def run(port, cookie, n, via, tag):
    ids = f"raw-a-{tag}", f"raw-b-{tag}"
    a_lease = lease(port, cookie, ids[0])
    b_lease = lease(port, cookie, ids[1])
    if via == "room":
        a_lease = lease(port, cookie, ids[0])  # the doorbell's re-lease: now room-served
        if "realtime" not in a_lease or "realtime" not in b_lease:
            raise BenchError("the leases are not room-served")
        path = a_lease["realtime"]["wsEndpoint"].split(f"{port}", 1)[1]
        tokens = a_lease["realtime"]["roomToken"], b_lease["realtime"]["roomToken"]
    else:
        path = "/ws/rindle/"
        tokens = a_lease["leaseToken"], b_lease["leaseToken"]
    a, b = Peer("A"), Peer("B")
    wa = await open_socket(port, path, a, cookie)
    wb = await open_socket(port, path, b, cookie)
    for ws, peer, client, token in ((wa, a, ids[0], tokens[0]), (wb, b, ids[1], tokens[1])):
        send(ws, {"t": "init", "clientID": client})
        send(ws, {"t": "subscribe", "queryId": 1, "leaseToken": token, "mode": "normalized"})
        await peer.until("progress")
    send(wa, {"t": "subscribe", "queryId": 0, "name": "_rindle/clientLmid", "mode": "normalized"})
    await a.until("progress")
    sent = {}
    start = time.monotonic()
    deadline = start + 120
    mid = 0
    last = f"{tag} burst {n}"
    # At most WINDOW mutations ahead of the confirmed lmid, as a client's queue keeps.
    while last not in b.seen or a.lmid < n:
        while mid < n and mid - a.lmid < WINDOW:
            mid += 1
            title = f"{tag} burst {mid}"
            args = {"id": ISSUE, "title": title, "updatedAt": 10_000 + mid}
            envelope = {"clientID": ids[0], "mid": mid, "name": "editTitle", "args": args}
            sent[title] = time.monotonic()
            send(wa, {"t": "pushMutation", "envelope": envelope})
        if time.monotonic() > deadline:
            raise BenchError(f"{via}: B saw {len(b.seen)} of {n}, A's lmid {a.lmid}")
        await asyncio.sleep(0.0005)
    receipts = [(b.seen[t] - sent[t]) * 1000 for t in sent if t in b.seen]
    wa.close()
    wb.close()
    return {
        "rate": n / (b.seen[last] - start),
        "p50": statistics.median(receipts),
        "p99": pct(receipts, 99),
        "confirm_ms": (a.lmid_at - start) * 1000,
        "missed": n - len(receipts),
    }
