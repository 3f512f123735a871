"""
What the normalized protocol names and fingerprints, byte for byte as the
published clients compute it (``@rindle/normalized`` ``aggTableName``,
``@rindle/remote`` ``normalizedFp``):

- a relationship ``count`` ships as rows of a synthetic table whose name is an
  FNV-1a-64 hash of the count's definition (child fields, child table, filter),
  with columns ``[<childField>..., "count"]`` and one row per parent group whose
  count is not zero;
- a hello lists the tables a query can surface (sorted by name, primary key as
  column indexes) and their fingerprint.
"""

import struct
from functools import lru_cache

from .ast import And, Exists, Or, Simple

_OFFSET = 0xCBF29CE484222325
_PRIME = 0x00000100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF
_I64 = (-(1 << 63), (1 << 63) - 1)
_SYSTEM_BYTE = {None: 0, "permissions": 1, "client": 2, "test": 3}


class Fnv:
    """FNV-1a 64 over the length-prefixed little-endian byte protocol of the clients."""

    __slots__ = ("h",)

    def __init__(self):
        self.h = _OFFSET

    def byte(self, b):
        self.h = ((self.h ^ (b & 0xFF)) * _PRIME) & _MASK

    def raw(self, data):
        for b in data:
            self.byte(b)

    def u32(self, v):
        self.raw(struct.pack("<I", v))

    def s(self, text):
        data = text.encode("utf-8")
        self.u32(len(data))
        self.raw(data)

    def hex(self):
        return f"{self.h:016x}"


def normalized_fp(tables):
    """The fingerprint of a hello's ``tables`` (sorted by name; primary key as indexes)."""
    f = Fnv()
    f.u32(len(tables))
    for t in tables:
        f.s(t["name"])
        f.u32(len(t["columns"]))
        for c in t["columns"]:
            f.s(c)
        f.u32(len(t["primaryKey"]))
        for i in t["primaryKey"]:
            f.s(t["columns"][i])
    return f.hex()


@lru_cache(maxsize=4096)
def agg_table_name(related):
    """The synthetic table of a relationship ``count`` (a parsed ``Related``)."""
    f = Fnv()
    f.u32(len(related.child_fields))
    for c in related.child_fields:
        f.s(c)
    _subquery(f, related.subquery)
    return f"__agg_{f.hex()}"


def agg_row(related, parent, count):
    """The synthetic row carrying ``parent``'s count: group columns, then ``count``."""
    row = {
        child: parent.get(p)
        for p, child in zip(related.parent_fields, related.child_fields, strict=True)
    }
    row["count"] = count
    return row


def _subquery(f, query):
    f.s(query.table)
    f.byte(1 if query.aggregate == "count" else 0)
    where = query.where
    if isinstance(where, And) and where.gate:
        # the client names the count from its own AST, without the server's read rule
        where = where.conditions[0] if len(where.conditions) == 2 else None
    if where is None:
        f.byte(0)
    else:
        f.byte(1)
        _condition(f, where)
    f.u32(len(query.related))
    for related in query.related:
        _correlation(f, related)
        _subquery(f, related.subquery)


def _correlation(f, related):
    f.u32(len(related.parent_fields))
    for p in related.parent_fields:
        f.s(p)
    f.u32(len(related.child_fields))
    for c in related.child_fields:
        f.s(c)


def _condition(f, condition):
    if isinstance(condition, Simple):
        f.byte(0)
        f.s(condition.op)
        f.byte(0)  # left: a column
        f.s(condition.column)
        f.byte(1)  # right: a literal
        _literal(f, condition.value)
    elif isinstance(condition, (And, Or)):
        f.byte(1 if isinstance(condition, And) else 2)
        f.u32(len(condition.conditions))
        for c in condition.conditions:
            _condition(f, c)
    elif isinstance(condition, Exists):
        f.byte(3)
        f.byte(0 if condition.negated else 1)
        f.byte(_SYSTEM_BYTE[condition.related.system])
        _correlation(f, condition.related)
        _subquery(f, condition.related.subquery)
    else:  # pragma: no cover - parse() admits no other node
        raise TypeError(f"not a condition: {condition!r}")


def _literal(f, value):
    if value is None:
        f.byte(0)
    elif isinstance(value, bool):
        f.byte(1)
        f.byte(1 if value else 0)
    elif isinstance(value, int) and _I64[0] <= value <= _I64[1]:
        # An integer-form JSON token in i64 range is an exact integer on the wire.
        f.byte(5)
        f.raw(struct.pack("<q", value))
    elif isinstance(value, (int, float)):
        f.byte(2)
        f.raw(struct.pack("<d", float(value)))
    elif isinstance(value, str):
        f.byte(3)
        f.s(value)
    else:
        f.byte(4)
        f.u32(len(value))
        for v in value:
            _literal(f, v)


def normalized_table_schemas(query, schema):
    """
    Every table ``query``'s tree can surface, for the hello: the root, each rendered
    relationship's table, and the synthetic table of each ``count`` in place of its
    children (which never sync); EXISTS and permission tables never appear.
    """
    found = {}

    def walk(q):
        names = [c.name for c in schema.get(q.table).wire_columns]  # never a private one
        found[q.table] = {
            "name": q.table,
            "columns": names,
            "primaryKey": [names.index(k) for k in schema.get(q.table).primary_key],
        }
        for related in q.visible_related:
            if related.subquery.aggregate == "count":
                name = agg_table_name(related)
                k = len(related.child_fields)
                found[name] = {
                    "name": name,
                    "columns": [*related.child_fields, "count"],
                    "primaryKey": list(range(k)),
                }
            elif related.subquery.aggregate is None:
                walk(related.subquery)

    walk(query)
    return [found[name] for name in sorted(found)]
