"""Public test helpers for projects that use rindle."""

import contextlib

from django.db import connections

from .engine.capture import OUTBOX
from .engine.engine import Engine


@contextlib.contextmanager
def fresh_runtime(using="default"):
    """
    ``with fresh_runtime() as runtime:`` — the block runs as a fresh process: every
    runtime of this process (engine, hub, ledger, tick, quota and grant caches; see
    ``rindle_app.runtime``) is shut down first, and again when the block ends, so
    nothing a test started outlives it. Ledgers are dropped unflushed, as a crash
    drops them: flush in the test what it must see stored. Yields the runtime of
    ``using``; its parts start on first use, as in a server. As a pytest fixture:
    ``rindle_runtime`` (``pytest_plugins = ["rindle_app.pytest_plugin"]``).
    """
    from . import runtime as runtimes

    runtimes.shutdown(flush=False)
    try:
        yield runtimes.get_runtime(using)
    finally:
        runtimes.shutdown(flush=False)


def outbox_high_water(using="default"):
    """The greatest outbox seq committed so far (0 when empty)."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
        return cursor.fetchone()[0]


def publish_watermark(using="default", timeout=5.0):
    """
    Publish the outbox watermark now, as a watermark step does, and return it: the
    greatest seq no open transaction can still commit below (waiting up to
    ``timeout`` seconds for the capturing transactions in flight), raised into the
    stream's state row. Readers tail only up to it, so a test that reads without a
    running hub (``LiveQueries``, ``read_query``) calls this where a watermarker
    would have run. On SQLite the watermark is always the greatest seq: it only
    makes sure the state row exists. None (nothing published) when a capturing
    transaction stayed open past ``timeout``.
    """
    from django.db import transaction

    from .stream import fence, state

    conn = connections[using]
    if conn.vendor != "postgresql":
        with conn.cursor() as cursor:
            return state.read(cursor).safe_seq
    seq = fence.safe_seq(using, timeout)
    if seq is None:
        return None
    with transaction.atomic(using), conn.cursor() as cursor:
        return state.publish(cursor, seq)


def outbox_since(seq, using="default"):
    """Captured events after ``seq`` as dicts, oldest first."""
    from .models import ChangeEvent

    return [
        {"seq": e.seq, "table": e.table, "op": e.op, "pk": e.key, "old": e.old, "new": e.new}
        for e in ChangeEvent.objects.using(using).filter(seq__gt=seq).order_by("seq")
    ]


class running:
    """``with running() as engine:`` — a fresh engine, closed (drained) on exit."""

    def __init__(self, using="default"):
        self.engine = Engine(using)

    def __enter__(self):
        return self.engine.start()

    def __exit__(self, *exc):
        self.engine.close()


class hold_writer:
    """
    ``with hold_writer(engine):`` — the writer thread is busy until the block ends, so
    requests submitted inside it queue up and commit together (a group commit) after.
    """

    def __init__(self, engine, timeout=10):
        self.engine = engine
        self.timeout = timeout

    def __enter__(self):
        import threading

        entered, self._release = threading.Event(), threading.Event()

        def gate(tx):
            entered.set()
            self._release.wait(self.timeout)

        self._request = self.engine.submit(gate)
        if not entered.wait(self.timeout):
            raise TimeoutError("the writer did not pick up the gate")
        return self

    def __exit__(self, *exc):
        self._release.set()
        self.engine.wait(self._request)


# --- the IVM oracle: what a maintained view must equal, computed from scratch ------------


class IndexedSource:
    """
    ``ivm.evaluate.ListSource`` semantics (children whose correlated fields equal the
    parent's under the comparator; null never matches), found through a hash index
    built once per snapshot instead of a scan per parent, so the oracle stays cheap on
    benchmark-sized tables. ``rows``: ``{table: [row dict, ...]}``.
    """

    def __init__(self, rows):
        from .ivm.store import index_key

        self.rows = rows
        self._index_key = index_key
        self._indexes = {}

    def lookup(self, table, columns, key):
        """The rows of ``table`` whose ``columns`` hold ``key`` (an ``index_key``)."""
        if key is None:
            return []
        index = self._indexes.get((table, columns))
        if index is None:
            index = {}
            for row in self.rows.get(table, ()):
                k = self._index_key(row, columns)
                if k is not None:
                    index.setdefault(k, []).append(row)
            self._indexes[(table, columns)] = index
        return index.get(key, [])

    def children(self, related, parent):
        key = self._index_key(parent, related.parent_fields)
        return self.lookup(related.subquery.table, related.child_fields, key)


def row_set(pairs):
    """(table, row) pairs as a set of (table, canonical JSON): footprints compared by content."""
    import json

    return {(t, json.dumps(r, sort_keys=True, default=str)) for t, r in pairs}


def reference_view(query, source, schema):
    """
    ``(result, rendered)``: the reference evaluator's view of ``query`` over ``source``
    (an ``IndexedSource``, or ``{table: rows}``), and the rows it renders as a
    ``row_set`` (what a maintained view's footprint must hold). A root
    ``column = literal`` conjunct picks the candidates by index (the rows for which
    the condition could hold at all); ``Evaluator.select`` still filters them, so the
    result is ``ivm.evaluate.evaluate``'s.
    """
    from .ivm.ast import And, Simple
    from .ivm.evaluate import Evaluator
    from .ivm.store import index_key

    if not isinstance(source, IndexedSource):
        source = IndexedSource(source)
    evaluator = Evaluator(source, schema)
    seen = []
    evaluator.visit = lambda table, row, *_key: seen.append((table, row))
    where = query.where
    conditions = where.conditions if isinstance(where, And) else (where,)
    candidates = source.rows.get(query.table, ())
    for c in conditions:
        if isinstance(c, Simple) and c.op == "=" and c.value is not None:
            key = index_key({c.column: c.value}, (c.column,))
            candidates = source.lookup(query.table, (c.column,), key)
            break
    if query.aggregate is not None:  # a root aggregate is one scalar
        return evaluator.aggregate(query, candidates), row_set(seen)
    nodes = evaluator.level(query, candidates)
    if query.one:
        return (nodes[0] if nodes else None), row_set(seen)
    return nodes, row_set(seen)


def store_differences(store, fresh):
    """
    Where a live store disagrees with ``fresh`` ({table: rows} read at the store's
    version), as messages: each table a ``MemoryStore`` holds, or each partition a
    ``PartitionStore`` holds, against the same rows picked from ``fresh``.
    """
    from .ivm.store import index_key

    problems = []
    for table, columns, key, held in store.holdings():
        if table not in fresh:
            continue
        want = {
            store.pk(table, r): r
            for r in fresh[table]
            if columns is None or index_key(r, columns) == key
        }
        if held != want:
            missing, extra = len(set(want) - set(held)), len(set(held) - set(want))
            where = table if columns is None else f"{table} partition {columns}"
            problems.append(
                f"store {where} differs from the database ({missing} missing, "
                f"{extra} extra, {len(want)} rows)"
            )
    return problems


def fresh_rows(engine, tables=None):
    """``(version, {table: rows})``: a new snapshot of ``engine``'s tables (or ``tables``)."""
    from .stream.reader import snapshot

    return snapshot(engine.using, list(engine.tables) if tables is None else tables)


def fresh_result(engine, query):
    """``query``'s result computed from scratch on a new snapshot of ``engine``'s database."""
    _version, rows = fresh_rows(engine)
    return reference_view(query, rows, engine.tables)[0]
