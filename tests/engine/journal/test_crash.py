"""
Crash safety of the journal: a process applying a folder of migrations is SIGKILLed
at random moments, and every kill leaves each migration either fully applied with
its marker or absent.

The child (``tests/support/crash_child.py``, mode ``journal``) runs
``rindle_migrate`` on this test run's database, pausing inside each migration's
transaction after every statement. After each kill: the journaled ids are a prefix
of the files in name order; a DDL migration's tables and columns exist exactly when
its marker does; a DML migration's rows and its counter increment exist exactly when
its marker does, once (the counter would show a second run); and the outbox holds
exactly one captured event per row change. Each restart re-runs the whole folder, so
journaled files must be ``present`` and run nothing; tables created by an earlier
child must be registered (captured) by the next one for its DML to be accepted. Set
RINDLE_CRASH_SEED to replay a run.
"""

import os
import random
import time
import uuid
from collections import Counter

import pytest
from django.db import connection

from rindle_app.models import ChangeEvent
from tests.support.processes import Child, wait_for_dead_sessions

from .conftest import journal_rows, tables

FILES = 60  # after the two set-up files; odd: DDL, even: DML
ROWS = 4  # rows each DML migration inserts
KILL_ROUNDS = 5
FINISH_TIMEOUT = 120


def build(folder, p):
    """The migration files; returns {id: kind}."""
    kinds = {}

    def add(mid, kind, statements):
        (folder / f"{mid}.sql").write_text(";\n".join(statements) + ";\n")
        kinds[mid] = kind

    add(
        "0000_base",
        "ddl",
        [
            f"CREATE TABLE {p}counter (id TEXT PRIMARY KEY, n INTEGER NOT NULL)",
            f"CREATE TABLE {p}items (id TEXT PRIMARY KEY, batch INTEGER NOT NULL)",
        ],
    )
    add("0001_counter", "dml", [f"INSERT INTO {p}counter (id, n) VALUES ('c', 0)"])
    for k in range(2, FILES + 2):
        if k % 2:
            add(
                f"{k:04d}_table",
                "ddl",
                [
                    f"CREATE TABLE {p}t{k} (id TEXT PRIMARY KEY, v TEXT)",
                    f"CREATE INDEX {p}t{k}_v ON {p}t{k} (v)",
                    f"ALTER TABLE {p}t{k} ADD COLUMN w TEXT",
                ],
            )
        else:
            add(
                f"{k:04d}_rows",
                "dml",
                [f"UPDATE {p}counter SET n = n + 1 WHERE id = 'c'"]
                + [
                    f"INSERT INTO {p}items (id, batch) VALUES ('{k}-{i}', {k})" for i in range(ROWS)
                ],
            )
    return kinds


def columns(table):
    with connection.cursor() as cursor:
        return [c.name for c in connection.introspection.get_table_description(cursor, table)]


def assert_consistent(p, kinds, context):
    ids = sorted(kinds)
    marked = [key for key, _c, _cc in journal_rows() if key in kinds]
    assert marked == ids[: len(marked)], f"{context}: markers are not a prefix: {marked}"
    present = set(tables())
    for mid in ids:
        k = int(mid[:4])
        if mid == "0000_base":
            want = {f"{p}counter", f"{p}items"}
            assert (want <= present) == (mid in marked), f"{context}: {mid} tables vs marker"
            assert not (want & present) or want <= present, f"{context}: {mid} half applied"
        elif kinds[mid] == "ddl":
            name = f"{p}t{k}"
            assert (name in present) == (mid in marked), f"{context}: {mid} table vs marker"
            if name in present:
                assert columns(name) == ["id", "v", "w"], f"{context}: {mid} half applied"
    if "0000_base" not in marked:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT n FROM {p}counter WHERE id = 'c'")
        counter = cursor.fetchone()
        cursor.execute(f"SELECT id, batch FROM {p}items")
        items = cursor.fetchall()
    assert (counter is not None) == ("0001_counter" in marked), f"{context}: counter row"
    dml = [mid for mid in marked if kinds[mid] == "dml" and mid != "0001_counter"]
    if counter is not None:
        assert counter[0] == len(dml), f"{context}: counter {counter[0]} for {len(dml)} DML markers"
    batches = Counter(batch for _id, batch in items)
    want = {int(mid[:4]): ROWS for mid in dml}
    assert dict(batches) == want, f"{context}: item rows {dict(batches)} vs markers {want}"
    events = Counter((e.table, e.op) for e in ChangeEvent.objects.filter(table__startswith=p))
    # Each table an applied DDL migration made has its one DDL marker, committed in
    # the migration's transaction like the journal's row.
    ddl = Counter({k: n for k, n in events.items() if k[1] == "ddl"})
    made = {name for name in present if name.startswith(p)}
    assert ddl == Counter({(name, "ddl"): 1 for name in made}), f"{context}: DDL markers"
    events -= ddl
    expected = Counter({(f"{p}items", "add"): len(items)})
    if counter is not None:
        expected[(f"{p}counter", "add")] = 1
        if counter[0]:
            expected[(f"{p}counter", "edit")] = counter[0]
    assert events == expected, f"{context}: outbox {dict(events)} vs rows {dict(expected)}"
    return len(marked)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_sigkill_between_steps_leaves_no_half_migration_and_no_double(scratch, tmp_path):
    """
    Five children are SIGKILLed 0.02-0.8 s after their engine starts; after every
    kill each migration is whole with its marker or absent, DML effects are never
    doubled and the outbox matches the rows. A last child completes the folder.
    """
    seed = int(os.environ.get("RINDLE_CRASH_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    p = f"jt_crash_{uuid.uuid4().hex[:8]}_"
    folder = tmp_path / "migrations"
    folder.mkdir()
    kinds = build(folder, p)
    child, interrupted, previous = None, 0, 0
    try:
        for round_no in range(1, KILL_ROUNDS + 1):
            context = f"seed {seed}, round {round_no}"
            child = Child(
                ["journal", folder, rng.randrange(2**32)], tmp_path / f"child-{round_no}.err"
            )
            child.wait_started()
            delay = rng.uniform(0.02, 0.8)
            time.sleep(delay)
            child.kill()
            wait_for_dead_sessions()
            done = assert_consistent(p, kinds, f"{context} (kill at {delay:.2f}s)")
            assert done >= previous, f"{context}: journaled migrations went back"
            if done < len(kinds):
                interrupted += 1
            previous = done
            print(f"round {round_no}: killed at {delay:.2f}s with {done} journaled")
        context = f"seed {seed}, final run"
        child = Child(["journal", folder, rng.randrange(2**32)], tmp_path / "child-final.err")
        child.wait_started()
        child.wait(FINISH_TIMEOUT)
        assert child.proc.returncode == 0 and "DONE" in child.lines, (
            f"{context}: exit {child.proc.returncode}\n{child.stderr()}"
        )
        assert assert_consistent(p, kinds, context) == len(kinds)
        assert (
            child.lines[-2]
            == f"schema version: {sorted(m for m in kinds if kinds[m] == 'ddl')[-1]}"
        )
        assert interrupted >= 3, f"{context}: no kill landed while work was outstanding"
    finally:
        if child is not None and child.proc.poll() is None:
            child.kill()
        wait_for_dead_sessions()
