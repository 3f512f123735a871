"""
Kill -9 between the steps of a one-shot public SQL write with an idempotency key:
after the statement ran, after its outcome was stored, after the commit. Each write
lands with its outcome or not at all, and a resend of every request answers the
landed ones from their stored outcomes (never running them twice) and applies the rest.
"""

import random
import subprocess

import pytest
from django.db import connection

from tests.conftest import child_env
from tests.support.processes import ROOT, command

WRITES = 10


def run_child(table, step, at):
    return subprocess.run(
        command("crash_child", "public_sql", table, WRITES, step, at),
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def state(table):
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT label FROM "{table}"')
        labels = sorted(int(r[0]) for r in cursor.fetchall())
        cursor.execute(
            "SELECT outcome_key FROM _rindle_sql_outcomes WHERE outcome_key LIKE %s",
            ["once:t1:k%"],
        )
        keys = sorted(int(r[0].rsplit(":k", 1)[1]) for r in cursor.fetchall())
    return labels, keys


@pytest.mark.parametrize("step", ["effects", "outcome", "committed"])
def test_a_kill_at_any_step_leaves_effects_and_outcome_together(transactional_db, step):
    table = f"sqlcrash_{step}"
    at = random.Random(step).randint(2, WRITES - 1)
    try:
        killed = run_child(table, step, at)
        assert killed.returncode == -9, killed.stdout + killed.stderr[-2000:]
        labels, keys = state(table)
        landed = at if step == "committed" else at - 1
        assert labels == keys == list(range(1, landed + 1))
        finished = run_child(table, "none", 0)
        assert finished.returncode == 0, finished.stdout + finished.stderr[-2000:]
        assert f"DONE replayed={landed}" in finished.stdout
        labels, keys = state(table)
        assert labels == keys == list(range(1, WRITES + 1))
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE IF EXISTS "{table}"')
