"""The writer survives failures that only show at COMMIT, and unexpected ones."""

import pytest
from django.db import IntegrityError, connection

from rindle_app.engine import mutator
from rindle_app.engine.writer import Writer
from rindle_app.testing import hold_writer


@pytest.fixture
def deferred_fk(engine):
    """A parent/child pair whose foreign key is checked at COMMIT, as Django declares them."""
    with connection.cursor() as cursor:
        cursor.execute('CREATE TABLE "fk_parent" ("id" TEXT PRIMARY KEY)')
        cursor.execute(
            'CREATE TABLE "fk_child" ("id" TEXT PRIMARY KEY, "parent" TEXT '
            'REFERENCES "fk_parent" ("id") DEFERRABLE INITIALLY DEFERRED)'
        )
    engine.register_existing_table("fk_parent")
    engine.register_existing_table("fk_child")
    engine.write(lambda tx: tx.insert("fk_parent", {"id": "p1"}))
    yield engine
    with connection.cursor() as cursor:
        cursor.execute('DROP TABLE "fk_child"')
        cursor.execute('DROP TABLE "fk_parent"')


@mutator("t_addChild")
def add_child(tx, args, user):
    tx.insert("fk_child", {"id": args["id"], "parent": args["parent"]})


def child_ids():
    with connection.cursor() as cursor:
        cursor.execute('SELECT id FROM "fk_child" ORDER BY id')
        return [r[0] for r in cursor.fetchall()]


def test_a_deferred_constraint_violation_is_a_rejection_that_advances_lmid(deferred_fk):
    """A mutation whose insert breaks a deferred foreign key is rejected; its lmid moves on."""
    engine = deferred_fk
    result = engine.mutate("c1", 1, "t_addChild", {"id": "orphan", "parent": "nope"})
    assert (result.status, result.code, result.lmid) == ("rejected", "integrity_error", 1)
    assert child_ids() == []
    assert engine.client_lmid("c1") == 1
    assert engine.mutate("c1", 2, "t_addChild", {"id": "ok", "parent": "p1"}).status == "applied"
    assert child_ids() == ["ok"]


def test_one_bad_commit_in_a_group_does_not_sink_the_others(deferred_fk):
    """Requests grouped with one whose commit fails still land; only the culprit fails."""
    engine = deferred_fk
    with hold_writer(engine):
        good = [
            engine.submit(lambda tx, i=i: tx.insert("fk_child", {"id": f"g{i}", "parent": "p1"}))
            for i in range(5)
        ]
        bad = engine.submit(lambda tx: tx.insert("fk_child", {"id": "bad", "parent": "missing"}))
    for request in good:
        engine.wait(request)
    with pytest.raises(IntegrityError):
        engine.wait(bad)
    assert child_ids() == [f"g{i}" for i in range(5)]


def test_an_unexpected_failure_fails_its_requests_and_the_writer_goes_on(engine, monkeypatch):
    """A bug that escapes the transaction code fails that batch, not the whole engine."""
    calls = {"n": 0}
    original = Writer._attempt

    def broken_once(self, pending):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug in the writer")
        return original(self, pending)

    monkeypatch.setattr(Writer, "_attempt", broken_once)
    with pytest.raises(RuntimeError, match="bug in the writer"):
        engine.write(lambda tx: None)
    assert engine.write(lambda tx: 7).value == 7
