"""
A socket is served while the process still loads (issue 16, items 1 and 2).

The hub's start (``LiveQueries.start``: the hydration) is held on a gate here, as
a large database holds it for seconds. Handshakes made meanwhile must be accepted
at once; what they ask for is answered when the data is ready, never dropped; and a
handshake the client gives up on (a reset) or that Daphne kills (it cancels an
application ``application_close_timeout`` seconds after its socket closed) must
leave nothing behind: not a count under its principal (``WS_MAX_SOCKETS_PER_PRINCIPAL``)
nor a connection in the hub.
"""

import asyncio
import threading

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from project.demo.models import User
from rindle_app.ivm.live import LiveQueries
from rindle_app.realtime import limits
from rindle_app.realtime.hub import Hub
from rindle_app.runtime import get_runtime

from .conftest import ORIGIN, Client, application, eventually

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async
PRINCIPAL = "address:?"  # WebsocketCommunicator's scope has no client address
GATE_TIMEOUT = 30  # a broken test fails instead of hanging


class Gate:
    """Holds every call of ``cls.name`` (in whatever thread makes it) until ``open()``."""

    def __init__(self, monkeypatch, cls, name):
        self.entered = threading.Event()
        self._open = threading.Event()
        real = getattr(cls, name)
        gate = self

        def held(*args, **kwargs):
            gate.entered.set()
            if not gate._open.wait(GATE_TIMEOUT):
                raise RuntimeError("the test never opened the gate")
            return real(*args, **kwargs)

        monkeypatch.setattr(cls, name, held)

    async def wait_entered(self):
        await eventually(self.entered.is_set, timeout=10)

    def open(self):
        self._open.set()


def limit(settings, **caps):
    settings.RINDLE = {**settings.RINDLE, "WS_RATE": 10_000, "WS_BURST": 10_000, **caps}


def raw():
    """A socket driven frame by frame, as Daphne drives the application."""
    return WebsocketCommunicator(application(), "/ws/rindle/", headers=[ORIGIN])


async def subscribe_users(client, query_id=1):
    await client.send(
        {"t": "subscribe", "queryId": query_id, "name": "users", "mode": "normalized"}
    )
    return await client.recv_until("progress", timeout=10)


def open_sockets():
    """(the principal's count, the hub's connections) as they are now."""
    runtime = get_runtime(None)
    hub = runtime.running_hub
    return runtime.sockets.count(PRINCIPAL), (len(hub.conns) if hub is not None else 0)


async def test_a_handshake_is_accepted_while_the_hub_loads_and_answered_when_it_is_ready(
    live, monkeypatch
):
    await db(User.objects.create)(id="u1", name="Ada")
    gate = Gate(monkeypatch, LiveQueries, "start")
    client = Client()
    # Daphne resets a handshake that waits 5 s; here it may not wait at all.
    assert await client.comm.connect(timeout=1) == (True, None)
    await client.send({"t": "init", "clientID": "c1"})
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    await client.send({"t": "nonsense"})
    await gate.wait_entered()
    assert await client.nothing(0.3)  # nothing is ready yet, and nothing is refused
    gate.open()
    hello, snap, progress = await client.recv_until("progress", timeout=10)
    assert hello["t"] == "nhello" and snap["batch"]["ops"] == [
        {"table": "user", "op": "add", "row": ["u1", "Ada"]}
    ]
    # Frames are answered in the order they came: the bad one after the subscribe.
    error = await client.recv()
    assert error["t"] == "error" and error["code"] == "bad_frame"
    await client.close()
    await eventually(lambda: open_sockets() == (0, 0))


async def test_handshakes_reset_during_the_load_do_not_count_against_a_live_one(
    live, settings, monkeypatch
):
    """
    The "accepted but never answered" hang. On the old consumer a handshake's connect
    waited in a worker thread for the hub's start; the client (or Daphne, after 5 s)
    gave up, and its disconnect queued behind that connect. When the load ended,
    every such dead handshake resumed at once and counted under its principal before
    its disconnect was handled, so the live socket accepted in that moment was over
    ``WS_MAX_SOCKETS_PER_PRINCIPAL`` and closed with 4429 right after its accept: to
    a client waiting for its data frame, an answer that never comes, with every
    thread idle. Locally (one address, 32 sockets) a dozen browser tabs retrying
    through a 25 s start did it.
    """
    limit(settings, WS_MAX_SOCKETS_PER_PRINCIPAL=1)
    gate = Gate(monkeypatch, LiveQueries, "start")
    dead = [raw() for _ in range(3)]
    await dead[0].send_input({"type": "websocket.connect"})
    await gate.wait_entered()
    for comm in dead[1:]:
        await comm.send_input({"type": "websocket.connect"})
    for comm in dead:  # the clients give up on these handshakes
        await comm.send_input({"type": "websocket.disconnect", "code": 1006})
    await asyncio.sleep(0.2)
    client = Client()
    connecting = asyncio.ensure_future(client.comm.connect(timeout=GATE_TIMEOUT))
    await asyncio.sleep(0.2)
    gate.open()
    assert await connecting == (True, None)
    hello, _snap, _progress = await subscribe_users(client)
    assert hello["t"] == "nhello"
    await eventually(lambda: open_sockets() == (1, 1))
    await client.close()
    for comm in dead:
        await comm.wait(GATE_TIMEOUT)
    await eventually(lambda: open_sockets() == (0, 0))


async def test_a_socket_killed_while_it_waits_for_the_load_leaves_nothing(live, monkeypatch):
    """Daphne cancels a dead socket's application; no disconnect handler runs then."""
    gate = Gate(monkeypatch, LiveQueries, "start")
    doomed = raw()
    connected, _ = await doomed.connect(timeout=1)
    assert connected
    await doomed.send_to(text_data='{"t": "subscribe", "queryId": 1, "name": "users"}')
    await gate.wait_entered()
    assert open_sockets()[0] == 1
    doomed.future.cancel()  # the kill, with the socket's subscribe still waiting
    with pytest.raises(asyncio.CancelledError):
        await doomed.future
    assert open_sockets()[0] == 0
    gate.open()
    client = Client()
    assert await client.connect()
    assert (await subscribe_users(client))[0]["t"] == "nhello"
    await eventually(lambda: open_sockets() == (1, 1))
    await client.close()
    await eventually(lambda: open_sockets() == (0, 0))


async def test_a_socket_killed_while_the_hub_registers_it_is_unregistered(live, monkeypatch):
    """The registration finishes in its thread after the kill; it is undone there."""
    client = Client()
    assert await client.connect()  # the hub runs
    assert (await subscribe_users(client))[0]["t"] == "nhello"
    gate = Gate(monkeypatch, Hub, "connect")
    doomed = raw()
    assert (await doomed.connect(timeout=1))[0]
    await doomed.send_to(text_data='{"t": "subscribe", "queryId": 1, "name": "users"}')
    await gate.wait_entered()
    doomed.future.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed.future
    gate.open()
    await eventually(lambda: open_sockets() == (1, 1))
    await client.close()
    await eventually(lambda: open_sockets() == (0, 0))


async def test_the_cap_still_refuses_a_socket_over_it_while_the_hub_loads(
    live, settings, monkeypatch
):
    limit(settings, WS_MAX_SOCKETS_PER_PRINCIPAL=1)
    gate = Gate(monkeypatch, LiveQueries, "start")
    first, second = Client(), Client()
    assert await first.comm.connect(timeout=1) == (True, None)
    assert await second.comm.connect(timeout=1) == (True, None)
    closed = await second.comm.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": limits.CLOSE_TOO_MANY_SOCKETS}
    gate.open()
    assert (await subscribe_users(first))[0]["t"] == "nhello"
    await first.close()
    await eventually(lambda: open_sockets() == (0, 0))
