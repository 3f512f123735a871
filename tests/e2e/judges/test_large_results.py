"""
Large results reach the published clients or fail loudly (issue 13 finding 6).

Daphne refuses to send a message over ``--websocket-max-message-size`` (1 MiB by
default); a seq-0 snapshot over it once vanished in the server's write, and the
client waited forever after its hello. Now the server refuses it first with a
``queryError`` naming ``WS_MAX_SEND_BYTES``, which ``@rindle/remote`` 0.9.0 reports
as a rejected subscription; a large result under the limit still hydrates.
"""

import json
import time

import pytest

from project.demo.models import Issue
from tests.support.demo import issue

from .test_published_clients import (
    FLAT,
    QUERIES,
    STEP_TIMEOUT,
    start,  # noqa: F401 (the fixture, shared)
)

pytestmark = pytest.mark.django_db(transaction=True)

# A title this long makes 5,000 issue cards well over 1 MiB on every encoding.
TITLE = "A long title " * 20


def many_issues(n):
    Issue.objects.bulk_create(
        issue(f"big{i:05}", title=f"{TITLE}{i}", owner="cy", created=100.0 + i) for i in range(n)
    )


def wire_frames(judge, role):
    return [json.loads(text) for d, text in judge.call("frames", role=role)["frames"] if d == "in"]


def refusal(judge, role):
    for frame in wire_frames(judge, role):
        if frame.get("t") == "queryError":
            return frame
    return None


def test_a_snapshot_over_the_send_limit_is_refused_to_the_published_clients(start, monkeypatch):  # noqa: F811
    monkeypatch.setitem(QUERIES, "huge", ("issuesPage", {"limit": 5000}))
    run = start([])
    many_issues(5000)
    run.subscribe("huge")
    roles = ["optimistic", "solo-huge"] + (["flat"] if FLAT else [])
    deadline = time.monotonic() + STEP_TIMEOUT
    found = {}
    while len(found) < len(roles) and time.monotonic() < deadline:
        for role in roles:
            if role not in found and (frame := refusal(run.judge, role)) is not None:
                found[role] = frame
        time.sleep(0.1)
    missing = [r for r in roles if r not in found]
    assert not missing, (
        f"no queryError reached {missing}; their last frames: "
        + "; ".join(f"{r}: {[f.get('t') for f in wire_frames(run.judge, r)]}" for r in missing)
        + f"\n--- server log:\n{run.server.log()}"
    )
    for frame in found.values():
        assert frame["code"] == "result_too_large" and frame["retryable"] is False
        assert "WS_MAX_SEND_BYTES = 1048576" in frame["message"]
    # The published client reports it (a terminal rejection), and the socket lives on.
    assert "subscription rejected" in run.judge.stderr()
    assert "WS_MAX_SEND_BYTES" in run.judge.stderr()
    state = run.judge.state()
    assert state["views"]["huge"]["resultType"] != "complete"
    assert state["connects"] == 1  # refused, not cut: the writer never reconnected
    log = run.server.log(tail=None)
    assert "Traceback" not in log and "PayloadExceededError" not in log, log[-4000:]


def test_a_large_result_under_the_send_limit_hydrates(start, monkeypatch):  # noqa: F811
    monkeypatch.setitem(QUERIES, "large", ("issuesPage", {"limit": 1500}))
    run = start([])
    many_issues(1500)
    run.subscribe("large")
    state = run.settle("hydrate 1,500 issues", timeout=30)
    assert len(state["views"]["large"]["data"]) == 1500
