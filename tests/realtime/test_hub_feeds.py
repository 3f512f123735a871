"""
A hub feed (``Hub.follow``), what a room follows its footprint with: the rows at
the catalog's version, then every later net row change with its version, with no
subscriber needed; a schema change, a resnapshot or a fault ends the feed once
(``None``), and ``unfollow`` lets the query go.
"""

import pytest

from project.demo import models as demo
from rindle_app.realtime.hub import get_hub
from rindle_app.testing import fresh_result, publish_watermark
from tests.support.demo import issue
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

FOOTPRINT = {
    "table": "issue",
    "where": {
        "type": "simple",
        "op": "=",
        "left": {"type": "column", "name": "ownerId"},
        "right": {"type": "literal", "value": "u1"},
    },
    "orderBy": [["id", "asc"]],
}


@pytest.fixture
def issues(engine):
    demo.User.objects.create(id="u1", name="User 1")
    demo.User.objects.create(id="u2", name="User 2")
    demo.Issue.objects.bulk_create([issue(f"i{n}", owner="u1", created=float(n)) for n in range(3)])


class Fed:
    def __init__(self):
        self.items = []

    def __call__(self, ops, version):
        self.items.append((ops, version))


def applied(hub, engine):
    target = publish_watermark(engine.using)  # on Postgres the hub reads up to it
    wait_for(lambda: hub.step() >= target, 5, "the hub to apply every commit")


def test_a_feed_starts_at_the_rows_and_gets_every_later_change(engine, issues):
    hub = get_hub(engine)
    fed = Fed()
    key, rows, version = hub.follow(FOOTPRINT, fed)
    assert sorted(r["id"] for _t, r in rows) == ["i0", "i1", "i2"]
    demo.Issue.objects.filter(id="i1").update(title="moved", owner_id="u2")  # leaves
    demo.Issue.objects.filter(id="i2").update(title="renamed")
    applied(hub, engine)
    ops = [op for batch, v in fed.items if batch for op in batch if v > version]
    assert sorted((op["op"], (op.get("new") or op["row"])["id"]) for op in ops) == [
        ("edit", "i2"),
        ("remove", "i1"),
    ]
    assert not hub.catalog.queries[key].subscribers  # kept with no subscriber
    with hub.lock:
        shared = hub.catalog.queries[key]
        assert shared.view.result() == fresh_result(engine, shared.query)
    hub.unfollow(key, fed)
    assert key not in hub.catalog.queries


def test_a_schema_change_ends_a_feed_once(engine, issues):
    hub = get_hub(engine)
    fed = Fed()
    key, _rows, _version = hub.follow(FOOTPRINT, fed)
    hub._on_schema_change("issue")  # what a migration of the table calls
    assert [ops for ops, _v in fed.items] == [None]
    assert key not in hub.catalog.queries
    demo.Issue.objects.filter(id="i2").update(title="after")
    applied(hub, engine)
    assert [ops for ops, _v in fed.items] == [None]  # nothing after the end
    hub.unfollow(key, fed)  # a no-op now


def test_a_feed_that_raises_does_not_stop_the_hub(engine, issues, caplog):
    hub = get_hub(engine)

    def broken(ops, version):
        raise RuntimeError("boom")

    fed = Fed()
    hub.follow(FOOTPRINT, broken)
    hub.follow(FOOTPRINT, fed)
    demo.Issue.objects.filter(id="i0").update(title="still")
    applied(hub, engine)
    assert any(batch for batch, _v in fed.items)
    assert "a feed failed" in caplog.text
