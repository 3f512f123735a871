"""
A query's view, maintained across commits from the changed rows alone.

After each commit, ``View.apply`` works out which root rows a change can affect at
all: the changed row itself where the root reads its table, and, through the
correlation indexes of the store, the parents of any affected row of a related or
EXISTS subquery, level by level up to the root. Only those root rows are
re-derived, with the reference evaluator's own semantics (so a view can never
disagree with the oracle on meaning). A window (``limit``/``start``) keeps its
bound: rows entering before the bound push the last ones out, and a window that
lost members is refilled from the store's ordered index, once per commit.

Each view keeps a footprint: every base row it shows, reference-counted by the
paths that reach it, so a row reached twice is sent once and removed only when no
path holds it. ``apply`` returns the footprint's change as table-tagged ops
(``add``/``remove``/``edit``), the shape ``nbatch`` carries.
"""

from collections import Counter

from sortedcontainers import SortedKeyList

from ..exceptions import FOOTPRINT_TOO_LARGE, LimitExceeded
from .ast import And, Or, Simple, subqueries
from .compare import sort_key
from .evaluate import Evaluator
from .store import index_key, order_key

# Root rows a hydration reads, prefetches the subtrees of and admits at a time.
_HYDRATE_BATCH = 256


def too_large(budget):
    """The refusal of a view past ``budget`` rows (``footprint_too_large``)."""
    return LimitExceeded(
        f"this query holds more than {budget} rows, what is left of the socket's "
        "WS_MAX_FOOTPRINT_ROWS",
        FOOTPRINT_TOO_LARGE,
    )


class StoreSource:
    """Children by correlation index lookups on the store."""

    def __init__(self, store):
        self.store = store

    def children(self, related, parent):
        key = index_key(parent, related.parent_fields)
        return self.store.lookup(related.subquery.table, related.child_fields, key)

    def window(self, related, parent):
        """
        ``parent``'s children already in the subquery's order (an ordered index per
        correlation value), or None where no such index applies (several columns).
        """
        if len(related.child_fields) != 1:
            return None
        key = index_key(parent, related.parent_fields)
        if key is None:
            return ()
        sub = related.subquery
        return self.store.ordered(sub.table, sub.order_by, (related.child_fields[0], key))


class View:
    """The maintained view of one normalized query over a ``MemoryStore``."""

    def __init__(self, query, store):
        self.query = query
        self.store = store
        self.evaluator = Evaluator(StoreSource(store), store.schema)
        self._key = order_key(query.order_by)
        self._members = SortedKeyList(key=self._key)  # root rows in view order
        self._roots = {}  # root pk -> (row, node, footprint rows)
        self.footprint = Counter()  # (table, pk) -> paths reaching the row
        self._images = {}  # (table, pk) -> row as last shown
        self._guard = root_guard(query)
        self._subs = {}  # id(level query) -> its subqueries (the query tree never changes)
        self._bound = None
        self._start = None  # the start bound as a row, for the store's scan
        if query.start is not None:
            self._start = dict(query.start.row)
            self._bound = (order_key(query.order_by)(self._start), query.start.exclusive)
        # The root conditions on the row alone: a store reading the database narrows
        # what it reads by them (the view still tests every row it gets).
        self._local = _row_local(query.where)
        # A partition window (see _is_partition_window) shows exactly the first ``limit``
        # rows of the store's ordered partition: it keeps those rows as a list (the
        # head) instead of an ordered copy of its own, and a commit compares the new
        # head with the old one.
        self._head = [] if _is_partition_window(query, self._guard) else None
        columns = store.schema.get(query.table).wire_columns  # a private column never shows
        self._names = query.select if query.select is not None else [c.name for c in columns]

    def rebind(self, store):
        """
        Read from ``store`` from now on: a view built on a read ahead's scratch store
        whose rows (the very row objects) were installed in ``store`` at the same
        version (``Catalog.install_ahead``).
        """
        self.store = store
        self.evaluator = Evaluator(StoreSource(store), store.schema)

    # --- reading -------------------------------------------------------------------------

    def result(self):
        """The view in the reference evaluator's shape."""
        nodes = [self._roots[self.store.pk(self.query.table, r)][1] for r in self.rows()]
        if self.query.one:
            return nodes[0] if nodes else None
        return nodes

    def rows(self):
        """The root rows of the view, in view order."""
        return list(self._members if self._head is None else self._head)

    def footprint_rows(self):
        """Every (table, row) the view shows, once each: a late subscriber's seq 0."""
        return [(table, self._images[(table, pk)]) for table, pk in sorted(self.footprint)]

    # --- maintenance -----------------------------------------------------------------

    def hydrate(self, budget=None):
        """
        Build the view from the store; returns the footprint as add ops. Past
        ``budget`` rows in its footprint it stops and raises ``LimitExceeded``
        (``footprint_too_large``): a query too large to serve is refused while it is
        read, not after the whole table was.
        """
        touched = {}
        if self._head is not None:
            self._head = self._partition_head()
            for row in self._head:
                self._show(row, touched)
            self._within(budget)
            return self._ops(touched)
        batch = []
        for row in self._scan(after=None, need=self.query.limit):
            batch.append(row)
            if len(batch) == _HYDRATE_BATCH:
                self._hydrate_batch(batch, touched, budget)
                batch = []
        self._hydrate_batch(batch, touched, budget)
        return self._ops(touched)

    def _hydrate_batch(self, roots, touched, budget):
        self._prefetch(self.query, roots)
        for row in roots:
            self._admit(row, touched)
        self._within(budget)

    def _within(self, budget):
        if budget is not None and len(self.footprint) > budget:
            raise too_large(budget)

    def _prefetch(self, q, rows):
        """Ask the store for the partitions ``rows``' subtrees read, level by level, at once."""
        for related in self._subqueries(q):
            if not rows:
                return
            sub = related.subquery
            keys = [index_key(r, related.parent_fields) for r in rows]
            self.store.prefetch(sub.table, related.child_fields, keys)
            if self._subqueries(sub):
                children = [
                    c for k in keys for c in self.store.lookup(sub.table, related.child_fields, k)
                ]
                self._prefetch(sub, children)

    def affected_roots(self, changes, members_only=False):
        """
        {root pk: [row versions]} of the root rows ``changes`` may alter. With
        ``members_only``, a change below a relationship the root only renders (no
        condition reads it) reaches only the roots the view holds: it cannot move a
        root in or out, so no other root needs reading (from a store that may have
        to go to the database for it).
        """
        if len(changes) == 1:  # a fresh dict already: nothing to merge
            return self._affected(self.query, *changes[0], members_only)
        out = {}
        for table, old, new in changes:
            for pk, versions in self._affected(self.query, table, old, new, members_only).items():
                out.setdefault(pk, []).extend(versions)
        return out

    def apply(self, changes, affected=None):
        """
        Bring the view up to date with ``changes`` ((table, old, new) triples that the
        store has already applied); returns the footprint ops of this commit.
        ``affected``, when the caller already knows them, are the root pks to redo.
        """
        if self._head is not None:
            return self._apply_head()
        if affected is None:
            affected = self.affected_roots(changes, members_only=True)
        if not affected:
            return []
        q, touched = self.query, {}
        limit = q.limit
        members, roots = self._members, self._roots  # one root per member: len(roots) is theirs
        last_row = members[-1] if limit is not None and len(roots) >= limit > 0 else None
        last = None if last_row is None else self._key(last_row)
        for pk in affected:
            if pk in roots:
                self._evict(pk, touched)
        candidates = []
        for pk in affected:
            row = self.store.get(q.table, pk)
            if row is not None and self._qualifies(row):
                candidates.append((pk, row))
        if last is not None:
            # Rows outside the old window all sort after its last row: a candidate past
            # that point may not be next, so the store refills the window from there.
            for pk, row in candidates:
                if not self._key(row) > last:
                    self._admit(row, touched, pk)
            if len(roots) < limit:
                for row in self._scan(after=last_row, need=limit - len(roots)):
                    self._admit(row, touched)
        else:
            for pk, row in candidates:
                self._admit(row, touched, pk)
        while limit is not None and len(roots) > limit:
            self._evict(self.store.pk(q.table, members[-1]), touched)
        return self._ops(touched)

    def _apply_head(self):
        """
        A partition window after a commit: the rows that left the head and the rows
        that joined it, by identity (the store replaces a changed row with a new
        dict), so an edit shows as the old row leaving and the new one joining the
        same key, and the work is the head's length, not a sorted copy's upkeep.
        """
        old, head = self._head, self._partition_head()
        self._head = head
        if len(old) == len(head) and all(a is b for a, b in zip(old, head)):
            return []  # the same row objects: nothing changed in the head
        # (Rows equal by value but new, 2.0 become 2 say, still replace the images.)
        kept, was = set(map(id, head)), set(map(id, old))
        touched = {}
        table, pk_of = self.query.table, self.store.pk
        for row in old:
            if id(row) not in kept:
                self._evict(pk_of(table, row), touched, ordered=False)
        for row in head:
            if id(row) not in was:
                self._show(row, touched)
        return self._ops(touched)

    def _show(self, row, touched):
        """``_admit`` for a partition window's row: its node is its cells, its path itself."""
        table = self.query.table
        pk = self.store.pk(table, row)
        key = (table, pk)
        footprint, images = self.footprint, self._images
        if key not in touched:
            touched[key] = images.get(key) if footprint.get(key) else None
        footprint[key] += 1
        images[key] = row
        self._roots[pk] = (row, {name: row.get(name) for name in self._names}, [key])

    def _partition_head(self):
        ordered = self.store.ordered(self.query.table, self.query.order_by, self._guard)
        return ordered[: self.query.limit]

    # --- internals -----------------------------------------------------------------------

    def _subqueries(self, q):
        subs = self._subs.get(id(q))
        if subs is None:
            subs = self._subs[id(q)] = subqueries(q)
        return subs

    def _qualifies(self, row):
        if not self.evaluator.holds(self.query.where, row):
            return False
        if self._bound is None:
            return True
        key, exclusive = self._bound
        k = self._key(row)
        return k > key if exclusive else not k < key

    def _scan(self, after, need):
        """Qualifying root rows in order, strictly after the row ``after``, at most ``need``."""
        if need == 0:
            return
        start, exclusive = None, False
        if self._bound is not None:
            start, exclusive = self._start, self._bound[1]
        if after is not None and (start is None or not self._key(after) < self._bound[0]):
            start, exclusive = after, True
        q = self.query
        origin = None if self._bound is None else (self._start, self._bound[1])
        rows = self.store.scan(
            q.table, q.order_by, self._guard, start, exclusive, self._local, origin
        )
        found = 0
        for row in rows:
            if self.evaluator.holds(self.query.where, row):
                yield row
                found += 1
                if need is not None and found >= need:
                    return

    def _admit(self, row, touched, pk=None):
        """Add a root row (``pk``: its primary key, when known) to the view."""
        shown = []
        self.evaluator.visit = lambda table, r, key: shown.append((table, r, key))
        try:
            node = self.evaluator.node(self.query, row)
        finally:
            self.evaluator.visit = None
        if pk is None:
            pk = self.store.pk(self.query.table, row)
        self._members.add(row)
        # The footprint keys are kept with the root, so evicting it needs no key again.
        paths = []
        footprint, images = self.footprint, self._images
        for table, r, key_columns in shown:
            # The root row itself (visited first) has the pk just computed.
            root = r is row and key_columns is None
            key = (table, pk if root else self._pk(table, r, key_columns))
            paths.append(key)
            if key not in touched:  # its image before this commit, once per key
                touched[key] = images.get(key) if footprint.get(key) else None
            footprint[key] += 1
            images[key] = r
        self._roots[pk] = (row, node, paths)

    def _evict(self, pk, touched, ordered=True):
        """Take a root row out of the view (``ordered`` False: a partition window's)."""
        row, _node, paths = self._roots.pop(pk)
        if ordered:
            self._members.remove(row)
        footprint, images = self.footprint, self._images
        for key in paths:
            if key not in touched:
                touched[key] = images.get(key) if footprint.get(key) else None
            paths_left = footprint[key] - 1
            if paths_left:
                footprint[key] = paths_left
            else:
                del footprint[key]

    def _pk(self, table, row, key_columns):
        if key_columns is None:
            return self.store.pk(table, row)
        return tuple([sort_key(row.get(c)) for c in key_columns])

    def _ops(self, touched):
        ops = []
        images, footprint = self._images, self.footprint
        for key, before in touched.items():
            table = key[0]
            after = images.get(key) if footprint.get(key) else None
            if after is None:
                images.pop(key, None)
                if before is not None:
                    ops.append({"table": table, "op": "remove", "row": before})
            elif before is None:
                ops.append({"table": table, "op": "add", "row": after})
            elif before != after:
                ops.append({"table": table, "op": "edit", "old": before, "new": after})
        if len(ops) > 1:
            ops.sort(key=lambda o: (o["op"] != "remove", o["table"]))
        return ops

    def _affected(self, q, table, old, new, members_only=False):
        """
        Rows of ``q``'s table whose place or subtree a change of ``table`` may alter,
        as {pk: [row versions]}: both versions of a changed row, since a child that
        moved between parents affects the one it left as well as the one it joined.
        """
        out = {}
        if q.table == table:
            for r in (old, new):
                if r is not None:
                    out.setdefault(self.store.pk(table, r), []).append(r)
        rendered = q.visible_related if members_only and q is self.query else ()
        for related in self._subqueries(q):
            below = self._affected(related.subquery, table, old, new)
            if any(related is r for r in rendered) and self._members_by(related, below, out):
                continue
            for versions in below.values():
                for version in versions:
                    key = index_key(version, related.child_fields)
                    for parent in self.store.lookup(q.table, related.parent_fields, key):
                        out.setdefault(self.store.pk(q.table, parent), []).append(parent)
        return out

    def _members_by(self, related, below, out):
        """
        The roots the view holds whose relationship ``related`` reaches a row of
        ``below``, into ``out``; False when that cannot be found cheaply (a view
        without a limit, correlated on other columns than its key: read the store).
        """
        q = self.query
        by_key = tuple(related.parent_fields) == tuple(self.store.schema.get(q.table).primary_key)
        if not by_key and q.limit is None:
            return False
        roots = self._roots
        for versions in below.values():
            for version in versions:
                key = index_key(version, related.child_fields)
                if key is None:
                    continue
                if by_key:
                    held = roots.get(key)
                    if held is not None:
                        out.setdefault(key, []).append(held[0])
                    continue
                for pk, (row, _node, _paths) in roots.items():
                    if index_key(row, related.parent_fields) == key:
                        out.setdefault(pk, []).append(row)
        return True


def _is_partition_window(query, guard):
    """
    True for a bounded window whose only condition is its root guard and which
    renders no relationship (``post WHERE board = ? ORDER BY score DESC LIMIT 20``):
    every row of the guard's partition qualifies, so the view is the partition's
    first ``limit`` rows in order.
    """
    if guard is None or query.related or query.start is not None or query.one:
        return False
    if query.limit is None or query.limit <= 0 or query.aggregate is not None:
        return False
    where = query.where
    if isinstance(where, And):
        if len(where.conditions) != 1:
            return False
        where = where.conditions[0]
    return isinstance(where, Simple) and where.op == "=" and where.column == guard[0]


def _row_local(where):
    """The part of ``where`` that reads the row alone (no subquery), or None."""
    if where is None or isinstance(where, Simple):
        return where
    if isinstance(where, And):
        local = [c for c in where.conditions if _is_local(c)]
        if not local:
            return None
        return local[0] if len(local) == 1 else And(tuple(local))
    return where if _is_local(where) else None


def _is_local(condition):
    if isinstance(condition, Simple):
        return True
    if isinstance(condition, (And, Or)):
        return all(_is_local(c) for c in condition.conditions)
    return False


def root_guard(query):
    """A root ``column = literal`` every result row satisfies: (column, index key), or None."""
    conditions = query.where.conditions if isinstance(query.where, And) else (query.where,)
    for c in conditions:
        if isinstance(c, Simple) and c.op == "=" and c.value is not None:
            return (c.column, index_key({c.column: c.value}, (c.column,)))
    return None


__all__ = ["StoreSource", "View", "root_guard"]
