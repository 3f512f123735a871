"""
The conformance fixtures of the original (``diff/*.json``): load one, run it, and
say whether our view equals the recorded one.

A fixture gives tables (``sources``), their rows (``sourceContents``), a query
(``ast``) and, for ``push`` fixtures, row changes applied in order (``pushes``).
``expected.data`` is the view after the last change. ``expected.pushes``, the
original's change stream, is informative only: ours may differ, the view may not.
"""

import json
from dataclasses import dataclass

from ..engine.tables import Column, Table
from .ast import QueryError, parse
from .evaluate import evaluate
from .store import MemoryStore
from .view import View


class Schema(dict):
    """Tables by name, as ``parse`` and ``evaluate`` read them."""

    @classmethod
    def from_sources(cls, sources):
        schema = cls()
        for name, spec in sources.items():
            columns = tuple(
                Column(col, info.get("type", "string"), bool(info.get("optional", False)))
                for col, info in spec["columns"].items()
            )
            schema[name] = Table(name, columns, tuple(spec["primaryKeys"]))
        return schema


@dataclass
class Outcome:
    name: str
    passed: bool
    why: str = ""

    def line(self):
        return f"PASS {self.name}" if self.passed else f"FAIL {self.name}: {self.why}"


def apply_push(rows, schema, table, change):
    """Apply one fixture change (add / remove / edit) to the rows of ``table``."""
    key = schema[table].primary_key
    current = rows.setdefault(table, [])

    def without(row):
        wanted = [row.get(k) for k in key]
        return [r for r in current if [r.get(k) for k in key] != wanted]

    kind = change["type"]
    if kind == "add":
        current.append(full_row(schema[table], change["row"]))
    elif kind == "remove":
        current[:] = without(change["row"])
    elif kind == "edit":
        current[:] = without(change.get("oldRow", change["row"]))
        current.append(full_row(schema[table], change["row"]))
    else:
        raise ValueError(f"unknown change type {kind!r}")


def run_fixture(path):
    """
    Run one fixture file two ways: the incremental view (hydrated from the source
    contents, then each push applied as its own commit) and the reference evaluator
    over the final rows. An ``Outcome`` says whether both give the recorded view.
    """
    name = str(path).rsplit("/", 1)[-1].removesuffix(".json")
    try:
        with open(path, encoding="utf-8") as f:
            fixture = json.load(f)
        spec = fixture["input"]
        schema = Schema.from_sources(spec["sources"])
        rows = {
            t: [full_row(schema[t], r) for r in spec.get("sourceContents", {}).get(t, [])]
            for t in schema
        }
        query = parse(spec["ast"], schema)
        store = MemoryStore(schema)
        for table, table_rows in rows.items():
            store.load(table, table_rows)
        view = View(query, store)
        view.hydrate()
        for table, change in spec.get("pushes", []):
            old_rows = {t: list(r) for t, r in rows.items()}
            apply_push(rows, schema, table, change)
            view.apply(_store_changes(store, schema, table, old_rows[table], rows[table]))
        got = evaluate(query, rows, schema)
        incremental = view.result()
    except QueryError as exc:
        return Outcome(name, False, f"query refused: {exc}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return Outcome(name, False, f"unreadable fixture: {type(exc).__name__}: {exc}")
    except Exception as exc:  # a bug of ours is a FAIL line too, never a crash of the run
        return Outcome(name, False, f"error: {type(exc).__name__}: {exc}")
    expected = fixture.get("expected", {}).get("data")
    if got != expected:
        return Outcome(name, False, "reference: " + first_difference(expected, got))
    if incremental != expected:
        return Outcome(name, False, "incremental: " + first_difference(expected, incremental))
    return Outcome(name, True)


def full_row(table, row):
    """A fixture row with every column present (optional ones default to null)."""
    return {c.name: row.get(c.name) for c in table.columns}


def _store_changes(store, schema, table, before, after):
    """Apply the difference of one table to ``store``; return it as change triples."""
    key = schema[table].primary_key
    pk = lambda r: tuple(r.get(k) for k in key)  # noqa: E731
    old_by, new_by = {pk(r): r for r in before}, {pk(r): r for r in after}
    changes = []
    for k in old_by.keys() | new_by.keys():
        old, new = old_by.get(k), new_by.get(k)
        if old != new:
            store.apply(table, old, new)
            changes.append((table, old, new))
    return changes


def first_difference(expected, got, path="data"):
    """A short description of where two JSON values first differ."""
    if type(expected) is not type(got) and not (
        isinstance(expected, (int, float)) and isinstance(got, (int, float))
    ):
        return f"{path}: expected {_short(expected)}, got {_short(got)}"
    if isinstance(expected, list):
        for i, (e, g) in enumerate(zip(expected, got, strict=False)):
            if e != g:
                return first_difference(e, g, f"{path}[{i}]")
        return f"{path}: expected {len(expected)} rows, got {len(got)}"
    if isinstance(expected, dict):
        for k in sorted(set(expected) | set(got)):
            if expected.get(k, _MISSING) != got.get(k, _MISSING):
                return first_difference(expected.get(k), got.get(k), f"{path}.{k}")
    return f"{path}: expected {_short(expected)}, got {_short(got)}"


_MISSING = object()


def _short(value):
    text = json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."
