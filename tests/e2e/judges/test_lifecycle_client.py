"""
The lifecycle doorbell, judged by the published ``@rindle/optimistic`` client
(``createRindleClient``) in Node against Daphne: two clients lease the realtime
labelled ``issueDetail`` through ``POST /api/rindle/query``, subscribe the doorbell
lease each lease carries, fold each other's occupancy row, and the first client's
0 -> 1 transition re-leases its query. Both views equal SQL.
"""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.support.processes import free_port

from .test_published_clients import (
    Server,
    expected_views,
    node_or_skip,
    run_node,
    seed,
    session_cookie,
    shaped,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_two_published_clients_ring_each_others_doorbell(engine, tmp_path):
    node = node_or_skip()
    seed()
    ada = get_user_model().objects.create_user("ada")
    server = Server(free_port(), tmp_path / "daphne.log")
    server.start()
    try:
        port = server.port
        result = run_node(
            node,
            ["lifecycle.mjs", "--api", f"http://127.0.0.1:{port}"]
            + ["--ws", f"ws://127.0.0.1:{port}/ws/rindle/", "--issue", "i1"]
            + ["--cookie", session_cookie(ada)],
            server,
            timeout=60,
        )
    finally:
        server.stop()
    assert result["anomalies"] == [], result
    assert (result["othersA"], result["othersB"]) == (1, 1), result
    assert result["aloneLeases"] >= 1 and result["leasesA"] > result["aloneLeases"], result
    with connection.cursor() as cursor:
        cursor.execute("SELECT scope, client_id FROM _rindle_scope_sessions ORDER BY client_id")
        assert cursor.fetchall() == [("issue/i1", "lifecycle-a"), ("issue/i1", "lifecycle-b")]
    expected = expected_views(engine, ada, ["detail"])["detail"]
    for view in (result["rowsA"], result["rowsB"]):
        assert shaped(view, expected) == expected
