"""Helpers of the watermarker's tests: raw connections, captured writes, the fence's locks."""

import uuid

import psycopg
import pytest
from django.db import connection

from rindle_app.engine.capture import FENCE_KEY


@pytest.fixture
def pg(transactional_db):
    """The test database, on PostgreSQL only (the watermarker's home)."""
    if connection.vendor != "postgresql":
        pytest.skip("the watermarker and the outbox fence are PostgreSQL's")
    return connection


def conninfo():
    s = connection.settings_dict
    parts = {
        "host": s.get("HOST") or "127.0.0.1",
        "port": s.get("PORT") or 5432,
        "user": s.get("USER") or "postgres",
        "dbname": s["NAME"],
    }
    if s.get("PASSWORD"):
        parts["password"] = s["PASSWORD"]
    return " ".join(f"{k}={v}" for k, v in parts.items())


def raw(autocommit=True):
    """A psycopg connection of its own to the test database."""
    return psycopg.connect(conninfo(), autocommit=autocommit)


def write_user(conn, user_id=None):
    """One captured insert (table "user") on ``conn``, in its current transaction."""
    conn.execute(
        'INSERT INTO "user" (id, name) VALUES (%s, %s)', [user_id or uuid.uuid4().hex, "x"]
    )


def last_seq(conn):
    """The greatest seq ``conn``'s transaction drew (its own rows only)."""
    return conn.execute(
        "SELECT MAX(seq) FROM _rindle_change_events WHERE txid = pg_current_xact_id()::text::bigint"
    ).fetchone()[0]


def safe_seq(conn=None):
    conn = conn or connection
    with conn.cursor() as cursor:
        cursor.execute("SELECT safe_seq FROM _rindle_stream WHERE name = 'outbox'")
        row = cursor.fetchone()
    return row[0] if row else 0


def max_seq():
    with connection.cursor() as cursor:
        cursor.execute("SELECT COALESCE(MAX(seq), 0) FROM _rindle_change_events")
        return cursor.fetchone()[0]


def fence_locks(granted=None):
    """(pid, mode, granted) of every lock on the outbox fence's key, from pg_locks."""
    sql = (
        "SELECT pid, mode, granted FROM pg_locks WHERE locktype = 'advisory' "
        "AND classid = %s AND objid = %s AND objsubid = 1"
    )
    params = [FENCE_KEY >> 32, FENCE_KEY & 0xFFFFFFFF]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [r for r in rows if granted is None or r[2] is granted]
