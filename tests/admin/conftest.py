"""Fixtures of the usage ledger's operator pages: a fixed clock and a fresh process ledger."""

import pytest

from rindle_app import flow
from rindle_app.flow import DAY_MS
from rindle_app.testing import fresh_runtime

HOUR_MS = 3_600_000
TODAY = 20_000  # 2024-10-04, a UTC day number
NOW = TODAY * DAY_MS + 12 * HOUR_MS  # noon


def day_at(days_ago, hour=10):
    """A Unix time in ms ``days_ago`` UTC days before ``TODAY``, at ``hour``."""
    return (TODAY - days_ago) * DAY_MS + hour * HOUR_MS


@pytest.fixture
def ledger(transactional_db, monkeypatch):
    """
    The process ledger (``flow.get_ledger()``, what the pages read) started afresh
    on the test database, with the clock stopped at ``NOW``; dropped unflushed after.
    """
    monkeypatch.setattr(flow, "now_ms", lambda: NOW)
    with fresh_runtime() as runtime:
        yield runtime.ledger
