"""The admin shows rindle's bookkeeping read-only, to operators with view rights."""

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from rindle_app import models

# One row per bookkeeping model, and text its listing must show.
SEEDS = {
    models.ChangeEvent: ({"table": "issue", "op": "add", "key": ["issue-7"]}, "issue-7"),
    models.ClientMutation: ({"client_id": "c1", "last_mutation_id": 3}, "c1"),
    models.ProducerOffset: ({"producer": "producer-1", "seq": 5}, "producer-1"),
    models.SourceOffset: ({"source": "source-1", "offset": "42"}, "source-1"),
    models.AppliedDdl: ({"key": "ddl-1", "applied_at": 0}, "ddl-1"),
    models.SqlOutcome: ({"outcome_key": "outcome-1", "result": "{}", "expires_at": 0}, "outcome-1"),
    models.RoomPlacement: ({"doc": "doc-1", "epoch": 2}, "doc-1"),
    models.RoomWatermark: ({"doc": "doc-2", "flush_seq": "9"}, "doc-2"),
    models.RoomClientMutation: (
        {"doc": "doc-3", "client_id": "room-client", "last_mutation_id": 4},
        "room-client",
    ),
    models.RoomMutationOutcome: (
        {"doc": "doc-4", "client_id": "c2", "mid": 1, "kind": "rejected", "args": {"n": 1}},
        "rejected",
    ),
    models.ScopeSession: ({"scope": "scope-1", "client_id": "c3", "expires_at": 0}, "scope-1"),
}
COMPOSITE = [models.RoomClientMutation, models.RoomMutationOutcome, models.ScopeSession]
REGISTERED = [m for m in SEEDS if m not in COMPOSITE]


def changelist(model):
    return reverse(f"admin:rindle_app_{model._meta.model_name}_changelist")


@pytest.mark.django_db
@pytest.mark.parametrize("model", list(SEEDS), ids=lambda m: m.__name__)
def test_an_operator_sees_every_bookkeeping_table(operator, model):
    """Every bookkeeping table, composite-key ones included, lists its rows."""
    fields, shown = SEEDS[model]
    model.objects.create(**fields)
    response = operator.get(changelist(model))
    assert response.status_code == 200
    assert shown in response.text


@pytest.mark.django_db
def test_the_app_index_links_the_composite_key_listings(operator):
    """The rindle app index links the listings the admin cannot register."""
    assert operator.get(reverse("admin:index")).status_code == 200
    response = operator.get(reverse("admin:app_list", args=["rindle_app"]))
    assert response.status_code == 200
    for model in COMPOSITE:
        assert f'href="{changelist(model)}"' in response.text


@pytest.mark.django_db
@pytest.mark.parametrize("model", REGISTERED, ids=lambda m: m.__name__)
def test_an_operator_cannot_add_rows(operator, model):
    """The add page of every bookkeeping table is forbidden."""
    url = reverse(f"admin:rindle_app_{model._meta.model_name}_add")
    assert operator.get(url).status_code == 403
    assert operator.post(url, SEEDS[model][0]).status_code == 403


@pytest.mark.django_db
def test_an_operator_can_read_never_edit_a_client_lmid(operator):
    """An operator can read a client's lmid but neither change nor delete it."""
    models.ClientMutation.objects.create(client_id="c1", last_mutation_id=3)
    change = reverse("admin:rindle_app_clientmutation_change", args=["c1"])
    delete = reverse("admin:rindle_app_clientmutation_delete", args=["c1"])

    page = operator.get(change)
    assert page.status_code == 200
    assert 'name="last_mutation_id"' not in page.text
    assert operator.post(change, {"client_id": "c1", "last_mutation_id": 99}).status_code == 403
    assert operator.post(delete, {"post": "yes"}).status_code == 403
    operator.post(
        changelist(models.ClientMutation),
        {"action": "delete_selected", "_selected_action": ["c1"], "post": "yes"},
    )
    assert models.ClientMutation.objects.get(client_id="c1").last_mutation_id == 3


@pytest.mark.django_db
@pytest.mark.parametrize("model", list(SEEDS), ids=lambda m: m.__name__)
def test_staff_without_permissions_cannot_view(staff, model):
    """A staff user without view permission is refused every bookkeeping table."""
    assert staff.get(changelist(model)).status_code == 403


@pytest.mark.django_db
def test_the_view_permission_opens_a_composite_key_listing(staff):
    """The model's view permission is what opens its composite-key listing."""
    staff.user.user_permissions.add(Permission.objects.get(codename="view_scopesession"))
    assert staff.get(changelist(models.ScopeSession)).status_code == 200
    assert staff.get(changelist(models.RoomClientMutation)).status_code == 403


@pytest.mark.django_db
def test_anonymous_visitors_are_sent_to_log_in(client):
    """A composite-key listing asks an anonymous visitor to log in."""
    response = client.get(changelist(models.ScopeSession))
    assert response.status_code == 302
    assert response.url.startswith(reverse("admin:login"))


@pytest.mark.django_db
def test_a_composite_key_listing_pages_by_one_hundred(operator):
    """A composite-key listing shows 100 rows a page, in primary-key order."""
    models.ScopeSession.objects.bulk_create(
        models.ScopeSession(scope="s", client_id=f"c{i:03}", expires_at=0) for i in range(101)
    )
    first = operator.get(changelist(models.ScopeSession))
    last = operator.get(changelist(models.ScopeSession), {"p": 2})
    assert len(first.context["rows"]) == 100
    assert first.context["rows"][0][1] == "c000"
    assert [row[1] for row in last.context["rows"]] == ["c100"]
    assert "Page 1 of 2" in first.text


@pytest.mark.django_db
def test_the_outbox_filters_by_op_and_table_and_finds_a_seq(operator):
    """The outbox filters by op and table, and its search finds one seq."""
    models.ChangeEvent.objects.all().delete()  # the DDL markers of the test database's migrate
    add = models.ChangeEvent.objects.create(table="issue", op="add", key=["i1"])
    models.ChangeEvent.objects.create(table="issue", op="remove", key=["i2"])
    models.ChangeEvent.objects.create(table="tag", op="add", key=["t1"])
    url = changelist(models.ChangeEvent)

    def listed(**params):
        return [e.key for e in operator.get(url, params).context["cl"].result_list]

    assert listed() == [["t1"], ["i2"], ["i1"]]
    assert listed(op="add") == [["t1"], ["i1"]]
    assert listed(table="issue", op="add") == [["i1"]]
    assert listed(q=str(add.seq)) == [["i1"]]
    assert listed(q="i1") == []


@pytest.mark.django_db
def test_the_outbox_counts_its_pages_from_the_seq_range(operator):
    """The unfiltered outbox is counted from its seq range, never by COUNT(*) nor facets."""
    models.ChangeEvent.objects.bulk_create(
        models.ChangeEvent(table="tag", op="add", key=[f"t{i}"]) for i in range(150)
    )
    with CaptureQueriesContext(connection) as queries:
        response = operator.get(changelist(models.ChangeEvent))
    outbox = [q["sql"] for q in queries if "_rindle_change_events" in q["sql"]]
    assert not [sql for sql in outbox if "COUNT(" in sql.upper()]
    cl = response.context["cl"]
    # The count is the seq range, holes included: on PostgreSQL a row inserted straight
    # into the outbox draws its seq from the fence guard after the identity default
    # drew one, so 150 such rows span more than 150 seqs.
    seqs = models.ChangeEvent.objects.order_by("seq").values_list("seq", flat=True)
    assert cl.result_count == seqs.last() - seqs.first() + 1 >= 150
    assert cl.full_result_count is None
    assert len(cl.result_list) == 100
    assert "_facets" not in response.text
