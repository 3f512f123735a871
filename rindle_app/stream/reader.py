"""
Reading the outbox: a consistent snapshot of the synced tables at a version, one
query's view at a version, and the committed changes after a version, in order.

Rows come back as the same JSON images the capture triggers record, so a row read
at hydration and the same row arriving as a change are equal value for value.

On SQLite every read of the outbox holds whole transactions (writers are
serialized and a read sees one snapshot), so "all changes after V" is gap-free.
On Postgres a transaction can commit after one with a higher seq: snapshots are
taken behind the outbox fence (see ``read_transaction``), and tails read only up to
``stream.fence.safe_seq``.
"""

import json
from contextlib import contextmanager

from django.db import connections

from ..engine.capture import FENCE_KEY, OUTBOX, sqlite_image
from ..engine.identifiers import quote
from ..ivm.sql import compile_query

HIGH_WATER = f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}"


def decode(table, image):
    """An outbox or snapshot image as the IVM's row: booleans as booleans."""
    if image is None:
        return None
    if isinstance(image, str):
        image = json.loads(image)
    for column in table.columns if table is not None else ():
        if column.type == "boolean" and image.get(column.name) in (0, 1):
            image[column.name] = bool(image[column.name])
    return image


# How long a fenced read waits for the capturing transactions in flight to end.
FENCE_WAIT_MS = 30_000


@contextmanager
def read_transaction(using, *, fresh=False):
    """
    A cursor inside ONE read-only transaction (REPEATABLE READ on Postgres, a
    deferred transaction on SQLite): every statement in it reads one snapshot.

    It runs on the thread's connection, unless ``fresh`` is set or that connection is
    inside an atomic block: a transaction begun earlier cannot give this read a
    snapshot of its own. Then it runs on a connection of its own, closed afterwards.

    On Postgres the snapshot is taken behind the outbox fence (``stream.fence``):
    while the exclusive side is held no capturing transaction is in flight, so
    every seq at or below the snapshot's greatest one is in it. Without the fence a
    transaction holding seq 10 could commit after the snapshot saw seq 11, and a
    reader going on from 11 would never see 10.
    """
    own = fresh or connections[using].in_atomic_block
    conn = connections.create_connection(using) if own else connections[using]
    try:
        with conn.cursor() as cursor:
            if conn.vendor == "sqlite":
                cursor.execute("BEGIN DEFERRED")
            else:
                _begin_fenced(cursor)
            try:
                yield cursor
            finally:
                # Read only: a COMMIT and a ROLLBACK end it alike, and ROLLBACK also
                # ends a Postgres transaction an error has aborted.
                cursor.execute("ROLLBACK")
    finally:
        if own:
            conn.close()


def _begin_fenced(cursor):
    # The lock is taken BEFORE the transaction: a repeatable-read snapshot is fixed
    # when its first statement starts, so a lock waited for inside it comes too late.
    cursor.execute("SELECT set_config('lock_timeout', %s, false)", [f"{FENCE_WAIT_MS}ms"])
    try:
        cursor.execute("SELECT pg_advisory_lock(%s)", [FENCE_KEY])
    finally:
        cursor.execute("SELECT set_config('lock_timeout', '0', false)")
    try:
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cursor.execute("SELECT 1")  # fixes the snapshot while no capture is in flight
    finally:
        cursor.execute("SELECT pg_advisory_unlock(%s)", [FENCE_KEY])


def snapshot(using, tables):
    """
    (version, {table name: [rows]}) read in ONE read transaction: the rows are the
    tables exactly as of outbox seq ``version``.
    """
    with read_transaction(using, fresh=True) as cursor:
        vendor = cursor.db.vendor
        cursor.execute(HIGH_WATER)
        version = cursor.fetchone()[0]
        rows = {}
        for table in tables:
            image = sqlite_image("t", table) if vendor == "sqlite" else "to_jsonb(t)"
            cursor.execute(f"SELECT {image} FROM {quote(table.name)} AS t")
            rows[table.name] = [decode(table, r[0]) for r in cursor.fetchall()]
    return version, rows


def read_query(using, query, schema):
    """
    (version, view) of one parsed query, read in ONE read transaction: the view (in
    the SSR shape, cells under ``cols``) is the database exactly as of outbox seq
    ``version``, so a live subscription can take over from that version.
    """
    sql, params = compile_query(query, connections[using].vendor, schema, render="snapshot")
    with read_transaction(using) as cursor:
        cursor.execute(HIGH_WATER)
        version = cursor.fetchone()[0]
        cursor.execute(sql, params)
        (text,) = cursor.fetchone()
    return version, None if text is None else json.loads(text)


def changes_after(using, seq, tables):
    """
    Every committed change with outbox seq > ``seq``, oldest first, as
    (seq, table, old, new); images of ``tables`` ({name: Table}) are decoded by type.

    It reads all of them in one statement: on SQLite that is whole transactions,
    where a LIMIT could cut one in two.
    """
    with connections[using].cursor() as cursor:
        cursor.execute(
            f'SELECT seq, "table", old, new FROM {OUTBOX} WHERE seq > %s ORDER BY seq', [seq]
        )
        return [
            (s, name, decode(tables.get(name), old), decode(tables.get(name), new))
            for s, name, old, new in cursor.fetchall()
        ]
