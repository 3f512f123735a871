"""
Reading the outbox without a lock: the committed changes after a version, in
order; one query's view; a snapshot of whole tables (the oracles'); and the read
transaction every other read (``stream.partitions``) runs in.

Rows come back as the same JSON images the capture triggers record, so a row read
from a table and the same row arriving as a change are equal value for value.

Every read starts from the stream's state row (``stream.state``) read in the SAME
snapshot as the data, and never takes the exclusive side of the outbox fence, so
no reader ever makes a writer wait:

- **The tail** (``tail``) reads the state and the events ``version < seq <=
  safe_seq`` in ONE statement. Everything at or below the published ``safe_seq``
  is final (the watermarker published it behind the fence), so a tail never moves
  past a seq whose transaction can still commit. It reads them all, with no LIMIT:
  a step ends at a published ``safe_seq``, the only versions that are states the
  database was in (transactions interleave their seqs, so a page boundary could end
  a step halfway through two of them).
- **A partition read** (``stream.partitions``) is a REPEATABLE READ READ ONLY
  snapshot (``consistent_read``) of some rows and the outbox changes of their table
  above a version: the live catalog's store corrects the rows back to its version
  with them. Per row, seq order is commit order (a capture trigger allocates the
  seq while the row is locked).
- **The SSR read** (``read_query``) reads the state and the query in one such
  snapshot and reports S: see there.

On SQLite the write lock orders commits by seq, so ``safe_seq`` is the greatest
seq (``stream.state.read``).
"""

import json
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import connections

from ..engine.capture import OUTBOX, sqlite_image
from ..engine.identifiers import quote
from ..ivm.sql import compile_query, decode_view
from . import state as stream_state


def decode(table, image):
    """
    An outbox or snapshot image as the IVM's row, every value in the wire encoding
    (``engine.values``): the one place rows enter the engine, so every consumer of a
    view (frames, the stream, the SSR read) sees the same values on every backend.
    """
    if image is None:
        return None
    if isinstance(image, str):
        image = json.loads(image)
    if table is not None and table.decoders:
        table.decode(image)
    return image


@dataclass(frozen=True)
class Tail:
    """The state and the committed events after a version, read in one statement."""

    state: stream_state.State
    events: list  # [(seq, table name, old, new)], oldest first


@contextmanager
def read_transaction(using, *, fresh=False):
    """
    A cursor inside ONE read-only transaction (REPEATABLE READ READ ONLY on Postgres,
    a deferred transaction on SQLite): every statement in it reads one snapshot,
    fixed by its first statement. It takes no lock a writer could wait for.

    It runs on the thread's connection, unless ``fresh`` is set or that connection is
    inside an atomic block: a transaction begun earlier cannot give this read a
    snapshot of its own. Then it runs on a connection of its own, closed afterwards.
    """
    own = fresh or connections[using].in_atomic_block
    conn = connections.create_connection(using) if own else connections[using]
    try:
        with conn.cursor() as cursor:
            if conn.vendor == "sqlite":
                cursor.execute("BEGIN DEFERRED")
            else:
                cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                yield cursor
            finally:
                # Read only: a COMMIT and a ROLLBACK end it alike, and ROLLBACK also
                # ends a Postgres transaction an error has aborted.
                cursor.execute("ROLLBACK")
    finally:
        if own:
            conn.close()


# SQLite's safe_seq: the greatest seq (its write lock orders commits by seq), and
# never below what retention pruned (an outbox pruned empty has no greatest seq).
_SQLITE_SAFE = f"MAX(safe_seq, horizon - 1, (SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}))"


def _state_sql(vendor):
    table = stream_state.TABLE
    if vendor == "postgresql":
        return f"SELECT epoch, safe_seq, horizon FROM {table} WHERE name = %s"
    return f"SELECT epoch, {_SQLITE_SAFE}, horizon FROM {table} WHERE name = %s"


def _read_state(cursor):
    """The state row as of the cursor's snapshot, or None when it is missing."""
    cursor.execute(_state_sql(cursor.db.vendor), [stream_state.STREAM])
    row = cursor.fetchone()
    if row is None:
        return None
    return stream_state.State(epoch=row[0], safe_seq=int(row[1]), horizon=int(row[2]))


def _ensure_state(using):
    """Create the state row (a fresh or flushed database) outside any read snapshot."""
    own = connections[using].in_atomic_block
    conn = connections.create_connection(using) if own else connections[using]
    try:
        with conn.cursor() as cursor:
            stream_state.ensure(cursor)
    finally:
        if own:
            conn.close()


def consistent_read(using, read, *, fresh=False):
    """
    ``(state, read(cursor, state))`` in one read transaction whose FIRST statement
    reads the state, so the state and everything ``read`` reads are one snapshot.
    A missing state row is created (outside the snapshot: it is read only) and the
    read starts over.
    """
    for _attempt in range(2):
        with read_transaction(using, fresh=fresh) as cursor:
            current = _read_state(cursor)
            if current is not None:
                return current, read(cursor, current)
        _ensure_state(using)
    raise RuntimeError("the stream's state row vanished twice while being read")


def snapshot(using, tables):
    """
    (version, {table name: [rows]}) of whole tables read in ONE snapshot: the rows
    hold every change at or below ``version`` (the published safe_seq), and on
    PostgreSQL possibly some committed above it. The oracles' fresh read; no serving
    path reads a whole table.
    """

    def read(cursor, _current):
        vendor = cursor.db.vendor
        rows = {}
        for t in tables:
            image = sqlite_image("t", t) if vendor == "sqlite" else "to_jsonb(t)"
            cursor.execute(f"SELECT {image} FROM {quote(t.name)} AS t")
            rows[t.name] = [decode(t, r[0]) for r in cursor.fetchall()]
        return rows

    current, rows = consistent_read(using, read, fresh=True)
    return current.safe_seq, rows


def read_query(using, query, schema):
    """
    (version, view) of one parsed query, read in ONE snapshot with the state: the
    view (in the SSR shape, cells under ``cols``) holds every commit at or below
    ``version``, the published safe_seq S of that snapshot.

    Why S. The rows may also hold transactions committed above S (the watermark lags
    the newest commit by up to a refresh interval, or by an open transaction). S is
    the greatest version of which "everything up to here is in these rows" is true
    and stays true: a seq below the newest visible one may still belong to an open
    transaction, so naming the newest would claim changes the rows lack. A client
    taking over lives with a low version and never with a high one. The published
    clients keep ``cvMin`` beside the SSR rows only until the live subscription's
    seq 0 (a fresh snapshot of the hub at its own version, stamped with its ``cv``)
    replaces them, and release incremental frames by ``cv <= cvMin`` of progress
    frames, which the SSR read never sends; a consumer that instead replays changes
    after ``version`` re-applies some that are in the rows already, as row images
    keyed by primary key, and lands where the database is. On SQLite S is the
    greatest seq, exactly the rows' version.
    """
    sql, params = compile_query(query, connections[using].vendor, schema, render="snapshot")

    def read(cursor, _current):
        cursor.execute(sql, params)
        (text,) = cursor.fetchone()
        return text

    current, text = consistent_read(using, read)
    view = None if text is None else json.loads(text)
    return current.safe_seq, decode_view(query, schema, view, snapshot=True)


def ddl_since(using, after):
    """
    ``(names, version)``: the tables whose DDL markers (``engine.schema_changes``)
    committed in ``(after, version]``, ``version`` being the published safe_seq read
    in the same snapshot (below it no marker can still commit). It reads the outbox
    past ``after`` by seq: the work is what was written since the last look.
    """
    from ..engine.schema_changes import DDL_OP

    def read(cursor, current):
        cursor.execute(
            f'SELECT DISTINCT "table" FROM {OUTBOX} WHERE seq > %s AND seq <= %s AND op = %s',
            [after, current.safe_seq, DDL_OP],
        )
        return sorted(row[0] for row in cursor.fetchall())

    current, names = consistent_read(using, read)
    return names, current.safe_seq


def _tail_sql(vendor):
    table = stream_state.TABLE
    if vendor == "postgresql":
        # One statement is one snapshot: the events are exactly those at or below the
        # safe_seq it reads, and the horizon is the one that held for them.
        return (
            f'SELECT s.epoch, s.safe_seq, s.horizon, e.seq, e."table", e.old, e.new '
            f"FROM {table} AS s LEFT JOIN {OUTBOX} AS e "
            "ON e.seq > %s AND e.seq <= s.safe_seq "
            "WHERE s.name = %s ORDER BY e.seq"
        )
    return (
        f"SELECT s.epoch, {_SQLITE_SAFE}, "
        f's.horizon, e.seq, e."table", e.old, e.new '
        f"FROM {table} AS s LEFT JOIN {OUTBOX} AS e ON e.seq > %s "
        "WHERE s.name = %s ORDER BY e.seq"
    )


def tail(using, version, tables):
    """
    The ``Tail`` after ``version``: the state and every committed change with
    ``version < seq <= safe_seq``, oldest first, as (seq, table, old, new); images of
    ``tables`` ({name: Table}) are decoded by type. None when the state row is
    missing (a flushed database): it is created, and the next read sees its new epoch.

    It reads all of them in one statement: on SQLite that is whole transactions,
    where a LIMIT could cut one in two; on PostgreSQL it ends at a safe_seq.
    """
    conn = connections[using]
    with conn.cursor() as cursor:
        cursor.execute(_tail_sql(conn.vendor), [version, stream_state.STREAM])
        rows = cursor.fetchall()
    if not rows:
        _ensure_state(using)
        return None
    epoch, safe, horizon = rows[0][:3]
    current = stream_state.State(epoch=epoch, safe_seq=int(safe), horizon=int(horizon))
    events = [
        (s, name, decode(tables.get(name), old), decode(tables.get(name), new))
        for _e, _s, _h, s, name, old, new in rows
        if s is not None
    ]
    return Tail(current, events)
