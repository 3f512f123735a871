"""
Kill -9 a room host mid-flush, then boot the next host as the original does: it
claims the next epoch (fencing the dead host), reads the room ledger and resumes.
Nothing applied is left unrecorded, nothing is applied twice, and for every mid
the ledger covers, "no outcome row" holds exactly when the mutation was applied.
"""

import random
from collections import Counter

import pytest
from django.db import connection

from .test_ingest_crash import WRITES, run_child

NAMES = 3  # the child's docs D0..D2 (tests/support/crash_child.py)
REJECT_ROOM_EVERY = 5  # the child rejects every 5th mid
STEPS = ("admitted", "effects", "ledger", "cursor", "committed")


def check(table):
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT label FROM "{table}"')
        labels = Counter(r[0] for r in cursor.fetchall())
        cursor.execute("SELECT doc, client_id, last_mutation_id FROM _rindle_room_client_mutations")
        lmids = {doc: (client, lmid) for doc, client, lmid in cursor.fetchall()}
        cursor.execute("SELECT doc, client_id, mid FROM _rindle_room_mutation_outcomes")
        outcomes = {(doc, client, mid) for doc, client, mid in cursor.fetchall()}
        cursor.execute('SELECT source, "offset" FROM _rindle_source_offsets')
        cursors = {source: int(offset) for source, offset in cursor.fetchall()}
        cursor.execute("SELECT count(*) FROM _rindle_client_mutations")
        (slow_path,) = cursor.fetchone()
    assert max(labels.values(), default=1) == 1, f"a mutation applied twice: {labels}"
    assert slow_path == 0, "a room flush wrote the slow-path ledger"
    landed = 0
    for k in range(NAMES):
        doc = f"D{k}"
        client, lmid = lmids.get(doc, (f"c{k}", 0))
        assert cursors.get(f"room:{doc}", 0) == lmid, "the ledger and the cursor disagree"
        for mid in range(1, lmid + 1):
            applied = f"{doc}:{mid}" in labels
            assert applied == ((doc, client, mid) not in outcomes), (doc, mid)
            assert applied == (mid % REJECT_ROOM_EVERY != 0), (doc, mid)
        beyond = [m for m in range(lmid + 1, WRITES + 1) if f"{doc}:{m}" in labels]
        assert not beyond, f"{doc}: applied but not recorded by the ledger: {beyond}"
        landed += lmid
    return landed


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
