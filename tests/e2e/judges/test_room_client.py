"""
A room, judged by the published ``@rindle/optimistic`` client in Node against
Daphne with ``ROOMS_ENABLED``: two clients' leases of the labelled ``issueDetail``
meet in one room (the second lease is room-served, the first upgrades through its
doorbell), each client's ``editTitle`` reaches the other through the room socket,
and the database ends with the last edit, its room lmids durable.
"""

import json

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.support.processes import free_port

from .test_published_clients import Server, node_or_skip, run_node, seed, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)
EDITS = 20


def judge(tmp_path, *flags):
    """Run room.mjs against Daphne with rooms on; its JSON result."""
    node = node_or_skip()
    seed()
    ada = get_user_model().objects.create_user("ada")
    settings_module = "tests.e2e.judges.settings_rooms"
    server = Server(free_port(), tmp_path / "daphne.log", settings_module)
    server.start()
    try:
        port = server.port
        result = run_node(
            node,
            ["room.mjs", "--api", f"http://127.0.0.1:{port}"]
            + ["--ws", f"ws://127.0.0.1:{port}/ws/rindle/", "--issue", "i1"]
            + ["--edits", str(EDITS), "--cookie", session_cookie(ada), *flags],
            server,
            timeout=90,
            log_tail=20000,
        )
    finally:
        server.stop(sig=2)
    print("room judge:", json.dumps(result))
    return result


def test_two_published_clients_edit_through_one_room(engine, tmp_path):
    result = judge(tmp_path)
    assert result["anomalies"] == [] and result["rejected"] == [], result
    assert result["roomsA"] == result["roomsB"] == ["room:issue/i1"], result
    assert result["titleA"] == result["titleB"] == f"title {EDITS}", result
    assert len(result["receiptsMs"]) == EDITS
    with connection.cursor() as cursor:
        cursor.execute('SELECT "title", "updatedAt" FROM "issue" WHERE "id" = %s', ["i1"])
        assert cursor.fetchone() == (f"title {EDITS}", 1000 + EDITS)
        cursor.execute(
            "SELECT client_id, last_mutation_id FROM _rindle_room_client_mutations ORDER BY 1"
        )
        assert cursor.fetchall() == [("room-a", EDITS // 2), ("room-b", EDITS // 2)]


def test_after_a_downgrade_the_ghost_holds_until_the_fence(engine, tmp_path):
    """
    B leaves; past the grace A's renewal carries no room but the fence, and A's view,
    sampled every millisecond through the downgrade, only ever shows the last edit.
    """
    result = judge(tmp_path, "--downgrade")
    assert result["anomalies"] == [], result
    assert result["downgraded"] == {"last": f"title {EDITS}", "now": f"title {EDITS}"}
    assert result["seenByA"] == [f"title {EDITS}"], result
    with connection.cursor() as cursor:
        cursor.execute("SELECT flush_seq FROM _rindle_room_watermark WHERE doc = %s", ["issue/i1"])
        (flush_seq,) = cursor.fetchone()
        assert int(flush_seq) > 0


def test_a_fleet_serves_one_doc_from_one_room(engine, tmp_path):
    """
    Two Daphne processes on one database with the Redis channel layer, client A on
    one and client B on the other: the doc's room lives in ONE process (one epoch
    claimed, never fenced back and forth) and the other relays B's room socket to it
    through the channel layer; each edit reaches the other client, and the database
    ends with the last edit.
    """
    import os

    if engine.vendor != "postgresql" or not os.environ.get("REDIS_URL"):
        pytest.skip("a fleet needs PostgreSQL and Redis (the channel layer)")
    node = node_or_skip()
    seed()
    ada = get_user_model().objects.create_user("ada")
    settings_module = "tests.e2e.judges.settings_rooms"
    servers = [Server(free_port(), tmp_path / f"daphne{n}.log", settings_module) for n in (1, 2)]
    for server in servers:
        server.start()
    one, two = (f"127.0.0.1:{s.port}" for s in servers)
    try:
        result = run_node(
            node,
            ["room.mjs", "--api", f"http://{one}", "--ws", f"ws://{one}/ws/rindle/"]
            + ["--api-b", f"http://{two}", "--ws-b", f"ws://{two}/ws/rindle/"]
            + ["--issue", "i1", "--edits", str(EDITS), "--cookie", session_cookie(ada)],
            servers[0],
            timeout=90,
            log_tail=20000,
        )
    finally:
        for server in servers:
            server.stop(sig=2)
    print("fleet room judge:", json.dumps(result))
    assert result["anomalies"] == [] and result["rejected"] == [], result
    assert result["roomsA"] == result["roomsB"] == ["room:issue/i1"], result
    assert result["titleA"] == result["titleB"] == f"title {EDITS}", result
    with connection.cursor() as cursor:
        cursor.execute("SELECT epoch FROM _rindle_room_placement WHERE doc = %s", ["issue/i1"])
        assert cursor.fetchone() == (1,), servers[1].log()  # one host, never fenced
        cursor.execute('SELECT "title" FROM "issue" WHERE "id" = %s', ["i1"])
        assert cursor.fetchone() == (f"title {EDITS}",)
        cursor.execute(
            "SELECT client_id, last_mutation_id FROM _rindle_room_client_mutations ORDER BY 1"
        )
        assert cursor.fetchall() == [("room-a", EDITS // 2), ("room-b", EDITS // 2)]
