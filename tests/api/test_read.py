"""POST /api/rindle/read: a named query's rows once, and exactly the version they reflect."""

from contextlib import contextmanager

import pytest
from django.conf import settings
from django.test import override_settings
from rest_framework import serializers
from rest_framework.test import APIClient

from project.demo import models as demo
from rindle_app import named
from rindle_app.ivm.ast import parse, query_key
from rindle_app.ivm.builder import table
from rindle_app.ivm.evaluate import evaluate
from rindle_app.named import named_query
from rindle_app.stream import reader
from rindle_app.testing import outbox_high_water, publish_watermark

from .conftest import error, post, state, token_client

URL = "/api/rindle/read"


@named_query("apiTestIssueCount")
def issue_count(args, ctx):
    return {"table": "issue", "aggregate": "count"}


@named_query("apiTestStrict", args=serializers.IntegerField(min_value=1))
def strict(args, ctx):
    return table("issue").limit(args)


def seed(engine):
    """A few users, issues, tags and comments, written through the engine and the ORM."""
    demo.User.objects.bulk_create(
        [demo.User(id="alice", name="Alice"), demo.User(id="bob", name="Bob")]
    )
    statuses = ["todo", "done", "review", "done", "backlog"]
    for i, status in enumerate(statuses):
        engine.write(
            lambda tx, i=i, status=status: tx.insert(
                "issue",
                {
                    "id": f"i{i}",
                    "title": f"Issue {i}",
                    "status": status,
                    "priority": "high",
                    "ownerId": "alice" if i % 2 else "bob",
                    "createdAt": 1000.0 + i,
                    "updatedAt": 1000.0 + i,
                },
            )
        )
    demo.Tag.objects.create(id="t1", issue_id="i1", name="bug")
    demo.Tag.objects.create(id="t2", issue_id="i1", name="api")
    demo.Comment.objects.create(id="c1", issue_id="i1", author_id="bob", body="hi", created_at=5)
    demo.Comment.objects.create(id="c2", issue_id="i3", author_id="alice", body="yo", created_at=6)


def reference(engine, name, args, user):
    """The reference evaluator's snapshot rows of ``name(args)`` over the current data."""
    query = parse(named.resolve(name, args, user), engine.tables)
    _version, rows = reader.snapshot(engine.using, list(engine.tables))
    view = evaluate(query, rows, engine.tables, render="snapshot")
    if query.one:
        view = [] if view is None else [view]
    return view, query_key(query)


CASES = [
    ("issuesPage", {"limit": 3}),
    ("issuesPage", {"limit": 50, "filter": [{"axis": "tag", "value": "BU"}]}),
    ("myIssues", {"limit": 10}),
    ("issueDetail", "i1"),
    ("recentComments", {"limit": 5}),
    ("users", None),
    ("tagOptions", {}),
]


@pytest.mark.parametrize("name,args", CASES, ids=[c[0] for c in CASES])
def test_the_rows_are_the_reference_evaluators_at_the_outbox_high_water(
    engine, machine, alice, name, args
):
    """
    rows equal the evaluator over the same data; cvMin is the published watermark,
    here the outbox high-water mark (published after the seed, as a watermarker would).
    """
    seed(engine)
    publish_watermark()
    response = post(machine, URL, {"name": name, "args": args})
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"rows", "cvMin", "queryKey"}
    want, key = reference(engine, name, args, alice)
    assert body["rows"] == want
    assert body["rows"], "the case should read some rows"
    assert body["cvMin"] == outbox_high_water() > 0
    assert body["queryKey"] == key
    assert response["Rindle-Boot-Id"] == engine.boot_id


def test_rows_nest_cells_under_cols_and_relationships_by_alias(engine, machine):
    """The SSR shape: {cols: {...}, <alias>: list | object | null | count}."""
    seed(engine)
    rows = post(machine, URL, {"name": "issuesPage", "args": {"limit": 5}}).json()["rows"]
    first = next(r for r in rows if r["cols"]["id"] == "i1")
    assert set(first) == {"cols", "owner", "tags", "commentCount"}
    assert first["cols"] == {
        "id": "i1",
        "title": "Issue 1",
        "status": "done",
        "priority": "high",
        "ownerId": "alice",
        "updatedAt": 1001.0,
    }
    assert first["owner"] == {"cols": {"id": "alice", "name": "Alice"}}
    assert [t["cols"]["name"] for t in first["tags"]] == ["api", "bug"]
    assert first["commentCount"] == 1


def test_a_one_query_reads_a_list_of_at_most_one_row(engine, machine):
    """The clients' SSR store maps over rows, so a one-query's rows is [row] or []."""
    seed(engine)
    found = post(machine, URL, {"name": "issueDetail", "args": "i3"}).json()
    missing = post(machine, URL, {"name": "issueDetail", "args": "nope"}).json()
    assert [r["cols"]["id"] for r in found["rows"]] == ["i3"]
    assert [c["cols"]["body"] for c in found["rows"][0]["comments"]] == ["yo"]
    assert missing["rows"] == [] and missing["cvMin"] == found["cvMin"]


def test_the_adapters_read_rules_apply(engine, machine, alice):
    """Rows the read rules hide are not read, counted or joined."""
    seed(engine)
    rindle = {**settings.RINDLE, "ADAPTER": "tests.support.adapters.HidesDone"}
    with override_settings(RINDLE=rindle):
        body = post(machine, URL, {"name": "issuesPage", "args": {"limit": 50}}).json()
        want, _key = reference(engine, "issuesPage", {"limit": 50}, alice)
        detail = post(machine, URL, {"name": "issueDetail", "args": "i1"}).json()
    assert body["rows"] == want
    assert sorted(r["cols"]["status"] for r in body["rows"]) == ["backlog", "review", "todo"]
    assert detail["rows"] == []


def test_cv_min_is_the_version_the_rows_reflect_while_writes_land(engine, machine, monkeypatch):
    """A write committed between the read's two statements is in neither the rows nor cvMin."""
    seed(engine)
    real = reader.read_transaction
    landed = []

    class Racing:
        def __init__(self, cursor):
            self.cursor = cursor

        def execute(self, sql, params=None):
            self.cursor.execute(sql, params)
            if not landed:
                landed.append(engine.write(lambda tx: tx.insert("user", new_user)).cv)

        def __getattr__(self, name):
            return getattr(self.cursor, name)

    @contextmanager
    def racing(using, **kwargs):
        with real(using, **kwargs) as cursor:
            yield Racing(cursor)

    new_user = {"id": "zed", "name": "Zed"}
    post(machine, URL, {"name": "users", "args": None})  # the first read makes the state row
    publish_watermark()
    before = outbox_high_water()
    monkeypatch.setattr(reader, "read_transaction", racing)
    body = post(machine, URL, {"name": "users", "args": None}).json()
    assert landed and landed[0] > before
    assert body["cvMin"] == before
    assert [r["cols"]["id"] for r in body["rows"]] == ["alice", "bob"]
    monkeypatch.undo()
    publish_watermark()
    after = post(machine, URL, {"name": "users", "args": None}).json()
    assert after["cvMin"] == landed[0]
    assert [r["cols"]["id"] for r in after["rows"]] == ["alice", "bob", "zed"]


def test_a_read_registers_nothing_and_writes_nothing(engine, machine):
    """A one-shot read leaves the database (and the outbox) as it was."""
    seed(engine)
    before = state()
    assert post(machine, URL, {"name": "issuesPage", "args": {"limit": 5}}).status_code == 200
    assert state() == before


BAD_REQUESTS = [
    ("malformed JSON", "{", 400, "parse_error"),
    ("a string body", '"users"', 400, "invalid_request"),
    ("no name", {"args": None}, 400, "invalid_request"),
    ("a list name", {"name": ["users"], "args": None}, 400, "invalid_request"),
    ("an unknown name", {"name": "nope", "args": None}, 404, "unknown_query"),
    ("a system query", {"name": "_rindle/clientLmid", "args": {}}, 404, "unknown_query"),
    ("bad args", {"name": "apiTestStrict", "args": "many"}, 400, "invalid_args"),
    ("oversized args", {"name": "users", "args": {"pad": "x" * 64 * 1024}}, 400, "invalid_args"),
]


@pytest.mark.parametrize(
    "body,status,code", [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_a_bad_read_is_refused_and_changes_nothing(engine, machine, body, status, code):
    before = state()
    error(post(machine, URL, body), status, code)
    assert state() == before


def test_a_root_aggregate_is_refused_as_a_server_error(engine, machine):
    """A named query that builds a root aggregate has no rows: its definition is at fault."""
    error(post(machine, URL, {"name": "apiTestIssueCount", "args": None}), 500, "unsupported")


def test_unauthorized_reads_and_scopes(engine, machine, session, alice):
    """The adapter's refusal is a 403; a token needs the read scope; a session needs CSRF."""
    rindle = {**settings.RINDLE, "ADAPTER": "tests.support.adapters.Refusing"}
    with override_settings(RINDLE=rindle):
        error(post(machine, URL, {"name": "issueDetail", "args": "i1"}), 403, "unauthorized")
    error(post(token_client(alice, "schema"), URL, {"name": "users"}), 403, "insufficient_scope")
    assert post(session, URL, {"name": "users"}).status_code == 200
    no_csrf = session.post(URL, {"name": "users"}, content_type="application/json")
    error(no_csrf, 403, "permission_denied")
    assert post(APIClient(), URL, {"name": "users"}).status_code == 200


def test_a_read_inside_a_request_transaction_takes_its_own_snapshot(engine, machine, monkeypatch):
    """Under ATOMIC_REQUESTS the read runs on a connection of its own, and still answers."""
    from django.db import connection

    seed(engine)
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)
    seen = []
    real = reader.read_transaction

    @contextmanager
    def spy(using, **kwargs):
        seen.append(connection.in_atomic_block)
        with real(using, **kwargs) as cursor:
            seen.append(cursor.db is connection)
            yield cursor

    monkeypatch.setattr(reader, "read_transaction", spy)
    publish_watermark()
    response = post(machine, URL, {"name": "users", "args": None})
    assert response.status_code == 200, response.content
    # Each read (the SSR read, and the schema follow's look) had a connection of its own.
    assert seen and seen == [True, False] * (len(seen) // 2)
    assert response.json()["cvMin"] == outbox_high_water()
    assert [r["cols"]["id"] for r in response.json()["rows"]] == ["alice", "bob"]
