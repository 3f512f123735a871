"""The writer: inline for an uncontended caller, queued otherwise, one transaction each."""

import threading

import pytest
from django.db import connection, connections, transaction

from project.demo.models import User
from rindle_app.engine import InvalidInput, MutationRejected, mutator
from rindle_app.testing import hold_writer


@mutator("t_ormThenReject")
def orm_then_reject(tx, args, user):
    User.objects.create(id=args["id"], name="via ORM")
    if args.get("reject"):
        raise MutationRejected("no")


def test_orm_calls_in_an_inline_mutator_join_its_transaction(engine):
    """The ORM inside a mutator writes in the mutation's transaction, rolled back with it."""
    assert engine.mutate("c1", 1, "t_ormThenReject", {"id": "kept"}).status == "applied"
    result = engine.mutate("c1", 2, "t_ormThenReject", {"id": "gone", "reject": True})
    assert (result.status, result.lmid) == ("rejected", 2)
    assert list(User.objects.values_list("id", flat=True)) == ["kept"]


def test_orm_calls_in_a_queued_mutator_roll_back_alone_in_a_group_commit(engine):
    """In one group commit, a rejected mutator's ORM writes go; its neighbour's stay."""
    results = {}

    def send(client, args):
        results[client] = engine.mutate(client, 1, "t_ormThenReject", args)

    with hold_writer(engine):
        senders = [
            threading.Thread(target=send, args=("c1", {"id": "gone", "reject": True})),
            threading.Thread(target=send, args=("c2", {"id": "kept"})),
        ]
        for t in senders:
            t.start()
        while engine.queue_depth < 2:
            pass
    for t in senders:
        t.join(10)
    assert (results["c1"].status, results["c2"].status) == ("rejected", "applied")
    assert list(User.objects.values_list("id", flat=True)) == ["kept"]
    assert engine.client_lmid("c1") == engine.client_lmid("c2") == 1


def test_the_callers_own_connection_is_restored_after_an_inline_write(engine):
    """After an inline write, the caller's thread has its own connection back."""
    with connection.cursor():
        pass
    own = connections["default"]
    engine.write(lambda tx: tx.insert("user", {"id": "u", "name": "x"}))
    assert connections["default"] is own
    assert own.in_atomic_block is False


def test_a_write_commits_independently_of_the_callers_transaction(engine):
    """On Postgres a write commits on the writer, whatever the caller's transaction does."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: see test_a_caller_holding_sqlites_write_lock_is_told_at_once")
    with pytest.raises(RuntimeError), transaction.atomic():
        engine.write(lambda tx: tx.insert("user", {"id": "committed", "name": "x"}))
        raise RuntimeError("the caller's own transaction rolls back")
    assert list(User.objects.values_list("id", flat=True)) == ["committed"]


def test_a_caller_holding_sqlites_write_lock_is_told_at_once(engine):
    """On SQLite a caller inside its own atomic() gets a clear error, not a lock timeout."""
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite has a single write lock per database")
    with transaction.atomic():
        with pytest.raises(InvalidInput) as info:
            engine.write(lambda tx: tx.insert("user", {"id": "u", "name": "x"}))
    assert info.value.code == "caller_holds_write_lock"
    assert User.objects.count() == 0


def test_a_write_inside_a_write_is_refused(engine):
    """A request may not start another write (it would wait for itself)."""

    def nested(tx):
        engine.write(lambda inner: None)

    with pytest.raises(InvalidInput) as info:
        engine.write(nested)
    assert info.value.code == "nested_write"


def test_an_alone_request_never_shares_a_group_commit(engine):
    """``alone``: queued between others, it runs in its own transaction; they still group."""
    seen = {}

    def send(name, alone):
        def fn(tx):
            seen[name] = tx  # the Tx of the transaction it ran in
            return tx.insert("user", {"id": name, "name": "x"})

        engine.write(fn, alone=alone)

    senders = []
    with hold_writer(engine):
        for depth, (name, alone) in enumerate(
            [("a", False), ("b", False), ("c", True), ("d", False), ("e", False)], start=1
        ):
            senders.append(threading.Thread(target=send, args=(name, alone)))
            senders[-1].start()
            while engine.queue_depth < depth:
                pass
    for t in senders:
        t.join(10)
    assert seen["a"] is seen["b"] and not seen["a"].solo
    assert seen["c"].solo and seen["c"] not in (seen["a"], seen["d"])
    assert seen["d"] is seen["e"]
    assert User.objects.count() == 5
