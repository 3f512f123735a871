"""
The query AST exactly as the rindle clients send it (camelCase JSON), parsed into
validated, normalized dataclasses.

``parse(ast, schema)`` checks every table, column and relationship against the
schema (anything supporting ``name in schema`` and ``schema.get(name)`` returning
an ``engine.tables.Table``, such as the engine's table map) and refuses
what the engine does not support, naming the part. Normalization appends every
missing primary-key column (ascending) to each level's ``orderBy``, EXISTS
subqueries included, and makes ``one`` imply ``limit 1``; a repeated related alias
keeps its last entry. ``query_key`` is a hash of the normalized AST's canonical
JSON, so field order never matters.
"""

import hashlib
import json
import math
from dataclasses import dataclass
from functools import cached_property

from ..engine.values import BINARY, TEMPORAL, canonical
from ..exceptions import INVALID_QUERY, UNKNOWN_COLUMN, UNKNOWN_TABLE, UNSUPPORTED, QueryError
from .compare import SIMPLE_OPS

SYSTEMS = frozenset({"client", "permissions", "test"})
_QUERY_KEYS = frozenset(
    {"table", "alias", "schema", "select", "where", "related", "start", "limit", "one"}
    | {"orderBy", "aggregate", "aggregatePrecomputed", "groupBy", "having"}
)


# --- the normalized AST ---------------------------------------------------------------


@dataclass(frozen=True)
class Simple:
    op: str
    column: str
    value: object


@dataclass(frozen=True)
class And:
    conditions: tuple
    # A read rule compiled in by the server (``system: "permissions"``): the first
    # condition is the query's own (if it had one), the last the rule. Names the
    # client derives from its own AST (a count's synthetic table) leave it out.
    gate: bool = False


@dataclass(frozen=True)
class Or:
    conditions: tuple


@dataclass(frozen=True)
class Exists:
    negated: bool
    related: "Related"
    flip: bool = False


@dataclass(frozen=True)
class Related:
    parent_fields: tuple
    child_fields: tuple
    subquery: "Query"
    system: str = None


@dataclass(frozen=True)
class Start:
    row: tuple  # ((column, value), ...) in orderBy order
    exclusive: bool


@dataclass(frozen=True)
class Query:
    table: str
    alias: str = None
    select: tuple = None
    where: object = None
    related: tuple = ()
    start: Start = None
    limit: int = None
    one: bool = False
    order_by: tuple = ()  # ((column, "asc" | "desc"), ...), total: ends with the pk
    aggregate: object = None  # None | "count" | ("sum", col) | ("avg", col)

    @cached_property  # read for every row rendered; the query never changes
    def visible_related(self):
        """Relationships that render (permission gates filter without syncing)."""
        return tuple(r for r in self.related if r.system != "permissions")


# --- parsing ------------------------------------------------------------------------


def parse(ast, schema):
    """Validate and normalize a wire AST; raise ``QueryError`` naming the bad part."""
    return _Parser(schema).query(ast, "$", kind="root")


class _Parser:
    def __init__(self, schema):
        self.schema = schema

    def table(self, name, path):
        if not isinstance(name, str):
            raise QueryError("table must be a string", code=INVALID_QUERY, path=path)
        table = self.schema.get(name) if name in self.schema else None
        if table is None:
            raise QueryError(f"unknown table {name!r}", code=UNKNOWN_TABLE, path=path)
        return table

    def column(self, table, name, path):
        if not isinstance(name, str) or name not in table.column_names:
            raise QueryError(
                f"unknown column {name!r} of table {table.name!r}", code=UNKNOWN_COLUMN, path=path
            )
        return name

    def query(self, ast, path, *, kind):
        if not isinstance(ast, dict):
            raise QueryError("a query must be an object", path=path)
        unknown = set(ast) - _QUERY_KEYS
        if unknown:
            raise QueryError(f"unknown field(s) {sorted(unknown)}", path=path)
        for unsupported in ("groupBy", "having"):
            if unsupported in ast:
                raise QueryError(f"{unsupported} is not supported yet", code=UNSUPPORTED, path=path)
        table = self.table(ast.get("table"), f"{path}.table")
        alias = ast.get("alias")
        if alias is not None and not isinstance(alias, str):
            raise QueryError("alias must be a string", path=f"{path}.alias")

        select = ast.get("select")
        if select is not None:
            if not isinstance(select, list):
                raise QueryError("select must be a list of columns", path=f"{path}.select")
            select = tuple(
                dict.fromkeys(
                    self.column(table, c, f"{path}.select[{i}]") for i, c in enumerate(select)
                )
            )

        where = self.condition(table, ast["where"], f"{path}.where") if "where" in ast else None

        related = {}
        raw_related = ast.get("related", [])
        if not isinstance(raw_related, list):
            raise QueryError("related must be a list", path=f"{path}.related")
        for i, entry in enumerate(raw_related):
            rel = self.related(table, entry, f"{path}.related[{i}]", kind="related")
            related.pop(rel.subquery.alias, None)  # a repeated alias: the last one wins
            related[rel.subquery.alias] = rel

        order_by = self.order_by(table, ast.get("orderBy"), f"{path}.orderBy")
        limit = ast.get("limit")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise QueryError("limit must be a non-negative integer", path=f"{path}.limit")
        one = ast.get("one", False)
        if not isinstance(one, bool):
            raise QueryError("one must be a boolean", path=f"{path}.one")
        if one:
            limit = 1 if limit is None else min(limit, 1)
        start = self.start(table, ast.get("start"), order_by, f"{path}.start")
        aggregate = self.aggregate(table, ast.get("aggregate"), f"{path}.aggregate")

        if aggregate is not None and kind == "root":
            shaped = [k for k in ("select", "related", "orderBy", "limit", "one") if ast.get(k)]
            if shaped:
                raise QueryError(
                    f"a root aggregate cannot be combined with {', '.join(shaped)}",
                    code=UNSUPPORTED,
                    path=path,
                )
        if aggregate is not None and kind == "related":
            bad = [k for k in ("start", "limit", "related", "one") if ast.get(k)]
            if bad:
                raise QueryError(
                    f"an aggregate relationship cannot carry {', '.join(bad)}",
                    code=UNSUPPORTED,
                    path=path,
                )
        if kind == "exists":
            bad = [k for k in ("start", "related", "aggregate") if ast.get(k)]
            if bad:
                raise QueryError(
                    f"an EXISTS subquery cannot carry {', '.join(bad)}",
                    code=UNSUPPORTED,
                    path=path,
                )
        return Query(
            table=table.name,
            alias=alias,
            select=select,
            where=where,
            related=tuple(related.values()),
            start=start,
            limit=limit,
            one=one,
            order_by=order_by,
            aggregate=aggregate,
        )

    def order_by(self, table, raw, path):
        raw = raw or []
        if not isinstance(raw, list):
            raise QueryError("orderBy must be a list of [column, direction]", path=path)
        order, seen = [], set()
        for i, item in enumerate(raw):
            if not (isinstance(item, list) and len(item) == 2 and item[1] in ("asc", "desc")):
                raise QueryError(
                    'each orderBy entry is [column, "asc" | "desc"]', path=f"{path}[{i}]"
                )
            col = self.column(table, item[0], f"{path}[{i}][0]")
            if next((c.encoding for c in table.columns if c.name == col), "") == BINARY:
                raise QueryError(
                    f"orderBy on the binary column {table.name}.{col} is not supported: its "
                    "wire form (base64) orders differently from the stored bytes",
                    code=UNSUPPORTED,
                    path=f"{path}[{i}][0]",
                )
            if col not in seen:
                seen.add(col)
                order.append((col, item[1]))
        for col in table.primary_key:
            if col not in seen:
                order.append((col, "asc"))
        return tuple(order)

    def start(self, table, raw, order_by, path):
        if raw is None:
            return None
        if not isinstance(raw, dict) or not isinstance(raw.get("row"), dict):
            raise QueryError("start must be {row: {...}, exclusive: bool}", path=path)
        exclusive = raw.get("exclusive", False)
        if not isinstance(exclusive, bool):
            raise QueryError("start.exclusive must be a boolean", path=f"{path}.exclusive")
        row = raw["row"]
        for col in row:
            self.column(table, col, f"{path}.row.{col}")
        missing = [c for c, _ in order_by if c not in row]
        if missing:
            raise QueryError(
                f"start.row must hold every ordering column; missing {missing}",
                path=f"{path}.row",
            )
        return Start(
            tuple(
                (
                    c,
                    self.typed(
                        table, c, self.literal(row[c], f"{path}.row.{c}"), f"{path}.row.{c}"
                    ),
                )
                for c, _ in order_by
            ),
            exclusive,
        )

    def aggregate(self, table, raw, path):
        if raw is None:
            return None
        if raw == "count":
            return "count"
        if isinstance(raw, dict) and len(raw) == 1:
            ((fn, col),) = raw.items()
            if fn in ("sum", "avg"):
                column = self.column(table, col, f"{path}.{fn}")
                kind = next(c.type for c in table.columns if c.name == column)
                if kind not in ("number", "int64"):
                    raise QueryError(
                        f"{fn} needs a number column; {column!r} is {kind}",
                        code=UNSUPPORTED,
                        path=f"{path}.{fn}",
                    )
                return (fn, column)
        raise QueryError(
            'aggregate must be "count", {"sum": column} or {"avg": column}',
            code=UNSUPPORTED,
            path=path,
        )

    def related(self, parent, entry, path, *, kind):
        if not isinstance(entry, dict):
            raise QueryError("a related entry must be an object", path=path)
        correlation = entry.get("correlation")
        if not isinstance(correlation, dict):
            raise QueryError("correlation is required", path=f"{path}.correlation")
        parent_fields = correlation.get("parentField")
        child_fields = correlation.get("childField")
        if not (
            isinstance(parent_fields, list)
            and isinstance(child_fields, list)
            and parent_fields
            and len(parent_fields) == len(child_fields)
        ):
            raise QueryError(
                "correlation needs parentField and childField lists of equal, non-zero length",
                path=f"{path}.correlation",
            )
        sub = entry.get("subquery")
        if not isinstance(sub, dict):
            raise QueryError("subquery is required", path=f"{path}.subquery")
        child = self.table(sub.get("table"), f"{path}.subquery.table")
        parent_fields = tuple(
            self.column(parent, c, f"{path}.correlation.parentField[{i}]")
            for i, c in enumerate(parent_fields)
        )
        child_fields = tuple(
            self.column(child, c, f"{path}.correlation.childField[{i}]")
            for i, c in enumerate(child_fields)
        )
        system = entry.get("system")
        if system is not None and system not in SYSTEMS:
            raise QueryError(f"unknown system {system!r}", path=f"{path}.system")
        subquery = self.query(sub, f"{path}.subquery", kind=kind)
        if subquery.alias is None:
            if kind == "related":
                raise QueryError(
                    "a relationship needs subquery.alias", path=f"{path}.subquery.alias"
                )
            subquery = _replace(subquery, alias=subquery.table)
        return Related(parent_fields, child_fields, subquery, system)

    def condition(self, table, raw, path):
        if not isinstance(raw, dict):
            raise QueryError("a condition must be an object", path=path)
        kind = raw.get("type")
        if kind in ("and", "or"):
            conditions = raw.get("conditions")
            if not isinstance(conditions, list):
                raise QueryError(f"{kind} needs a conditions list", path=path)
            parts = tuple(
                self.condition(table, c, f"{path}.conditions[{i}]")
                for i, c in enumerate(conditions)
            )
            if kind == "or":
                return Or(parts)
            return And(parts, gate=raw.get("system") == "permissions")
        if kind == "simple":
            op = raw.get("op")
            if op not in SIMPLE_OPS:
                raise QueryError(f"unknown operator {op!r}", code=UNSUPPORTED, path=f"{path}.op")
            left, right = raw.get("left"), raw.get("right")
            if not (isinstance(left, dict) and left.get("type") == "column"):
                raise QueryError("left must be a column", code=UNSUPPORTED, path=f"{path}.left")
            if not (isinstance(right, dict) and right.get("type") == "literal"):
                raise QueryError("right must be a literal", code=UNSUPPORTED, path=f"{path}.right")
            column = self.column(table, left.get("name"), f"{path}.left.name")
            value = self.literal(right.get("value"), f"{path}.right.value", array=op.endswith("IN"))
            if op.endswith("IN") and not isinstance(value, tuple):
                raise QueryError(f"{op} needs an array literal", path=f"{path}.right.value")
            if op.endswith("LIKE") and not isinstance(value, str):
                raise QueryError(f"{op} needs a string pattern", path=f"{path}.right.value")
            value = self.typed(table, column, value, f"{path}.right.value", op=op)
            return Simple(op, column, value)
        if kind == "correlatedSubquery":
            op = raw.get("op")
            if op not in ("EXISTS", "NOT EXISTS"):
                raise QueryError(
                    "op must be EXISTS or NOT EXISTS", code=UNSUPPORTED, path=f"{path}.op"
                )
            if raw.get("scalar"):
                raise QueryError("scalar subqueries are not supported", code=UNSUPPORTED, path=path)
            related = self.related(table, raw.get("related"), f"{path}.related", kind="exists")
            return Exists(op == "NOT EXISTS", related, bool(raw.get("flip", False)))
        raise QueryError(f"unknown condition type {kind!r}", path=f"{path}.type")

    def typed(self, table, name, value, path, *, op=None):
        """
        A literal for column ``name`` in its wire encoding (``engine.values``): a
        datetime, date, time or UUID literal is normalized to the column's fixed-width
        form, or refused when it is not one; a pattern or a comparison that the wire
        form would order differently from the stored one is refused.
        """
        encoding = next((c.encoding for c in table.columns if c.name == name), "")
        if not encoding:
            return value
        if op is not None and op.endswith("LIKE") and encoding in (TEMPORAL | {BINARY}):
            raise QueryError(
                f"{op} on the {encoding} column {table.name}.{name} is not supported: "
                "compare it with a range (>=, <) instead",
                code=UNSUPPORTED,
                path=path,
            )
        if encoding == BINARY and not (op in ("IS", "IS NOT") and value is None):
            raise QueryError(
                f"the binary column {table.name}.{name} can only be tested for null",
                code=UNSUPPORTED,
                path=path,
            )
        try:
            if isinstance(value, tuple):
                return tuple(canonical(encoding, v) for v in value)
            return canonical(encoding, value)
        except ValueError as exc:
            raise QueryError(f"{table.name}.{name}: {exc}", path=path) from None

    def literal(self, value, path, *, array=False):
        if isinstance(value, list):
            if not array:
                raise QueryError("an array literal is only valid for IN / NOT IN", path=path)
            return tuple(self.literal(v, f"{path}[{i}]") for i, v in enumerate(value))
        if isinstance(value, float) and not math.isfinite(value):
            return None  # as the original: NaN and infinities become null
        if isinstance(value, float) and value == 0.0:
            return 0.0  # -0.0: databases store and compare it as 0.0
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise QueryError("a literal is null, a boolean, a number or a string", path=path)


def subqueries(query):
    """The related (visible) and EXISTS subqueries directly below ``query``."""
    found = list(query.visible_related)

    def walk(condition):
        if isinstance(condition, Exists):
            found.append(condition.related)
        elif isinstance(condition, (And, Or)):
            for c in condition.conditions:
                walk(c)

    walk(query.where)
    return found


def _replace(query, **changes):
    from dataclasses import replace

    return replace(query, **changes)


# --- back to JSON, and the canonical key ----------------------------------------------


def to_json(node):
    """The normalized AST as wire JSON (camelCase), for keys and for logs."""
    if isinstance(node, Query):
        out = {"table": node.table, "orderBy": [list(o) for o in node.order_by]}
        if node.alias is not None:
            out["alias"] = node.alias
        if node.select is not None:
            out["select"] = list(node.select)
        if node.where is not None:
            out["where"] = to_json(node.where)
        if node.related:
            out["related"] = [to_json(r) for r in node.related]
        if node.start is not None:
            out["start"] = {"row": dict(node.start.row), "exclusive": node.start.exclusive}
        if node.limit is not None:
            out["limit"] = node.limit
        if node.one:
            out["one"] = True
        if node.aggregate is not None:
            agg = node.aggregate
            out["aggregate"] = agg if agg == "count" else {agg[0]: agg[1]}
        return out
    if isinstance(node, Related):
        out = {
            "correlation": {
                "parentField": list(node.parent_fields),
                "childField": list(node.child_fields),
            },
            "subquery": to_json(node.subquery),
        }
        if node.system is not None:
            out["system"] = node.system
        return out
    if isinstance(node, Simple):
        value = list(node.value) if isinstance(node.value, tuple) else node.value
        return {
            "type": "simple",
            "op": node.op,
            "left": {"type": "column", "name": node.column},
            "right": {"type": "literal", "value": value},
        }
    if isinstance(node, (And, Or)):
        return {
            "type": "and" if isinstance(node, And) else "or",
            "conditions": [to_json(c) for c in node.conditions],
        }
    if isinstance(node, Exists):
        # flip is a planner hint that never changes a result: not part of identity.
        return {
            "type": "correlatedSubquery",
            "op": "NOT EXISTS" if node.negated else "EXISTS",
            "related": to_json(node.related),
        }
    raise TypeError(f"not an AST node: {node!r}")


def canonical_json(query):
    return json.dumps(to_json(query), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def query_key(query):
    """The dedup key of a normalized query: equal ASTs, whatever their field order."""
    return hashlib.sha256(canonical_json(query).encode()).hexdigest()[:32]
