"""
GET /v1/stream's waiters wake on the runtime's doorbell: a long-poll or an event
stream answers within a moment of the watermark's publication (the watermarker's
notification on PostgreSQL, the inotify commit watcher on SQLite), not at its next
timed read; the doorbell belongs to the runtime.
"""

import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connections
from django.test import AsyncClient

from rindle_app import tokens
from rindle_app.runtime import get_runtime, shutdown
from rindle_app.stream import fence, notify
from rindle_app.stream import state as stream_state

from .api_support import *  # noqa: F403  (the fixtures)
from .api_support import postgres, publish
from .test_stream_api_wait import SSE, parse_sse

pytestmark = pytest.mark.django_db(transaction=True)

# The timed read is this far apart, so only a wake-up answers within BOUND.
SLOW_POLL = 3.0
BOUND = 0.5


@pytest.fixture(autouse=True)
def slow_poll(settings):
    settings.RINDLE = {
        **settings.RINDLE,
        "STREAM_LONG_POLL_INTERVAL_SECONDS": SLOW_POLL,
        "WAKE_POLL_INTERVAL": SLOW_POLL,
    }


def commit_and_publish(key):
    """
    Commit a captured row on a connection of its own (another session) and, on
    PostgreSQL, publish it as a watermark step does (fence, state, notification).
    Returns the monotonic time the publication committed.
    """
    conn = connections.create_connection("default")
    try:
        with conn.cursor() as cursor:
            cursor.execute('INSERT INTO "user" (id, name) VALUES (%s, %s)', [key, key])
        if conn.vendor == "postgresql":
            seq = fence.safe_seq("default", 5.0)
            conn.set_autocommit(False)
            with conn.cursor() as cursor:
                stream_state.publish(cursor, seq)
                cursor.execute("SELECT pg_notify(%s, %s)", [notify.WATERMARK_CHANNEL, str(seq)])
            conn.commit()
    finally:
        conn.close()
    return time.monotonic()


class Later:
    """``commit_and_publish(key)`` on a thread after ``delay`` seconds; ``at`` is its time."""

    def __init__(self, delay, key):
        self.at = None
        self.thread = threading.Thread(target=self._run, args=(delay, key))
        self.thread.start()

    def _run(self, delay, key):
        time.sleep(delay)
        self.at = commit_and_publish(key)

    def join(self):
        self.thread.join(10)
        return self.at


def now_cursor(reader):
    publish()
    return reader.get("/v1/stream", {"cursor": "now"}).json()["cursor"]


def test_a_long_poll_answers_within_a_moment_of_the_publication(reader):
    """
    With the timed read 3 s apart, a change published while a long-poll waits is
    answered within half a second of its publication, three times in a row.
    """
    cursor = now_cursor(reader)
    for n in range(3):
        writer = Later(0.3, f"k{n}")
        body = reader.get("/v1/stream", {"cursor": cursor, "wait": "10"}).json()
        answered = time.monotonic()
        published = writer.join()
        assert [e["key"] for e in body["events"]] == [[f"k{n}"]]
        assert answered - published < BOUND, answered - published
        cursor = body["cursor"]
    assert get_runtime().running_bell.live


def test_an_event_stream_sends_a_change_within_a_moment_of_its_publication(reader):
    """Under WSGI, each published change arrives on the open stream at once, not at a timed read."""
    cursor = now_cursor(reader)
    writers = [Later(0.3, "s0"), Later(1.0, "s1")]
    response = reader.get("/v1/stream", {"cursor": cursor, "wait": "2"}, HTTP_ACCEPT=SSE)
    arrivals = []
    for chunk in response.streaming_content:
        for event in parse_sse(chunk.decode()):
            if event["event"] == "change":
                arrivals.append((event["data"]["key"], time.monotonic()))
    response.close()
    published = [w.join() for w in writers]
    assert [key for key, _ in arrivals] == [["s0"], ["s1"]]
    for (_key, at), pub in zip(arrivals, published, strict=True):
        assert at - pub < BOUND, at - pub


def test_an_asgi_event_stream_wakes_on_the_loop_within_a_moment(alice):
    """Under ASGI the stream's task waits on the doorbell and sends the change at once."""
    raw, _token = tokens.create(alice, ["stream"])
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    cursor = now_cursor(client)
    arrivals = []

    async def consume():
        response = await AsyncClient().get(
            "/v1/stream",
            {"cursor": cursor, "wait": "1.5"},
            headers={"Accept": SSE, "Authorization": f"Bearer {raw}"},
        )
        assert response.status_code == 200 and response.is_async
        async for chunk in response.streaming_content:
            for event in parse_sse(chunk.decode()):
                if event["event"] == "change":
                    arrivals.append((event["data"]["key"], time.monotonic()))

    writer = Later(0.4, "a0")
    async_to_sync(consume)()
    published = writer.join()
    assert [key for key, _ in arrivals] == [["a0"]]
    assert arrivals[0][1] - published < BOUND, arrivals[0][1] - published


def test_the_doorbell_is_the_runtimes_and_stops_with_it(reader):
    """One bell per runtime, started by the first wait; shutdown closes it and its source."""
    cursor = now_cursor(reader)
    reader.get("/v1/stream", {"cursor": cursor, "wait": "0.1"})
    runtime = get_runtime()
    bell = runtime.running_bell
    assert bell is not None and bell.live
    assert bell.source == ("listen" if postgres() else "inotify")
    reader.get("/v1/stream", {"cursor": cursor, "wait": "0.1"})
    assert runtime.running_bell is bell
    source = bell._source
    shutdown()
    assert bell.closed and not bell.live
    assert not source._thread.is_alive()
    assert get_runtime().running_bell is None
