"""
Child process of ``test_retention_kill.py``: prunes the outbox until killed.

Run with ``child_env()`` so Django uses the parent test run's database. Usage::

    python tests/stream/retention_child.py BATCH_SIZE PAUSE_SECONDS NOW_ISO

It prunes every row stamped 7 days before NOW_ISO, BATCH_SIZE rows per transaction,
sleeping PAUSE_SECONDS inside each batch's transaction (after the batch's rows
were read, before they are deleted), so a kill lands inside a batch more often
than between two. Prints ``BATCH <horizon>`` after each committed batch, ``DONE``
at the end.
"""

import datetime
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from rindle_app.stream import retention  # noqa: E402


def main():
    batch_size, pause, now = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    clock = datetime.datetime.fromisoformat(now)
    cut = retention._cut

    def slow_cut(rows, cutoff, size):
        time.sleep(pause)
        return cut(rows, cutoff, size)

    retention._cut = slow_cut
    pruner = retention.Retention(
        age=datetime.timedelta(days=7),
        batch_size=batch_size,
        now=lambda: clock,
        on_prune=lambda stream, horizon: print(f"BATCH {horizon}", flush=True),
    )
    pruner.run_once()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
