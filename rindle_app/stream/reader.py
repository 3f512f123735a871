"""
Reading the outbox: a consistent snapshot of the synced tables at a version, and
the committed changes after a version, in order.

Rows come back as the same JSON images the capture triggers record, so a row read
at hydration and the same row arriving as a change are equal value for value.

On SQLite every read of the outbox holds whole transactions (writers are
serialized and a read sees one snapshot), so "all changes after V" is gap-free.
On Postgres a transaction can commit after one with a higher seq; a gap-free tail
there needs the outbox fence and watermark (DESIGN section 7), which this reader
does not implement yet: it is exact when the engine is the only writer.
"""

import json

from django.db import connections

from ..engine.capture import OUTBOX, sqlite_image
from ..engine.identifiers import quote


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


def snapshot(using, tables):
    """
    (version, {table name: [rows]}) read in ONE read transaction: the rows are the
    tables exactly as of outbox seq ``version``.
    """
    conn = connections.create_connection(using)
    try:
        conn.ensure_connection()
        raw = conn.connection.cursor()
        with conn.wrap_database_errors:
            if conn.vendor == "sqlite":
                raw.execute("BEGIN DEFERRED")
            else:
                raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                raw.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
                version = raw.fetchone()[0]
                rows = {}
                for table in tables:
                    if conn.vendor == "sqlite":
                        image = sqlite_image("t", table)
                    else:
                        image = "to_jsonb(t)"
                    raw.execute(f"SELECT {image} FROM {quote(table.name)} AS t")
                    rows[table.name] = [decode(table, r[0]) for r in raw.fetchall()]
            finally:
                raw.execute("COMMIT")
        return version, rows
    finally:
        conn.close()


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
