"""
The usage-ledger tests' child process, run as ``python -m tests.support.flow_child
MODE ARGS...`` (``processes.command``) with ``child_env()``. The modes:

``ledger NODE COUNT FLUSH_EVERY NOW_MS`` (tests/flow/test_processes.py)
    Counts COUNT transfers into a ledger of node NODE and flushes, for the
    multi-process and kill -9 tests: prints ``STARTED``, then ``FLUSHED <n>`` after
    each flush that committed the first ``n`` transfers, then ``DONE``.

``meter NAMESPACE exit|kill`` (tests/flow/wiring/test_tick.py)
    A serving process in miniature: counts one transfer through a meter (which
    starts the ledger, its flush tick and the exit flush), prints ``counted``, then
    exits normally or is killed.
"""

import os
import signal
import sys

from tests.support.children import boot, say

boot()

from rindle_app.flow import FlowLedger, FlowStore, Transfer  # noqa: E402


def run_ledger(node, count, flush_every, now):
    count, flush_every, now = int(count), int(flush_every), int(now)
    ledger = FlowLedger(FlowStore(), node=node, retention_days=30).start(now)
    say("STARTED")
    for i in range(1, count + 1):
        ledger.record("acme", now, Transfer(1, 2, session=f"{node}-{i % 5}"))
        if i % flush_every == 0:
            ledger.flush(now)
            say(f"FLUSHED {i}")
    ledger.flush(now)
    say("DONE")


def run_meter(namespace, how):
    from rindle_app.flow import quota

    quota.meter(namespace, session="child").transfer(bytes_in=7, bytes_out=11)
    say("counted")
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)


MODES = {"ledger": run_ledger, "meter": run_meter}

if __name__ == "__main__":
    MODES[sys.argv[1]](*sys.argv[2:])
