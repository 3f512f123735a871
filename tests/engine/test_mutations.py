"""The lmid rules of client mutations, one test per rule, and bad envelopes."""

import functools
import uuid

import pytest
from django.core.exceptions import PermissionDenied
from django.db import OperationalError
from django.test import override_settings
from rest_framework import serializers

from project.demo.models import User
from rindle_app.adapter import RindleAdapter
from rindle_app.engine import (
    InvalidInput,
    MutationGap,
    MutationRejected,
    Unavailable,
    mutator,
)
from rindle_app.testing import outbox_high_water, outbox_since
from tests.support.threads import run_at_once


class NameArgs(serializers.Serializer):
    id = serializers.CharField(max_length=40)
    name = serializers.CharField(max_length=40)


@mutator("t_addUser", args=NameArgs)
def add_user(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": args["name"]})


@mutator("t_addTwoThenFail")
def add_two_then_fail(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "first"})
    tx.insert("user", {"id": args["id"] + "-2", "name": "second"})
    raise MutationRejected("changed my mind", code="nope")


@mutator("t_duplicate")
def duplicate(tx, args, user):
    tx.insert("user", {"id": args["id"] + "-a", "name": "a"})
    tx.insert("user", {"id": args["id"], "name": "again"})  # the id already exists


@mutator("t_forbidden")
def forbidden(tx, args, user):
    raise PermissionDenied("owners only")


@mutator("t_whoami")
def whoami(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": user.username if user else "nobody"})


@mutator("t_unknownTable")
def unknown_table(tx, args, user):
    tx.insert("no_such_table", {"id": "x"})


_flaky = {"left": 0}


@mutator("t_flaky")
def flaky(tx, args, user):
    tx.insert("user", {"id": args["id"], "name": "flaky"})
    if _flaky["left"] > 0:
        _flaky["left"] -= 1
        raise OperationalError("database is locked")


class DenyAll(RindleAdapter):
    def authorize_mutation(self, user, name, args):
        return False


def user_ids():
    return sorted(User.objects.values_list("id", flat=True))


def test_a_new_client_has_lmid_zero(engine):
    """A client that never mutated has lmid 0."""
    assert engine.client_lmid("fresh") == 0


def test_next_mid_applies_effects_and_lmid_together(engine):
    """mid == lmid + 1 runs the mutator and stores the lmid in the same commit."""
    before = outbox_high_water()
    result = engine.mutate("c1", 1, "t_addUser", {"id": "u1", "name": "Ann"})
    assert (result.status, result.lmid, result.code) == ("applied", 1, None)
    assert user_ids() == ["u1"]
    assert engine.client_lmid("c1") == 1
    events = outbox_since(before)
    assert {(e["table"], e["op"]) for e in events} == {
        ("user", "add"),
        ("_rindle_client_mutations", "add"),
    }
    assert result.cv == max(e["seq"] for e in events)


def test_replayed_mid_is_absorbed_without_effects(engine):
    """mid <= lmid is absorbed: success, the stored lmid, nothing written."""
    engine.mutate("c1", 1, "t_addUser", {"id": "u1", "name": "Ann"})
    engine.mutate("c1", 2, "t_addUser", {"id": "u2", "name": "Bob"})
    before = outbox_high_water()
    for mid in (1, 2):
        result = engine.mutate("c1", mid, "t_addUser", {"id": f"other{mid}", "name": "X"})
        assert (result.status, result.lmid, result.accepted) == ("absorbed", 2, True)
    assert user_ids() == ["u1", "u2"]
    assert outbox_since(before) == []


def test_gap_is_refused_with_the_stored_lmid(engine):
    """mid > lmid + 1 is refused, reports the stored lmid, and writes nothing."""
    engine.mutate("c1", 1, "t_addUser", {"id": "u1", "name": "Ann"})
    before = outbox_high_water()
    with pytest.raises(MutationGap) as info:
        engine.mutate("c1", 3, "t_addUser", {"id": "u3", "name": "Cy"})
    assert info.value.lmid == 1
    assert info.value.as_dict()["code"] == "mid_gap"
    assert info.value.status == 409
    assert engine.client_lmid("c1") == 1
    assert outbox_since(before) == []


def test_mutator_rejection_rolls_back_effects_and_still_advances_lmid(engine):
    """A mutator that raises after writing leaves no effect, but the lmid moves on."""
    result = engine.mutate("c1", 1, "t_addTwoThenFail", {"id": "u1"})
    assert (result.status, result.lmid, result.code) == ("rejected", 1, "nope")
    assert result.reason == "changed my mind"
    assert user_ids() == []
    assert engine.client_lmid("c1") == 1
    follow_up = engine.mutate("c1", 2, "t_addUser", {"id": "u2", "name": "Bob"})
    assert follow_up.status == "applied"


def test_invalid_args_are_a_business_rejection(engine):
    """Args failing the mutator's serializer are rejected; the lmid advances."""
    result = engine.mutate("c1", 1, "t_addUser", {"id": "u1"})
    assert (result.status, result.lmid, result.code) == ("rejected", 1, "invalid_args")
    assert "name" in result.reason
    assert user_ids() == []
    assert engine.client_lmid("c1") == 1


def test_unknown_mutator_is_a_business_rejection(engine):
    """An unknown mutator name is rejected with a code; the lmid advances."""
    result = engine.mutate("c1", 1, "noSuchMutator", {})
    assert (result.status, result.code) == ("rejected", "unknown_mutator")
    assert engine.client_lmid("c1") == 1


def test_unauthorized_by_adapter_is_a_business_rejection(engine):
    """The adapter's refusal rejects the mutation before it runs; the lmid advances."""
    with override_settings(RINDLE={"ADAPTER": "tests.engine.test_mutations.DenyAll"}):
        result = engine.mutate("c1", 1, "t_addUser", {"id": "u1", "name": "Ann"})
    assert (result.status, result.code) == ("rejected", "unauthorized")
    assert user_ids() == []
    assert engine.client_lmid("c1") == 1


def test_permission_denied_inside_the_mutator_is_unauthorized(engine):
    """PermissionDenied raised by a mutator is reported as unauthorized."""
    result = engine.mutate("c1", 1, "t_forbidden", {})
    assert (result.status, result.code, result.reason) == (
        "rejected",
        "unauthorized",
        "owners only",
    )
    assert engine.client_lmid("c1") == 1


def test_integrity_error_inside_the_mutator_is_a_business_rejection(engine):
    """A deterministic integrity error is a rejection (retrying cannot help): lmid advances."""
    engine.mutate("c1", 1, "t_addUser", {"id": "dup", "name": "Ann"})
    result = engine.mutate("c1", 2, "t_duplicate", {"id": "dup"})
    assert (result.status, result.code) == ("rejected", "integrity_error")
    assert user_ids() == ["dup"]  # the mutator's first insert was rolled back too
    assert engine.client_lmid("c1") == 2


def test_unknown_table_inside_the_mutator_is_rejected_with_its_code(engine):
    """A mutator naming an unregistered table is rejected with code unknown_table."""
    result = engine.mutate("c1", 1, "t_unknownTable", {})
    assert (result.status, result.code) == ("rejected", "unknown_table")


def test_database_failure_advances_nothing_and_is_retryable(engine):
    """An infrastructure error rolls everything back, lmid included; a resend applies once."""
    _flaky["left"] = 1
    before = outbox_high_water()
    with pytest.raises(Unavailable) as info:
        engine.mutate("c1", 1, "t_flaky", {"id": "f1"})
    assert info.value.retryable and info.value.code == "unavailable"
    assert engine.client_lmid("c1") == 0
    assert outbox_since(before) == []
    result = engine.mutate("c1", 1, "t_flaky", {"id": "f1"})
    assert (result.status, result.lmid) == ("applied", 1)
    assert user_ids() == ["f1"]


def test_the_acting_user_comes_from_the_caller_never_from_args(engine, django_user_model):
    """The mutator sees the user passed by the transport, whatever args claim."""
    alice = django_user_model.objects.create_user("alice")
    engine.mutate("c1", 1, "t_whoami", {"id": "w1", "user": "mallory"}, user=alice)
    engine.mutate("c2", 1, "t_whoami", {"id": "w2", "user": "mallory"})
    assert dict(User.objects.values_list("id", "name")) == {"w1": "alice", "w2": "nobody"}


def test_clients_have_independent_lmids(engine):
    """Each client id has its own mid sequence."""
    engine.mutate("a", 1, "t_addUser", {"id": "a1", "name": "A"})
    engine.mutate("b", 1, "t_addUser", {"id": "b1", "name": "B"})
    engine.mutate("b", 2, "t_addUser", {"id": "b2", "name": "B"})
    assert (engine.client_lmid("a"), engine.client_lmid("b")) == (1, 2)


@pytest.mark.parametrize(
    "client_id, mid, name, args, code",
    [
        ("c1", "1", "t_addUser", {}, "invalid_mid"),
        ("c1", 1.0, "t_addUser", {}, "invalid_mid"),
        ("c1", True, "t_addUser", {}, "invalid_mid"),
        ("c1", 0, "t_addUser", {}, "invalid_mid"),
        ("c1", -3, "t_addUser", {}, "invalid_mid"),
        ("", 1, "t_addUser", {}, "invalid_client_id"),
        (7, 1, "t_addUser", {}, "invalid_client_id"),
        ("x" * 256, 1, "t_addUser", {}, "invalid_client_id"),
        ("c1", 1, "", {}, "invalid_name"),
        ("c1", 1, None, {}, "invalid_name"),
        ("c1", 1, "t_addUser", {"id": object()}, "invalid_args"),
        ("c1", 1, "t_addUser", {"v": float("nan")}, "invalid_args"),
        ("c1", 1, "t_addUser", {"blob": "x" * (64 * 1024)}, "args_too_large"),
    ],
)
def test_malformed_envelope_is_refused_and_writes_nothing(engine, client_id, mid, name, args, code):
    """A malformed envelope gets a machine-readable code; no effect, no lmid, no event."""
    before = outbox_high_water()
    with pytest.raises(InvalidInput) as info:
        engine.mutate(client_id, mid, name, args)
    assert info.value.code == code
    assert info.value.status == 400
    assert outbox_since(before) == []
    assert engine.client_lmid("c1") == 0


@mutator("t_badSql")
def bad_sql(tx, args, user):
    tx.insert("user", {"id": "before-typo", "name": "x"})
    tx.execute("SELECT * FROM no_such_table")


def test_a_sql_mistake_in_a_mutator_is_a_rejection_on_every_backend(engine):
    """A missing table in a mutator's SQL is deterministic: rejected, lmid advances."""
    result = engine.mutate("c1", 1, "t_badSql", {})
    assert result.status == "rejected"
    assert result.code == "mutator_error"
    assert "no_such_table" in result.reason
    assert user_ids() == []
    assert engine.client_lmid("c1") == 1


@mutator("t_count")
def count_effect(tx, args, user):
    # A fresh id per run: applying a mid twice leaves two rows, not a key conflict.
    tx.insert("user", {"id": uuid.uuid4().hex, "name": str(args["mid"])})


def test_two_writers_racing_one_client_apply_each_mid_once(transactional_db):
    """Two engines (as in two processes) sending one client's envelopes never double-apply."""

    from rindle_app.engine import Engine

    engines = [Engine().start(), Engine().start()]
    total = 60

    def send(engine):
        mid = 1
        while mid <= total:
            try:
                engine.mutate("shared", mid, "t_count", {"client": "shared", "mid": mid})
                mid += 1
            except MutationGap as gap:
                mid = gap.lmid + 1

    try:
        run_at_once([functools.partial(send, e) for e in engines])
        assert engines[0].client_lmid("shared") == total
        names = sorted(User.objects.values_list("name", flat=True), key=int)
        assert names == [str(m) for m in range(1, total + 1)]
    finally:
        for e in engines:
            e.close()
