"""Fixtures of the usage-ledger tests: a fake clock (explicit ms) and ledgers."""

import pytest

from rindle_app.flow import DAY_MS, FlowLedger, FlowStore
from rindle_app.models import FlowDayRecord

HOUR_MS = 3_600_000
DAY = 20_000  # 2024-10-04, a UTC day number
NOON = DAY * DAY_MS + 12 * HOUR_MS
MIDNIGHT = (DAY + 1) * DAY_MS  # the start of DAY + 1
RETENTION = 30


@pytest.fixture
def make_ledger():
    """``make_ledger(node, now=NOON)``: a started ledger over the test database."""

    def make(node="node-a", now=NOON, retention_days=RETENTION):
        return FlowLedger(FlowStore(), node=node, retention_days=retention_days).start(now)

    return make


@pytest.fixture
def ledger(db, make_ledger):
    return make_ledger()


def stored(namespace=None):
    """Every kept row as a dict (sorted), for comparing store states."""
    rows = FlowDayRecord.objects.order_by("namespace", "day", "node")
    if namespace is not None:
        rows = rows.filter(namespace=namespace)
    return list(rows.values())
