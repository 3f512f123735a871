"""
Child process of ``tests/public_sql/test_crash.py``: one-shot public SQL writes with
idempotency keys, until done or until it kills itself at a chosen step.

    python tests/public_sql/crash_child.py TABLE WRITES STEP AT

Write n (1..WRITES) is ``INSERT INTO TABLE (id, label) VALUES ('r<n>', 'n')`` under
idempotency key ``k<n>``. STEP is where the process SIGKILLs itself on the AT-th
write reaching it: ``effects`` (the statement ran, its outcome not stored yet),
``outcome`` (outcome stored, not committed), ``committed`` (committed, nobody
answered) or ``none``. The child always starts again from 1: a write that landed
must be answered from its stored outcome, never run twice.
"""

import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from rindle_app.engine import get_engine, outcomes, public_sql  # noqa: E402


def main(table, writes, step, at):
    engine = get_engine()
    engine.register_table(table, ["id", "label"], [0], ["string", "string"])
    principal = public_sql.Principal(user=None, token=SimpleNamespace(pk=1, tables=[table]))
    reached = {"n": 0, "armed": True}

    def maybe_die(here):
        if here == step and reached["armed"]:
            reached["n"] += 1
            if reached["n"] == at:
                os.kill(os.getpid(), signal.SIGKILL)

    store = outcomes.store

    def store_then_die(tx, key, record, now):
        maybe_die("effects")
        store(tx, key, record, now)
        maybe_die("outcome")

    outcomes.store = store_then_die
    engine.add_commit_listener(lambda cv: maybe_die("committed"))
    print("STARTED", flush=True)
    replayed = 0
    for n in range(1, writes + 1):
        sql = f'INSERT INTO "{table}" (id, label) VALUES (?, ?)'
        statements = public_sql.parse_statements(
            {"sql": sql, "args": [f"r{n}", str(n)]}, engine.vendor, many=False
        )
        answer = public_sql.run_once(engine, principal, "execute", statements, f"k{n}")
        replayed += answer.replayed
        if answer.status != 200 or answer.body["result"]["rows_affected"] != 1:
            print(f"ANOMALY {n}: {answer}", flush=True)
            sys.exit(1)
    print(f"DONE replayed={replayed}", flush=True)


if __name__ == "__main__":
    table, writes, step, at = sys.argv[1:5]
    main(table, int(writes), step, int(at))
