"""
A fleet's rooms through the channel layer (``realtime.room_router``), in process:
a second ``RoomRegistry`` with a router of its own stands for another server. A doc
hosted there is served there, this process relaying the socket; a host that stops
answering gets its relayed sockets closed to retry (4503); a placement naming a
host that never answers is taken over with the next epoch.
"""

import asyncio
import os
import time

import pytest
from channels.db import database_sync_to_async
from django.db import connection

from rindle_app import rooms
from rindle_app.realtime.room_server import RoomRegistry

from . import test_room_socket as sockets
from .conftest import ORIGIN, Client
from .test_room_host import Socket  # a socket that keeps what the room delivers
from .test_room_socket import DOC, ROOM_PATH, lease

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]
db = database_sync_to_async
people, rooms_on = sockets.people, sockets.rooms_on  # the room socket tests' fixtures


@pytest.fixture
def fleet(live):
    if live.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        pytest.skip("routing rooms needs a channel layer across processes (Redis)")
    return live


def placement():
    with connection.cursor() as cursor:
        cursor.execute("SELECT epoch, host FROM _rindle_room_placement WHERE doc = %s", [DOC])
        return cursor.fetchone()


def set_placement(epoch, host):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO _rindle_room_placement (doc, epoch, host) VALUES (%s, %s, %s)",
            [DOC, epoch, host],
        )


def join_elsewhere(other):
    """The doc's room, booted by ``other`` (another server's registry)."""
    profile, key = rooms.split_doc(DOC)
    return other.join(
        Socket(),
        DOC,
        profile,
        key,
        rooms.mutators_of(profile.name),
        lambda e: rooms.load_footprint(e, profile, key),
        rooms.footprint_tables(profile, key),
    )


async def room_socket(client_id, token):
    client = Client(headers=[ORIGIN], path=ROOM_PATH)
    assert await client.connect()
    await client.send({"t": "init", "clientID": client_id})
    await client.send({"t": "subscribe", "queryId": 1, "leaseToken": token, "mode": "normalized"})
    frames = await client.recv_until("progress", timeout=10)
    return client, frames


async def test_a_doc_hosted_elsewhere_is_served_there(fleet, people):
    ada, bob = people
    other = RoomRegistry(fleet)
    other.start_routing(asyncio.get_running_loop())
    try:
        room = await db(join_elsewhere)(other)
        host = other.router.channel
        assert (await db(placement)()) == (1, host)
        await db(lease)(ada, "A")
        rt = (await db(lease)(bob, "B"))["realtime"]
        b, frames = await room_socket("B", rt["roomToken"])
        assert frames[0]["t"] == "nhello", frames
        await b.send({"t": "subscribe", "queryId": 0, "name": "_rindle/clientLmid"})
        await b.recv_until("progress", timeout=5)
        assert len(room.sockets) == 2  # the other server's socket and the relayed one
        env = {"clientID": "B", "mid": 1, "name": "editTitle"}
        env["args"] = {"id": "i1", "title": "relayed", "updatedAt": 5}
        await b.send({"t": "pushMutation", "envelope": env})
        deadline = time.monotonic() + 5
        while [r["title"] for r in room.host.rows("issue")] != ["relayed"]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        # The lmid moves once the host flushed it, through the relay.
        while True:
            frame = await b.recv(timeout=5)
            if frame["t"] == "nbatch" and frame["queryId"] == 0:
                break
        assert (await db(placement)()) == (1, host)  # served there: never fenced
        # The host stops answering: its relayed socket is closed to retry.
        other.router.close()
        started = time.monotonic()
        while True:
            out = await b.comm.receive_output(timeout=10)
            if out["type"] == "websocket.close":
                break
        assert out["code"] == 4503 and time.monotonic() - started < 12
    finally:
        other.close()


async def test_a_host_that_never_answers_is_taken_over_with_the_next_epoch(fleet, people):
    ada, bob = people
    await db(set_placement)(5, "rindle.rooms.gone!nobody")
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    started = time.monotonic()
    b, frames = await room_socket("B", rt["roomToken"])
    assert frames[0]["t"] == "nhello", frames
    assert time.monotonic() - started < 5
    epoch, host = await db(placement)()
    assert epoch == 6 and host.startswith("rindle.rooms.") and host != "rindle.rooms.gone!nobody"
    await b.close()


async def test_sockets_relayed_by_a_process_that_died_leave_the_room(fleet, people):
    from rindle_app.runtime import get_runtime

    ada, bob = people
    await db(lease)(ada, "A")
    rt = (await db(lease)(bob, "B"))["realtime"]
    b, _ = await room_socket("B", rt["roomToken"])  # the room boots here
    registry = get_runtime().rooms
    room = registry.get(DOC)
    dead = {"doc": DOC, "reply": "rindle.rooms.dead!relay", "sid": "s1"}
    assert await db(registry.router._join)(dead)  # a socket another process relayed
    assert len(room.sockets) == 2
    deadline = time.monotonic() + 12
    while len(room.sockets) != 1:
        assert time.monotonic() < deadline, room.sockets
        await asyncio.sleep(0.1)
    assert not registry.router._served
    await b.close()
