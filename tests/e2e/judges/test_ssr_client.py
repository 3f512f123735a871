"""
Server-side rendering judged by the published ``@rindle/client`` in Node against Daphne
(``tests/e2e/node/ssr.mjs``): a ``ServerStore`` preloads each demo query through
``POST /api/rindle/read``, the dehydrated state seeds a second ``Store`` (the browser's
first paint), and a live optimistic client subscribes the same queries. The seeded view
must show what the live view shows, ``.one()`` relationships (an object, or null when the
child is missing) and a root ``.one()`` (a row, or null) included, and what SQL reads.

The client reads the snapshot in ``Store.assembleNode`` (``@rindle/client`` 0.9.0,
``src/store.ts``): cells under ``cols``, each relationship under its alias, an array
mapped row by row, an object assembled as one row, anything else (null, a count) kept.
So a ``.one()`` relationship sent as an array would paint as an array where the live view
has an object; the comparison below would show it.
"""

import json

import pytest
from django.contrib.auth import get_user_model

from project.demo.models import Comment, Issue
from rindle_app import tokens
from tests.support.processes import free_port

from .test_published_clients import (
    Server,
    expected_views,
    node_or_skip,
    run_node,
    seed,
    shaped,
)

pytestmark = pytest.mark.django_db(transaction=True)

# key -> named query and args, as test_published_clients.QUERIES names them
KEYS = ["page", "mine", "detail", "ghost", "recent", "users", "tags"]


def test_a_hydrated_first_paint_equals_the_live_view(engine, tmp_path):
    from .test_published_clients import QUERIES

    node = node_or_skip()
    seed()
    # An issue whose owner has no user row: its .one() owner is null, on both paths.
    Issue.objects.create(
        id="i7", title="Orphan", status="todo", priority="low", owner_id="nobody",
        created_at=7.0, updated_at=7.0,
    )  # fmt: skip
    Comment.objects.create(id="c9", issue_id="i7", author_id="nobody", body="?", created_at=13.0)
    ada = get_user_model().objects.create_user("ada")
    raw, _ = tokens.create(ada, ["read"])
    queries = [[key, *QUERIES[key]] for key in KEYS]
    server = Server(free_port(), tmp_path / "daphne.log")
    server.start()
    try:
        port = server.port
        result = run_node(
            node,
            ["ssr.mjs", "--api", f"http://127.0.0.1:{port}"]
            + ["--ws", f"ws://127.0.0.1:{port}/ws/rindle/", "--token", raw, "--user", "ada"]
            + ["--queries", json.dumps(queries)],
            server,
            timeout=60,
        )
    finally:
        server.stop()

    expected = expected_views(engine, ada, KEYS)
    for key in KEYS:
        got = result[key]
        assert got["resultType"] == "complete", key
        # The live view also carries columns the query orders by but does not select
        # (the client's engine keeps them); everything the first paint shows, it shows.
        seeded, live = got["seeded"], got["live"]
        assert shaped(live, seeded) == seeded, f"{key}: first paint {seeded}\nlive {live}"
        assert shaped(seeded, expected[key]) == expected[key], key

    # The cases this exists for did occur: a .one() relationship as an object and as null,
    # and a root .one() with a row and without.
    page = {row["id"]: row for row in result["page"]["seeded"]}
    assert page["i1"]["owner"] == {"id": "ada", "name": "Ada Lovelace"}
    assert page["i7"]["owner"] is None
    first = next(r for r in result["page"]["read"]["rows"] if r["cols"]["id"] == "i1")
    assert first["owner"] == {"cols": {"id": "ada", "name": "Ada Lovelace"}}
    orphan = next(r for r in result["page"]["read"]["rows"] if r["cols"]["id"] == "i7")
    assert orphan["owner"] is None
    assert result["detail"]["seeded"]["id"] == "i1"
    assert result["detail"]["seeded"]["owner"]["id"] == "ada"
    assert result["ghost"]["seeded"] is None and result["ghost"]["read"]["rows"] == []
    recent = {row["id"]: row for row in result["recent"]["seeded"]}
    assert recent["c9"]["author"] is None and recent["c9"]["issue"]["id"] == "i7"
