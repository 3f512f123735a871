"""
Crash safety: a process applying client mutations is killed with SIGKILL at random
moments, and every kill leaves each client's lmid and its effects in step.

The child (``tests/support/crash_child.py``, mode ``mutations``) uses this test
run's database. After each kill the committed state must satisfy, per client: the
effect rows are exactly the non-rejected mids in 1..lmid, each once (an effect never
lands without its lmid, an lmid never without its effect); and the outbox holds
exactly one ``add`` event per effect row. The next child re-sends every envelope
from mid 1, so absorbed envelopes must not run again. Set RINDLE_CRASH_SEED to
replay a run.
"""

import os
import random
import time
import uuid
from collections import Counter

import pytest
from django.db import connection, transaction

from rindle_app.models import ChangeEvent
from tests.support.processes import Child, wait_for_dead_sessions

CLIENTS, MIDS, RACERS = 8, 400, 2
KILL_ROUNDS = 5
REJECT_EVERY = 7  # tests/support/crash_child.py: REJECT_EVERY
FINISH_TIMEOUT = 120


def child_args(table, rng):
    return ["mutations", table, CLIENTS, MIDS, RACERS, rng.randrange(2**32)]


def client_ids(table):
    return [f"{table}-c{n}" for n in range(CLIENTS)]


def expected_mids(lmid):
    return {mid for mid in range(1, lmid + 1) if mid % REJECT_EVERY}


def snapshot(table):
    """(lmid per client, effect rows (id, client, mid), outbox (op, pk) of ``table``)."""
    clients = client_ids(table)
    with transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            marks = ", ".join(["%s"] * len(clients))
            cursor.execute(
                "SELECT client_id, last_mutation_id FROM _rindle_client_mutations "
                f"WHERE client_id IN ({marks})",
                clients,
            )
            lmids = {client: 0 for client in clients}
            lmids.update(dict(cursor.fetchall()))
            cursor.execute(f'SELECT id, client, mid FROM "{table}"')
            effects = cursor.fetchall()
        events = list(ChangeEvent.objects.filter(table=table).values_list("op", "key"))
    return lmids, effects, events


def assert_consistent(table, lmids, effects, events, context):
    """Effects == the non-rejected mids of 1..lmid, once each; one outbox add per effect."""
    by_client = {client: Counter() for client in lmids}
    strays = [row for row in effects if row[1] not in by_client]
    assert not strays, f"{context}: effect rows of unknown clients: {strays[:5]}"
    for _, client, mid in effects:
        by_client[client][mid] += 1
    for client, lmid in lmids.items():
        counts = by_client[client]
        doubled = sorted(mid for mid, n in counts.items() if n > 1)
        assert not doubled, f"{context}: {client} effects applied twice: {doubled}"
        have, want = set(counts), expected_mids(lmid)
        assert have == want, (
            f"{context}: {client} at lmid {lmid}: effects without lmid "
            f"{sorted(have - want)}, lmid without effects {sorted(want - have)}"
        )
    ops = Counter(op for op, _ in events)
    assert set(ops) <= {"add"}, f"{context}: unexpected outbox ops {ops}"
    captured = Counter(key[0] for _, key in events)
    written = Counter(row[0] for row in effects)
    assert captured == written, (
        f"{context}: outbox adds differ from effect rows: "
        f"missing {sorted((written - captured).elements())[:5]}, "
        f"extra {sorted((captured - written).elements())[:5]}"
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigkill_at_random_moments_never_splits_an_lmid_from_its_effects(tmp_path):
    """
    Five children are SIGKILLed 0.05-1.0 s after starting; after every kill each
    client's effects are exactly its non-rejected mids up to its lmid, once, with one
    outbox event each, and no lmid ever goes back. Every restart re-sends every
    envelope from mid 1 (absorbed ones run nothing), and a last child completes
    them all: lmid == MIDS for every client, every non-rejected effect exactly once.
    """
    seed = int(os.environ.get("RINDLE_CRASH_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    table = f"fx_crash_{uuid.uuid4().hex[:12]}"
    child = None
    previous = {client: 0 for client in client_ids(table)}
    interrupted = 0
    try:
        for round_no in range(1, KILL_ROUNDS + 1):
            context = f"seed {seed}, round {round_no}"
            child = Child(child_args(table, rng), tmp_path / f"child-{round_no}.err")
            child.wait_started()
            delay = rng.uniform(0.05, 1.0)
            time.sleep(delay)
            child.kill()
            assert not child.anomalies, f"{context}: {child.anomalies[:10]}\n{child.stderr()}"
            wait_for_dead_sessions()
            lmids, effects, events = snapshot(table)
            assert_consistent(table, lmids, effects, events, f"{context} (kill at {delay:.2f}s)")
            regressed = {c: (previous[c], lmids[c]) for c in lmids if lmids[c] < previous[c]}
            assert not regressed, f"{context}: committed lmids went back: {regressed}"
            if not child.done and sum(lmids.values()) < CLIENTS * MIDS:
                interrupted += 1
            previous = lmids

        context = f"seed {seed}, final run"
        child = Child(child_args(table, rng), tmp_path / "child-final.err")
        child.wait_started()
        child.wait(FINISH_TIMEOUT)
        assert not child.anomalies, f"{context}: {child.anomalies[:10]}\n{child.stderr()}"
        assert child.proc.returncode == 0 and child.done, (
            f"{context}: exit {child.proc.returncode}\n{child.stderr()}"
        )
        lmids, effects, events = snapshot(table)
        assert lmids == {client: MIDS for client in lmids}, f"{context}: {lmids}"
        assert_consistent(table, lmids, effects, events, context)
        assert len(effects) == CLIENTS * len(expected_mids(MIDS))
        assert interrupted >= 1, f"{context}: no kill landed while work was outstanding"
    finally:
        if child is not None and child.proc.poll() is None:
            child.kill()
        wait_for_dead_sessions()
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE IF EXISTS "{table}"')
