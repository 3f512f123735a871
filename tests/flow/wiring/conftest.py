"""
Fixtures of the wiring tests: a fresh usage ledger and quota cache per test, the
websocket client and the HTTP callers of the realtime and API tests.
"""

import json

from channels.db import database_sync_to_async

from rindle_app import flow
from rindle_app.models import FlowDayRecord
from tests.realtime.conftest import ORIGIN, Client, live  # noqa: F401
from tests.support.views import token_client  # noqa: F401  (re-exported for the tests)


def today(namespace):
    """The namespace's figure today (this process's live slot plus the store)."""
    return flow.get_ledger().today(namespace, flow.now_ms())


async def today_async(namespace):
    return await database_sync_to_async(today)(namespace)


def stored(namespace):
    return list(FlowDayRecord.objects.filter(namespace=namespace).values())


def utf8(text):
    return len(text.encode("utf-8"))


def bearer(raw):
    return [ORIGIN, (b"authorization", f"Bearer {raw}".encode())]


def post(client, url, body):
    """POST ``body`` as JSON; returns the response and the body's byte count."""
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(url, data, content_type="application/json"), utf8(data)
