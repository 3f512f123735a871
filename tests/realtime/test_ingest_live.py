"""A producer write and a change-source batch reach a live subscriber as ordinary batches."""

import pytest
from channels.db import database_sync_to_async

from .conftest import Client
from .test_consumer import subscribe, users_ops

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async


async def test_machine_writes_arrive_live_and_replays_send_nothing(live):
    client = Client()
    assert await client.connect()
    _hello, snap, _progress = await subscribe(client, 1, "users")
    assert snap["batch"]["ops"] == []

    add = {"table": "user", "op": "add", "row": {"id": "u9", "name": "Grace"}}
    result = await db(live.producer_write)("hr-sync", 1, [add])
    batch, progress = await client.recv_until("progress")
    assert users_ops(batch["batch"]) == [("add", ("u9", "Grace"))]
    assert batch["batch"]["cv"] == result.cv and progress["frame"]["cvMin"] == result.cv

    edit = {"table": "user", "op": "edit", "old": {"id": "u9"}, "row": {"name": "G. Hopper"}}
    applied = await db(live.apply_source_batch)("directory", "1", [edit])
    batch, _progress = await client.recv_until("progress")
    assert [op["op"] for op in batch["batch"]["ops"]] == ["edit"]
    assert batch["batch"]["ops"][0]["new"] == ["u9", "G. Hopper"]
    assert batch["batch"]["cv"] == applied.cv

    # Replays are absorbed before any write: the subscriber hears nothing.
    assert not (await db(live.producer_write)("hr-sync", 1, [add])).applied
    assert not (await db(live.apply_source_batch)("directory", "1", [edit])).applied
    assert await client.nothing(0.3)
    await client.close()
