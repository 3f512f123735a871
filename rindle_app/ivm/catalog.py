"""
Every live query of one process over one store: shared queries, families,
subscribers, and the routing that sends a commit only to the views it can affect.

- A **shared query** is one maintained view per canonical AST, however many
  subscribers attach; a late subscriber's seq 0 is the view's footprint, not a
  re-query.
- A **family** is a template with one parameter compared for equality on a root
  column (``{"type": "parameter"}`` in place of the literal); each binding is a
  partition, found through an index on the binding value, never by testing every
  binding.
- **Routing**: a change reaches only views that read its table; for the root table,
  views guarded by ``column = literal`` are looked up by the row's value.
- **Fault isolation**: an exception while maintaining one view faults that query
  alone (its subscribers are told, retryably); the others go on.
"""

import copy
import json
import logging
from dataclasses import dataclass, field

from ..exceptions import UNSUPPORTED, ResnapshotRequired
from .ast import QueryError, parse, query_key, subqueries, to_json
from .evaluate import Evaluator
from .store import MemoryStore, index_key
from .view import StoreSource, View, root_guard, too_large

logger = logging.getLogger("rindle.ivm")


@dataclass
class Fault:
    """A query that failed while being maintained; its subscribers must re-subscribe."""

    key: str
    subscribers: list
    message: str
    retryable: bool = True


@dataclass
class SharedQuery:
    key: str
    query: object
    view: View
    subscribers: set = field(default_factory=set)
    guard: tuple = None  # (column, index key) of a root equality, or None
    tables: frozenset = frozenset()
    shape: str = None  # the query's key with its guard literal left out


@dataclass
class _Shape:
    """Guarded views alike but for their guard value."""

    root: str
    column: str
    tables: frozenset = frozenset()
    by_value: dict = field(default_factory=dict)  # guard value key -> {query key}


class FamilyTemplate:
    """A query AST with one parameter: ``{"type": "parameter"}`` as a literal's place."""

    def __init__(self, ast):
        self.ast = ast
        self.column = _parameter_column(ast)

    def instantiate(self, binding):
        """The concrete member AST for ``binding``."""
        ast = copy.deepcopy(self.ast)
        _bind(ast.get("where"), binding)
        return ast


class Catalog:
    """
    Live queries over a store of ``schema``'s tables: a ``MemoryStore`` filled by
    ``load`` (the fixtures, the oracles), or the ``PartitionStore`` a live catalog
    reads the database through (``ivm.live``), started at its version.
    """

    def __init__(self, schema, store=None, version=0):
        self.schema = schema
        self.store = MemoryStore(schema) if store is None else store
        self.version = version
        self.queries = {}  # key -> SharedQuery
        self._by_sub = {}  # subscriber -> key
        self._by_table = {}  # table -> {key}: unguarded views reading the table
        # Guarded views grouped by shape (the query but for its guard literal): a change
        # is traced to root rows once per shape, then sent by the rows' guard values.
        self._shapes = {}  # shape key -> _Shape
        self.families = {}  # family id -> {binding key: query key}

    # --- the store -----------------------------------------------------------------

    def load(self, version, rows):
        """Fill the store with a snapshot taken at ``version`` ({table: [rows]})."""
        for table, table_rows in rows.items():
            self.store.load(table, table_rows)
        self.version = version

    def replace_table(self, table, rows):
        """
        Reload ``table`` (its definition changed; ``rows`` is None if it is gone). The
        queries reading it must have been destroyed first: see ``reading``.
        """
        self.store.drop(table)
        if rows is not None:
            self.store.load(table, rows)

    def reading(self, table):
        """Keys of the registered queries whose view ``table`` can change."""
        return [key for key, shared in self.queries.items() if table in _tables(shared.query)]

    def commit(self, version, changes):
        """
        Apply one commit ((table, old, new) triples) at ``version``; returns
        ({query key: ops}, [Fault]) for the views it changed or broke.
        """
        if version <= self.version:
            return {}, []  # already applied: a replayed tail never doubles a change
        self.store.advance(version, changes)
        self.version = version
        outputs, faults = {}, []
        for key, (routed, affected) in self._route(changes).items():
            shared = self.queries[key]
            try:
                ops = shared.view.apply(routed, affected)
            except ResnapshotRequired:  # the store cannot read at this version: nor can any view
                raise
            except Exception as exc:  # one query's failure must not stop the others
                logger.exception("rindle ivm: query %s faulted", key)
                faults.append(self._fault(key, exc))
                continue
            if ops:
                outputs[key] = ops
        return outputs, faults

    # --- shared queries ------------------------------------------------------------

    def register(self, ast, budget=None):
        """
        Register (or find) the shared query of ``ast``; returns it, hydrated. A new
        view holding more than ``budget`` rows is refused while it is built
        (``LimitExceeded``) and not registered.
        """
        query = parse(ast, self.schema)
        if query.aggregate is not None:
            raise QueryError(
                "a root aggregate is answered by a one-shot read; it is not maintained live yet",
                code=UNSUPPORTED,
            )
        key = query_key(query)
        shared = self.queries.get(key)
        if shared is None:
            view = View(query, self.store)
            view.hydrate(budget)
            shared = self._add(key, query, view)
        return shared

    def _add(self, key, query, view):
        guard = _guard(query)
        shared = SharedQuery(
            key,
            query,
            view,
            guard=guard,
            tables=_tables(query),
            shape=_shape_key(query) if guard is not None else None,
        )
        self.queries[key] = shared
        self._index(shared)
        return shared

    def read_ahead(self, ast, budget=None):
        """
        Read, without the caller's lock, what registering ``ast`` will read (its
        hydration, walked on a scratch store: ``PartitionStore.read_ahead``), so the
        locked ``register`` that follows ``install_ahead`` finds it resident. None when
        there is nothing to read ahead: the query is registered already, is not
        valid (``register`` says why), or the store reads nothing (a ``MemoryStore``).
        Reads only ``queries`` (one membership test) of the catalog's state.
        """
        reader = getattr(self.store, "read_ahead", None)
        if reader is None:
            return None
        try:
            query = parse(ast, self.schema)
        except QueryError:
            return None
        key = query_key(query)
        if query.aggregate is not None or key in self.queries:
            return None
        views = []

        def walk(store):
            views.append(View(query, store))
            views[0].hydrate(budget)

        ahead = reader(walk)
        if ahead is not None:
            ahead.key, ahead.budget = key, budget
            ahead.query, ahead.view = query, views[0] if ahead.refusal is None else None
        return ahead

    def install_ahead(self, ahead, budget=None):
        """
        Under the lock: install a ``read_ahead`` before its ``register`` (see the
        store). A walk already refused past its budget, when ``budget`` (what the
        register would be allowed) is no larger, is refused here at once
        (``LimitExceeded``): its view exceeded that many rows at the version read,
        and building it again would only read it again, under the lock.
        """
        if ahead is None or ahead.key in self.queries:
            return None
        if ahead.refusal is not None and budget is not None and budget <= ahead.budget:
            raise too_large(budget)
        self.store.install_ahead(ahead)
        if ahead.exact and ahead.view is not None:
            # Nothing moved: the walk's view is the view at this version, over the very
            # rows now resident here. It is registered as built, not built again.
            view = ahead.view
            view.rebind(self.store)
            view._within(budget)
            self._add(ahead.key, ahead.query, view)
        return ahead

    def attach(self, key, subscriber):
        """Attach a subscriber; returns its seq-0 ops (the footprint, as adds)."""
        shared = self.queries[key]
        shared.subscribers.add(subscriber)
        self._by_sub[subscriber] = key
        return [{"table": t, "op": "add", "row": r} for t, r in shared.view.footprint_rows()]

    def detach(self, subscriber):
        """Detach one subscriber; the query and its peers keep running."""
        key = self._by_sub.pop(subscriber, None)
        if key is not None and key in self.queries:
            self.queries[key].subscribers.discard(subscriber)

    def destroy(self, key):
        """Tear a query down, dropping every subscriber still on it."""
        shared = self.queries.pop(key, None)
        if shared is None:
            return
        for sub in shared.subscribers:
            self._by_sub.pop(sub, None)
        self._unindex(shared)

    def fault_subscribers(self, key, reason):
        """
        Fault and detach every subscriber of a query, leaving the query itself (for
        a following ``destroy``): they are told to re-subscribe.
        """
        shared = self.queries[key]
        fault = Fault(key, sorted(shared.subscribers, key=str), reason)
        for sub in shared.subscribers:
            self._by_sub.pop(sub, None)
        shared.subscribers.clear()
        return fault

    def snapshot(self, key):
        """The query's current rows in the SSR shape ``{cols: {...}, <alias>: ...}``."""
        shared = self.queries.get(key)
        if shared is None:
            return []
        evaluator = Evaluator(StoreSource(self.store), self.schema, render="snapshot")
        nodes = [evaluator.node(shared.query, row) for row in shared.view.rows()]
        if shared.query.one:
            return nodes[0] if nodes else None
        return nodes

    # --- families ------------------------------------------------------------------

    def bind(self, family, template, binding):
        """Bind one partition of ``family``: hydrates only that partition."""
        shared = self.register(template.instantiate(binding))
        self.families.setdefault(family, {})[_value_key(binding)] = shared.key
        return shared

    def unbind(self, family, binding):
        """Drop one partition (faulting nothing: its subscribers are detached)."""
        key = self.families.get(family, {}).pop(_value_key(binding), None)
        if key is not None:
            self.destroy(key)
        return key is not None

    def partition(self, family, binding):
        key = self.families.get(family, {}).get(_value_key(binding))
        return self.queries.get(key) if key else None

    def partition_snapshot(self, family, binding):
        """The one-shot snapshot of one bound partition (``[]`` when unbound)."""
        shared = self.partition(family, binding)
        return self.snapshot(shared.key) if shared is not None else []

    # --- routing -------------------------------------------------------------------

    def _index(self, shared):
        if shared.guard is None:
            for table in shared.tables:
                self._by_table.setdefault(table, set()).add(shared.key)
            return
        shape = self._shapes.get(shared.shape)
        if shape is None:
            shape = self._shapes[shared.shape] = _Shape(shared.query.table, shared.guard[0])
        shape.tables = shared.tables
        shape.by_value.setdefault(shared.guard[1], set()).add(shared.key)

    def _unindex(self, shared):
        for keys in self._by_table.values():
            keys.discard(shared.key)
        shape = self._shapes.get(shared.shape)
        if shape is not None:
            keys = shape.by_value.get(shared.guard[1], set())
            keys.discard(shared.key)
            if not keys:
                shape.by_value.pop(shared.guard[1], None)
            if not shape.by_value:
                del self._shapes[shared.shape]

    def _route(self, changes):
        """
        {query key: (its changes, root pks to redo or None to work them out)}: the
        views a commit can affect, by table, and for guarded views by the guard value
        of the root rows a change reaches. Each view gets only the changes routed to
        it, so a bulk commit costs per view what concerns that view.
        """
        routes = {}
        queries = self.queries

        def send(key, change, pks):
            route = routes.get(key)
            if route is None:
                if key in queries:
                    routes[key] = ([change], None if pks is None else set(pks))
                return
            routed, known = route
            if routed[-1] is not change:
                routed.append(change)
            if known is not None:
                if pks is None:
                    routes[key] = (routed, None)
                else:
                    known.update(pks)

        for change in changes:
            table, old, new = change
            for key in self._by_table.get(table, ()):
                send(key, change, None)
            for shape in self._shapes.values():
                if table not in shape.tables:
                    continue
                columns = (shape.column,)
                if table == shape.root:
                    for row in (old, new):
                        if row is not None:
                            for key in shape.by_value.get(index_key(row, columns), ()):
                                send(key, change, None)
                    continue
                probe = queries[next(iter(next(iter(shape.by_value.values()))))]
                by_value = {}
                for pk, versions in probe.view.affected_roots([change]).items():
                    for row in versions:
                        by_value.setdefault(index_key(row, columns), set()).add(pk)
                for value, pks in by_value.items():
                    for key in shape.by_value.get(value, ()):
                        send(key, change, pks)
        return routes

    def _fault(self, key, exc):
        fault = self.fault_subscribers(key, f"{type(exc).__name__}: {exc}")
        self.destroy(key)
        return fault


# --- helpers ---------------------------------------------------------------------------


def _value_key(value):
    return index_key({"v": value}, ("v",))


def _guard(query):
    """
    The view's root guard for routing, or None when the root table is read again
    below the root (a self-join): then a row failing the guard can still change a
    guarded row's subtree.
    """
    below = set()
    for related in subqueries(query):
        below |= _tables(related.subquery)
    return None if query.table in below else root_guard(query)


def _shape_key(query):
    """The canonical JSON of ``query`` with its root guard's literal left out."""
    ast = to_json(query)
    where = ast["where"]
    for c in where["conditions"] if where["type"] == "and" else [where]:
        if c["type"] == "simple" and c["op"] == "=" and c["right"]["value"] is not None:
            c["right"] = {"type": "guard"}
            break
    return json.dumps(ast, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _tables(query):
    """Every table whose rows can change the view of ``query``."""
    found = {query.table}
    for related in subqueries(query):
        found |= _tables(related.subquery)
    return frozenset(found)


def _parameter_column(ast):
    where = ast.get("where")
    parts = where.get("conditions", []) if where and where.get("type") == "and" else [where]
    for c in parts:
        if c and c.get("type") == "simple" and c.get("right", {}).get("type") == "parameter":
            if c.get("op") != "=":
                raise ValueError("a family parameter must be compared with =")
            return c["left"]["name"]
    raise ValueError("a family template needs a root `column = parameter` condition")


def _bind(condition, binding):
    if not condition:
        return
    if condition.get("type") in ("and", "or"):
        for c in condition["conditions"]:
            _bind(c, binding)
    elif condition.get("type") == "simple" and condition["right"].get("type") == "parameter":
        condition["right"] = {"type": "literal", "value": binding}
