"""
Read rules compiled into the query: a hidden row is never sent, counted, or usable
in an EXISTS, however a named query reaches it, and stays hidden as data changes.
"""

import pytest
from channels.db import database_sync_to_async

from project.demo.models import Comment, Issue, User
from tests.support.demo import create_issue

from .conftest import Client

pytestmark = [pytest.mark.django_db(transaction=True)]

db = database_sync_to_async


@pytest.fixture
def secrets(live, settings):
    settings.RINDLE = {**settings.RINDLE, "ADAPTER": "tests.support.adapters.HidesSecrets"}
    User.objects.create(id="u1", name="Ada")
    for i, title in enumerate(["open plan", "secret plan"]):
        create_issue(f"i{i}", title=title, created=float(i))
    Comment.objects.create(id="c0", issue_id="i0", author_id="u1", body="fine", created_at=1.0)
    Comment.objects.create(
        id="c1", issue_id="i0", author_id="u1", body="secret note", created_at=2.0
    )
    Comment.objects.create(id="c2", issue_id="i1", author_id="u1", body="fine", created_at=3.0)
    return live


def rows(ops, table):
    return sorted(op["row"] for op in ops if op["table"] == table and op["op"] == "add")


async def snapshot(client, qid, name, args):
    await client.send(
        {"t": "subscribe", "queryId": qid, "name": name, "args": args, "mode": "normalized"}
    )
    frames = await client.recv_until("progress")
    assert frames[0]["t"] == "nhello", frames
    return frames[1]["batch"]["ops"], frames[0]["hello"]["tables"]


@pytest.mark.asyncio
async def test_where_related_count_and_exists_never_reveal_hidden_rows(secrets):
    client = Client()
    assert await client.connect()
    ops, tables = await snapshot(client, 1, "issuesPage", {"limit": 10})
    assert [r[0] for r in rows(ops, "issue")] == ["i0"]
    count_table = next(t["name"] for t in tables if t["name"].startswith("__"))
    assert rows(ops, count_table) == [["i0", 1]]  # the secret comment is not counted
    ops, _ = await snapshot(
        client, 2, "issuesPage", {"limit": 10, "filter": [{"axis": "title", "value": "secret"}]}
    )
    assert rows(ops, "issue") == []
    # EXISTS over comments: only the hidden comment matches "note"
    ops, _ = await snapshot(
        client, 3, "issuesPage", {"limit": 10, "filter": [{"axis": "comment", "value": "note"}]}
    )
    assert rows(ops, "issue") == []
    ops, _ = await snapshot(client, 4, "issueDetail", "i0")
    assert [r[0] for r in rows(ops, "comment")] == ["c0"]
    ops, _ = await snapshot(client, 5, "issueDetail", "i1")
    assert rows(ops, "issue") == [] and rows(ops, "comment") == []
    # recentComments: c2's issue is hidden, so its one-relationship is empty
    ops, _ = await snapshot(client, 6, "recentComments", {"limit": 10})
    assert [r[0] for r in rows(ops, "comment")] == ["c0", "c2"]
    assert [r[0] for r in rows(ops, "issue")] == ["i0"]
    await client.close()


@pytest.mark.asyncio
async def test_a_row_that_becomes_hidden_leaves_every_view(secrets):
    client = Client()
    assert await client.connect()
    await snapshot(client, 1, "issueDetail", "i0")
    await db(Comment.objects.filter(id="c0").update)(body="secret now")
    batch, _ = await client.recv_until("progress")
    assert {"table": "comment", "op": "remove"}.items() <= batch["batch"]["ops"][0].items()
    await db(Issue.objects.filter(id="i0").update)(title="secret too")
    batch, _ = await client.recv_until("progress")
    assert {op["table"] for op in batch["batch"]["ops"] if op["op"] == "remove"} >= {"issue"}
    await client.close()


@pytest.mark.asyncio
async def test_authorize_query_refuses_a_named_query(live, settings):
    settings.RINDLE = {**settings.RINDLE, "ADAPTER": "tests.support.adapters.NoUsersQuery"}
    client = Client()
    assert await client.connect()
    await client.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    frame = await client.recv()
    assert frame["t"] == "queryError" and frame["code"] == "unauthorized"
    assert frame["retryable"] is False
    await client.close()


def test_a_read_rule_does_not_rename_a_count_the_client_names_from_its_own_ast(live):
    """The synthetic count table is named from the query as the client wrote it."""
    from rindle_app.ivm.ast import parse
    from rindle_app.ivm.normalized import normalized_table_schemas
    from rindle_app.named import compile_permissions, resolve
    from tests.support.adapters import HidesSecrets

    plain = resolve("issuesPage", {"limit": 5}, None)
    gated = compile_permissions(plain, HidesSecrets().read_rules(None))
    assert gated != plain

    def names(ast):
        return [t["name"] for t in normalized_table_schemas(parse(ast, live.tables), live.tables)]

    assert names(gated) == names(plain)
