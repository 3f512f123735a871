"""
A process that counts transfers into the usage ledger and flushes, for the
multi-process and kill -9 tests: ``flow_child.py NODE COUNT FLUSH_EVERY NOW_MS``.

Prints ``STARTED``, then ``FLUSHED <n>`` after each flush that committed the first
``n`` transfers, then ``DONE``. Uses the parent's test database (``child_env()``).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from rindle_app.flow import FlowLedger, FlowStore, Transfer  # noqa: E402


def main(node, count, flush_every, now):
    ledger = FlowLedger(FlowStore(), node=node, retention_days=30).start(now)
    print("STARTED", flush=True)
    for i in range(1, count + 1):
        ledger.record("acme", now, Transfer(1, 2, session=f"{node}-{i % 5}"))
        if i % flush_every == 0:
            ledger.flush(now)
            print(f"FLUSHED {i}", flush=True)
    ledger.flush(now)
    print("DONE", flush=True)


if __name__ == "__main__":
    node, count, flush_every, now = sys.argv[1:5]
    main(node, int(count), int(flush_every), int(now))
