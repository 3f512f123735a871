"""
The live catalog's store: only the partitions live queries read, loaded from the
database on demand and corrected to the exact version being processed.

A **partition** is the set of rows of one table whose columns equal one key: the
rows of a correlation (``comment.issueId = 'i7'``), of a primary key (one row), of
a root guard (``post.board = 3``, kept in order for windows). Reading one that is
not resident loads it; from then on ``advance`` keeps it in step with every commit,
as ``MemoryStore`` keeps whole tables. A window over a whole table (no guard) is
never loaded: ``scan`` pages through the database in the window's order.

**The version rule** (DESIGN §2). The store stands at version V (the commit being
processed), and the database may be ahead of it: other processes go on writing.
A read is ONE snapshot that returns the rows it selects AND the outbox changes of
their table above V (``PartitionSource.read``). Every change at or below V is in
that snapshot (V is at most a published safe_seq, and a seq at or below safe_seq
is final), so the snapshot is "V, then exactly those changes". Per row, seq order
is commit order, so the row's image at V is the ``old`` image of the first change
above V that names its key, and a key whose first change above V is a ``new``
image did not exist at V. The rows read for keys that no change above V names are
already as of V. So: the untouched rows as read, plus the images at V of the
touched keys that fall in the partition (or the page), is the partition at V,
exactly. The outbox above V is short: the hub is near the head, and retention
never prunes above a reader (a read below the horizon raises
``ResnapshotRequired``, as the tail does).

A page of a scan covers the key range up to its last row read (everything when it
came back short), so the images at V merged into it are those in that range, and
the next page starts after it: each row at V is yielded once, whatever moved in the
database between two pages. The pages read from the start of a window's order are
kept as a **run**: every row of the table in that order (narrowed by the window's
row conditions) up to the last key read, kept in step like a partition, so a window
that loses a row refills from memory, and reads the database only past the run.

**Bounds.** Resident partitions are kept in least-recently-read order, and when
their rows exceed ``max_rows`` (``RINDLE["STORE_MAX_ROWS"]``) the oldest are
forgotten. Forgetting is only a cost, never an error: a partition read again is
loaded again, at the version of that moment. Memory therefore follows what the
live queries read, not the size of the tables.
"""

import weakref
from collections import OrderedDict, deque

from sortedcontainers import SortedKeyList

from ..exceptions import LimitExceeded, ResnapshotRequired
from .ast import And, Query, Simple, Start
from .compare import key_value
from .evaluate import Evaluator
from .sql import compile_rows
from .store import KeyedStore, index_key, order_key

# A scan's first page holds twice what the view asks for (at least this many rows);
# each further page doubles, up to the last size.
_FIRST_PAGE, _LAST_PAGE = 64, 4096
# A run keeps at most this many rows (its first ones: a window reads from the start).
_RUN_ROWS = 2 * _LAST_PAGE
# Keys one prefetch read asks for at most (one IN list).
_PREFETCH_KEYS = 500
# While a read ahead is out, the commits applied meanwhile are kept (up to about
# this many changes) so it can be brought forward to the store's version; past it,
# what it read is read again under the lock.
_LOG_CHANGES = 20_000
# A row whose image at the version a correction starts from is not known (one the
# read returned, no change named before): it is found in its read by primary key.
_UNKNOWN = object()


class _Run:
    """
    The rows of a table in one order (and row conditions) from an origin (a window's
    start bound, or the beginning) up to ``upper``.
    """

    __slots__ = ("key", "where", "origin", "lower", "rows", "by_pk", "upper", "last", "complete")

    def __init__(self, key, where, origin):
        self.key, self.where, self.origin = key, where, origin  # origin: (row, exclusive)
        self.lower = None if origin is None else (key(origin[0]), origin[1])
        self.rows = SortedKeyList(key=key)
        self.by_pk = {}
        self.upper = self.last = None  # the key, and the row, of the last row read
        self.complete = False  # True when the run holds every row to the end


class _Read:
    """A read ahead's read of the partitions ``columns = key`` of the keys of ``buckets``."""

    __slots__ = ("table", "columns", "buckets", "later", "cover", "touched")

    def __init__(self, table, columns, buckets, later, cover, touched):
        self.table, self.columns, self.buckets = table, columns, buckets  # buckets: at V0
        self.later, self.cover = later, cover  # changes above V0; every seq <= cover is in
        self.touched = touched  # {pk: row as read} of the keys changed above V0


class _PageRead:
    """One page of a scan: its rows at V (``page``), its key range, and what was read."""

    __slots__ = ("key", "bound", "exclusive", "upper", "last", "page", "later", "cover", "touched")

    def __init__(self, key, bound, exclusive, upper, last):
        self.key, self.bound, self.exclusive = key, bound, exclusive  # where it starts
        self.upper, self.last = upper, last  # its last row read and its key (None: the end)
        self.page = self.later = self.cover = self.touched = None

    @property
    def full(self):
        return self.last is not None

    def correct(self, base, moves):
        """The page's rows: ``base`` ({pk: row}) with ``moves`` (``_correct``) applied, in order."""
        rows = dict(base)
        key, bound, upper = self.key, self.bound, self.upper
        for pk, _before, after in moves:
            rows.pop(pk, None)
            if after is None:
                continue
            k = key(after)
            if bound is not None and (k < bound or (self.exclusive and k == bound)):
                continue
            if upper is None or not k > upper:
                rows[pk] = after
        return sorted(rows.values(), key=key)


class _RunRead:
    """A run a read ahead started, and its pages in order (until it was first trimmed)."""

    __slots__ = ("table", "name", "order_by", "where", "origin", "pages")

    def __init__(self, table, name, order_by, where, origin):
        self.table, self.name = table, name
        self.order_by, self.where, self.origin = order_by, where, origin
        self.pages = []


class Ahead:
    """What ``PartitionStore.read_ahead`` read: partitions, orders and runs at ``version``."""

    def __init__(self, origin, generation):
        self.origin = origin  # the store it was read for
        self.scratch = None  # the store the walk read into, at ``version``
        self.version = None
        self.generation = generation
        self.key = None  # the query it was read for (set by ``Catalog.read_ahead``)
        self.budget = None  # the walk's budget (set by ``Catalog.read_ahead``)
        self.refusal = None  # the LimitExceeded the walk stopped at, if it did
        self.installed = 0  # partitions and runs install_ahead took (the tests read it)
        self.skipped = 0  # reads it could not correct to the store's version
        # True once installed when every read went in as read (the same version, none
        # resident already): the store then holds exactly what the walk's view read.
        self.exact = False


class PartitionStore(KeyedStore):
    """The store of a live catalog (see the module): partitions on demand, at version V."""

    def __init__(self, schema, source, *, max_rows, vendor):
        super().__init__(schema)
        self.source = source  # .read(table, sql, params, version) -> (rows, later, cover)
        self.vendor = vendor
        self.max_rows = max_rows
        self.version = 0
        self._lookups = {}  # table -> {columns: {key: {pk: row}}}: resident keys only
        # table -> {column: {key: {order_by: SortedKeyList}}}: resident (column,) keys only
        self._orders = {}
        self._fresh = {}  # (table, pk) -> its image after this commit (None: gone)
        self._runs = {}  # table -> {(order_by, where): _Run}
        self._local = Evaluator(None, schema)  # row conditions only: no source needed
        self._resident = OrderedDict()  # (table, columns, key) -> None, oldest read first
        self.rows_held = 0
        self.loads = 0  # partitions and pages read from the database
        self.generation = 0  # bumped by drop() and clear(): a read ahead of them is stale
        self._reads = None  # a read ahead's scratch store records its reads here
        self._pending = weakref.WeakSet()  # reads ahead not installed (or dropped) yet
        self._log = deque()  # (version before, version after, changes) while any is out
        self._logged = 0  # changes in _log

    # --- reading ----------------------------------------------------------------------

    def get(self, table, pk):
        """The row of ``table`` with primary key ``pk`` at V, or None."""
        fresh = self._fresh.get((table, pk), self)
        if fresh is not self:  # changed by this commit: its image is the row at V
            return fresh
        columns = self.primary_key(table)
        index = self._lookups.get(table, {}).get(columns)
        if index is None or pk not in index:
            # A row a run holds is its key's partition at V too: no read for it.
            for run in self._runs.get(table, {}).values():
                row = run.by_pk.get(pk)
                if row is not None:
                    return row
        bucket = self._bucket(table, columns, pk)
        return bucket.get(pk)

    def lookup(self, table, columns, key):
        """Rows of ``table`` whose ``columns`` equal ``key`` (an ``index_key``) at V."""
        if key is None:
            return ()
        if columns == self.primary_key(table):  # one row: this commit's, a run's, or read
            row = self.get(table, key)
            return () if row is None else (row,)
        return tuple(self._bucket(table, columns, key).values())

    def ordered(self, table, order_by, guard):
        """The rows of one guard partition ((column, key)) in ``order_by`` order."""
        if guard is None:
            raise ValueError("a partition store keeps no whole-table order: use scan()")
        column, key = guard
        bucket = self._bucket(table, (column,), key)
        by_order = self._orders.setdefault(table, {}).setdefault(column, {}).setdefault(key, {})
        ordered = by_order.get(order_by)
        if ordered is None:
            ordered = by_order[order_by] = SortedKeyList(bucket.values(), key=order_key(order_by))
        return ordered

    def scan(
        self, table, order_by, guard=None, start=None, exclusive=False, where=None, origin=None
    ):
        """
        Rows of ``table`` at V in ``order_by`` order, after the row ``start`` (at or
        after unless ``exclusive``); with ``guard``, of that partition only. ``where``
        (conditions on the row alone) may narrow what is read: a caller still tests
        each row, since the rows at V merged into a page are not narrowed by it.
        """
        if guard is not None:
            ordered = self.ordered(table, order_by, guard)
            if start is None:
                return iter(ordered)
            key = order_key(order_by)(start)
            return ordered.irange_key(key, inclusive=(not exclusive, True))
        return self._scan_run(table, order_by, start, exclusive, where, origin)

    def holdings(self):
        """Every resident partition as (table, columns, key, {pk: row}): for the oracles."""
        for table, columns, key in self._resident:
            if columns is not None:  # a run is a range, not a partition: see the views
                yield table, columns, key, self._lookups[table][columns][key]

    def prefetch(self, table, columns, keys):
        """
        Make the partitions ``columns = key`` of ``table`` resident for every key of
        ``keys`` (index keys; None ignored), reading the missing ones together: a
        view about to render 50 parents reads their children in one read, not 50.
        """
        if len(columns) != 1:
            return
        index = self._lookups.setdefault(table, {}).setdefault(columns, {})
        missing = sorted({k for k in keys if k is not None and k not in index})
        if len(missing) < 2:
            return
        (column,) = columns
        pk_order = tuple((c, "asc") for c in self.primary_key(table))
        for at in range(0, len(missing), _PREFETCH_KEYS):
            chunk = missing[at : at + _PREFETCH_KEYS]
            where = Simple("IN", column, [key_value(k[0]) for k in chunk])
            rows, later, cover = self._fetch(Query(table, where=where, order_by=pk_order))
            buckets = {k: {} for k in chunk}
            raw = {}
            for row in rows:
                pk = self.pk(table, row)
                raw[pk] = row
                bucket = buckets.get(index_key(row, columns))
                if bucket is not None:
                    bucket[pk] = row
            self._settle(table, columns, buckets, later, cover, raw)
            for k, bucket in buckets.items():
                index[k] = bucket
                self._resident[(table, columns, k)] = None
                self.rows_held += len(bucket)
        self._evict(keep=None)

    # --- reading ahead of the hub's lock -----------------------------------------------

    def read_ahead(self, walk):
        """
        Read what ``walk(store)`` reads (a new query's hydration) WITHOUT the lock
        that guards this store: ``walk`` runs on a scratch store standing at this
        store's version V0 (one attribute read: a commit being applied meanwhile
        only makes V0 older) that reads partitions, sorts them for windows and pages
        through runs as this one would, and keeps each read as it came back: the
        rows, the changes above V0, and the read's cover (every change at or below
        it is in the rows). Returns an ``Ahead`` for ``install_ahead``, or None when
        nothing can be read ahead (below the horizon: the locked read says so). A
        walk refused by its budget keeps what it read: the locked build reads the
        same rows first, and refuses again (``Catalog.install_ahead`` refuses at
        once instead).
        """
        ahead = Ahead(self, self.generation)
        # Out BEFORE the version is read: every commit applied after that is logged.
        self._pending.add(ahead)
        scratch = ahead.scratch = PartitionStore(
            self.schema, self.source, max_rows=self.max_rows, vendor=self.vendor
        )
        scratch.start(self.version)
        ahead.version = scratch.version
        scratch._reads = []
        try:
            walk(scratch)
        except LimitExceeded as exc:
            ahead.refusal = exc
        except ResnapshotRequired:
            self._pending.discard(ahead)
            return None
        return ahead

    def install_ahead(self, ahead):
        """
        Under the lock: make resident what ``ahead`` read (partitions not resident
        yet, their orders, runs not started yet), corrected from its version V0 to
        this store's version V with ``_correct``: the changes between V0 and V that
        the reads saw are undone to V (or the rows read stand as read), since each
        read holds every change up to its cover and the changes above V0. A read
        whose cover is below V (the database moved past what it holds: a commit
        between V0 and V it may lack), a read of another store (re-hydrated) or of
        before a ``drop``/``clear`` is left out: the locked build reads it itself,
        as before. Returns ``ahead`` (its ``installed`` and ``skipped`` counts).
        """
        if ahead is None:
            return None
        self._pending.discard(ahead)
        since, to = ahead.version, self.version
        if ahead.origin is not self or ahead.generation != self.generation or to < since:
            ahead.skipped += 1
            return ahead
        scratch = ahead.scratch
        self.loads += scratch.loads
        ahead.exact = since == to
        for read in scratch._reads:
            if isinstance(read, _RunRead):
                self._install_run(read, since, to, ahead)
            else:
                self._install_read(scratch, read, since, to, ahead)
        ahead.exact = ahead.exact and not ahead.skipped
        if ahead.exact and self.rows_held > self.max_rows:
            ahead.exact = False  # forgetting now could drop what the view reads
        self._evict(keep=None)
        return ahead

    def _catch_up(self, table, later, touched, cover, since, to):
        """
        The moves that bring one read ahead from ``since`` (V0) to ``to`` (V), or None
        when it cannot be. Up to its cover, the changes the read holds are undone to
        V; past it (commits applied after the read), the commits the store logged
        meanwhile are applied over it, whole: each key ends at its last image in them.
        """
        stop = min(cover, to)
        forward = None
        if stop < to:
            batches = [b for b in self._log if b[1] > stop]
            if not batches or batches[0][0] > stop:
                return None  # the log does not reach back to the read
            forward = {}
            pk = self.pk
            for _since, _version, changes in batches:
                for name, old, new in changes:
                    if name == table:
                        if old is not None:
                            forward[pk(table, old)] = None
                        if new is not None:
                            forward[pk(table, new)] = new
        return self._correct(table, later, touched, since, stop, forward)

    def _install_read(self, scratch, read, since, to, ahead):
        table, columns = read.table, read.columns
        index = self._lookups.setdefault(table, {}).setdefault(columns, {})
        todo = [k for k in read.buckets if k not in index]
        if len(todo) < len(read.buckets):
            ahead.exact = False
        if not todo:
            return
        by_key = None
        if len(columns) == 1:  # the orders the walk sorted of these very buckets
            held = scratch._lookups.get(table, {}).get(columns, {})
            sorted_ = scratch._orders.get(table, {}).get(columns[0], {})
            by_key = {
                k: sorted_[k] for k, b in read.buckets.items() if k in sorted_ and held.get(k) is b
            }
        moves = self._catch_up(table, read.later, read.touched, read.cover, since, to)
        if moves is None:
            ahead.skipped += 1
            return
        if moves:  # on every bucket of the read: the moves of a key stay within the read
            self._place(columns, read.buckets, moves, by_key)
        for k in todo:
            bucket = read.buckets[k]
            index[k] = bucket
            orders = None if by_key is None else by_key.get(k)
            if orders:  # its sorted windows, sorted ahead of the lock
                self._orders.setdefault(table, {}).setdefault(columns[0], {})[k] = orders
            self._resident[(table, columns, k)] = None
            self.rows_held += len(bucket)
            ahead.installed += 1

    def _install_run(self, record, since, to, ahead):
        table, name = record.table, record.name
        runs = self._runs.setdefault(table, {})
        if name in runs:
            ahead.exact = False
        if name in runs or not record.pages:
            return
        pages = []
        for read in record.pages:  # the prefix that can be brought to V
            moves = self._catch_up(table, read.later, read.touched, read.cover, since, to)
            if moves is None:
                ahead.skipped += 1
                break
            page = read.page
            if moves:
                page = read.correct({self.pk(table, r): r for r in page}, moves)
            pages.append((read, page))
        if not pages:
            return
        run = runs[name] = _Run(order_key(record.order_by), record.where, record.origin)
        self._resident[(table, None, name)] = None
        for read, page in pages:
            self._extend(table, run, read, page)
        ahead.installed += 1

    # --- writing ---------------------------------------------------------------------

    def advance(self, version, changes):
        """Apply one commit's changes ((table, old, new), in order) and stand at ``version``."""
        self._fresh = {}
        for table, old, new in changes:
            self.apply(table, old, new)
        since, self.version = self.version, version
        if self._pending:  # a read ahead is out: installing it may need these changes
            self._log.append((since, version, changes))
            self._logged += len(changes)
            while self._logged > _LOG_CHANGES and len(self._log) > 1:
                self._logged -= len(self._log.popleft()[2])
        elif self._log:
            self._log.clear()
            self._logged = 0

    def start(self, version):
        """Stand at ``version`` with nothing resident (a new or re-hydrated catalog)."""
        self.version = version
        self._fresh = {}

    def apply(self, table, old, new):
        fresh = self._fresh
        old_pk = new_pk = None
        if old is not None:
            old_pk = self.pk(table, old)
            fresh[(table, old_pk)] = None
        if new is not None:
            new = dict(new)
            new_pk = self.pk(table, new)
            fresh[(table, new_pk)] = new
        runs = self._runs.get(table)
        if runs:
            self._apply_runs(runs, old_pk, new, new_pk)
        indexes = self._lookups.get(table)
        if not indexes:
            return  # nothing of this table is resident: the change needs no upkeep here
        orders = self._orders.get(table, {})
        for columns, index in indexes.items():
            by_key = orders.get(columns[0]) if len(columns) == 1 else None
            if old is not None:
                bucket = index.get(index_key(old, columns))
                if bucket is not None:
                    stored = bucket.pop(old_pk, None)
                    if stored is not None:
                        self.rows_held -= 1
                        if by_key:
                            _unorder(by_key, index_key(old, columns), stored)
            if new is not None:
                k = index_key(new, columns)
                bucket = index.get(k)
                if bucket is not None:
                    stored = bucket.pop(new_pk, None)
                    if stored is not None:  # an insert over a key it holds replaces it
                        self.rows_held -= 1
                        if by_key:
                            _unorder(by_key, k, stored)
                    bucket[new_pk] = new
                    self.rows_held += 1
                    if by_key:
                        for ordered in by_key.get(k, {}).values():
                            ordered.add(new)

    def drop(self, table):
        """Forget ``table``'s partitions (its definition changed or it is gone)."""
        for entry in [e for e in self._resident if e[0] == table]:
            self._forget(entry)
        for held in (self._lookups, self._orders, self._runs, self._primary_keys):
            held.pop(table, None)
        self._fresh = {k: v for k, v in self._fresh.items() if k[0] != table}
        self.generation += 1

    def clear(self):
        """Forget every partition (a re-hydration)."""
        self._lookups, self._orders, self._fresh, self._runs = {}, {}, {}, {}
        self._resident.clear()
        self.rows_held = 0
        self.generation += 1

    # --- internals -----------------------------------------------------------------------

    def _bucket(self, table, columns, key):
        indexes = self._lookups.get(table)
        index = None if indexes is None else indexes.get(columns)
        if index is not None:
            bucket = index.get(key)
            if bucket is not None:
                # The read order matters only once forgetting is near: under half the
                # bound, a hit (every commit's hot path) skips the bookkeeping.
                if self.rows_held > self.max_rows >> 1:
                    self._resident.move_to_end((table, columns, key))
                return bucket
        else:
            index = self._lookups.setdefault(table, {}).setdefault(columns, {})
        entry = (table, columns, key)
        bucket = self._load(table, columns, key)
        index[key] = bucket
        self._resident[entry] = None
        self.rows_held += len(bucket)
        self._evict(keep=entry)
        return bucket

    def _load(self, table, columns, key):
        """The partition ``columns = key`` of ``table`` at V, read in one snapshot."""
        values = [key_value(part) for part in key]
        where = And(tuple(Simple("=", c, v) for c, v in zip(columns, values)))
        pk_order = tuple((c, "asc") for c in self.primary_key(table))
        rows, later, cover = self._fetch(Query(table=table, where=where, order_by=pk_order))
        bucket = {self.pk(table, row): row for row in rows}
        self._settle(table, columns, {key: bucket}, later, cover, bucket)
        return bucket

    def _settle(self, table, columns, buckets, later, cover, raw):
        """
        Correct the partitions of one read ({key: {pk: row as read}}) to V, and when
        reading ahead, record the read (see ``install_ahead``). ``raw``: {pk: row as
        read} of every row read.
        """
        moves = self._correct(table, later, raw, None, self.version)
        if self._reads is not None:
            # The rows as read of the keys changed above V: a later version's images
            # of them are those rows again, or other images of the same changes.
            touched = {pk: before for pk, before, _after in moves if before is not None}
            self._reads.append(_Read(table, columns, buckets, later, cover, touched))
        self._place(columns, buckets, moves)

    def _place(self, columns, buckets, moves, by_key=None):
        """
        Apply ``moves`` ((pk, before, after) from ``_correct``) to ``buckets`` ({index
        key: {pk: row}} of one read, and their ordered lists ``by_key``, {index key:
        {order_by: SortedKeyList}}): a row leaves its key's bucket, its image joins
        the bucket of its own key when that key was read. A read of one key holds
        every row it returned, so there a row leaves that bucket whatever its key;
        a row whose image before is ``_UNKNOWN`` is looked for in every bucket.
        """
        only = next(iter(buckets)) if len(buckets) == 1 else None
        for pk, before, after in moves:
            if before is _UNKNOWN:  # somewhere in the read, or not in it at all
                homes = [only] if only is not None else [k for k, b in buckets.items() if pk in b]
            elif before is not None:
                homes = [only if only is not None else index_key(before, columns)]
            else:
                homes = ()
            for k in homes:
                bucket = buckets.get(k)
                stored = None if bucket is None else bucket.pop(pk, None)
                if stored is not None and by_key:
                    _unorder(by_key, k, stored)
            if after is not None:
                k = index_key(after, columns)
                bucket = buckets.get(k)
                if bucket is not None:
                    stored = bucket.get(pk)
                    bucket[pk] = after
                    if by_key:
                        if stored is not None:
                            _unorder(by_key, k, stored)
                        for ordered in by_key.get(k, {}).values():
                            ordered.add(after)

    def _scan_run(self, table, order_by, start, exclusive, where, origin):
        """
        A scan over a whole table: from the run of its window's ``origin`` ((start
        row, exclusive) of the window, or None for the beginning) where it has one,
        then from pages.
        """
        runs = self._runs.setdefault(table, {})
        # A condition may hold a list (IN), a row dict: neither is hashable.
        name = (order_by, repr(where), repr(origin))
        run, record = runs.get(name), None
        if run is None:
            if not _same_start(start, exclusive, origin):  # from the middle: no run yet
                yield from self._pages(table, order_by, start, exclusive, where)
                return
            run = runs[name] = _Run(order_key(order_by), where, origin)
            self._resident[(table, None, name)] = None
            if self._reads is not None:
                record = _RunRead(table, name, order_by, where, origin)
                self._reads.append(record)
        else:
            self._resident.move_to_end((table, None, name))
        key = run.key
        bound = None if start is None else key(start)
        if bound is None:
            yield from run.rows
        else:
            yield from run.rows.irange_key(bound, inclusive=(not exclusive, True))
        if run.complete:
            return
        # Past the run: read on from its last row, and keep what is read in it.
        if run.last is not None:
            after, after_exclusive = run.last, True
        else:
            after, after_exclusive = origin if origin is not None else (None, False)
        for read in self._page_reads(table, order_by, after, after_exclusive, where):
            page = read.page
            if runs.get(name) is not run:  # forgotten meanwhile
                yield from (r for r in page if bound is None or _after(key(r), bound, exclusive))
                continue
            if record is not None:  # the run's pages in order, until it is first trimmed
                record.pages.append(read)
                if len(run.rows) + len(page) > _RUN_ROWS:
                    record = None
            self._extend(table, run, read, page)
            self._evict(keep=(table, None, name))
            yield from (r for r in page if bound is None or _after(key(r), bound, exclusive))

    def _extend(self, table, run, read, page):
        """Add one page (``read`` and its rows ``page`` at V) at the end of ``run``."""
        for row in page:
            run.rows.add(row)
            run.by_pk[self.pk(table, row)] = row
        self.rows_held += len(page)
        run.upper, run.complete = read.upper, not read.full
        if read.full:
            run.last = read.last
        self._trim(table, run)

    def _pages(self, table, order_by, start, exclusive, where):
        for read in self._page_reads(table, order_by, start, exclusive, where):
            yield from read.page

    def _page_reads(self, table, order_by, start, exclusive, where):
        """Each page's ``_PageRead``: its rows at V (``page``), its range, what was read."""
        key = order_key(order_by)
        bound = None if start is None else key(start)
        size = _FIRST_PAGE
        while True:
            page_start = None
            if start is not None:
                page_start = Start(tuple((c, start.get(c)) for c, _d in order_by), exclusive)
            query = Query(table, where=where, order_by=order_by, start=page_start, limit=size)
            rows, later, cover = self._fetch(query)
            full = len(rows) == size
            last = max(rows, key=key) if full else None  # rows come in no order
            read = _PageRead(key, bound, exclusive, None if last is None else key(last), last)
            read.later, read.cover = later, cover
            raw = {self.pk(table, r): r for r in rows}
            moves = self._correct(table, later, raw, None, self.version)
            read.touched = {pk: before for pk, before, _after in moves if before is not None}
            read.page = read.correct(raw, moves)
            yield read
            if not full:
                return
            start, exclusive, bound = last, True, read.upper
            size = min(size * 2, _LAST_PAGE)

    def _apply_runs(self, runs, old_pk, new, new_pk):
        for run in runs.values():
            if old_pk is not None:
                stored = run.by_pk.pop(old_pk, None)
                if stored is not None:
                    run.rows.remove(stored)
                    self.rows_held -= 1
            if new is not None:
                stored = run.by_pk.pop(new_pk, None)
                if stored is not None:
                    run.rows.remove(stored)
                    self.rows_held -= 1
                k = run.key(new)
                inside = run.complete or (run.upper is not None and not k > run.upper)
                if inside and run.lower is not None:
                    inside = _after(k, *run.lower)
                if inside and self._local.holds(run.where, new):
                    run.rows.add(new)
                    run.by_pk[new_pk] = new
                    self.rows_held += 1

    def _trim(self, table, run):
        """Keep a run's first ``_RUN_ROWS`` rows; what lies past them is read again."""
        extra = len(run.rows) - _RUN_ROWS
        if extra <= 0:
            return
        for row in run.rows[-extra:]:
            del run.by_pk[self.pk(table, row)]
        del run.rows[-extra:]
        self.rows_held -= extra
        run.last = run.rows[-1]
        run.upper, run.complete = run.key(run.last), False

    def _fetch(self, query):
        """(rows, later, cover) of ``query``'s level in ONE snapshot (``PartitionSource.read``)."""
        sql, params = compile_rows(query, self.vendor, self.schema)
        read = self.source.read(self.schema.get(query.table), sql, params, self.version)
        self.loads += 1
        return read

    def _correct(self, table, later, raw, since, to, forward=None):
        """
        THE correction of a read (see the module), for every path that reads: the
        rows whose image differs between standing at ``since`` (None: as read, the
        snapshot's own) and at ``to``, as (pk, before, after), None for absent.
        ``later``: the read's (seq, old, new) changes above the version it was read
        at, oldest first; ``raw``: {pk: row as read}, at least of the keys changed
        above ``since`` and ``to``. Per key, seq order is commit order, so a key's
        image at a version is the ``old`` image of its first change above it (None:
        its first change above it is an insert), and a key no change above it names
        is as read. ``to`` must be at most the read's cover (see ``install_ahead``);
        ``forward`` ({pk: image or None}: commits after ``to``, applied over it) then
        moves the rows on past it.
        """
        pk_of = self.pk
        images = []
        for version in (since, to):
            touched = {}
            if version is not None:
                for seq, old, new in later:
                    if seq <= version:
                        continue
                    if old is not None:
                        touched.setdefault(pk_of(table, old), old)
                    if new is not None:
                        touched.setdefault(pk_of(table, new), None)
            images.append(touched)
        was, now = images
        moves = []
        for pk in {**was, **now, **(forward or {})}:
            before = was[pk] if pk in was else raw.get(pk, _UNKNOWN if forward else None)
            after = now[pk] if pk in now else raw.get(pk)
            copy = pk in now
            if forward and pk in forward:
                after, copy = forward[pk], True
            if before is not after:
                moves.append((pk, before, after if after is None or not copy else dict(after)))
        return moves

    def _evict(self, keep):
        """Forget the least recently read partitions while more than ``max_rows`` are held."""
        resident = self._resident
        while self.rows_held > self.max_rows and len(resident) > 1:
            entry = next(iter(resident))
            if entry == keep:
                resident.move_to_end(entry)
                continue
            self._forget(entry)

    def _forget(self, entry):
        table, columns, key = entry
        del self._resident[entry]
        if columns is None:  # a run
            run = self._runs.get(table, {}).pop(key, None)
            if run is not None:
                self.rows_held -= len(run.rows)
            return
        bucket = self._lookups.get(table, {}).get(columns, {}).pop(key, None)
        if bucket is not None:
            self.rows_held -= len(bucket)
        if len(columns) == 1:
            self._orders.get(table, {}).get(columns[0], {}).pop(key, None)


def _same_start(start, exclusive, origin):
    if origin is None:
        return start is None
    return start is origin[0] and exclusive == origin[1]


def _after(k, bound, exclusive):
    return k > bound or (not exclusive and k == bound)


def _unorder(by_key, key, row):
    for ordered in by_key.get(key, {}).values():
        ordered.remove(row)
