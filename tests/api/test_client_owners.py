"""POST /api/rindle/mutate honours client id owners (issue 13, finding 4)."""

from django.db import connection
from django.test import Client

from project.demo import models as demo
from rindle_app.ivm.builder import table
from rindle_app.named import named_query

from .conftest import error, post, state, token_client
from .test_mutate import URL, create, set_status


@named_query("own_ledgerRows")
def ledger_rows(args, ctx):
    return table("_rindle_client_mutations")


def owners():
    with connection.cursor() as cursor:
        cursor.execute("SELECT client_id, owner FROM _rindle_client_mutations ORDER BY 1")
        return dict(cursor.fetchall())


def frozen():
    return state(), owners()


def signed_in(django_user_model, name):
    client = Client()
    client.force_login(django_user_model.objects.create_user(name))
    return client


def test_another_user_is_refused_with_client_id_taken_and_nothing_changes(
    engine, session, alice, django_user_model
):
    """B under A's id: 403 client_id_taken, no row, no lmid, no outbox row; A goes on."""
    assert post(session, URL, {"envelope": create("i1", 1)}).json()["lmid"] == 1
    assert owners() == {"c1": f"u:{alice.pk}"}
    bob = signed_in(django_user_model, "bob")
    before = frozen()
    for envelope in (set_status("i1", 2, "done"), set_status("i1", 9, "done"), create("i1", 1)):
        detail = error(post(bob, URL, {"envelope": envelope}), 403, "client_id_taken")
        assert "lmid" not in detail and detail["retryable"] is False
        assert frozen() == before
    # A's next real mutation is applied, not absorbed.
    outcome = post(session, URL, {"envelope": set_status("i1", 2, "review")}).json()
    assert outcome == {**outcome, "accepted": True, "lmid": 2}
    assert "duplicate" not in outcome
    assert demo.Issue.objects.get(id="i1").status == "review"


def test_a_taken_id_stops_a_batch_where_it_appears(engine, session, django_user_model):
    """Envelopes before the taken one are applied; it and those after are not."""
    post(session, URL, {"envelope": create("i1", 1, client="theirs")})
    bob = signed_in(django_user_model, "bob")
    batch = [create("i2", 1, client="mine"), set_status("i1", 2, "done", client="theirs")]
    error(post(bob, URL, {"envelopes": batch}), 403, "client_id_taken")
    assert demo.Issue.objects.get(id="i1").status == "todo"
    assert sorted(owners()) == ["mine", "theirs"]


def test_a_token_and_its_user_are_different_owners(engine, machine, session, alice):
    """A token's ids are the token's; its user's browser session cannot use them."""
    post(machine, URL, {"envelope": create("i1", 1)})
    assert owners() == {"c1": f"t:{machine.token.pk}"}
    error(post(session, URL, {"envelope": set_status("i1", 2, "done")}), 403, "client_id_taken")
    other = token_client(alice, "mutate")
    error(post(other, URL, {"envelope": set_status("i1", 2, "done")}), 403, "client_id_taken")


def test_a_user_is_one_owner_over_http_and_websocket(engine, session, alice):
    """The same signed-in user may use an id it claimed over either transport."""
    engine.mutate("c1", 1, "no_such_mutator", {}, owner=f"u:{alice.pk}")  # as a socket would
    assert post(session, URL, {"envelope": create("i1", 2)}).json()["accepted"] is True


def test_anonymous_clients_are_bound_by_their_session(engine, settings):
    """An anonymous browser's session owns its ids; another session or none is refused."""
    # The opt-in anonymous mutations need (issue 13, safe defaults); unknown before it.
    settings.RINDLE = {**settings.RINDLE, "ALLOW_ANONYMOUS_MUTATIONS": True}
    browser = Client()
    session = browser.session
    session["seen"] = True
    session.save()
    browser.cookies["sessionid"] = session.session_key
    assert post(browser, URL, {"envelope": create("i1", 1)}).json()["lmid"] == 1
    assert owners()["c1"].startswith("s:") and session.session_key not in owners()["c1"]
    other = Client()
    other_session = other.session
    other_session.save()
    other.cookies["sessionid"] = other_session.session_key
    for intruder in (other, Client()):
        error(post(intruder, URL, {"envelope": create("i1", 2)}), 403, "client_id_taken")
    assert post(browser, URL, {"envelope": create("i2", 2)}).json()["lmid"] == 2


def test_the_ssr_read_never_shows_an_owner(engine, machine):
    """The lmid system query is not readable over HTTP; a query over the ledger hides owners."""
    post(machine, URL, {"envelope": create("i1", 1)})
    refused = post(machine, "/api/rindle/read", {"name": "_rindle/clientLmid", "args": {}})
    error(refused, 404, "unknown_query")
    rows = post(machine, "/api/rindle/read", {"name": "own_ledgerRows", "args": None}).json()
    assert rows["rows"] == [{"cols": {"client_id": "c1", "last_mutation_id": 1}}]
