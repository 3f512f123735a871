"""Fixtures of the migrations-journal tests: the process engine and scratch tables."""

import pytest
from django.db import connection

from rindle_app.engine import get_engine, shutdown
from rindle_app.testing import outbox_high_water

PREFIX = "jt_"


def drop_scratch_tables():
    """Drop every table a test created (names start with ``jt_``), views first."""
    with connection.cursor() as cursor:
        names = connection.introspection.table_names(cursor, include_views=True)
        views = {t.name for t in connection.introspection.get_table_list(cursor) if t.type == "v"}
        sqlite = connection.vendor == "sqlite"
        if sqlite:
            cursor.execute("PRAGMA foreign_keys = OFF")
        for name in sorted(n for n in names if n.startswith(PREFIX)):
            kind = "VIEW" if name in views else "TABLE"
            cascade = "" if sqlite else " CASCADE"
            cursor.execute(f'DROP {kind} IF EXISTS "{name}"{cascade}')
        if sqlite:
            cursor.execute("PRAGMA foreign_keys = ON")


@pytest.fixture
def engine(transactional_db):
    """The engine the views and the command use (``get_engine()``), stopped after."""
    shutdown()
    drop_scratch_tables()
    yield get_engine()
    shutdown()
    drop_scratch_tables()


@pytest.fixture
def scratch(transactional_db):
    """The test database without an engine in this process; scratch tables dropped after."""
    shutdown()
    drop_scratch_tables()
    yield
    drop_scratch_tables()


def tables():
    with connection.cursor() as cursor:
        return sorted(connection.introspection.table_names(cursor))


def journal_rows():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT key, checksum, content_checksum FROM _rindle_applied_ddl ORDER BY key"
        )
        return cursor.fetchall()


def state():
    """What a refused migration must leave alone: tables, journal and outbox."""
    return {"tables": tables(), "journal": journal_rows(), "outbox": outbox_high_water()}


def rows(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
