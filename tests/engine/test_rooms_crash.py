"""
Kill -9 a room host mid-flush, then boot the next host as the original does: it
claims the next epoch (fencing the dead host), reads the room ledger and resumes.
Nothing applied is left unrecorded, nothing is applied twice, and for every mid
the ledger covers, "no outcome row" holds exactly when the mutation was applied.
"""

import random

import pytest
from django.db import connection

from tests.support.room_ledger import check_room_ledger

from .test_ingest_crash import WRITES, run_child

NAMES = 3  # the child's docs D0..D2 (tests/support/crash_child.py)
REJECT_ROOM_EVERY = 5  # the child rejects every 5th mid
STEPS = ("admitted", "effects", "ledger", "cursor", "committed")


def check(table):
    return check_room_ledger(
        table, docs=NAMES, writes=WRITES, reject_every=REJECT_ROOM_EVERY, cursors=True
    )


@pytest.mark.parametrize("step", STEPS)
def test_a_room_host_killed_mid_flush_loses_and_doubles_nothing(engine, step):
    table = f"room_crash_{step}"
    at = random.Random(step).randint(2, WRITES * NAMES - 2)
    killed = run_child(table, "room", step, at)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert "ANOMALY" not in killed.stdout, killed.stdout
    landed = check(table)
    assert landed == (at if step == "committed" else at - 1)
    finished = run_child(table, "room", "none", 0)
    assert finished.returncode == 0 and "DONE" in finished.stdout, finished.stderr[-2000:]
    assert "ANOMALY" not in finished.stdout, finished.stdout
    assert check(table) == WRITES * NAMES
    with connection.cursor() as cursor:
        cursor.execute("SELECT doc, epoch FROM _rindle_room_placement ORDER BY doc")
        assert cursor.fetchall() == [(f"D{k}", 2) for k in range(NAMES)]
        cursor.execute(f'DROP TABLE IF EXISTS "{table}"')
