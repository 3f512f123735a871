"""
Hostile frames on one socket (issue 13 finding 7): deep nesting, lone surrogates,
NaN and Infinity, huge numbers, wrong types in every field of every frame kind,
unknown kinds, binary and oversized frames. The fuzzed socket is never closed and
answers every frame in order; a second socket's subscription keeps receiving
correct data; and no refused frame changes anything.

The fuzzed socket holds a token with the "read" scope only, so no frame it sends
may write: every change of rows, ledger or outbox is a bug. ``RINDLE_SOAK=N``
multiplies the example budget.
"""

import asyncio
import json
import threading

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from project.demo.models import Comment, Issue, Tag, User
from rindle_app import tokens
from rindle_app.testing import outbox_high_water

from ..conftest import examples
from .conftest import ORIGIN, Client

pytestmark = pytest.mark.django_db(transaction=True)

MAX_FRAME = 64 * 1024
# Hypothesis raises the recursion limit by 2,000 while an example runs, so nesting
# that would overflow the default limit of 1,000 must go deeper here.
DEPTH = 5000
# A poison token replaces the JSON string of its marker in the encoded frame.
POISON = {
    "DEEP_ARRAY": "[" * DEPTH + "]" * DEPTH,
    "DEEP_OBJECT": '{"a":' * DEPTH + "1" + "}" * DEPTH,
    "DEEP_MIXED": '[{"a":' * (DEPTH // 2) + "0" + "}]" * (DEPTH // 2),
    "LONE_HIGH": '"\\ud800"',
    "LONE_LOW": '"x\\udfffy"',
    "LONE_KEY": '{"\\ud83d": 1}',
    "NAN": "NaN",
    "INF": "Infinity",
    "NEG_INF": "-Infinity",
    "OVERFLOW": "1e999",
    "HUGE_INT": "9" * 40,
    "HUGER_INT": "9" * 5000,
}
MARKER = "\x00poison:{}\x00"

VALID = {
    "init": {"t": "init", "clientID": "fuzz-client"},
    "subscribe": {"t": "subscribe", "queryId": 1, "name": "users", "args": None},
    "unsubscribe": {"t": "unsubscribe", "queryId": 1},
    "pushMutation": {
        "t": "pushMutation",
        "envelope": {"clientID": "fuzz-client", "mid": 1, "name": "setStatus", "args": {}},
    },
    "mutate": {"t": "mutate", "mutations": []},
}
FIELDS = [(kind, (name,)) for kind, frame in VALID.items() for name in frame]
FIELDS += [("subscribe", ("mode",)), ("subscribe", ("leaseToken",))]
FIELDS += [("pushMutation", ("envelope", name)) for name in VALID["pushMutation"]["envelope"]]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from([MARKER.format(name) for name in POISON])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def encode(frame):
    text = json.dumps(frame)
    for name, token in POISON.items():
        text = text.replace(json.dumps(MARKER.format(name)), token)
    return text


@st.composite
def wrong_field(draw):
    """A valid frame of some kind with one field (nested ones too) set to anything."""
    kind, path = draw(st.sampled_from(FIELDS))
    frame = json.loads(json.dumps(VALID[kind]))
    target = frame
    for name in path[:-1]:
        target = target[name]
    if draw(st.booleans()):
        target[path[-1]] = draw(values)
    else:
        target.pop(path[-1], None)
    return encode(frame)


def oversized(n):
    return json.dumps({"t": "init", "clientID": "x" * n})


hostile = st.one_of(
    wrong_field(),
    st.builds(lambda t: encode({"t": t, "queryId": 1}), values),  # unknown and mistyped kinds
    st.sampled_from(list(POISON.values())),  # a poison token as the whole frame
    st.builds(lambda v: encode(v), values),  # any JSON value at all
    st.text(max_size=40),  # any text (mostly not JSON)
    st.sampled_from(["\ud800", '{"t":"init","clientID":"\udc00"}']),  # raw surrogates in process
    st.binary(max_size=64),  # binary frames
    st.integers(min_value=MAX_FRAME + 1, max_value=4 * MAX_FRAME).map(oversized),
)

ANSWER_KINDS = {"error", "queryError", "nhello", "nbatch", "hello", "batch", "progress"}


class LoopThread:
    """One event loop in a thread, so sockets outlive each hypothesis example."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine, timeout=60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def state():
    """What no frame of the fuzzed socket may change."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(SUM(last_mutation_id), 0) FROM _rindle_client_mutations")
        (lmids,) = cursor.fetchone()
    return (
        Issue.objects.count(),
        Comment.objects.count(),
        Tag.objects.count(),
        User.objects.count(),
        lmids,
        outbox_high_water(),
    )


async def send_and_probe(client, frame, probe):
    """Send ``frame``, then a probe; the frames answered up to the probe's answer."""
    kind = "bytes" if isinstance(frame, bytes) else "text"
    await client.comm.send_input({"type": "websocket.receive", kind: frame})  # empty ones too
    await client.send({"t": probe})
    answers = []
    while True:
        output = await client.comm.receive_output(timeout=10)
        assert output["type"] == "websocket.send", f"the fuzzed socket closed: {output}"
        answer = json.loads(output["text"])
        assert isinstance(answer, dict) and answer.get("t") in ANSWER_KINDS, answer
        if answer["t"] == "error":
            assert answer.get("code") != "internal_error", (frame, answer)
        if answer.get("message") == f"unknown frame type {probe!r}":
            return answers
        answers.append(answer)


def test_hostile_frames_never_close_the_socket_nor_touch_anyone_else(live, settings):
    settings.RINDLE = {
        **settings.RINDLE,
        "WS_RATE": 100_000,
        "WS_BURST": 100_000,
        "WS_MAX_FRAME_BYTES": MAX_FRAME,
    }
    alice = get_user_model().objects.create_user("alice", password="pw")
    raw, _ = tokens.create(alice, ["read"])
    User.objects.create(id="seed", name="Seed")
    loop = LoopThread()

    async def open_sockets():
        fuzzed = Client(headers=[ORIGIN, (b"authorization", f"Bearer {raw}".encode())])
        observer = Client()
        assert await fuzzed.connect() and await observer.connect()
        await observer.send({"t": "subscribe", "queryId": 9, "name": "users", "mode": "normalized"})
        frames = await observer.recv_until("progress")
        return fuzzed, observer, frames[1]["batch"]

    fuzzed, observer, snapshot = loop.run(open_sockets())
    assert [op["row"] for op in snapshot["ops"]] == [["seed", "Seed"]]
    seen = {"seq": 0, "probe": 0, "users": 0}

    async def observer_sees(user_id):
        batch, progress = await observer.recv_until("progress")
        assert batch["queryId"] == 9 and batch["batch"]["seq"] == seen["seq"] + 1
        assert batch["batch"]["ops"] == [{"table": "user", "op": "add", "row": [user_id, "n"]}]
        assert progress["frame"]["cvMin"] >= batch["batch"]["cv"]
        seen["seq"] += 1

    @hypothesis_settings(
        max_examples=examples(60),
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.lists(hostile, min_size=1, max_size=6))
    # The frames of finding 7, always tried first.
    @example([POISON["DEEP_ARRAY"], POISON["DEEP_OBJECT"]])
    @example(['{"t":"init","clientID":"\\ud800"}'])
    @example(['{"t":"subscribe","queryId":1,"name":"issuesPage","args":{"\\udfff":1}}'])
    def fuzz(frames):
        before = state()
        for frame in frames:
            seen["probe"] += 1
            loop.run(send_and_probe(fuzzed, frame, f"probe-{seen['probe']}"))
        assert state() == before
        # Meanwhile the other socket's subscription goes on, seq by seq.
        seen["users"] += 1
        user_id = f"w{seen['users']}"
        User.objects.create(id=user_id, name="n")
        loop.run(observer_sees(user_id))

    try:
        fuzz()

        # The fuzzed socket still serves a real subscription.
        async def still_serves():
            await fuzzed.send({"t": "subscribe", "queryId": 77, "name": "tagOptions"})
            while True:
                frame = await fuzzed.recv()
                if frame.get("queryId") == 77:
                    return frame

        assert loop.run(still_serves())["t"] == "hello"
        loop.run(fuzzed.close())
        loop.run(observer.close())
    finally:
        loop.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("name", list(POISON))
@pytest.mark.parametrize(
    "template",
    [
        "{}",
        '{{"t": "init", "clientID": {}}}',
        '{{"t": "subscribe", "queryId": 1, "name": "issuesPage", "args": {{"limit": {}}}}}',
        '{{"t": "subscribe", "queryId": {}, "name": "users"}}',
    ],
    ids=["frame", "clientID", "args", "queryId"],
)
async def test_each_poison_gets_a_bad_frame_error_and_the_socket_stays_open(live, name, template):
    client = Client()
    assert await client.connect()
    await client.send(template.format(POISON[name]))
    reply = await client.recv()
    assert reply["t"] == "error" and reply["code"] == "bad_frame", reply
    await client.send({"t": "subscribe", "queryId": 2, "name": "users", "mode": "normalized"})
    assert (await client.recv_until("progress"))[0]["t"] == "nhello"
    await client.close()
