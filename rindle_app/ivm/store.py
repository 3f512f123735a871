"""
The IVM's own copy of the synced tables, advanced only by applying committed
changes in outbox order.

Operators read it while processing commit V, and it holds exactly version V,
whatever other processes have written to the database since (DESIGN §2, the
version rule). Indexes are built on first use and kept in step by ``apply``: by
primary key, by any column tuple (for correlation lookups), and in any order (for
refilling a window from its bound).
"""

from sortedcontainers import SortedKeyList

from .compare import reverse_sort_key, sort_key


def order_key(order_by):
    """
    A function row -> key whose ordering is ``order_by``'s (null first, per direction).

    The column keys are concatenated into one flat tuple, which orders the same as a
    tuple of them (a column key's length follows from its first item, the kind) and
    costs a window's bisect one tuple per row instead of one per column.
    """
    columns = tuple((c, reverse_sort_key if d == "desc" else sort_key) for c, d in order_by)
    if len(columns) == 2:  # the usual completed order: one column, then the primary key
        (first, first_key), (second, second_key) = columns
        return lambda row: first_key(row.get(first)) + second_key(row.get(second))

    def key(row):
        flat = ()
        for c, column_key in columns:
            flat += column_key(row.get(c))
        return flat

    return key


def index_key(row, columns):
    """The lookup key of ``row`` on ``columns``; None if any is null (null never correlates)."""
    if len(columns) == 1:  # the usual correlation: one column
        value = row.get(columns[0])
        return None if value is None else (sort_key(value),)
    values = [row.get(c) for c in columns]
    if any(v is None for v in values):
        return None
    return tuple([sort_key(v) for v in values])


class KeyedStore:
    """What every store shares: ``schema``, and rows keyed by their primary key."""

    def __init__(self, schema):
        self.schema = schema
        # table -> primary key columns; a schema change drops the table and reloads it.
        self._primary_keys = {}

    def primary_key(self, table):
        """The primary key columns of ``table``, as a tuple."""
        columns = self._primary_keys.get(table)
        if columns is None:
            columns = self._primary_keys[table] = tuple(self.schema.get(table).primary_key)
        return columns

    def pk(self, table, row):
        columns = self._primary_keys.get(table) or self.primary_key(table)
        if len(columns) == 1:
            return (sort_key(row.get(columns[0])),)
        return tuple([sort_key(row.get(c)) for c in columns])


class MemoryStore(KeyedStore):
    """Rows of every registered table, by primary key, with derived indexes."""

    def __init__(self, schema):
        super().__init__(schema)
        self._rows = {}  # table -> {pk: row}, created on first use
        self._lookups = {}  # table -> {columns: {key: {pk: row}}}
        # table -> {(order_by, guard column or None): {guard key or None: SortedKeyList}}
        self._orders = {}

    # --- reading ----------------------------------------------------------------------

    def rows(self, table):
        return self._table(table).values()

    def get(self, table, pk):
        return self._table(table).get(pk)

    def _table(self, table):
        rows = self._rows.get(table)
        if rows is None:
            rows = self._rows[table] = {}
        return rows

    def lookup(self, table, columns, key):
        """Rows of ``table`` whose ``columns`` equal ``key`` (an ``index_key``)."""
        if key is None:
            return ()
        indexes = self._lookups.setdefault(table, {})
        index = indexes.get(columns)
        if index is None:
            index = {}
            for pk, row in self._table(table).items():
                k = index_key(row, columns)
                if k is not None:
                    index.setdefault(k, {})[pk] = row
            indexes[columns] = index
        return tuple(index.get(key, {}).values())

    def ordered(self, table, order_by, guard=None):
        """
        The rows of ``table`` in ``order_by`` order, kept in step; with ``guard``
        ((column, index key)), only the rows whose column holds that value, so a
        window over one partition never walks the others.
        """
        column, value = guard if guard is not None else (None, None)
        by_value = self._orders.setdefault(table, {}).setdefault((order_by, column), {})
        ordered = by_value.get(value)
        if ordered is None:
            if guard is None:
                rows = self._table(table).values()
            else:
                rows = self.lookup(table, (column,), value)
            ordered = SortedKeyList(rows, key=order_key(order_by))
            # A guarded list is kept only while it holds rows (see _unindex), so lists
            # for values that come and go never pile up.
            if guard is None or ordered:
                by_value[value] = ordered
        return ordered

    def scan(
        self, table, order_by, guard=None, start=None, exclusive=False, where=None, origin=None
    ):
        """
        The rows of ``table`` (of one guard partition with ``guard``) in ``order_by``
        order, after the row ``start`` (at or after unless ``exclusive``). ``where``
        and ``origin`` are the partition store's (its narrowing, and the window's own
        start, which names the run it keeps); every row is here, so they are unused.
        """
        ordered = self.ordered(table, order_by, guard)
        if start is None:
            return iter(ordered)
        key = order_key(order_by)(start)
        return ordered.irange_key(key, inclusive=(not exclusive, True))

    def prefetch(self, table, columns, keys):
        """Nothing to read: every row is here (see ``PartitionStore.prefetch``)."""

    def holdings(self):
        """Every table held, as (table, None, None, {pk: row}): for the oracles."""
        for table, rows in self._rows.items():
            yield table, None, None, rows

    # --- writing ---------------------------------------------------------------------

    def advance(self, version, changes):
        """Apply one commit's changes ((table, old, new), in order)."""
        for table, old, new in changes:
            self.apply(table, old, new)

    def drop(self, table):
        """Forget ``table``'s rows and indexes (its definition changed or it is gone)."""
        for held in (self._rows, self._lookups, self._orders, self._primary_keys):
            held.pop(table, None)

    def load(self, table, rows):
        for row in rows:
            self.apply(table, None, row)

    def apply(self, table, old, new):
        """Apply one change (old is None for an insert, new is None for a delete)."""
        rows = self._table(table)
        if old is not None:
            pk = self.pk(table, old)
            stored = rows.pop(pk, None)
            if stored is not None:
                self._unindex(table, pk, stored)
        if new is not None:
            new = dict(new)
            pk = self.pk(table, new)
            stored = rows.pop(pk, None)
            if stored is not None:  # an insert over an existing key replaces it
                self._unindex(table, pk, stored)
            rows[pk] = new
            self._index(table, pk, new)

    def _index(self, table, pk, row):
        for columns, index in self._lookups.get(table, {}).items():
            k = index_key(row, columns)
            if k is not None:
                bucket = index.get(k)
                if bucket is None:
                    bucket = index[k] = {}
                bucket[pk] = row
        for (_order_by, column), by_value in self._orders.get(table, {}).items():
            ordered = by_value.get(None if column is None else index_key(row, (column,)))
            if ordered is not None:
                ordered.add(row)

    def _unindex(self, table, pk, row):
        for columns, index in self._lookups.get(table, {}).items():
            k = index_key(row, columns)
            bucket = index.get(k)
            if bucket is not None:
                bucket.pop(pk, None)
                if not bucket:
                    del index[k]
        for (_order_by, column), by_value in self._orders.get(table, {}).items():
            value = None if column is None else index_key(row, (column,))
            ordered = by_value.get(value)
            if ordered is not None:
                ordered.remove(row)
                if not ordered and value is not None:
                    del by_value[value]
