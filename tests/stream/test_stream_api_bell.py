"""
GET /v1/stream's waiters wake on the runtime's doorbell: a long-poll or an event
stream answers within a moment of the watermark's publication (the watermarker's
notification on PostgreSQL, the inotify commit watcher on SQLite), not at its next
timed read; the doorbell belongs to the runtime. At most
STREAM_LONG_POLL_MAX_WAITERS requests wait at once; past it a waiting request is
503 stream_busy, and each place is given back however its wait ended.
"""

import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, connections, transaction
from django.test import AsyncClient

from rindle_app import tokens
from rindle_app.runtime import get_runtime, shutdown
from rindle_app.stream import fence, notify
from rindle_app.stream import state as stream_state
from tests.conftest import scrape_metrics
from tests.support.views import token_client
from tests.support.waiting import wait_for

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


def waiting():
    bell = get_runtime().running_bell
    return 0 if bell is None else bell.waiting


class Poll:
    """A long-poll of ``client`` on a thread of its own; ``response`` once it answered."""

    def __init__(self, client, params):
        self.response = None
        self.thread = threading.Thread(target=self._run, args=(client, params))
        self.thread.start()

    def _run(self, client, params):
        try:
            self.response = client.get("/v1/stream", params)
        finally:
            connections.close_all()

    def join(self):
        self.thread.join(15)
        assert not self.thread.is_alive()
        return self.response


def test_past_the_waiter_cap_a_waiting_request_is_503_stream_busy_with_retry_after(alice, settings):
    """
    With STREAM_LONG_POLL_MAX_WAITERS 2 and two long-polls waiting, a third long-poll
    and an event stream are 503 stream_busy (retryable, Retry-After) and read nothing;
    a read without wait is still served. Once the two answered, a wait is admitted.
    """
    settings.RINDLE = {**settings.RINDLE, "STREAM_LONG_POLL_MAX_WAITERS": 2}
    clients = [token_client(alice, "stream") for _ in range(3)]
    cursor = now_cursor(clients[0])
    polls = [Poll(c, {"cursor": cursor, "wait": "10"}) for c in clients[:2]]
    wait_for(lambda: waiting() == 2, timeout=10)
    for accept in ("application/json", SSE):
        refused = clients[2].get("/v1/stream", {"cursor": cursor, "wait": "5"}, HTTP_ACCEPT=accept)
        assert refused.status_code == 503
        assert refused["Content-Type"].startswith("application/json")
        assert refused["Retry-After"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "stream_busy" and error["retryable"] is True
        assert "STREAM_LONG_POLL_MAX_WAITERS" in error["message"]
    served = clients[2].get("/v1/stream", {"cursor": cursor})
    assert served.status_code == 200 and served.json()["events"] == []
    metrics = scrape_metrics()  # an operator sees the cap reached, and the refusals
    assert 'rindle_stream_waiters{database="default",kind="waiting"} 2.0' in metrics
    assert 'rindle_stream_waiters{database="default",kind="limit"} 2.0' in metrics
    assert 'rindle_stream_busy_total{database="default"} 2.0' in metrics
    commit_and_publish("wake")
    for poll in polls:
        response = poll.join()
        assert response.status_code == 200
        assert [e["key"] for e in response.json()["events"]] == [["wake"]]
    assert waiting() == 0
    admitted = clients[2].get("/v1/stream", {"cursor": cursor, "wait": "0.2"})
    assert admitted.status_code == 200 and len(admitted.json()["events"]) == 1


def prune_past_the_newest():
    """In one transaction: commit a captured row, and move the horizon past it."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute('INSERT INTO "user" (id, name) VALUES (%s, %s)', ["pruned", "x"])
        cursor.execute("SELECT MAX(seq) FROM _rindle_change_events")
        newest = cursor.fetchone()[0]
        cursor.execute("DELETE FROM _rindle_change_events")
        cursor.execute(
            "UPDATE _rindle_stream SET horizon = %s WHERE name = %s",
            [newest + 1, stream_state.STREAM],
        )


def test_a_wait_that_ends_in_an_error_gives_its_place_back(reader, settings):
    """
    A long-poll overtaken by retention mid-wait answers 409 resnapshot_required (the
    cap 1): its place is free again, so the next wait is admitted, not refused.
    """
    settings.RINDLE = {**settings.RINDLE, "STREAM_LONG_POLL_MAX_WAITERS": 1}
    cursor = now_cursor(reader)
    poll = Poll(reader, {"cursor": cursor, "wait": "10"})
    wait_for(lambda: waiting() == 1, timeout=10)
    prune_past_the_newest()  # a commit the waiter never saw, and retention passed it
    get_runtime().running_bell.ring()
    response = poll.join()
    assert response.status_code == 409
    assert response.json()["error"]["reason"] == "below_horizon"
    assert waiting() == 0
    commit_and_publish("after")
    cursor = now_cursor(reader)
    assert reader.get("/v1/stream", {"cursor": cursor, "wait": "0.1"}).status_code == 200


def test_an_event_stream_holds_its_place_until_it_ends_or_is_closed_unread(reader, settings):
    """
    An event stream is a waiter until its body ends; one Django closes without
    reading it (the client went away first) gives its place back too.
    """
    settings.RINDLE = {**settings.RINDLE, "STREAM_LONG_POLL_MAX_WAITERS": 1}
    cursor = now_cursor(reader)
    unread = reader.get("/v1/stream", {"cursor": cursor, "wait": "5"}, HTTP_ACCEPT=SSE)
    assert unread.status_code == 200 and waiting() == 1
    busy = reader.get("/v1/stream", {"cursor": cursor, "wait": "5"}, HTTP_ACCEPT=SSE)
    assert busy.status_code == 503 and busy.json()["error"]["code"] == "stream_busy"
    unread.close()
    assert waiting() == 0
    read = reader.get("/v1/stream", {"cursor": cursor, "wait": "0.3"}, HTTP_ACCEPT=SSE)
    assert read.status_code == 200 and waiting() == 1
    b"".join(read.streaming_content)
    assert waiting() == 0
