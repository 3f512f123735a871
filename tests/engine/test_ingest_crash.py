"""
Kill -9 between every pair of steps of the producer and change-source paths.

The child (``tests/support/crash_child.py``) kills itself with SIGKILL at one step of one write:
after admission, after the effects, after the cursor upsert, after the commit. The
parent then checks the committed state: per producer (source), the stored seq
(offset) S covers exactly the writes 1..S, each one row exactly once, and the outbox
holds one ``add`` per row. A second child re-sends everything from 1 to the end:
what landed is absorbed, the rest applies, and nothing is lost or doubled.
"""

import random
import subprocess
from collections import Counter

import pytest
from django.db import connection

from tests.conftest import child_env
from tests.support.processes import ROOT, command

WRITES = 12
NAMES = 3
STEPS = ("admitted", "effects", "cursor", "committed")


def run_child(table, mode, step, at):
    proc = subprocess.run(
        command("crash_child", mode, table, WRITES, step, at),
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc


def state(table, mode):
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT label FROM "{table}"')
        labels = Counter(r[0] for r in cursor.fetchall())
        if mode == "producer":
            cursor.execute("SELECT producer, seq FROM _rindle_producer_offsets")
            stored = {p: int(s) for p, s in cursor.fetchall()}
        else:
            cursor.execute('SELECT source, "offset" FROM _rindle_source_offsets')
            stored = {s: int(o) for s, o in cursor.fetchall()}
        cursor.execute(
            "SELECT COUNT(*) FROM _rindle_change_events WHERE \"table\" = %s AND op = 'add'",
            [table],
        )
        (adds,) = cursor.fetchone()
    return labels, stored, adds


def check(table, mode):
    labels, stored, adds = state(table, mode)
    assert max(labels.values(), default=1) == 1, f"a write applied twice: {labels}"
    expected = {f"{name}:{n}" for name, last in stored.items() for n in range(1, last + 1)}
    assert set(labels) == expected, "effects and cursor disagree"
    assert adds == sum(labels.values()), "the outbox does not match the rows"
    return stored


@pytest.mark.parametrize("mode", ["producer", "source"])
@pytest.mark.parametrize("step", STEPS)
def test_a_kill_between_any_two_steps_loses_and_doubles_nothing(engine, mode, step):
    table = f"crash_{mode}_{step}"
    at = random.Random(f"{mode}{step}").randint(2, WRITES * NAMES - 2)
    try:
        killed = run_child(table, mode, step, at)
        assert killed.returncode == -9, killed.stderr[-2000:]
        stored = check(table, mode)
        landed = sum(stored.values())
        # The kill after the commit keeps that write; any earlier kill loses it whole.
        assert landed == (at if step == "committed" else at - 1)
        finished = run_child(table, mode, "none", 0)
        assert finished.returncode == 0 and "DONE" in finished.stdout, finished.stderr[-2000:]
        stored = check(table, mode)
        assert sorted(stored.values()) == [WRITES] * NAMES
        if mode == "producer":
            engine.seed_producer_census()
            assert engine.producer_census.get() == NAMES
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE IF EXISTS "{table}"')
