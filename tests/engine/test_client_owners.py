"""Client ids have owners: the first principal that writes under one owns it (issue 13, 4)."""

import hashlib
import threading
from types import SimpleNamespace

import pytest
from django.db import connection

from project.demo.models import User
from rindle_app.engine import ClientIdTaken, Engine, MutationGap, mutator
from rindle_app.engine.mutations import principal_key
from rindle_app.flow.quota import Refusal, refusal_for
from rindle_app.testing import outbox_high_water

from .test_concurrency import run_all

A, B = "u:1", "u:2"


@mutator("own_addUser")
def add_user(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": args.get("name", "x")})


def add(uid):
    return "own_addUser", {"id": uid}


def ledger():
    """Every ledger row with its owner, as stored."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT client_id, last_mutation_id, owner FROM _rindle_client_mutations "
            "ORDER BY client_id"
        )
        return cursor.fetchall()


def frozen():
    """What a refused mutation must leave alone."""
    return ledger(), sorted(User.objects.values_list("id", flat=True)), outbox_high_water()


def test_principal_keys_name_the_kind_and_reveal_nothing():
    """A token, a user, a session and a sessionless client each get a key of their kind."""
    user = SimpleNamespace(pk=7, is_authenticated=True)
    anonymous = SimpleNamespace(pk=None, is_authenticated=False)
    assert principal_key(user, SimpleNamespace(pk=3), "sess") == "t:3"
    assert principal_key(user, None, "sess") == "u:7"
    digest = hashlib.sha256(b"secret-session-key").hexdigest()
    assert principal_key(anonymous, None, "secret-session-key") == f"s:{digest}"
    assert "secret-session-key" not in principal_key(None, None, "secret-session-key")
    assert principal_key(anonymous, None, None) == principal_key(None) == "anonymous"


def test_a_taken_id_counts_as_a_permission_refusal():
    """The usage ledger files client_id_taken with the permission refusals, frame or HTTP."""
    assert refusal_for("client_id_taken") == Refusal.PERMISSION
    assert refusal_for("client_id_taken", 403) == Refusal.PERMISSION


def test_the_first_writer_owns_the_client_id(engine):
    """The first principal's write claims the id; the owner is stored with the lmid."""
    result = engine.mutate("c1", 1, *add("a1"), owner=A)
    assert result.status == "applied"
    assert ledger() == [("c1", 1, A)]
    engine.mutate("c1", 2, *add("a2"), owner=A)
    assert ledger() == [("c1", 2, A)]


def test_another_principal_is_refused_and_nothing_is_read_or_written(engine):
    """B under A's id: client_id_taken, whatever the mid; the mutator never runs."""
    engine.mutate("c1", 1, *add("a1"), owner=A)
    before = frozen()
    for mid in (1, 2, 50):  # a replay, the next mid, a gap: none tells B the lmid
        with pytest.raises(ClientIdTaken) as info:
            engine.mutate("c1", mid, *add(f"b{mid}"), owner=B)
        assert info.value.code == "client_id_taken" and info.value.status == 403
        assert "lmid" not in info.value.as_dict()
        assert frozen() == before
    with pytest.raises(ClientIdTaken):
        engine.check_owner("c1", B)
    engine.check_owner("c1", A)
    engine.check_owner("fresh", B)  # a new id is nobody's yet


def test_the_owners_next_mutation_is_applied_not_absorbed(engine):
    """B's refused attempt at A's next mid leaves that mid for A's real mutation."""
    engine.mutate("c1", 1, *add("a1"), owner=A)
    with pytest.raises(ClientIdTaken):
        engine.mutate("c1", 2, *add("b2"), owner=B)
    result = engine.mutate("c1", 2, *add("a2"), owner=A)
    assert result.status == "applied" and result.lmid == 2
    assert sorted(User.objects.values_list("id", flat=True)) == ["a1", "a2"]


def test_a_rejected_first_mutation_still_claims_the_id(engine):
    """A business rejection advances the lmid, and binds the id like any write."""
    result = engine.mutate("c1", 1, "no_such_mutator", {}, owner=A)
    assert result.status == "rejected"
    assert ledger() == [("c1", 1, A)]
    with pytest.raises(ClientIdTaken):
        engine.mutate("c1", 2, *add("b2"), owner=B)


def test_a_mutator_failure_claims_through_the_recorded_rejection(engine):
    """A mutator that fails its solo transaction is recorded by the fallback, owner included."""
    engine.mutate("c1", 1, *add("dup"), owner=A)
    result = engine.mutate("c2", 1, *add("dup"), owner=B)  # the id exists: integrity error
    assert result.status == "rejected"
    assert ("c2", 1, B) in ledger()
    with pytest.raises(ClientIdTaken):
        engine.mutate("c2", 2, *add("x"), owner=A)


def test_an_unowned_row_is_claimed_once_by_the_next_principal(engine):
    """A row from before owners existed (owner NULL) goes to the first principal after."""
    engine.mutate("old", 1, *add("o1"))  # trusted server code: no owner, no claim
    assert ledger() == [("old", 1, None)]
    engine.check_owner("old", B)  # claimable by anyone until claimed
    assert engine.mutate("old", 2, *add("o2"), owner=A).status == "applied"
    assert ledger() == [("old", 2, A)]
    with pytest.raises(ClientIdTaken):
        engine.mutate("old", 3, *add("o3"), owner=B)
    # Trusted code neither checks nor takes the owner away.
    assert engine.mutate("old", 3, *add("o3")).status == "applied"
    assert ledger() == [("old", 3, A)]


def test_a_gap_is_still_a_gap_for_the_owner(engine):
    """The owner check changes nothing of the lmid rule for the owner."""
    engine.mutate("c1", 1, *add("a1"), owner=A)
    with pytest.raises(MutationGap) as info:
        engine.mutate("c1", 5, *add("a5"), owner=A)
    assert info.value.lmid == 1
    assert engine.mutate("c1", 1, *add("a1"), owner=A).status == "absorbed"


def test_principals_racing_on_a_fresh_id_in_one_writer_leave_one_owner(engine):
    """Threads on one engine (grouped in one transaction or not): exactly one claims."""
    owners = [f"u:{i}" for i in range(8)]
    barrier = threading.Barrier(len(owners))

    def claim(owner):
        barrier.wait()
        try:
            return engine.mutate("race", 1, *add(owner.replace(":", "-")), owner=owner).status
        except ClientIdTaken:
            return "taken"

    outcomes = run_all(claim, owners)
    assert sorted(outcomes) == ["applied"] + ["taken"] * (len(owners) - 1)
    (row,) = ledger()
    winner = owners[outcomes.index("applied")]
    assert row == ("race", 1, winner)
    assert list(User.objects.values_list("id", flat=True)) == [winner.replace(":", "-")]


def test_principals_racing_through_separate_writers_leave_one_owner(engine):
    """Writers of their own (as in other processes: separate connections) race; one owns."""
    engines = [Engine().start() for _ in range(4)]
    try:
        barrier = threading.Barrier(len(engines))

        def claim(i):
            barrier.wait()
            try:
                return engines[i].mutate("race", 1, *add(f"w{i}"), owner=f"u:{i}").status
            except ClientIdTaken:
                return "taken"

        outcomes = run_all(claim, range(len(engines)))
    finally:
        for e in engines:
            e.close()
    assert sorted(outcomes) == ["applied"] + ["taken"] * (len(engines) - 1)
    winner = outcomes.index("applied")
    assert ledger() == [("race", 1, f"u:{winner}")]
    assert list(User.objects.values_list("id", flat=True)) == [f"w{winner}"]


class CountingCursor:
    """The writer's raw cursor, counting the statements sent through it."""

    def __init__(self, raw):
        self.raw, self.statements = raw, []

    def execute(self, sql, params=()):
        self.statements.append(sql)
        return self.raw.execute(sql, params)

    def __getattr__(self, name):
        return getattr(self.raw, name)


@mutator("own_noop")
def noop(tx, args, user):
    pass


def test_the_owner_check_costs_no_statement(engine, vendor):
    """An owned mutation sends the writer's statements an unowned one sends (Postgres: 2)."""
    engine.mutate("warm", 1, "own_noop", {})  # the writer's connection is prepared
    writer = engine._writer
    counting = writer._raw = CountingCursor(writer._raw)
    try:
        engine.mutate("plain", 1, "own_noop", {})
        plain = list(counting.statements)
        counting.statements.clear()
        engine.mutate("owned", 1, "own_noop", {}, owner=A)
        engine.mutate("owned", 2, "own_noop", {}, owner=A)
        owned = counting.statements
    finally:
        writer._raw = counting.raw
    assert len(owned) == 2 * len(plain)
    assert len(plain) == (2 if vendor == "postgresql" else 3)  # sqlite: + the commit version
