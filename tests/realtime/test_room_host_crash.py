"""
Kill -9 a process whose room hosts are mid-flush, then boot the next hosts: they
claim the next epoch, absorb what is durable as replays and apply the rest. No
mutation is applied but unrecorded, none is applied twice, and under every room
lmid "no outcome row" holds exactly when the mutation was applied.
"""

import random

import pytest
from django.db import connection

from tests.engine.test_ingest_crash import WRITES, run_child
from tests.support.room_ledger import check_room_ledger

NAMES = 3  # the child's docs D0..D2 (tests/support/crash_child.py, mode room_host)
BATCH = 3  # mids per flush (ROOM_HOST_BATCH)
REJECT_EVERY = 5  # the child's mutator rejects every 5th mid, after writing its row
STEPS = ("admitted", "effects", "ledger", "cursor", "committed")


def check(table):
    return check_room_ledger(
        table, docs=NAMES, writes=WRITES, reject_every=REJECT_EVERY, batch=BATCH
    )


@pytest.mark.parametrize("step", STEPS)
def test_room_hosts_killed_mid_flush_lose_and_double_nothing(engine, step):
    table = f"room_host_crash_{step}"
    flushes = WRITES // BATCH * NAMES
    at = random.Random(step).randint(2, flushes - 1)
    try:
        killed = run_child(table, "room_host", step, at)
        assert killed.returncode == -9, killed.stderr[-2000:]
        assert "ANOMALY" not in killed.stdout, killed.stdout
        # the kill after the commit keeps that flush; any earlier kill loses it whole
        assert check(table) == BATCH * (at if step == "committed" else at - 1)
        finished = run_child(table, "room_host", "none", 0)
        assert finished.returncode == 0 and "DONE" in finished.stdout, finished.stderr[-2000:]
        assert "ANOMALY" not in finished.stdout, finished.stdout
        assert check(table) == WRITES * NAMES
        with connection.cursor() as cursor:
            cursor.execute("SELECT doc, epoch FROM _rindle_room_placement ORDER BY doc")
            assert cursor.fetchall() == [(f"D{k}", 2) for k in range(NAMES)]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE IF EXISTS "{table}"')
