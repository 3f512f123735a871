"""
A process that serves HTTP only (no live queries, so no tail meets the DDL markers)
follows another process's migration on its next ``/schema`` or SSR read, within
``WAKE_POLL_INTERVAL`` (``Engine.follow_schema``); a process with live queries
leaves it to its tail.
"""

import time

import pytest
from django.db import connection, connections

from rindle_app.engine.schema_changes import mark
from rindle_app.testing import publish_watermark

from .conftest import post, token_client

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "follow_rows"


@pytest.fixture
def table(engine, settings):
    settings.RINDLE = {**settings.RINDLE, "WAKE_POLL_INTERVAL": 0.01}
    engine.register_table(TABLE, ["id", "label"], [0], ["string", "string"])
    yield engine
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE IF EXISTS "{TABLE}"')


def migrate_elsewhere():
    """Another process's migration: a column added, and its DDL marker, in one commit."""
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            if other.vendor == "postgresql":
                cursor.execute("BEGIN")
            else:
                cursor.execute("BEGIN IMMEDIATE")
            cursor.execute(f'ALTER TABLE "{TABLE}" ADD COLUMN "extra" TEXT')
            mark(cursor, other.vendor, TABLE)
            cursor.execute("COMMIT")
    finally:
        other.close()
    publish_watermark()
    time.sleep(0.02)  # past WAKE_POLL_INTERVAL since the last look


def columns_of(client):
    tables = {t["name"]: t for t in client.get("/schema").json()["tables"]}
    return [c["name"] for c in tables[TABLE]["columns"]]


def test_an_http_only_process_follows_another_process_migration(table, alice):
    client = token_client(alice, "schema", "read")
    assert columns_of(client) == ["id", "label"]
    migrate_elsewhere()
    assert columns_of(client) == ["id", "label", "extra"]
    ast = {"table": TABLE, "orderBy": [["id", "asc"]], "select": ["id", "extra"]}
    assert post(token_client(alice, "daemon"), "/query", {"ast": ast}).status_code == 200


def test_a_process_with_live_queries_leaves_the_markers_to_its_tail(table, monkeypatch):
    from rindle_app.realtime.hub import get_hub
    from rindle_app.stream import reader

    get_hub(table)  # its hub listens for schema changes, and its tail meets the marker
    looks = []
    monkeypatch.setattr(reader, "ddl_since", lambda *args: looks.append(args) or ([], 0))
    migrate_elsewhere()
    table.follow_schema()
    assert looks == []
