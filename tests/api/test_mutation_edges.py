"""
Django-shaped edges of POST /api/rindle/mutate: a body that fails validation is a 400
with DRF's field errors; a mutator's validation rejection is an outcome carrying the
field errors as a dict; per-mutator DRF permission classes; what a mutation created.
"""

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from project.demo import models as demo
from tests.support import edge_mutators  # noqa: F401  (registers the t_edge* mutators)

from .conftest import error, post, state, token_client

URL = "/api/rindle/mutate"


def envelope(name, args, mid=1, client="c1"):
    return {"clientID": client, "mid": mid, "name": name, "args": args}


def users():
    return sorted(demo.User.objects.values_list("id", flat=True))


@pytest.fixture
def machine(alice):
    return token_client(alice, "mutate", "read")


# --- request-level validation: 400 with DRF's field errors ----------------------------


@pytest.mark.parametrize(
    "body, details",
    [
        (
            {"envelope": {"clientID": "c1", "mid": "one", "name": "n", "args": {}}},
            {"envelope": {"mid": ["A valid integer is required."]}},
        ),
        ({"envelope": {"clientID": "c1", "mid": 1, "args": {}}}, {"envelope": {"name": None}}),
        ({"nothing": 1}, None),
    ],
)
def test_a_body_that_fails_validation_is_400_with_drfs_field_errors(engine, machine, body, details):
    before = state()
    detail = error(post(machine, URL, body), 400, "invalid_request")
    assert isinstance(detail["details"], dict) and detail["details"]
    if details is not None:
        for field, expected in details["envelope"].items():
            got = detail["details"]["envelope"][field]
            assert isinstance(got, list) and all(isinstance(m, str) for m in got)
            assert expected is None or got == expected
    assert state() == before


def test_a_lease_body_that_fails_validation_names_its_fields(engine, machine):
    detail = error(post(machine, "/api/rindle/query", {"args": {}}), 400, "invalid_request")
    assert detail["details"] == {"name": ["This field is required."]}
    assert "name: This field is required." in detail["message"]


# --- a mutator's validation rejection: an outcome with structured details -------------


def test_invalid_args_are_a_rejection_whose_details_are_the_field_errors(engine, machine):
    args = {"id": "u1", "name": "a name far too long"}
    outcome = post(machine, URL, {"envelope": envelope("t_edgeAddUser", args)}).json()
    assert outcome["rejected"] is True and outcome["code"] == "invalid_args"
    assert outcome["details"] == {"name": ["Ensure this field has no more than 10 characters."]}
    assert outcome["reason"] == (
        "invalid arguments: name: Ensure this field has no more than 10 characters."
    )
    assert outcome["lmid"] == 1 and users() == []  # the mid is consumed, nothing written


def test_a_mutator_validating_with_raise_exception_is_rejected_with_the_field_errors(
    engine, machine, caplog
):
    outcome = post(machine, URL, {"envelope": envelope("t_edgeValidatesInside", {})}).json()
    assert outcome["code"] == "invalid_args"
    assert outcome["details"] == {
        "id": ["This field is required."],
        "name": ["This field is required."],
    }
    assert outcome["lmid"] == 1 and users() == []  # its earlier write is rolled back
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # a rejection, not a bug


def test_a_mutator_raising_djangos_validation_error_is_rejected_with_its_message_dict(
    engine, machine
):
    args = {"id": "u1", "name": ""}
    outcome = post(machine, URL, {"envelope": envelope("t_edgeFullClean", args)}).json()
    assert outcome["code"] == "invalid_args"
    assert outcome["details"] == {"name": ["This field cannot be blank."]}
    assert users() == []


def test_mutation_rejected_carries_the_details_it_was_given(engine, machine):
    args = {"at": "10:00"}
    outcome = post(machine, URL, {"envelope": envelope("t_edgeRejectsWithDetails", args)})
    body = outcome.json()
    assert outcome.status_code == 200
    assert body["code"] == "slot_taken" and body["reason"] == "that slot is taken"
    assert body["details"] == {"slot": {"at": "10:00"}}


def test_a_rejection_without_details_has_no_details_key(engine, machine):
    outcome = post(machine, URL, {"envelope": envelope("noSuchMutator", {})}).json()
    assert outcome["code"] == "unknown_mutator" and "details" not in outcome


# --- permission_classes ---------------------------------------------------------------


def test_a_permission_class_refusal_is_a_rejection_that_consumes_the_mid(
    engine, alice, django_user_model
):
    bob = token_client(django_user_model.objects.create_user("bob"), "mutate")
    before = users()
    refused = post(bob, URL, {"envelope": envelope("t_edgeAliceOnly", {"id": "u1"})}).json()
    assert refused["rejected"] is True and refused["code"] == "permission_denied"
    assert refused["reason"] == "only alice may do this"
    assert refused["lmid"] == 1 and users() == before
    alice_client = token_client(alice, "mutate")
    ok = post(alice_client, URL, {"envelope": envelope("t_edgeAliceOnly", {"id": "u1"}, 1, "c2")})
    assert ok.json()["accepted"] is True and users() == ["u1"]


def test_a_permission_class_sees_drfs_request_with_the_token_as_auth(engine, alice):
    plain = token_client(alice, "mutate")
    refused = post(plain, URL, {"envelope": envelope("t_edgeAdminToken", {"id": "u1"})}).json()
    assert refused["code"] == "permission_denied"
    assert refused["reason"] == "this takes a token with the admin scope"
    admin = token_client(alice, "admin")
    body = {"envelope": envelope("t_edgeAdminToken", {"id": "u1"}, 1, "c2")}
    assert post(admin, URL, body).json()["accepted"] is True
    assert users() == ["u1"]


def test_the_project_wide_default_applies_where_a_mutator_sets_none(engine, settings):
    settings.RINDLE = {
        **settings.RINDLE,
        "ALLOW_ANONYMOUS_MUTATIONS": True,
        "MUTATOR_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    }
    anonymous = APIClient()
    refused = post(anonymous, URL, {"envelope": envelope("t_edgeDefault", {"id": "u1"})}).json()
    assert refused["code"] == "permission_denied" and refused["lmid"] == 1
    # permission_classes=[] on the mutator opts out of the default.
    body = {"envelope": envelope("t_edgeOpen", {"id": "u2"}, 2)}
    assert post(anonymous, URL, body).json()["accepted"] is True
    assert users() == ["u2"]


def test_without_permission_classes_everyone_may_as_before(engine, machine):
    body = {"envelope": envelope("t_edgeDefault", {"id": "u1"})}
    assert post(machine, URL, body).json()["accepted"] is True


# --- what a mutation created ----------------------------------------------------------


def test_the_client_picks_the_key_and_the_mutators_result_travels_back(engine, machine):
    args = {"id": "3f0c2a1e-client-made", "name": "Ada"}
    outcome = post(machine, URL, {"envelope": envelope("t_edgeCreate", args)}).json()
    assert outcome["accepted"] is True
    assert outcome["result"] == {"id": "3f0c2a1e-client-made", "slug": "ada"}
    assert users() == ["3f0c2a1e-client-made"]
    # A replay is absorbed: nothing runs again, so there is no result to send.
    replay = post(machine, URL, {"envelope": envelope("t_edgeCreate", args)}).json()
    assert replay["duplicate"] is True and "result" not in replay


def test_a_mutator_returning_nothing_sends_no_result(engine, machine):
    outcome = post(machine, URL, {"envelope": envelope("t_edgeDefault", {"id": "u1"})}).json()
    assert outcome["accepted"] is True and "result" not in outcome


@pytest.mark.parametrize("name, value", [("t_edgeReturns", "x" * 5000), ("t_edgeReturnsObject", 0)])
def test_a_result_over_the_cap_or_not_json_rejects_the_mutation(engine, machine, name, value):
    with override_settings(RINDLE={**_rindle(), "MAX_MUTATION_RESULT_BYTES": 4096}):
        outcome = post(machine, URL, {"envelope": envelope(name, {"id": "u1", "value": value})})
    body = outcome.json()
    assert body["rejected"] is True and body["code"] == "mutation_result_invalid"
    assert body["lmid"] == 1 and users() == []  # its writes are rolled back


def test_a_batch_carries_each_envelopes_result(engine, machine):
    batch = [
        envelope("t_edgeReturns", {"id": "u1", "value": [1, 2]}, 1),
        envelope("t_edgeAddUser", {"id": "u2"}, 2),
        envelope("t_edgeReturns", {"id": "u3", "value": {"n": 3}}, 3),
    ]
    outcomes = post(machine, URL, {"envelopes": batch}).json()
    assert outcomes[0]["result"] == [1, 2]
    assert outcomes[1]["details"] == {"name": ["This field is required."]}
    assert outcomes[2]["result"] == {"n": 3}


def _rindle():
    from django.conf import settings

    return settings.RINDLE
