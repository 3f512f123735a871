"""
Fixtures and helpers of the public stream tests (test_stream_api_*.py), kept out
of a conftest so the other stream helpers' tests stay independent of them. A test
module takes the fixtures with ``from .api_support import *`` (``__all__``) and
the helpers by name.
"""

import threading

import pytest
from django.db import connection, connections, transaction

from rindle_app.engine import get_engine, shutdown
from rindle_app.stream import fence
from rindle_app.stream import state as stream_state

from ..api.conftest import token_client

__all__ = ["alice", "empty_outbox", "engine", "reader"]


@pytest.fixture
def engine(transactional_db):
    """The engine the views use (``get_engine()``), stopped after the test."""
    shutdown()
    yield get_engine()
    shutdown()


@pytest.fixture(autouse=True)
def empty_outbox(engine):
    """
    Start from an empty outbox: on SQLite the flush after the previous test deleted its
    rows through the capture triggers, leaving 'remove' events behind. Its numbering
    starts again too, as the fresh stream state row (horizon 1) expects: otherwise the
    earlier tests' seqs (past 100,000 in the whole suite) leave a gap larger than a
    page's scan between the horizon and the first event.
    """
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM _rindle_change_events")
        if connection.vendor == "sqlite":
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = '_rindle_change_events'")
            cursor.execute("DELETE FROM _rindle_stream")


@pytest.fixture
def alice(engine, django_user_model):
    return django_user_model.objects.create_user("alice", password="pw")


@pytest.fixture
def reader(alice):
    """A machine client holding the stream scope."""
    return token_client(alice, "stream")


def postgres():
    return connection.vendor == "postgresql"


def publish():
    """
    Publish the safe watermark by hand, as the watermarker does (fence then state),
    and return it. On SQLite safe_seq is the greatest seq already: nothing to do.
    """
    if not postgres():
        with connection.cursor() as cursor:
            return stream_state.read(cursor).safe_seq
    seq = None
    while seq is None:
        seq = fence.safe_seq("default", timeout=1.0)
    with transaction.atomic(), connection.cursor() as cursor:
        return stream_state.publish(cursor, seq)


def publish_to(seq):
    """Publish exactly ``seq`` (Postgres), as a watermarker that stopped there would."""
    with transaction.atomic(), connection.cursor() as cursor:
        stream_state.publish(cursor, seq)


def set_horizon(horizon):
    """Move the horizon as retention does (and delete what lies below it)."""
    with transaction.atomic(), connection.cursor() as cursor:
        stream_state.ensure(cursor)
        cursor.execute("DELETE FROM _rindle_change_events WHERE seq < %s", [horizon])
        cursor.execute(
            "UPDATE _rindle_stream SET horizon = %s WHERE name = %s", [horizon, stream_state.STREAM]
        )


def current_state():
    with connection.cursor() as cursor:
        return stream_state.read(cursor)


class HeldTransaction:
    """
    A session on a connection of its own that wrote a captured row and keeps its
    transaction open (holding the fence's shared side) until ``release``.
    """

    def __init__(self, sql, params=()):
        self.conn = connections.create_connection("default")
        self.conn.set_autocommit(False)
        with self.conn.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.pid = cursor.fetchone()[0]
            cursor.execute(sql, list(params))  # last: what pg_stat_activity shows as its query

    def release(self, commit=True):
        try:
            (self.conn.commit if commit else self.conn.rollback)()
        finally:
            self.conn.close()


def later(seconds, fn):
    """Run ``fn`` on a thread after ``seconds``; join the returned thread."""
    thread = threading.Thread(target=lambda: (threading.Event().wait(seconds), fn()))
    thread.start()
    return thread
