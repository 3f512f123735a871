"""The store's grouped reads behind the fleet page."""

import pytest

from rindle_app.flow import FlowLedger, FlowStore, Transfer

from .conftest import NOW, TODAY, day_at

pytestmark = pytest.mark.django_db(transaction=True)


def test_daily_bytes_sums_the_other_nodes_and_keeps_the_asked_nodes_row_apart():
    a = FlowLedger(FlowStore(), node="node-a").start(NOW)
    b = FlowLedger(FlowStore(), node="node-b").start(NOW)
    c = FlowLedger(FlowStore(), node="node-c").start(NOW)
    for ledger, n in ((a, 1), (b, 10), (c, 100)):
        ledger.record("acme", day_at(2), Transfer(n, 2 * n))
        ledger.record("acme", day_at(0), Transfer(n, 0))
        ledger.flush(NOW)
    b.record("globex", day_at(0), Transfer(7, 8))
    b.record("globex", day_at(0, 11), Transfer(7, 8))
    b.flush(NOW)
    store = FlowStore()
    assert store.daily_bytes(TODAY - 2, TODAY, "node-a") == [
        ("acme", TODAY - 2, False, 110, 220, 2),
        ("acme", TODAY - 2, True, 1, 2, 1),
        ("acme", TODAY, False, 110, 0, 2),
        ("acme", TODAY, True, 1, 0, 1),
        ("globex", TODAY, False, 14, 16, 2),
    ]
    # The window's bounds are inclusive, and the rows outside it are not read.
    assert store.daily_bytes(TODAY, TODAY, "nobody") == [
        ("acme", TODAY, False, 111, 0, 3),
        ("globex", TODAY, False, 14, 16, 2),
    ]
    assert store.daily_bytes(TODAY - 1, TODAY - 1, "node-a") == []


def test_last_seen_by_namespace_reads_the_latest_sighting_from_the_floor_on():
    a = FlowLedger(FlowStore(), node="node-a").start(NOW)
    b = FlowLedger(FlowStore(), node="node-b").start(NOW)
    a.record("acme", day_at(5), Transfer(1, 1))
    a.record("acme", day_at(1, 8), Transfer(1, 1))
    b.record("acme", day_at(1, 9), Transfer(1, 1))
    a.record("old", day_at(5), Transfer(1, 1))
    a.auth_failure("umbrella", day_at(0))
    a.flush(NOW)
    b.flush(NOW)
    store = FlowStore()
    assert store.last_seen_by_namespace(TODAY - 5) == {
        "acme": day_at(1, 9),
        "old": day_at(5),
        "umbrella": 0,
    }
    assert store.last_seen_by_namespace(TODAY - 4) == {"acme": day_at(1, 9), "umbrella": 0}
