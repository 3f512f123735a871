"""
The reference evaluator: a whole query evaluated from scratch over rows in memory.

It is the plainest statement of rindle's query semantics, and the oracle the
incremental operators and the SQL compiler are tested against; it is not meant to
be fast. ``evaluate`` returns the view in the conformance fixtures' shape: a list
of row objects (every column with explicit nulls, or only the ``select``ed ones)
carrying each visible relationship under its alias (a list, an object or null for
``one``, an integer for ``count``, a number or null for ``sum``/``avg``); a root
``one`` query returns one object or None. ``render="snapshot"`` gives the SSR shape
instead, cells nested under ``cols`` so no column can collide with an alias.
"""

from functools import cmp_to_key

from .ast import And, Exists, Or, Simple
from .compare import compare, equal, matches
from .normalized import agg_row, agg_table_name


def evaluate(query, rows, schema, *, render="fixture"):
    """The view of ``query`` over ``rows`` ({table: [row dict, ...]})."""
    evaluator = Evaluator(ListSource(rows), schema, render)
    if query.aggregate is not None:  # a root aggregate is one scalar
        return evaluator.aggregate(query, rows.get(query.table, ()))
    nodes = evaluator.level(query, rows.get(query.table, ()))
    if query.one:
        return nodes[0] if nodes else None
    return nodes


class ListSource:
    """Rows as plain lists: every lookup is a scan (the oracle needs no more)."""

    def __init__(self, rows):
        self.rows = rows

    def children(self, related, parent):
        keys = [parent.get(f) for f in related.parent_fields]
        if any(k is None for k in keys):
            return []
        return [
            child
            for child in self.rows.get(related.subquery.table, ())
            if all(equal(child.get(f), k) for f, k in zip(related.child_fields, keys, strict=True))
        ]


def compare_rows(order_by, a, b):
    """-1, 0 or 1: the order of two rows under a (completed) ``orderBy``."""
    for column, direction in order_by:
        c = compare(a.get(column), b.get(column))
        if c:
            return c if direction == "asc" else -c
    return 0


class Evaluator:
    """Evaluates levels of a query over a source (``children(related, parent)``)."""

    def __init__(self, source, schema, render="fixture"):
        self.source = source
        self.schema = schema
        self.render = render
        # Called with (table, row, key columns or None for the table's pk) for every row
        # rendered, synthetic count rows included: how views learn their footprint.
        self.visit = None

    def select(self, query, candidates, *, ordered=False):
        """
        The rows of one level: filtered, ordered, bounded by start and limit.
        ``ordered`` candidates are already in the level's order, so taking a window
        stops at its limit instead of sorting every candidate.
        """
        bound = dict(query.start.row) if query.start is not None else None
        floor = 1 if query.start is not None and query.start.exclusive else 0
        if ordered:
            kept = []
            if query.limit == 0:
                return kept
            for r in candidates:
                if bound is not None and compare_rows(query.order_by, r, bound) < floor:
                    continue
                if self.holds(query.where, r):
                    kept.append(r)
                    if query.limit is not None and len(kept) >= query.limit:
                        break
            return kept
        kept = [r for r in candidates if self.holds(query.where, r)]
        kept.sort(key=cmp_to_key(lambda a, b: compare_rows(query.order_by, a, b)))
        if bound is not None:
            kept = [r for r in kept if compare_rows(query.order_by, r, bound) >= floor]
        if query.limit is not None:
            kept = kept[: query.limit]
        return kept

    def level(self, query, candidates):
        return [self.node(query, row) for row in self.select(query, candidates)]

    def children(self, related, parent):
        return self.source.children(related, parent)

    def holds(self, condition, row):
        if condition is None:
            return True
        if isinstance(condition, Simple):
            return matches(condition.op, row.get(condition.column), condition.value)
        if isinstance(condition, And):
            return all(self.holds(c, row) for c in condition.conditions)
        if isinstance(condition, Or):
            return any(self.holds(c, row) for c in condition.conditions)
        if isinstance(condition, Exists):
            sub = condition.related.subquery
            # Existence needs no order (an EXISTS subquery carries no start).
            found = sub.limit != 0 and any(
                self.holds(sub.where, c) for c in self.children(condition.related, row)
            )
            return found != condition.negated
        raise TypeError(f"not a condition: {condition!r}")

    def node(self, query, row):
        if self.visit is not None:
            self.visit(query.table, row, None)
        names = query.select
        if names is None:
            names = [c.name for c in self.schema.get(query.table).wire_columns]
        cells = {name: row.get(name) for name in names}
        out = {"cols": cells} if self.render == "snapshot" else cells
        for related in query.visible_related:
            sub = related.subquery
            if sub.aggregate is not None:
                out[sub.alias] = value = self.aggregate(sub, self.children(related, row))
                if self.visit is not None and sub.aggregate == "count" and value:
                    # A count syncs as a row of its synthetic table, never as children.
                    self.visit(
                        agg_table_name(related), agg_row(related, row, value), related.child_fields
                    )
            else:
                window = getattr(self.source, "window", None)
                ordered = window(related, row) if window is not None else None
                if ordered is not None:
                    rows = self.select(sub, ordered, ordered=True)
                else:
                    rows = self.select(sub, self.children(related, row))
                nodes = [self.node(sub, r) for r in rows]
                out[sub.alias] = (nodes[0] if nodes else None) if sub.one else nodes
        return out

    def aggregate(self, sub, kids):
        matching = [k for k in kids if self.holds(sub.where, k)]
        if sub.aggregate == "count":
            return len(matching)
        fn, column = sub.aggregate
        values = [k[column] for k in matching if k.get(column) is not None]
        if not values:
            return None
        total = sum(values)
        return total if fn == "sum" else total / len(values)
