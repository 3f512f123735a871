"""The hand-over from the hub to each socket's sender task."""

import asyncio
import collections

import pytest

from rindle_app.realtime.consumer import RindleConsumer
from rindle_app.realtime.hub import _push_all

pytestmark = pytest.mark.asyncio


def _consumer():
    consumer = RindleConsumer()
    consumer._outbox = collections.deque()
    consumer._idle = None
    return consumer


async def test_a_batch_for_a_socket_whose_sender_was_cancelled_is_taken_quietly():
    """A closing socket's sender is cancelled with its future; a late batch raises nothing."""
    consumer = _consumer()
    consumer._idle = asyncio.get_running_loop().create_future()
    consumer._idle.cancel()
    consumer._deliver(["frame"])
    assert list(consumer._outbox) == [["frame"]] and consumer._idle is None


class _Conn:
    def __init__(self, push):
        self.closed = False
        self.push = push


async def test_one_socket_that_fails_the_hand_over_does_not_starve_the_others():
    """Every socket of a loop gets its batch, whatever an earlier one raised."""
    got = []

    def broken(frames):
        raise RuntimeError("a broken socket")

    _push_all([(_Conn(broken), ["a"]), (_Conn(got.append), ["b"])])
    assert got == [["b"]]
