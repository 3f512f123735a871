"""
An immutable builder for the wire AST, the JSON the rindle clients send::

    from rindle_app.ivm.builder import correlate, exists, table

    q = (
        table("issue")
        .where("status", "=", "todo")
        .where(exists(correlate("id", "issueId"), table("tag").where("name", "ILIKE", "%ui%")))
        .order_by("createdAt", "desc")
        .limit(50)
        .related("owner", correlate("ownerId", "id"), table("user").select("id", "name"))
        .count_as("commentCount", correlate("id", "issueId"), table("comment"))
    )
    q.build()          # the wire dict
    q.parse(schema)    # ast.parse(q.build(), schema)

It mirrors the original's TypeScript builder (``packages/client/src/query.ts``):
several ``.where`` calls AND together, ``.related`` (alias ``.sub``) and ``.count_as``
add ``related[]`` entries in call order, an EXISTS subquery is aliased by its
table, and empty fields are left out. Each method returns a new ``Query``.
Conditions are plain wire dicts, so hand-written JSON mixes freely with them.
Nothing is checked against a schema here: ``parse`` does that.
"""

import copy
import math
from dataclasses import dataclass, replace

from ..exceptions import UNSUPPORTED
from .ast import QueryError, parse
from .compare import SIMPLE_OPS

NEGATED_OPS = {
    "=": "!=",
    "!=": "=",
    "<": ">=",
    ">=": "<",
    ">": "<=",
    "<=": ">",
    "IS": "IS NOT",
    "IS NOT": "IS",
    "LIKE": "NOT LIKE",
    "NOT LIKE": "LIKE",
    "ILIKE": "NOT ILIKE",
    "NOT ILIKE": "ILIKE",
    "IN": "NOT IN",
    "NOT IN": "IN",
}


# --- conditions -----------------------------------------------------------------------


def cond(column, op, value):
    """``column <op> literal``; IN / NOT IN take a list (or any iterable but a string)."""
    if op not in SIMPLE_OPS:
        raise QueryError(f"unknown operator {op!r}", code=UNSUPPORTED)
    if op.endswith("IN"):
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            raise QueryError(f"{op} needs a list of literals")
        value = [_literal(v) for v in value]
    else:
        value = _literal(value)
    return {
        "type": "simple",
        "op": op,
        "left": {"type": "column", "name": column},
        "right": {"type": "literal", "value": value},
    }


def and_(*conditions):
    return {"type": "and", "conditions": [copy.deepcopy(c) for c in conditions]}


def or_(*conditions):
    return {"type": "or", "conditions": [copy.deepcopy(c) for c in conditions]}


def not_(condition):
    """SQL ``NOT``, pushed into the operators (the AST has no NOT node).

    As in SQL, a null cell satisfies neither a comparison nor its negation:
    ``not_(cond("x", "=", 1))`` is ``x != 1``, which a null ``x`` does not match.
    """
    kind = condition.get("type")
    if kind == "simple":
        return {**copy.deepcopy(condition), "op": NEGATED_OPS[condition["op"]]}
    if kind in ("and", "or"):
        return {
            "type": "or" if kind == "and" else "and",
            "conditions": [not_(c) for c in condition["conditions"]],
        }
    if kind == "correlatedSubquery":
        op = "EXISTS" if condition["op"] == "NOT EXISTS" else "NOT EXISTS"
        return {**copy.deepcopy(condition), "op": op}
    raise QueryError(f"not a condition: {condition!r}")


def correlate(parent, child):
    """The join of a relationship: parent column(s) equal to child column(s)."""
    parent = (parent,) if isinstance(parent, str) else tuple(parent)
    child = (child,) if isinstance(child, str) else tuple(child)
    if not parent or len(parent) != len(child):
        raise QueryError("correlate needs as many parent columns as child columns")
    return {"parentField": list(parent), "childField": list(child)}


def exists(on, subquery, *, system=None):
    """``EXISTS`` the correlated ``subquery``; ``system="permissions"`` makes a gate.

    A permission gate filters the parent's rows without syncing the subquery's table.
    As in the original, the subquery's alias is its table name.
    """
    return _exists("EXISTS", on, subquery, system)


def not_exists(on, subquery, *, system=None):
    return _exists("NOT EXISTS", on, subquery, system)


def _exists(op, on, subquery, system):
    sub = replace(subquery, alias=subquery.table).build()
    return {"type": "correlatedSubquery", "op": op, "related": _related(on, sub, system)}


def _related(on, sub, system=None):
    out = {"correlation": _correlation(on), "subquery": sub}
    if system is not None:
        out["system"] = system
    return out


def _correlation(on):
    if isinstance(on, dict):
        return correlate(on["parentField"], on["childField"])
    parent, child = on
    return correlate(parent, child)


def _literal(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    raise QueryError(f"{value!r} is not a literal (null, a boolean, a finite number, a string)")


# --- queries --------------------------------------------------------------------------


def table(name):
    """A query over table ``name``."""
    return Query(name)


@dataclass(frozen=True)
class Query:
    table: str
    alias: str = None
    conditions: tuple = ()
    columns: tuple = None
    ordering: tuple = ()
    relationships: tuple = ()
    bound: dict = None
    max_rows: int = None
    single: bool = False
    aggregate: str = None

    def where(self, *args):
        """``where(condition)`` or ``where(column, op, value)``; repeated calls AND."""
        condition = args[0] if len(args) == 1 else cond(*args)
        if not isinstance(condition, dict):
            raise QueryError("where takes a condition or (column, op, value)")
        return replace(self, conditions=self.conditions + (copy.deepcopy(condition),))

    def select(self, *columns):
        return replace(self, columns=(self.columns or ()) + columns)

    def order_by(self, column, direction="asc"):
        if direction not in ("asc", "desc"):
            raise QueryError('direction is "asc" or "desc"')
        return replace(self, ordering=self.ordering + ((column, direction),))

    def limit(self, n):
        return replace(self, max_rows=n)

    def start(self, row, *, exclusive=False):
        """Keyset paging: start at ``row`` (after it when ``exclusive``)."""
        return replace(
            self, bound={"row": {k: _literal(v) for k, v in row.items()}, "exclusive": exclusive}
        )

    def one(self):
        """A single row (an object or null); implies ``limit 1``."""
        return replace(self, single=True)

    def related(self, alias, on, subquery, *, one=False):
        """Nest ``subquery``'s rows under ``alias`` in each row (the original's ``sub``)."""
        sub = replace(subquery, alias=alias, single=subquery.single or one).build()
        return replace(self, relationships=self.relationships + (_related(on, sub),))

    sub = related

    def count_as(self, alias, on, subquery):
        """Show the number of correlated ``subquery`` rows under ``alias``."""
        sub = replace(subquery, alias=alias, aggregate="count").build()
        return replace(self, relationships=self.relationships + (_related(on, sub),))

    def build(self):
        """The wire AST: a fresh dict, in the original's ``compile()`` shape."""
        out = {"table": self.table}
        if self.alias is not None:
            out["alias"] = self.alias
        if len(self.conditions) == 1:
            out["where"] = copy.deepcopy(self.conditions[0])
        elif self.conditions:
            out["where"] = {"type": "and", "conditions": copy.deepcopy(list(self.conditions))}
        if self.relationships:
            out["related"] = copy.deepcopy(list(self.relationships))
        if self.bound is not None:
            out["start"] = copy.deepcopy(self.bound)
        if self.ordering:
            out["orderBy"] = [list(o) for o in self.ordering]
        if self.max_rows is not None:
            out["limit"] = self.max_rows
        if self.single:
            out["one"] = True
        if self.columns:
            out["select"] = list(self.columns)
        if self.aggregate is not None:
            out["aggregate"] = self.aggregate
        return out

    def parse(self, schema):
        """The validated, normalized query (``ast.parse``)."""
        return parse(self.build(), schema)
