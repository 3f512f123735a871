"""
rindle mounted under a prefix in a live Daphne: ``path("sync/", include(...))`` for the
app, daemon, ingest, rooms and ops planes, and ``application(prefix="sync/")`` for the
websocket. The published ``@rindle/daemon-client`` (``baseUrl`` with the prefix) drives
every route it has but the journal (``/migrate`` creates a table that would outlive the
test; test_daemon_client.py covers it) and subscribes its lease on ``/sync/ws/rindle/``,
unchanged; the root and the planes left out answer 404.
"""

import json
import urllib.error
import urllib.request

import pytest
from django.contrib.auth import get_user_model

from rindle_app import tokens
from tests.support.processes import free_port

from .test_published_clients import NODE_DIR, Server, node_or_skip, run_node

pytestmark = pytest.mark.django_db(transaction=True)


def status(url, body=None, token=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_daemon_client_drives_a_prefixed_mount(engine, tmp_path):
    node = node_or_skip()
    if not (NODE_DIR / "node_modules" / "@rindle" / "daemon-client").is_dir():
        pytest.skip("tests/e2e/node/node_modules lacks @rindle/daemon-client (npm install)")
    user = get_user_model().objects.create_user("ops")
    raw, _token = tokens.create(user, ["admin"], name="api-server")
    server = Server(
        free_port(),
        tmp_path / "daphne.log",
        "tests.e2e.judges.settings_prefixed",
        app="tests.e2e.judges.prefixed_asgi:application",
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        result = run_node(
            node,
            ["daemon.mjs", "--base", f"{base}/sync"]
            + ["--ws", f"ws://127.0.0.1:{server.port}/sync/ws/rindle/", "--token", raw]
            + ["--skip", "migrate"],
            server,
            timeout=90,
        )
        assert result["failures"] == [], "\n".join(result["failures"]) + server.log()
        assert result["checks"]["mid1"]["applied"] is True
        # Nothing at the root; the planes left out are nowhere.
        assert status(f"{base}/version", token=raw) == 404
        assert status(f"{base}/sync/version", token=raw) == 200
        assert status(f"{base}/sync/v1/sql/execute", {"sql": "SELECT 1"}, raw) == 404
        assert status(f"{base}/sync/api/rindle/docs/") == 200
    finally:
        server.stop()
