"""
Crash safety: a process applying client mutations is killed with SIGKILL at random
moments, and every kill leaves each client's lmid and its effects in step.

The child (``tests/crash_child.py``) uses this test run's database. After each kill
the committed state must satisfy, per client: the effect rows are exactly the
non-rejected mids in 1..lmid, each once (an effect never lands without its lmid,
an lmid never without its effect); and the outbox holds exactly one ``add`` event
per effect row. The next child re-sends every envelope from mid 1, so absorbed
envelopes must not run again. Set RINDLE_CRASH_SEED to replay a run.
"""

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction

from rindle_app.models import ChangeEvent

from .conftest import child_env

ROOT = Path(__file__).resolve().parent.parent
CHILD = ROOT / "tests" / "crash_child.py"
CLIENTS, MIDS, RACERS = 8, 400, 2
KILL_ROUNDS = 5
REJECT_EVERY = 7  # crash_child.REJECT_EVERY
START_TIMEOUT = 60
FINISH_TIMEOUT = 120


def child_args(table, rng):
    return [table, CLIENTS, MIDS, RACERS, rng.randrange(2**32)]


class Child:
    """
    One run of a crash child (``script``, default crash_child.py, with ``args``) on
    this test run's database; its stdout lines are collected by a thread, and a
    ``STARTED`` line marks it ready.
    """

    def __init__(self, args, stderr_path, script=CHILD):
        self.stderr_path = stderr_path
        self.lines = []
        self.started = threading.Event()
        self._stderr = open(stderr_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *map(str, args)],
            cwd=ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("STARTED"):
                self.started.set()
        self.started.set()  # EOF: the child died before (or after) starting

    def wait_started(self):
        if not self.started.wait(START_TIMEOUT) or "STARTED" not in self.lines:
            self.kill()
            pytest.fail(f"the child did not start:\n{self.stderr()}")

    def kill(self):
        """SIGKILL the child (if still running) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.finish()

    def wait(self, timeout):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the child did not finish in {timeout} s (hang?):\n{self.stderr()}")
        self.finish()

    def finish(self):
        self._reader.join(10)
        self.proc.stdout.close()
        self._stderr.close()

    @property
    def done(self):
        return "DONE" in self.lines

    @property
    def anomalies(self):
        return [line for line in self.lines if line.startswith("ANOMALY")]

    def stderr(self):
        return Path(self.stderr_path).read_text()[-4000:]


def client_ids(table):
    return [f"{table}-c{n}" for n in range(CLIENTS)]


def expected_mids(lmid):
    return {mid for mid in range(1, lmid + 1) if mid % REJECT_EVERY}


def wait_for_dead_sessions(timeout=20):
    """On Postgres, wait until the killed child's server sessions have ended."""
    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            if cursor.fetchone()[0] == 0:
                return
        if time.monotonic() > deadline:
            pytest.fail("the killed child's database sessions did not end")
        time.sleep(0.05)


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
