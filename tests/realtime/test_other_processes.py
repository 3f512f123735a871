"""Writes made by other processes (ORM in a shell, raw driver) reach subscribers."""

import asyncio
import sys
import time

import pytest

from tests.conftest import child_env

from .conftest import Client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ORM_WRITE = """
import time
from project.demo.models import User
User.objects.create(id="p1", name="From another process")
print(time.time(), flush=True)
"""


async def _subscribe_users(client):
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    return await client.recv_until("progress")


@pytest.mark.parametrize("repeat", range(3))
async def test_an_orm_write_in_another_process_reaches_subscribers_quickly(live, repeat):
    client = Client()
    assert await client.connect()
    await _subscribe_users(client)
    # The child runs beside the event loop (a blocking run would stall the loop and
    # count the child's own exit in the latency): the frame's arrival is timed as it
    # arrives, and the child's commit time read afterwards.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "manage.py",
        "shell",
        "-c",
        ORM_WRITE,
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        batch, progress = await client.recv_until("progress", timeout=60)
        received = time.time()
    finally:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    committed = float(out.decode().strip().splitlines()[-1])
    assert batch["batch"]["ops"] == [
        {"table": "user", "op": "add", "row": ["p1", "From another process"]}
    ]
    # The target is 50 ms; a loaded CI machine gets slack, the bench reports the figure.
    assert received - committed < 0.5, f"{(received - committed) * 1000:.0f} ms"
    await client.close()
