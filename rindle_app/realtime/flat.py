"""
The flat subscription mode: a live view's result tree as the ``hello`` and the
path-addressed change events that ``@rindle/remote`` validates and
``@rindle/client``'s ``ArrayView`` folds.

A level of the tree is described by a wire schema: its columns (the ``select``ed
ones, with the primary key and the ``orderBy`` columns forced in, since the client
keeps and finds rows by sort key; in the table's column order), the primary key
and the pk-completed sort as column indexes, whether the level is singular
(``one``), and one relationship slot per rendered relationship. A relationship
aggregate is a singular child level of one row ``[<childField>..., count]`` (or
``sum`` / ``avg``) with a ``project`` marker the client unwraps to a scalar; the
row exists only while the group has members, so a count appears with an ``add``,
changes with an ``edit`` and falls back to its identity (0, or null for sum and
avg) with a ``remove``. Permission gates and EXISTS subqueries never appear.
Cells are bare values; a JSON column travels as its raw JSON text.

Changes are located the way the client locates them: by the parent rows' sort
keys, hop by hop, as the client holds them at that point of the stream. The
client ignores an ``add`` for a key it already holds, so a row whose key changes
travels as ``remove`` then ``add``, and a row whose cells change as ``edit``.
"""

import copy
import json

from ..exceptions import UNSUPPORTED
from ..ivm.ast import QueryError
from ..ivm.compare import COMPARATOR_VERSION, sort_key
from ..ivm.evaluate import Evaluator
from ..ivm.normalized import Fnv
from ..ivm.view import StoreSource

__all__ = ["FlatEncoder", "schema_fp"]

_IDENTITY = {"count": 0, "sum": None, "avg": None}


def schema_fp(wire_schema):
    """The 16-hex FNV-1a-64 fingerprint of a wire schema (``@rindle/remote`` ``schemaFp``)."""
    f = Fnv()
    _hash_level(f, wire_schema)
    return f.hex()


def _hash_level(f, ws):
    columns = ws["columns"]
    f.byte(0x53)  # 'S'
    f.u32(len(columns))
    for c in columns:
        f.s(c)
    # Key and sort are hashed by column name: the fingerprint ignores column positions.
    f.u32(len(ws["primaryKey"]))
    for i in ws["primaryKey"]:
        f.s(columns[i])
    f.u32(len(ws["sort"]))
    for i, ascending in ws["sort"]:
        f.s(columns[i])
        f.byte(1 if ascending else 0)
    f.byte(1 if ws["singular"] else 0)
    f.u32(len(ws["relationships"]))
    for rel in ws["relationships"]:
        f.s(rel["name"])
        child = rel.get("child")
        if child is None:
            f.byte(0)
            continue
        f.byte(1)
        _hash_level(f, child)
        project = rel.get("project")
        if project:
            f.byte(1)
            f.s(child["columns"][project["col"]])  # the identity value is not hashed
        else:
            f.byte(0)


class _Level:
    """One level of the tree: which cells a row ships, and its relationships in slot order."""

    __slots__ = ("query", "columns", "primary_key", "rels", "json_columns")

    def __init__(self, query, columns, primary_key, rels=(), json_columns=frozenset()):
        self.query = query
        self.columns = columns
        self.primary_key = primary_key
        self.rels = rels
        self.json_columns = json_columns


class _Rel:
    """One relationship slot; ``aggregate`` is "count", "sum" or "avg" for a projected one."""

    __slots__ = ("slot", "related", "level", "aggregate")

    def __init__(self, slot, related, level, aggregate=None):
        self.slot = slot
        self.related = related
        self.level = level
        self.aggregate = aggregate


class FlatEncoder:
    """
    The flat protocol for one parsed query over ``schema`` (the table map).

    ``wire_schema`` and ``schema_fp`` are what the ``hello`` carries. ``render``
    takes the current tree of a maintained ``View``; ``snapshot_events`` and
    ``diff_events`` turn trees into JSON-ready ``FlatChange`` dicts.

    A tree is a dict {row key: node} in view order, a node a tuple ``(cells,
    slots)``: the wire cells, and per relationship slot a dict {child key: node}.
    Trees are immutable once rendered and share unchanged subtrees between renders,
    so ``diff_events`` skips a shared subtree in O(1): its cost is the number of
    root rows plus the size of the subtrees that were rendered again, at worst
    proportional to the view. ``render`` renders again only the root rows the view
    re-derived since the last render and reuses the others' subtrees: a ``View``
    re-derives every root whose subtree a commit may change, giving it a new result
    node, and never alters a result node it keeps, so an unchanged node (by
    identity) vouches for an unchanged subtree.
    """

    def __init__(self, query, schema):
        if query.aggregate is not None:
            raise QueryError(
                "a root aggregate has no flat form; subscribe to it in normalized mode",
                code=UNSUPPORTED,
            )
        self.query = query
        self.schema = schema
        self._root, self.wire_schema = _compile(query, schema, singular=query.one)
        self.schema_fp = schema_fp(self.wire_schema)
        self._evaluator = None
        self._store = None
        self._view = None
        self._memo = {}  # root key -> (the view's result node, our node)

    def hello(self, epoch):
        """The subscription handshake (sent once, before the seq-0 batch)."""
        return {
            "epoch": epoch,
            "comparatorVersion": COMPARATOR_VERSION,
            "schema": copy.deepcopy(self.wire_schema),
            "schemaFp": self.schema_fp,
        }

    # --- trees ---------------------------------------------------------------------------

    def render(self, view, store):
        """
        The current tree of ``view`` (a maintained ``View`` of this query over
        ``store``): O(root rows) plus the subtrees of roots re-derived since the
        previous call.
        """
        if store is not self._store:
            self._store = store
            self._evaluator = Evaluator(StoreSource(store), self.schema)
            self._memo = {}
        if view is not self._view:
            self._view = view
            self._memo = {}
        nodes = view.result()
        if self.query.one:
            nodes = [] if nodes is None else [nodes]
        root, old, memo, tree = self._root, self._memo, {}, {}
        for row, result in zip(view.rows(), nodes, strict=True):
            key = _key(row, root.primary_key)
            hit = old.get(key)
            node = hit[1] if hit is not None and hit[0] is result else self._node(root, row)
            memo[key] = (result, node)
            tree[key] = node
        self._memo = memo
        return tree

    def _node(self, level, row):
        if level.json_columns:
            cells = tuple(
                _json_text(row.get(c)) if c in level.json_columns else row.get(c)
                for c in level.columns
            )
        else:
            cells = tuple(row.get(c) for c in level.columns)
        if not level.rels:
            return (cells, ())
        return (cells, tuple(self._children(rel, row) for rel in level.rels))

    def _children(self, rel, row):
        ev, related = self._evaluator, rel.related
        sub = related.subquery
        if rel.aggregate is not None:
            members = [k for k in ev.children(related, row) if ev.holds(sub.where, k)]
            if not members:
                return {}
            value = len(members) if rel.aggregate == "count" else ev.aggregate(sub, members)
            group = tuple(row.get(p) for p in related.parent_fields)
            return {tuple(sort_key(v) for v in group): ((*group, value), ())}
        window = ev.source.window(related, row)
        if window is not None:
            rows = ev.select(sub, window, ordered=True)
        else:
            rows = ev.select(sub, ev.children(related, row))
        level = rel.level
        return {_key(r, level.primary_key): self._node(level, r) for r in rows}

    # --- events --------------------------------------------------------------------------

    def snapshot_events(self, tree):
        """The seq-0 batch: one root ``add`` per row, each with its whole subtree."""
        root = self._root
        return [{"path": [], "op": {"tag": "add", "node": _wire(root, n)}} for n in tree.values()]

    def diff_events(self, old_tree, new_tree):
        """The events that fold ``old_tree`` into ``new_tree`` on the client; [] if equal."""
        out = []
        _diff(self._root, old_tree, new_tree, [], out)
        return out


# --- compiling the wire schema ------------------------------------------------------------


def _compile(query, schema, *, singular):
    table = schema.get(query.table)
    names = [c.name for c in table.wire_columns]  # never a private one
    if query.select is None:
        columns = names
    else:
        keep = {*query.select, *table.primary_key, *(c for c, _ in query.order_by)}
        columns = [n for n in names if n in keep]
    at = {c: i for i, c in enumerate(columns)}
    wire = {
        "columns": list(columns),
        "primaryKey": [at[c] for c in table.primary_key],
        "sort": [[at[c], direction == "asc"] for c, direction in query.order_by],
        "singular": bool(singular),
        "relationships": [],
    }
    rels = []
    for slot, related in enumerate(query.visible_related):
        sub = related.subquery
        if sub.aggregate is not None:
            fn = sub.aggregate if sub.aggregate == "count" else sub.aggregate[0]
            k = len(related.child_fields)
            child = {
                "columns": [*related.child_fields, fn],
                "primaryKey": list(range(k)),
                "sort": [[i, True] for i in range(k)],
                "singular": True,
                "relationships": [],
            }
            group = _Level(sub, (), ())  # its one row is built from the parent
            rels.append(_Rel(slot, related, group, fn))
            project = {"col": k, "identity": _IDENTITY[fn]}
        else:
            level, child = _compile(sub, schema, singular=sub.one)
            rels.append(_Rel(slot, related, level))
            project = None
        wire["relationships"].append(
            {"name": sub.alias, "slot": slot, "child": child, "project": project}
        )
    json_columns = frozenset(c.name for c in table.columns if c.type == "json")
    level = _Level(
        query, tuple(columns), tuple(table.primary_key), tuple(rels), json_columns & set(columns)
    )
    return level, wire


# --- trees to events ----------------------------------------------------------------------


def _key(row, primary_key):
    return tuple(sort_key(row.get(c)) for c in primary_key)


def _json_text(value):
    # JSON columns travel as their raw JSON text, as in normalized mode.
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _wire(level, node):
    """A node as a ``WireNode``: its row, and its non-empty relationship slots."""
    cells, slots = node
    out = {"row": list(cells), "rels": []}
    for rel, children in zip(level.rels, slots, strict=True):
        if children:
            out["rels"].append(
                {"rel": rel.slot, "children": [_wire(rel.level, c) for c in children.values()]}
            )
    return out


def _same_cells(a, b):
    # Tuple equality takes True for 1; the client's does not, so the types must agree
    # too (an int and a float of one value are the same number on the wire).
    if a != b:
        return False
    return all(type(x) is type(y) or sort_key(x) == sort_key(y) for x, y in zip(a, b))


def _diff(level, old, new, path, out):
    if old is new:
        return
    for key, (cells, _slots) in old.items():
        if key not in new:
            out.append({"path": path, "op": {"tag": "remove", "row": list(cells)}})
    for key, node in new.items():
        before = old.get(key)
        if before is None or before is node:
            continue
        cells, slots = node
        if not _same_cells(before[0], cells):
            out.append(
                {"path": path, "op": {"tag": "edit", "old": list(before[0]), "new": list(cells)}}
            )
        if not level.rels:
            continue
        # Children are addressed through the parent as the client now holds it (edited).
        parent = list(cells)
        for rel, a, b in zip(level.rels, before[1], slots, strict=True):
            if a is not b and (a or b):
                hop = [*path, {"rel": rel.slot, "parentRow": parent}]
                _diff(rel.level, a, b, hop, out)
    for key, node in new.items():
        if key not in old:
            out.append({"path": path, "op": {"tag": "add", "node": _wire(level, node)}})
