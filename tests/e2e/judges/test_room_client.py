"""
A room, judged by the published ``@rindle/optimistic`` client in Node against
Daphne with ``ROOMS_ENABLED``: two clients' leases of the labelled ``issueDetail``
meet in one room (the second lease is room-served, the first upgrades through its
doorbell), each client's ``editTitle`` reaches the other through the room socket,
and the database ends with the last edit, its room lmids durable.
"""

import json
import subprocess

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.conftest import child_env
from tests.support.processes import free_port

from .test_published_clients import NODE_DIR, Server, node_or_skip, seed, session_cookie

pytestmark = pytest.mark.django_db(transaction=True)
EDITS = 20


def test_two_published_clients_edit_through_one_room(engine, tmp_path):
    node = node_or_skip()
    seed()
    ada = get_user_model().objects.create_user("ada")
    server = Server(free_port(), tmp_path / "daphne.log", RINDLE_ROOMS_ENABLED="1")
    server.start()
    try:
        port = server.port
        out = subprocess.run(
            [node, "room.mjs", "--api", f"http://127.0.0.1:{port}"]
            + ["--ws", f"ws://127.0.0.1:{port}/ws/rindle/", "--issue", "i1"]
            + ["--edits", str(EDITS), "--cookie", session_cookie(ada)],
            cwd=NODE_DIR,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert out.returncode == 0, f"{out.stderr}\n{server.log()}"
        result = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        server.stop(sig=2)
    print("room judge:", json.dumps(result))
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
