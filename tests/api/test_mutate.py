"""POST /api/rindle/mutate: envelopes validated first, then applied strictly in order."""

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework.test import APIClient

from project.demo import models as demo
from rindle_app.adapter import RindleAdapter
from rindle_app.engine import Unavailable
from rindle_app.engine.engine import Engine
from rindle_app.testing import outbox_high_water

from .conftest import error, post, state, token_client

URL = "/api/rindle/mutate"
T0 = 1_704_067_200_000.0


def create(issue_id, mid, client="c1", title="Fix the login form"):
    return {
        "clientID": client,
        "mid": mid,
        "name": "createIssue",
        "args": {
            "id": issue_id,
            "title": title,
            "status": "todo",
            "priority": "high",
            "owner": "alice",
            "description": "",
            "descriptionCommentId": f"{issue_id}-c0",
            "createdAt": T0,
        },
    }


def set_status(issue_id, mid, status, client="c1"):
    args = {"id": issue_id, "status": status, "updatedAt": T0 + mid}
    return {"clientID": client, "mid": mid, "name": "setStatus", "args": args}


def lmid(engine, client="c1"):
    return engine.client_lmid(client)


def test_one_envelope_is_applied_and_answers_one_outcome(engine, machine):
    """{envelope} answers {accepted, rejected, lmid, cv} and the rows are written."""
    response = post(machine, URL, {"envelope": create("i1", 1)})
    assert response.status_code == 200, response.content
    assert response.json() == {
        "accepted": True,
        "rejected": False,
        "lmid": 1,
        "cv": outbox_high_water(),
    }
    assert demo.Issue.objects.get(id="i1").title == "Fix the login form"
    assert response["Rindle-Boot-Id"] == engine.boot_id


def test_a_batch_runs_in_order_and_answers_a_list(engine, machine):
    """{envelopes} answers one outcome per envelope, in order; later ones see earlier ones."""
    batch = [create("i1", 1), set_status("i1", 2, "review"), set_status("i1", 3, "done")]
    response = post(machine, URL, {"envelopes": batch})
    assert response.status_code == 200, response.content
    outcomes = response.json()
    assert [o["lmid"] for o in outcomes] == [1, 2, 3]
    assert all(o["accepted"] and not o["rejected"] for o in outcomes)
    assert outcomes[0]["cv"] < outcomes[1]["cv"] < outcomes[2]["cv"]
    assert demo.Issue.objects.get(id="i1").status == "done"
    assert lmid(engine) == 3


def test_a_replayed_batch_is_absorbed_as_duplicates(engine, machine):
    """A retried batch (mid <= lmid) is accepted again, marked duplicate, and runs nothing."""
    batch = [create("i1", 1), set_status("i1", 2, "review")]
    post(machine, URL, {"envelopes": batch})
    demo.Issue.objects.filter(id="i1").update(status="backlog")
    before = state()
    replay = post(machine, URL, {"envelopes": batch}).json()
    assert [(o["accepted"], o.get("duplicate"), o["lmid"]) for o in replay] == [
        (True, True, 2),
        (True, True, 2),
    ]
    assert state() == before


def test_a_business_rejection_advances_the_lmid_with_a_reason(engine, machine):
    """A mutator's refusal is an outcome, not an HTTP error: lmid moves on, nothing is written."""
    batch = [create("i1", 1, title="buy spam now"), create("i2", 2)]
    outcomes = post(machine, URL, {"envelopes": batch}).json()
    assert outcomes[0] == {
        "accepted": False,
        "rejected": True,
        "reason": "titles mentioning spam are not allowed",
        "code": "spam",
        "lmid": 1,
        "cv": outcomes[0]["cv"],
    }
    assert outcomes[1]["accepted"] and outcomes[1]["lmid"] == 2
    assert sorted(demo.Issue.objects.values_list("id", flat=True)) == ["i2"]


def test_unknown_mutators_and_bad_args_are_rejections(engine, machine):
    """The envelope is well-formed, so its mutator's verdict is a per-envelope rejection."""
    unknown = {"clientID": "c1", "mid": 1, "name": "noSuchMutator", "args": {}}
    bad_args = {"clientID": "c1", "mid": 2, "name": "setStatus", "args": {"id": "i1"}}
    outcomes = post(machine, URL, {"envelopes": [unknown, bad_args]}).json()
    assert [(o["rejected"], o["code"], o["lmid"]) for o in outcomes] == [
        (True, "unknown_mutator", 1),
        (True, "invalid_args", 2),
    ]


def test_the_adapter_refusing_a_mutation_rejects_it(engine, machine):
    """authorize_mutation returning False rejects the envelope; the lmid still advances."""
    rindle = {**settings.RINDLE, "ADAPTER": "tests.support.adapters.Refusing"}
    with override_settings(RINDLE=rindle):
        outcome = post(machine, URL, {"envelope": create("i1", 1)}).json()
    assert (outcome["rejected"], outcome["code"], outcome["lmid"]) == (True, "unauthorized", 1)
    assert not demo.Issue.objects.exists()


ANONYMOUS_WRITES = override_settings(RINDLE={**settings.RINDLE, "ALLOW_ANONYMOUS_MUTATIONS": True})


def test_an_anonymous_mutation_is_refused_unless_the_project_opts_in(engine):
    """403 anonymous_mutations_disabled by default: nothing applied, no lmid row."""
    before = state()
    body = {"envelopes": [create("i1", 1), set_status("i1", 2, "done")]}
    error(post(APIClient(), URL, body), 403, "anonymous_mutations_disabled")
    assert state() == before


class AllowsAnonymousWrites(RindleAdapter):
    """An adapter that opts in to anonymous writes (instead of the setting)."""

    def allow_anonymous_mutations(self):
        return True


def test_the_adapter_may_opt_in_to_anonymous_writes(engine):
    with override_settings(RINDLE={**settings.RINDLE, "ADAPTER": AllowsAnonymousWrites}):
        outcome = post(APIClient(), URL, {"envelope": create("i1", 1)}).json()
    assert (outcome["rejected"], outcome["reason"]) == (True, "sign in to do this")


def test_a_project_wide_is_authenticated_stops_an_anonymous_mutation(engine, machine):
    """rindle's routes honour REST_FRAMEWORK["DEFAULT_PERMISSION_CLASSES"] (even opted in)."""
    drf = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    }
    before = state()
    with override_settings(REST_FRAMEWORK=drf), ANONYMOUS_WRITES:
        error(post(APIClient(), URL, {"envelope": create("i1", 1)}), 401, "not_authenticated")
        assert state() == before
        error(post(APIClient(), "/api/rindle/read", {"name": "users"}), 401, "not_authenticated")
        outcome = post(machine, URL, {"envelope": create("i1", 1)}).json()
    assert outcome["accepted"] is True


@ANONYMOUS_WRITES
def test_an_anonymous_mutation_runs_as_the_anonymous_user(engine):
    """The acting user is request.user: the demo's createIssue refuses anonymous authors."""
    outcome = post(APIClient(), URL, {"envelope": create("i1", 1)}).json()
    assert (outcome["rejected"], outcome["code"]) == (True, "unauthorized")
    assert outcome["reason"] == "sign in to do this"


def test_the_acting_user_is_the_authenticated_one(engine, machine, session):
    """Mutators see the request's user, never one named in the args."""
    post(machine, URL, {"envelope": create("i1", 1)})
    post(session, URL, {"envelope": create("i2", 1, client="browser")})
    authors = dict(demo.Comment.objects.values_list("id", "author_id"))
    assert authors == {"i1-c0": "alice", "i2-c0": "alice"}


def test_a_mid_gap_is_a_409_and_stops_the_batch(engine, machine):
    """mid > lmid + 1: 409 mid_gap with the stored lmid; envelopes before it stay applied."""
    post(machine, URL, {"envelope": create("i1", 1)})
    batch = [set_status("i1", 2, "review"), set_status("i1", 4, "done"), set_status("i1", 5, "x")]
    response = post(machine, URL, {"envelopes": batch})
    detail = error(response, 409, "mid_gap")
    assert detail["lmid"] == 2
    assert "mutation gap" in detail["message"]  # what the clients look for
    assert demo.Issue.objects.get(id="i1").status == "review"
    assert lmid(engine) == 2


def test_an_unavailable_database_is_a_retryable_503(engine, machine, monkeypatch):
    """Infrastructure failure: 503, retryable, Retry-After; the batch stops there."""
    real = Engine.mutate

    def flaky(self, client_id, mid, name, args, user=None, **kwargs):
        if mid == 2:
            raise Unavailable("database is locked")
        return real(self, client_id, mid, name, args, user, **kwargs)

    monkeypatch.setattr(Engine, "mutate", flaky)
    batch = [create("i1", 1), set_status("i1", 2, "review"), set_status("i1", 3, "done")]
    response = post(machine, URL, {"envelopes": batch})
    detail = error(response, 503, "unavailable")
    assert detail["retryable"] is True
    assert response["Retry-After"] == "1"
    assert lmid(engine) == 1
    assert demo.Issue.objects.get(id="i1").status == "todo"
    monkeypatch.undo()
    retried = post(machine, URL, {"envelopes": batch}).json()
    assert [o.get("duplicate", False) for o in retried] == [True, False, False]
    assert demo.Issue.objects.get(id="i1").status == "done"


def good():
    return set_status("i1", 2, "review")


BAD_BODIES = [
    ("malformed JSON", '{"envelope": {', "parse_error"),
    ("a list body", "[]", "invalid_request"),
    ("neither envelope nor envelopes", {}, "invalid_request"),
    ("both envelope and envelopes", {"envelope": good(), "envelopes": [good()]}, "invalid_request"),
    ("envelope not an object", {"envelope": [good()]}, "invalid_request"),
    ("envelopes not a list", {"envelopes": good()}, "invalid_request"),
    ("no envelopes", {"envelopes": []}, "invalid_input"),
    ("33 envelopes", {"envelopes": [good()] * 33}, "invalid_input"),
    ("a string mid", {"envelope": {**good(), "mid": "2"}}, "invalid_request"),
    ("a fractional mid", {"envelope": {**good(), "mid": 2.5}}, "invalid_request"),
    ("a boolean mid", {"envelope": {**good(), "mid": True}}, "invalid_request"),
    ("a zero mid", {"envelope": {**good(), "mid": 0}}, "invalid_request"),
    ("a mid beyond 2**53", {"envelope": {**good(), "mid": 2**53}}, "invalid_request"),
    ("no clientID", {"envelope": {"mid": 2, "name": "setStatus", "args": {}}}, "invalid_request"),
    ("a number clientID", {"envelope": {**good(), "clientID": 7}}, "invalid_request"),
    ("an empty clientID", {"envelope": {**good(), "clientID": ""}}, "invalid_request"),
    ("an overlong clientID", {"envelope": {**good(), "clientID": "c" * 256}}, "invalid_request"),
    ("no name", {"envelope": {"clientID": "c1", "mid": 2, "args": {}}}, "invalid_request"),
    ("a null name", {"envelope": {**good(), "name": None}}, "invalid_request"),
    # A bad envelope anywhere refuses the whole batch, the good ones before it included.
    ("a bad third envelope", {"envelopes": [good(), good(), {**good(), "mid": -1}]},
     "invalid_request"),
    ("oversized args in the last envelope",
     {"envelopes": [good(), {**good(), "args": {"pad": "x" * 64 * 1024}}]}, "args_too_large"),
]  # fmt: skip


@pytest.mark.parametrize("body,code", [c[1:] for c in BAD_BODIES], ids=[c[0] for c in BAD_BODIES])
def test_a_malformed_body_is_a_400_and_applies_nothing(engine, machine, body, code):
    post(machine, URL, {"envelope": create("i1", 1)})
    before = state()
    error(post(machine, URL, body), 400, code)
    assert state() == before
    assert lmid(engine) == 1


def test_the_envelope_limit_is_a_setting(engine, machine):
    rindle = {**settings.RINDLE, "MAX_MUTATIONS_PER_REQUEST": 2}
    with override_settings(RINDLE=rindle):
        batch = [create("i1", 1), set_status("i1", 2, "done"), set_status("i1", 3, "todo")]
        error(post(machine, URL, {"envelopes": batch}), 400, "invalid_input")
        assert post(machine, URL, {"envelopes": batch[:2]}).status_code == 200


def test_refused_callers_apply_nothing(engine, alice, session):
    """A token without the mutate scope, or a session without CSRF, changes nothing."""
    before = state()
    reader = token_client(alice, "read", "schema")
    error(post(reader, URL, {"envelope": create("i1", 1)}), 403, "insufficient_scope")
    no_csrf = session.post(URL, {"envelope": create("i1", 1)}, content_type="application/json")
    error(no_csrf, 403, "permission_denied")
    assert state() == before
    assert post(session, URL, {"envelope": create("i1", 1)}).json()["accepted"] is True
