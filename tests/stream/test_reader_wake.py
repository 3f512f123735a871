"""A serving process wakes on the watermarker's notification, not on its poll."""

import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection, transaction

from project.demo.models import User
from rindle_app.realtime.hub import get_hub
from rindle_app.runtime import get_runtime
from rindle_app.stream import fence, notify, state
from rindle_app.testing import fresh_runtime
from tests.realtime.conftest import Client

from .reader_support import postgres_only

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def serving(transactional_db):
    with fresh_runtime() as runtime:
        yield runtime.engine


def publish_and_notify():
    """A watermark step: publish safe_seq and notify rindle_watermark in one transaction."""
    seq = fence.safe_seq("default", 5.0)
    with transaction.atomic(), connection.cursor() as cursor:
        state.publish(cursor, seq)
        cursor.execute("SELECT pg_notify(%s, %s)", [notify.WATERMARK_CHANNEL, str(seq)])


async def test_a_watermark_notification_wakes_the_hub_long_before_its_poll(serving):
    """
    With the poll 30 s away and nothing else publishing, a change committed while the
    watermark stood still reaches the subscriber within a moment of the watermark's
    notification (the hub tails only up to the published safe_seq).
    """
    await sync_to_async(postgres_only)()
    hub = await sync_to_async(get_hub)(serving)
    watermarker = get_runtime(serving.using).watermarker
    if watermarker is not None:  # nothing else publishes: this test does, by hand
        await sync_to_async(watermarker.close)()
    hub.poll_interval = 30.0
    hub._wake.set()
    client = Client()
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    await client.recv_until("progress")
    await sync_to_async(User.objects.create)(id="w1", name="waits for the watermark")
    assert await client.nothing(timeout=0.5)  # not published: not read
    started = time.monotonic()
    await sync_to_async(publish_and_notify)()
    frames = await client.recv_until("progress", timeout=5)
    assert time.monotonic() - started < 1.0
    ops = [op for f in frames if f["t"] == "nbatch" for op in f["batch"]["ops"]]
    assert ops == [{"table": "user", "op": "add", "row": ["w1", "waits for the watermark"]}]
    await client.close()
