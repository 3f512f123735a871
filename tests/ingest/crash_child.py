"""
Child process of ``tests/ingest/test_crash.py``: sends producer writes or change-
source batches until done, or until it kills itself at a chosen step.

Usage (with ``child_env()`` so Django uses the parent test run's database)::

    python tests/ingest/crash_child.py TABLE MODE WRITES STEP AT

MODE is ``producer`` (producers ``P0``..``P2``, seq 1..WRITES each) or ``source``
(sources ``S0``..``S2``, offsets 1..WRITES each). Every write adds one row
``<name>-<n>`` labelled ``<name>:<n>``; a producer's replay must carry the same
payload, so a write applied twice would collide on the key and fail the child. The
child always starts again from 1: what already landed must be absorbed.

STEP names where the process SIGKILLs itself on the AT-th write that reaches it:
``admitted`` (stored position read, no effects yet), ``effects`` (effects written,
cursor not), ``cursor`` (cursor upserted, not committed), ``committed`` (committed,
nobody told), or ``none``. Prints ``STARTED`` and, if it finishes, ``DONE``.
"""

import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from rindle_app.engine import get_engine, producers, sources  # noqa: E402

NAMES = 3


def main(table, mode, writes, step, at):
    engine = get_engine()
    engine.register_table(table, ["id", "label"], [0], ["string", "string"])
    module = producers if mode == "producer" else sources
    reached = {"n": 0, "armed": False}

    def maybe_die(here):
        if here == step and reached["armed"]:
            reached["n"] += 1
            if reached["n"] == at:
                os.kill(os.getpid(), signal.SIGKILL)

    apply, store = module.apply_changes, module._store

    def apply_changes(tx, changes):
        maybe_die("admitted")
        rows = apply(tx, changes)
        maybe_die("effects")
        return rows

    def _store(tx, *args):
        store(tx, *args)
        maybe_die("cursor")

    module.apply_changes, module._store = apply_changes, _store
    engine.add_commit_listener(lambda cv: maybe_die("committed"))
    reached["armed"] = True
    print("STARTED", flush=True)
    for n in range(1, writes + 1):
        for k in range(NAMES):
            name = f"{'P' if mode == 'producer' else 'S'}{k}"
            row = {"id": f"{name}-{n}", "label": f"{name}:{n}"}
            change = {"table": table, "op": "add", "row": row}
            if mode == "producer":
                engine.producer_write(name, n, [change])
            else:
                engine.apply_source_batch(name, str(n), [change])
    print("DONE", flush=True)


if __name__ == "__main__":
    table, mode, writes, step, at = sys.argv[1:6]
    main(table, mode, int(writes), step, int(at))
