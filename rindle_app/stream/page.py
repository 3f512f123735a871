"""
One page of the public change stream (``GET /v1/stream``): the committed outbox
events after a cursor, up to the published ``safe_seq``, in seq order.

The stream's state (epoch, safe_seq, horizon) and the events are read in ONE
statement, so they come from one snapshot. Read apart, a pruner could run between
the two: the reader would check the cursor against the old horizon, then fetch
``seq > cursor`` from an outbox whose prefix had just been deleted, and skip it
without knowing. In one statement the check and the events agree: a cursor the
pruner overtook is refused (``ResnapshotRequired``), never answered with events
that jump its gap.

A cursor names the last seq its reader applied, with the epoch of the numbering
it was read in. Its next seq is ``cursor + 1``:

- ``cursor + 1 < horizon``: those events were pruned; resnapshot (below_horizon);
- another epoch: the database was restored or replaced; resnapshot (epoch_mismatch);
- ``cursor > safe_seq``: the reader claims events that were never published here
  (a restore without a new epoch, or a forged cursor); resnapshot (ahead).

Holes are normal: a rolled-back transaction leaves its seqs unused forever, so a
page never requires contiguity. Each page examines at most ``scan`` seqs past its
cursor; the next cursor is the last event's seq when the page is full, else the
last seq the page examined, so a consumer of a quiet table moves on instead of
rescanning the busy ones.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connections

from ..engine.capture import OUTBOX
from ..exceptions import ResnapshotRequired
from . import state as stream_state
from .reader import decode

MAX_SEQ = 2**63 - 1


@dataclass(frozen=True)
class Page:
    """What one read of the stream found: the state it was checked against and its events."""

    epoch: str
    safe_seq: int
    horizon: int
    after: int  # the cursor the page continued (the horizon - 1 for "from the oldest")
    events: list  # dicts: seq, table, op, key, old, new, created_at (ISO 8601)
    next_seq: int

    @property
    def cursor(self):
        return format_cursor(self.epoch, self.next_seq)


def format_cursor(epoch, seq):
    return f"{epoch}:{seq}"


def read_page(using, *, epoch=None, after=None, tables=None, limit, scan, schema=None):
    """
    The page after ``(epoch, after)``; ``after`` None reads from the oldest retained
    event (horizon - 1). ``tables``: only events of those tables (None: all).
    ``schema`` ({name: Table}) decodes the images by column type. Raises
    ``ResnapshotRequired`` when the cursor cannot continue.
    """
    conn = connections[using]
    sql, params = _statement(conn.vendor, after, tables, limit, scan)
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        if not rows:  # a fresh or flushed database has no state row yet
            stream_state.ensure(cursor)
            cursor.execute(sql, params)
            rows = cursor.fetchall()
    current, safe_seq, horizon = rows[0][0], int(rows[0][1]), int(rows[0][2])
    start = horizon - 1 if after is None else after
    check(epoch, start, current, safe_seq, horizon)
    events = [_event(row[3:], schema or {}) for row in rows if row[3] is not None]
    if len(events) >= limit:
        next_seq = events[-1]["seq"]
    else:
        next_seq = max(start, min(safe_seq, _until(start, scan)))
    return Page(current, safe_seq, horizon, start, events, next_seq)


def check(epoch, after, current, safe_seq, horizon):
    """Refuse a cursor that cannot continue (the module docstring's three rules)."""
    if epoch is not None and epoch != current:
        raise ResnapshotRequired(
            ResnapshotRequired.EPOCH_MISMATCH,
            f"the cursor is of epoch {epoch!r}, the stream is now {current!r}: resnapshot",
            epoch=current,
            horizon=horizon,
            safe_seq=safe_seq,
        )
    if after + 1 < horizon:
        raise ResnapshotRequired(
            ResnapshotRequired.BELOW_HORIZON,
            f"events after {after} were pruned; the oldest retained is {horizon}: resnapshot",
            epoch=current,
            horizon=horizon,
            safe_seq=safe_seq,
        )
    if after > safe_seq:
        raise ResnapshotRequired(
            ResnapshotRequired.AHEAD,
            f"the cursor {after} is ahead of the published safe_seq {safe_seq}: resnapshot",
            epoch=current,
            horizon=horizon,
            safe_seq=safe_seq,
        )


def _until(after, scan):
    return min(after + scan, MAX_SEQ)


def _statement(vendor, after, tables, limit, scan):
    """The one statement: the state row joined with the events it permits."""
    columns = 'e.seq, e."table", e.op, e.pk, e.old, e.new, e.created_at'
    inner = 'seq, "table", op, pk, old, new, created_at'
    if vendor == "postgresql":
        table_filter = ' AND "table" = ANY(%s)' if tables is not None else ""
        # after None: from the horizon, read in the same statement.
        sql = (
            f"SELECT s.epoch, s.safe_seq, s.horizon, {columns} "
            f"FROM {stream_state.TABLE} AS s LEFT JOIN LATERAL ("
            f"SELECT {inner} FROM {OUTBOX} "
            "WHERE seq > COALESCE(%s::bigint, s.horizon - 1) "
            "AND seq <= LEAST(s.safe_seq, COALESCE(%s::bigint, s.horizon - 1 + %s::bigint))"
            f"{table_filter} ORDER BY seq LIMIT %s) AS e ON TRUE "
            "WHERE s.name = %s ORDER BY e.seq"
        )
        params = [after, None if after is None else _until(after, scan), scan]
        if tables is not None:
            params.append(list(tables))
        params += [limit, stream_state.STREAM]
        return sql, params
    # SQLite: writers are serialized, so every seq in the outbox is committed and
    # safe_seq is the greatest one (or what was published, or below the horizon:
    # everything there is committed or gone). One statement reads one snapshot.
    safe = f"MAX(s.safe_seq, s.horizon - 1, (SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}))"
    start = f"COALESCE(?, (SELECT horizon - 1 FROM {stream_state.TABLE} WHERE name = ?))"
    table_filter = ""
    if tables is not None:
        table_filter = ' AND "table" IN (' + ", ".join("?" for _ in tables) + ")"
    sql = (
        f"SELECT s.epoch, {safe}, s.horizon, {columns} "
        f"FROM {stream_state.TABLE} AS s LEFT JOIN ("
        f"SELECT {inner} FROM {OUTBOX} WHERE seq > {start} AND seq <= COALESCE(?, {start} + ?)"
        f"{table_filter} ORDER BY seq LIMIT ?) AS e ON 1 "
        "WHERE s.name = ? ORDER BY e.seq"
    ).replace("?", "%s")
    until = None if after is None else _until(after, scan)
    params = [after, stream_state.STREAM, until, after, stream_state.STREAM, scan]
    if tables is not None:
        params += list(tables)
    params += [limit, stream_state.STREAM]
    return sql, params


def _event(row, schema):
    seq, table, op, key, old, new, created_at = row
    definition = schema.get(table)
    if isinstance(key, str):
        key = json.loads(key)
    if definition is not None and definition.decoders:
        key = list(definition.decode(dict(zip(definition.primary_key, key))).values())
    return {
        "seq": int(seq),
        "table": table,
        "op": op,
        "key": key,
        "old": decode(definition, old),
        "new": decode(definition, new),
        "created_at": _iso(created_at),
    }


def _iso(value):
    """ISO 8601 with the zone; SQLite keeps the database clock's UTC time as text."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.isoformat()
