"""/metrics: today's flow of this process's ledger, summed, with no namespace label."""

import re

from rindle_app.flow import REASONS, Refusal, Transfer
from rindle_app.testing import fresh_runtime

from ..conftest import scrape_metrics
from .conftest import NOW, day_at


def samples(text):
    """``{(name, labels): value}`` of every rindle_flow sample."""
    found = {}
    for name, labels, number in re.findall(r"^(rindle_flow_\w+)(?:\{(.*)\})? (\S+)$", text, re.M):
        found[(name, labels)] = float(number)
    return found


def test_a_scrape_shows_todays_flow_from_memory_without_a_query(ledger, django_assert_num_queries):
    ledger.record("stale", day_at(1), Transfer(999, 999))  # only yesterday: not today's
    ledger.record("acme", day_at(0), Transfer(100, 4000, bulk_bytes_out=1000, session="s1"))
    ledger.flush(NOW)  # flushed or not, today's figures are the live slot's
    ledger.record("acme", day_at(0, 11), Transfer(20, 30))
    ledger.record("globex", day_at(0), Transfer(5, 6))
    ledger.refuse("globex", day_at(0), Refusal.QUOTA)
    ledger.refuse("initech", day_at(0), Refusal.RATE_LIMIT)
    ledger.auth_failure("umbrella", day_at(0))
    ledger.auth_failure("umbrella", day_at(0))
    with django_assert_num_queries(0):
        text = scrape_metrics()
    got = samples(text)
    db = 'database="default"'
    assert got[("rindle_flow_bytes_today", f'{db},direction="in"')] == 125
    assert got[("rindle_flow_bytes_today", f'{db},direction="out"')] == 4036
    assert got[("rindle_flow_bulk_bytes_today", f'{db},direction="out"')] == 1000
    assert got[("rindle_flow_bulk_bytes_today", f'{db},direction="in"')] == 0
    assert got[("rindle_flow_transfers_today", db)] == 3
    assert got[("rindle_flow_auth_failures_today", db)] == 2
    # acme, globex, initech (refused: a tenant at the door); not umbrella, not stale.
    assert got[("rindle_flow_namespaces_seen_today", db)] == 3
    refusals = {
        labels.split('reason="')[1].rstrip('"'): n
        for (name, labels), n in got.items()
        if name == "rindle_flow_refusals_today"
    }
    assert refusals == {**dict.fromkeys(REASONS, 0), "quota": 1, "rate_limit": 1}
    assert got[("rindle_flow_late_records_total", db)] == 0
    # Low cardinality: no sample names a namespace, whatever the tenant count.
    assert "namespace" not in "".join(labels for _name, labels in got)
    assert not any(ns in text for ns in ("acme", "globex", "initech", "umbrella"))


def test_without_a_ledger_the_flow_series_have_no_samples(ledger):
    with fresh_runtime():  # the ledger is dropped: this process has none
        text = scrape_metrics()
    assert "# TYPE rindle_flow_bytes_today gauge" in text
    assert samples(text) == {}
