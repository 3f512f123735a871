"""
Row changes sent by machine writers (foreign producers and change sources):
validated against the table map before anything is queued, then applied in the
caller's write transaction.

A change is ``{"table", "op": "add", "row"}``, ``{"table", "op": "remove", "old"}``
or ``{"table", "op": "edit", "old", "row"}``; ``old`` needs only the primary key.
A row or old image is an object, or positional: a list of one value per column of
the table's wire schema (``GET /schema``), in its order, as the daemon client sends.
Values are in the wire encoding (``engine.values``, docs/protocol.md "Value
encoding"): a typed model column's value is stored as Django stores it (a datetime
as SQLite's text or PostgreSQL's timestamptz, a UUID as SQLite's 32 hex digits),
and one that is not a value of the column is ``invalid_value``. Otherwise they
apply verbatim, as the original's change-source path does:

- ``add`` inserts the row; a row with the same key is a conflict (``row_exists``)
  that rolls the whole batch back, since exactly-once admission has already ruled
  out a replay;
- ``edit`` sets every column ``row`` names on the row keyed by ``old`` (the key
  itself may change);
- ``remove`` deletes the row keyed by ``old``.

A missing row makes ``edit`` and ``remove`` no-ops: the writer owns its rows'
history, and the engine reports how many rows each batch actually changed.
"""

import json
from dataclasses import dataclass

from django.db import IntegrityError

from ..exceptions import (
    INVALID_CHANGE,
    INVALID_CHANGES,
    INVALID_OP,
    INVALID_ROW,
    INVALID_VALUE,
    NO_KEY,
    TOO_MANY_CHANGES,
    UNKNOWN_COLUMN,
    UNKNOWN_TABLE,
    RowConflict,
)
from .errors import InvalidInput
from .identifiers import quote
from .tables import HIDDEN_PREFIXES
from .values import to_stored

OPS = ("add", "edit", "remove")


@dataclass(frozen=True)
class Change:
    table: str
    op: str
    row: dict = None
    old: dict = None


def writable(tables, name, extra=()):
    """Whether machine writers may write ``name``: a registered client-visible table."""
    if name not in tables:
        return False
    return name in extra or not name.startswith(HIDDEN_PREFIXES)


_FIELDS = frozenset({"table", "op", "row", "old"})
_CONTAINERS = (dict, list)


def parse_changes(tables, changes, *, limit, extra_tables=()):
    """
    Validate ``changes`` (a list of change dicts) against the table map; return
    ``Change`` objects or raise ``InvalidInput`` naming the first bad change.
    """
    if not isinstance(changes, list):
        raise InvalidInput("changes must be a list", code=INVALID_CHANGES)
    if len(changes) > limit:
        raise InvalidInput(
            f"a batch holds at most {limit} changes, not {len(changes)}", code=TOO_MANY_CHANGES
        )
    resolved = {}  # table name -> Table, for the tables this batch may write
    return [_parse_one(tables, c, i, extra_tables, resolved) for i, c in enumerate(changes)]


def _parse_one(tables, change, i, extra_tables, resolved):
    if not isinstance(change, dict):
        raise InvalidInput(f"changes[{i}] must be an object", code=INVALID_CHANGE)
    if not _FIELDS.issuperset(change):
        unknown = sorted(set(change) - _FIELDS)
        raise InvalidInput(f"changes[{i}] has unknown fields {unknown}", code=INVALID_CHANGE)
    name, op = change.get("table"), change.get("op")
    table = resolved.get(name) if isinstance(name, str) else None
    if table is None:
        if not isinstance(name, str) or not writable(tables, name, extra_tables):
            raise InvalidInput(
                f"changes[{i}]: table {name!r} is not a writable table", code=UNKNOWN_TABLE
            )
        table = resolved[name] = tables.get(name)
    if op not in OPS:
        raise InvalidInput(f"changes[{i}]: op must be one of {OPS}, not {op!r}", code=INVALID_OP)
    row = _keyed(table, change.get("row"), i, "row")
    old = _keyed(table, change.get("old"), i, "old")
    if op != "remove":
        _check_row(table, row, i, "row", full_key=op == "add")
    elif row is not None:
        raise InvalidInput(f"changes[{i}]: a remove carries no row", code=INVALID_CHANGE)
    if op != "add":
        _check_row(table, old, i, "old", full_key=True)
    elif old is not None:
        raise InvalidInput(f"changes[{i}]: an add carries no old image", code=INVALID_CHANGE)
    return Change(name, op, row, old)


def keyed(columns, row, where):
    """
    ``row`` as an object: a positional row (a list, the daemon client's form) names
    ``columns`` in order and must have exactly one value per column; anything else is
    returned as it is, for the caller's own checks.
    """
    if not isinstance(row, list):
        return row
    if len(row) != len(columns):
        raise InvalidInput(
            f"{where}: a positional row has {len(row)} values; the table has {len(columns)} "
            f"columns {list(columns)}",
            code=INVALID_ROW,
        )
    return dict(zip(columns, row))


def _keyed(table, row, i, field):
    return keyed([c.name for c in table.wire_columns], row, f"changes[{i}].{field}")


def _check_row(table, row, i, field, *, full_key):
    if not isinstance(row, dict) or not row:
        raise InvalidInput(f"changes[{i}].{field} must be a non-empty object", code=INVALID_ROW)
    if not table.column_names.issuperset(row):
        unknown = [c for c in row if c not in table.column_names]
        raise InvalidInput(
            f"changes[{i}].{field}: unknown column(s) {unknown} in table {table.name!r}",
            code=UNKNOWN_COLUMN,
        )
    if full_key:
        for k in table.primary_key:
            if row.get(k) is None:
                raise InvalidInput(
                    f"changes[{i}].{field}: primary key column {k!r} missing", code=NO_KEY
                )
    for name, value in row.items():
        if isinstance(value, _CONTAINERS):
            if name not in table.json_columns:
                raise InvalidInput(
                    f"changes[{i}].{field}.{name}: an object or list fits only a JSON column",
                    code=INVALID_VALUE,
                )
        elif value != value:  # NaN
            raise InvalidInput(
                f"changes[{i}].{field}.{name}: NaN is not a value", code=INVALID_VALUE
            )


def digest(changes):
    """A stable digest of a batch's payload (the replay identity of a producer write)."""
    import hashlib

    canonical = json.dumps(changes, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def apply_changes(tx, changes):
    """Apply parsed ``changes`` in ``tx``, in order; return the number of rows changed."""
    tables = tx.tables
    changed = 0
    i, n = 0, len(changes)
    while i < n:
        change = changes[i]
        table = tables.get(change.table)
        try:
            if change.op == "add":
                # A run of adds to one table with the same columns is one executemany.
                cols = tuple(change.row)
                j = i + 1
                while j < n and _same_insert(changes[j], change.table, cols):
                    j += 1
                sql = _insert_sql(tx, table, cols)
                if table.json_columns.isdisjoint(cols) and table.encoded.keys().isdisjoint(cols):
                    # the row dicts are in cols order, every value stored as sent
                    rows = [tuple(ch.row.values()) for ch in changes[i:j]]
                else:
                    rows = [[_value(tx, table, c, ch.row[c]) for c in cols] for ch in changes[i:j]]
                tx.run_many(sql, rows)
                changed += j - i
                i = j
                continue
            if change.op == "edit":
                changed += _run(tx, *_update(tx, table, change.old, change.row))
            else:
                changed += _run(tx, *_delete(tx, table, change.old))
        except IntegrityError as exc:
            raise RowConflict(
                f"{change.op} on {change.table!r} was refused by a constraint: {exc}",
                table=change.table,
            ) from exc
        i += 1
    return changed


def _same_insert(change, table, cols):
    return change.op == "add" and change.table == table and tuple(change.row) == cols


def _run(tx, sql, params):
    return max(tx.run(sql, params), 0)


def _value(tx, table, name, value):
    encoding = table.encoded.get(name)
    if encoding is not None:
        try:
            return to_stored(encoding, tx.vendor, value)
        except ValueError as exc:
            raise InvalidInput(f"{table.name}.{name}: {exc}", code=INVALID_VALUE) from None
    if name not in table.json_columns or value is None:
        return value
    if tx.vendor == "postgresql":
        from psycopg.types.json import Jsonb

        return Jsonb(value)
    return json.dumps(value, separators=(",", ":"))


def _insert_sql(tx, table, cols):
    names = ", ".join(quote(c) for c in cols)
    marks = ", ".join(["%s"] * len(cols))
    return f"INSERT INTO {quote(table.name)} ({names}) VALUES ({marks})"


def _key(tx, table, old):
    where = " AND ".join(f"{quote(k)} = %s" for k in table.primary_key)
    return where, [_value(tx, table, k, old[k]) for k in table.primary_key]


def _update(tx, table, old, row):
    sets = ", ".join(f"{quote(c)} = %s" for c in row)
    where, key = _key(tx, table, old)
    params = [_value(tx, table, c, v) for c, v in row.items()] + key
    return f"UPDATE {quote(table.name)} SET {sets} WHERE {where}", params


def _delete(tx, table, old):
    where, key = _key(tx, table, old)
    return f"DELETE FROM {quote(table.name)} WHERE {where}", key
