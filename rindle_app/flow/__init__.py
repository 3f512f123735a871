"""
The usage ledger: per namespace (tenant) and UTC day, the bytes, transfers,
refusals, auth failures and distinct sessions, counted in memory on the transfer
path (``FlowLedger``) and copied by a periodic flush into the database
(``FlowStore``), where every process keeps its own rows and readers sum them.

The transport and the tick use the process-wide ledger::

    from rindle_app.flow import Transfer, get_ledger

    ledger = get_ledger()  # at startup: the first call reads the store once
    ledger.record(namespace, now_ms, Transfer(bytes_in=120, bytes_out=4096, session=sid))
    ledger.flush(now_ms)  # on a tick and at shutdown

Crash bound: what was counted since the last flush is lost with the process.
"""

import time

from .figures import (
    DAY_MS,
    REASONS,
    Fleet,
    FlowDay,
    Glance,
    Refusal,
    Row,
    Transfer,
    day_date,
    utc_day,
)
from .ledger import FlowLedger
from .store import FlowStore

__all__ = [
    "DAY_MS",
    "REASONS",
    "Fleet",
    "FlowDay",
    "FlowLedger",
    "FlowStore",
    "Glance",
    "Refusal",
    "Row",
    "Transfer",
    "day_date",
    "get_ledger",
    "now_ms",
    "running_ledger",
    "shutdown",
    "utc_day",
]


def now_ms():
    """The wall clock in integer Unix milliseconds, as the ledger counts time."""
    return time.time_ns() // 1_000_000


def get_ledger(using=None):
    """
    This process's ledger over the database alias ``using``, started on first use
    (by its runtime, ``rindle_app.runtime``).

    The first call reads the store (the forget tombstones, and this node's rows of
    today when ``RINDLE["FLOW_NODE_ID"]`` is set), so make it at startup, not on a
    transfer; if the store is unreachable it raises and the next call tries again.
    """
    from ..runtime import get_runtime

    return get_runtime(using).ledger


def running_ledger(using=None):
    """The ledger of ``using`` if this process has one, else None."""
    from ..runtime import running

    runtime = running(using)
    return None if runtime is None else runtime.running_ledger


def shutdown(now=None):
    """Flush and drop every ledger of this process (call it on a graceful stop)."""
    from ..runtime import runtimes

    for runtime in runtimes():
        runtime.drop_ledger(now)
