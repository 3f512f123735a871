"""GET /v1/stream waiting for events: the long-poll and server-sent events (WSGI and ASGI)."""

import json
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.test import AsyncClient

from rindle_app import tokens

from .api_support import *  # noqa: F403  (the fixtures)
from .api_support import later, postgres, publish

pytestmark = pytest.mark.django_db(transaction=True)

SSE = "text/event-stream"


def commit_user(key):
    """Commit a captured row on a connection of its own (another session), then publish."""

    def run():
        conn = connections.create_connection("default")
        try:
            with conn.cursor() as cursor:
                cursor.execute('INSERT INTO "user" (id, name) VALUES (%s, %s)', [key, key])
        finally:
            conn.close()
        if postgres():
            publish_on_own_connection()

    return run


def publish_on_own_connection():
    from rindle_app.engine.capture import OUTBOX
    from rindle_app.stream import state as stream_state

    conn = connections.create_connection("default")
    try:
        conn.set_autocommit(False)
        with conn.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [0x72696E646C65])
            cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
            stream_state.publish(cursor, cursor.fetchone()[0])
        conn.commit()
    finally:
        conn.close()


def now_cursor(reader):
    publish()
    return reader.get("/v1/stream", {"cursor": "now"}).json()["cursor"]


def parse_sse(text):
    """The events of an event-stream body: dicts of their fields (data decoded)."""
    events = []
    for block in text.split("\n\n"):
        fields = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(": ")
            fields[name] = value
        if "event" in fields:
            fields["data"] = json.loads(fields["data"])
            events.append(fields)
    return events


def test_a_long_poll_returns_as_soon_as_a_commit_is_published(reader):
    """wait=N answers within a poll interval of the commit, not at the end of the wait."""
    cursor = now_cursor(reader)
    writer = later(0.3, commit_user("late"))
    started = time.monotonic()
    body = reader.get("/v1/stream", {"cursor": cursor, "wait": "10"}).json()
    elapsed = time.monotonic() - started
    writer.join()
    assert [e["key"] for e in body["events"]] == [["late"]]
    assert 0.25 <= elapsed < 5


def test_an_idle_long_poll_answers_empty_at_its_wait_bound(reader):
    """With nothing new, wait=N answers an empty page after about N seconds, same cursor."""
    cursor = now_cursor(reader)
    started = time.monotonic()
    body = reader.get("/v1/stream", {"cursor": cursor, "wait": "0.6"}).json()
    elapsed = time.monotonic() - started
    assert body["events"] == [] and body["cursor"] == cursor
    assert 0.6 <= elapsed < 3


def test_a_long_poll_never_waits_past_the_configured_maximum(reader, settings):
    """A wait above STREAM_LONG_POLL_MAX_SECONDS is refused, not honoured."""
    settings.RINDLE = {**settings.RINDLE, "STREAM_LONG_POLL_MAX_SECONDS": 1}
    response = reader.get("/v1/stream", {"wait": "2"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_parameter"


def test_server_sent_events_carry_each_change_with_its_cursor_as_id(reader):
    """
    Accept: text/event-stream streams one ``change`` event per row change, ``id:`` its
    cursor, including changes committed while the stream is open; it ends at the wait.
    """
    cursor = now_cursor(reader)
    commit_user("early")()
    writer = later(0.3, commit_user("late"))
    started = time.monotonic()
    response = reader.get("/v1/stream", {"cursor": cursor, "wait": "1.5"}, HTTP_ACCEPT=SSE)
    assert response.status_code == 200 and response["Content-Type"].startswith(SSE)
    text = b"".join(response.streaming_content).decode()
    elapsed = time.monotonic() - started
    writer.join()
    changes = [e for e in parse_sse(text) if e["event"] == "change"]
    assert [e["data"]["key"] for e in changes] == [["early"], ["late"]]
    epoch = cursor.split(":")[0]
    assert [e["id"] for e in changes] == [f"{epoch}:{e['data']['seq']}" for e in changes]
    assert 1.5 <= elapsed < 5


def test_an_event_stream_resumes_from_last_event_id(reader):
    """A reconnecting EventSource sends Last-Event-ID; the stream goes on after it."""
    cursor = now_cursor(reader)
    commit_user("one")()
    commit_user("two")()
    first = reader.get("/v1/stream", {"cursor": cursor, "limit": "1", "wait": "0"}).json()
    response = reader.get(
        "/v1/stream", {"wait": "0"}, HTTP_ACCEPT=SSE, HTTP_LAST_EVENT_ID=first["cursor"]
    )
    events = parse_sse(b"".join(response.streaming_content).decode())
    assert [e["data"]["key"] for e in events if e["event"] == "change"] == [["two"]]


def test_an_event_stream_refuses_a_bad_cursor_with_a_json_status_before_streaming(reader):
    """A cursor the stream cannot continue is a 409 JSON error, not a broken stream."""
    response = reader.get("/v1/stream", {"cursor": "feedface:5"}, HTTP_ACCEPT=SSE)
    assert response.status_code == 409
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["reason"] == "epoch_mismatch"


def test_server_sent_events_under_asgi_stream_from_an_async_generator(alice):
    """
    Under ASGI (Daphne) the event stream is an async iterator, so an idle stream waits
    on the event loop; it yields the same events with their ids.
    """
    raw, _token = tokens.create(alice, ["stream"])
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    cursor = now_cursor(client)
    commit_user("async")()

    async def consume():
        response = await AsyncClient().get(
            "/v1/stream",
            {"cursor": cursor, "wait": "0.3"},
            headers={"Accept": SSE, "Authorization": f"Bearer {raw}"},
        )
        assert response.status_code == 200
        assert response.is_async
        chunks = [chunk async for chunk in response.streaming_content]
        return b"".join(chunks).decode()

    events = parse_sse(async_to_sync(consume)())
    changes = [e for e in events if e["event"] == "change"]
    assert [e["data"]["key"] for e in changes] == [["async"]]
    assert changes[0]["id"].endswith(f":{changes[0]['data']['seq']}")
