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

import logging
import os
import threading
import time

from .ledger import (
    DAY_MS,
    REASONS,
    Fleet,
    FlowDay,
    FlowLedger,
    Glance,
    Refusal,
    Row,
    Transfer,
    day_date,
    utc_day,
)
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

logger = logging.getLogger("rindle.flow")
_ledgers = {}
_lock = threading.Lock()


def now_ms():
    """The wall clock in integer Unix milliseconds, as the ledger counts time."""
    return time.time_ns() // 1_000_000


def get_ledger(using=None):
    """
    This process's ledger over the database alias ``using``, started on first use.

    The first call reads the store (the forget tombstones, and this node's rows of
    today when ``RINDLE["FLOW_NODE_ID"]`` is set), so make it at startup, not on a
    transfer; if the store is unreachable it raises and the next call tries again.
    """
    from ..conf import rindle_settings

    using = using or rindle_settings.DATABASE
    ledger = _ledgers.get(using)
    if ledger is not None:
        return ledger
    with _lock:
        ledger = _ledgers.get(using)
        if ledger is None:
            node = rindle_settings.FLOW_NODE_ID or None
            ledger = FlowLedger(FlowStore(using), node=node).start(now_ms())
            _ledgers[using] = ledger
        return ledger


def running_ledger(using=None):
    """The ledger of ``using`` if this process has one, else None."""
    from ..conf import rindle_settings

    return _ledgers.get(using or rindle_settings.DATABASE)


def shutdown(now=None):
    """Flush and drop every ledger of this process (call it on a graceful stop)."""
    with _lock:
        ledgers = list(_ledgers.values())
        _ledgers.clear()
    for ledger in ledgers:
        try:
            ledger.flush(now_ms() if now is None else now)
        except Exception:
            logger.exception("the final flush of %r failed; its unflushed flow is lost", ledger)


def _after_fork_in_child():
    # A forked child must not write under its parent's node id.
    _ledgers.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
