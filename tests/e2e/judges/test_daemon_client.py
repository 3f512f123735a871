"""
The original daemon's control plane, judged by the published ``@rindle/daemon-client``
(``HttpRindleDaemonClient``) and ``@rindle/api-server``'s ``SplitDaemonClient`` (0.9.0)
in Node against Daphne: ``tests/e2e/node/daemon.mjs`` calls every route the client has,
unchanged, and the database must hold exactly what the original's semantics leave.
"""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from rindle_app import tokens
from tests.support.processes import free_port

from .test_published_clients import NODE_DIR, Server, node_or_skip, run_node

pytestmark = pytest.mark.django_db(transaction=True)


def rows(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return cursor.fetchall()


def test_the_published_daemon_client_drives_every_route(engine, tmp_path):
    node = node_or_skip()
    if not (NODE_DIR / "node_modules" / "@rindle" / "daemon-client").is_dir():
        pytest.skip("tests/e2e/node/node_modules lacks @rindle/daemon-client (npm install)")
    user = get_user_model().objects.create_user("ops")
    raw, _token = tokens.create(user, ["daemon"], name="api-server")
    server = Server(free_port(), tmp_path / "daphne.log")
    server.start()
    try:
        port = server.port
        result = run_node(
            node,
            ["daemon.mjs", "--base", f"http://127.0.0.1:{port}"]
            + ["--ws", f"ws://127.0.0.1:{port}/ws/rindle/", "--token", raw],
            server,
            timeout=90,
        )
    finally:
        server.stop()
    assert result["failures"] == [], "\n".join(result["failures"]) + server.log()
    c = result["checks"]

    # Replay absorption, the gap, the corrected retry after an SQL error, reject-mutation.
    assert c["mid1"]["applied"] is True and c["mid1"]["lmid"] == 1
    assert c["mid1"]["lmidAdvances"] == [{"clientID": "dc", "lmid": 1}]
    assert c["mid1Replay"]["applied"] is False and c["mid1Replay"]["lmid"] == 1
    assert c["gapStatus"] == 409
    assert c["sqlErrorStatus"] == 400
    assert c["afterSqlError"] == {"cols": ["n"], "rows": [[0]]}
    assert c["corrected"]["applied"] is True and c["corrected"]["lmid"] == 2
    assert c["reject"]["lmid"] == 3 and c["rejectReplay"]["lmid"] == 3
    assert c["rejectGapStatus"] == 409
    assert c["key1"]["applied"] is True and c["key1Replay"]["applied"] is False
    assert c["key1Replay"]["cv"] == c["key1"]["cv"]

    # Reads: bare cell arrays, read-only whatever the token, the SSR shape.
    assert c["read"] == {"cols": ["id", "name"], "rows": [["d1", "One"], ["d2", "Two"]]}
    assert c["readWriteStatus"] == 400
    assert [r["cols"] for r in c["query"]["rows"]] == [{"id": "d1", "name": "One"}]
    assert isinstance(c["query"]["cvMin"], int) and c["query"]["queryKey"]
    assert c["badAstStatus"] == 400
    assert "issue" in c["schemaTables"] and "user" in c["schemaTables"]
    assert not [t for t in c["schemaTables"] if t.startswith("_rindle_")]
    assert c["version"]["bootId"] in c["bootIds"]
    assert set(c["stats"]) == {"subscriptions", "materializations", "leases", "connections"}

    # Positional change rows, in column order; their replay; the room routes.
    assert c["rowChange"]["applied"] is True and c["rowChangeReplay"]["applied"] is False
    assert c["rowEdit"]["applied"] is True
    assert c["epoch"]["epoch"] >= 1 and c["roomLmids"] == {"lmids": {}}

    # /migrate: the journal, its replay, the array form stopping at a refusal with 200.
    assert c["migrate"]["applied"] is True and c["migrate"]["schemaVersion"] == "judge_0001"
    assert c["migrateReplay"]["applied"] is False
    batch = c["migrateBatch"]
    assert batch["applied"] == 0 and batch["failedId"] == "judge_0002" and batch["error"]

    # Interactive sessions: read-your-writes, the lmid at commit, begin-time absorption.
    assert c["sessionRead"] == {"cols": ["name"], "rows": [["Session"]]}
    assert c["sessionQuery"] == {"cols": ["n"], "rows": [[2]]}
    assert c["sessionCommit"]["applied"] is True and c["sessionCommit"]["lmid"] == 4
    assert c["sessionAbsorbed"]["absorbed"] is True and c["sessionAbsorbed"]["lmid"] == 4
    assert "sessionId" not in c["sessionAbsorbed"]
    assert c["sessionGoneStatus"] == 410
    assert c["afterRollback"]["rows"] == [[0]]

    # The read/write split: reads to the read leg, writes (and strong reads) to the master.
    assert [tuple(r) for r in c["routed"]] == [
        ("reads", "/materialize"),
        ("reads", "/query"),
        ("reads", "/execute-sql-read"),
        ("writes", "/execute-sql-read"),
        ("writes", "/execute-sql-txn"),
        ("writes", "/reject-mutation"),
        ("reads", "/dematerialize"),
    ]

    # A pin: kept warm with no subscriber (counted by /stats) until /dematerialize.
    assert c["pin"] == {"materializationId": "pin:judge-pin", "reused": False}
    assert c["pinAgain"]["materializationId"] == "pin:judge-pin"
    assert c["pinAgain"]["reused"] is True
    assert c["statsPinned"]["materializations"] == 1
    assert c["statsPinned"]["subscriptions"] == 0
    assert c["unpin"] == {"removed": True}
    assert c["statsUnpinned"]["materializations"] == 0

    # The websocket by a /materialize lease: it hydrates and follows a write; a bogus lease.
    assert c["lease"]["leaseToken"] == "string" and c["lease"]["materializationId"]
    assert c["hello"] == "nhello"
    assert c["hydrated"] == 6  # d1 d2 k1 p1 s1 s2: the users so far
    assert c["live"] is True
    assert c["bogus"]["t"] == "queryError" and c["bogus"]["queryId"] == 2
    assert c["statsLive"]["subscriptions"] >= 1 and c["statsLive"]["connections"] >= 1
    assert c["dematerialize"] == {"removed": True}

    # And the database holds exactly that.
    assert rows('SELECT id, name FROM "user" ORDER BY id') == [
        ("d1", "One"),
        ("d2", "Two"),
        ("k1", "Keyed"),
        ("p1", "Edited"),
        ("s1", "Session"),
        ("s2", "Two"),
        ("w1", "Live"),
    ]
    ledger = rows(
        "SELECT client_id, last_mutation_id FROM _rindle_client_mutations ORDER BY client_id"
    )
    assert ledger == [("dc", 5), ("split", 2)]
    assert rows("SELECT count(*) FROM judge_note") == [(0,)]
