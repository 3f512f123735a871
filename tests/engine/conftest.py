"""Fixtures of the ingest-plane tests."""

from django.db import connection


def scratch_table(engine, name):
    """Register table ``name`` (id, label, n, meta) on ``engine``; drop it after the test."""
    engine.register_table(
        name, ["id", "label", "n", "meta"], [0], ["string", "string", "int64", "json"]
    )
    yield engine
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE IF EXISTS "{name}"')
