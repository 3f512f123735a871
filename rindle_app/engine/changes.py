"""
Row changes sent by machine writers (foreign producers and change sources):
validated against the table map before anything is queued, then applied in the
caller's write transaction.

A change is ``{"table", "op": "add", "row"}``, ``{"table", "op": "remove", "old"}``
or ``{"table", "op": "edit", "old", "row"}``; ``old`` needs only the primary key.
They apply verbatim, as the original's change-source path does:

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

from .errors import InvalidInput, RindleError
from .identifiers import quote
from .tables import HIDDEN_PREFIXES

OPS = ("add", "edit", "remove")


class RowConflict(RindleError):
    """An ``add`` met an existing row (or another constraint refused the batch)."""

    code = "row_conflict"
    status = 409


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


def parse_changes(tables, changes, *, limit, extra_tables=()):
    """
    Validate ``changes`` (a list of change dicts) against the table map; return
    ``Change`` objects or raise ``InvalidInput`` naming the first bad change.
    """
    if not isinstance(changes, list):
        raise InvalidInput("changes must be a list", code="invalid_changes")
    if len(changes) > limit:
        raise InvalidInput(
            f"a batch holds at most {limit} changes, not {len(changes)}", code="too_many_changes"
        )
    return [_parse_one(tables, c, i, extra_tables) for i, c in enumerate(changes)]


def _parse_one(tables, change, i, extra_tables):
    where = f"changes[{i}]"
    if not isinstance(change, dict):
        raise InvalidInput(f"{where} must be an object", code="invalid_change")
    unknown = set(change) - {"table", "op", "row", "old"}
    if unknown:
        raise InvalidInput(f"{where} has unknown fields {sorted(unknown)}", code="invalid_change")
    name, op = change.get("table"), change.get("op")
    if not isinstance(name, str) or not writable(tables, name, extra_tables):
        raise InvalidInput(f"{where}: table {name!r} is not a writable table", code="unknown_table")
    if op not in OPS:
        raise InvalidInput(f"{where}: op must be one of {OPS}, not {op!r}", code="invalid_op")
    table = tables.get(name)
    row, old = change.get("row"), change.get("old")
    if op in ("add", "edit"):
        _check_row(table, row, f"{where}.row", full_key=op == "add")
    elif row is not None:
        raise InvalidInput(f"{where}: a remove carries no row", code="invalid_change")
    if op in ("edit", "remove"):
        _check_row(table, old, f"{where}.old", full_key=True)
    elif old is not None:
        raise InvalidInput(f"{where}: an add carries no old image", code="invalid_change")
    return Change(name, op, row, old)


def _check_row(table, row, where, *, full_key):
    if not isinstance(row, dict) or not row:
        raise InvalidInput(f"{where} must be a non-empty object", code="invalid_row")
    unknown = [c for c in row if c not in table.column_names]
    if unknown:
        raise InvalidInput(
            f"{where}: unknown column(s) {unknown} in table {table.name!r}", code="unknown_column"
        )
    if full_key:
        missing = [k for k in table.primary_key if row.get(k) is None]
        if missing:
            raise InvalidInput(f"{where}: primary key column(s) {missing} missing", code="no_key")
    for name, value in row.items():
        if isinstance(value, (dict, list)) and _column(table, name).type != "json":
            raise InvalidInput(
                f"{where}.{name}: an object or list fits only a JSON column", code="invalid_value"
            )
        if isinstance(value, float) and value != value:
            raise InvalidInput(f"{where}.{name}: NaN is not a value", code="invalid_value")


def _column(table, name):
    return next(c for c in table.columns if c.name == name)


def digest(changes):
    """A stable digest of a batch's payload (the replay identity of a producer write)."""
    import hashlib

    canonical = json.dumps(changes, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def apply_changes(tx, changes):
    """Apply parsed ``changes`` in ``tx``; return the number of rows changed."""
    tables = tx._tables
    changed = 0
    for change in changes:
        table = tables.get(change.table)
        try:
            if change.op == "add":
                changed += _run(tx, *_insert(tx, table, change.row))
            elif change.op == "edit":
                changed += _run(tx, *_update(tx, table, change.old, change.row))
            else:
                changed += _run(tx, *_delete(tx, table, change.old))
        except IntegrityError as exc:
            raise RowConflict(
                f"{change.op} on {change.table!r} was refused by a constraint: {exc}",
                table=change.table,
            ) from exc
    return changed


def _run(tx, sql, params):
    with tx._wrap:
        tx._raw.execute(sql, params)
    return max(tx._raw.rowcount, 0)


def _value(tx, table, name, value):
    if _column(table, name).type != "json" or value is None:
        return value
    if tx.vendor == "postgresql":
        from psycopg.types.json import Jsonb

        return Jsonb(value)
    return json.dumps(value, separators=(",", ":"))


def _insert(tx, table, row):
    cols = ", ".join(quote(c) for c in row)
    marks = ", ".join([tx._ph] * len(row))
    params = [_value(tx, table, c, v) for c, v in row.items()]
    return f"INSERT INTO {quote(table.name)} ({cols}) VALUES ({marks})", params


def _key(tx, table, old):
    where = " AND ".join(f"{quote(k)} = {tx._ph}" for k in table.primary_key)
    return where, [old[k] for k in table.primary_key]


def _update(tx, table, old, row):
    sets = ", ".join(f"{quote(c)} = {tx._ph}" for c in row)
    where, key = _key(tx, table, old)
    params = [_value(tx, table, c, v) for c, v in row.items()] + key
    return f"UPDATE {quote(table.name)} SET {sets} WHERE {where}", params


def _delete(tx, table, old):
    where, key = _key(tx, table, old)
    return f"DELETE FROM {quote(table.name)} WHERE {where}", key
