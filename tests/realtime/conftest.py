"""Websocket fixtures: the project's ASGI app, a fresh engine and hub per test."""

import asyncio
import json

import pytest
from channels.testing import WebsocketCommunicator

from rindle_app.testing import fresh_runtime

ORIGIN = (b"origin", b"http://localhost")


@pytest.fixture
def live(transactional_db):
    """The process engine and hub, started fresh and shut down after the test."""
    with fresh_runtime() as runtime:
        yield runtime.engine


def application():
    from project.asgi import application as app

    return app


class Client:
    """A WebsocketCommunicator speaking JSON frames."""

    def __init__(self, headers=(ORIGIN,), path="/ws/rindle/"):
        self.comm = WebsocketCommunicator(application(), path, headers=list(headers))

    async def connect(self):
        connected, _ = await self.comm.connect(timeout=5)
        return connected

    async def send(self, frame):
        await self.comm.send_to(text_data=frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout=5):
        return json.loads(await self.comm.receive_from(timeout=timeout))

    async def recv_until(self, kind, timeout=5):
        """Frames up to and including the first of type ``kind``."""
        frames = []
        while True:
            frame = await self.recv(timeout)
            frames.append(frame)
            if frame["t"] == kind:
                return frames

    async def nothing(self, timeout=0.3):
        return await self.comm.receive_nothing(timeout=timeout)

    async def close(self):
        await self.comm.disconnect()


async def eventually(predicate, timeout=5):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


async def push_set_status(client, client_id="c1", mid=1):
    """``init`` as ``client_id``, push an empty ``setStatus`` as ``mid``; the reply frame."""
    await client.send({"t": "init", "clientID": client_id})
    env = {"clientID": client_id, "mid": mid, "name": "setStatus", "args": {}}
    await client.send({"t": "pushMutation", "envelope": env})
    return await client.recv()
