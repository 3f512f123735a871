#!/usr/bin/env python
"""
Incremental view maintenance (IVM) against re-querying, on the workloads of the
research note ``ivm-anchors.md`` §6, scaled down for a 2-core machine.

    .venv/bin/python bench/ivm.py [--quick] [--only w1,w2,ui,mem] [--profile] [--seed N]

One run, one fresh database: a temporary SQLite file, set as DATABASE_URL before
``django.setup()``, migrated in this process, deleted afterwards. The engine is
started with ``rindle_app.engine.get_engine()`` and every workload table is created
with ``engine.register_table(...)``, so its capture triggers feed the outbox like any
synced table. See bench/README.md ("bench/ivm.py").

Workloads (sizes are printed with the results):

- **W1**, top-k family: ``post WHERE board = ? ORDER BY score DESC LIMIT 20`` bound
  for 150 of 200 boards, 1,000 subscribers; a script of single-row commits (score
  updates, inserts into and out of the top range, deletes incl. the bound row,
  edits across the bound) then a tail of multi-row batch commits.
- **W2**, issue list: ``w2_issue WHERE project_id = ? AND closed = false AND
  EXISTS(label name = 'bug') ORDER BY updated_at DESC LIMIT 50`` with ``one(author)``,
  ``comments ORDER BY created_at DESC LIMIT 3`` and ``count(comments)``; a mixed
  script (comments, labels, bumps, close/reopen, renames, new issues).
- **UI**, the original's "realistic UI views" over the demo tables (issue, user,
  comment): median ms per add+remove pair for six views.
- **MEM**: tracemalloc bytes per idle shared query and per attached subscriber.

Variants of W1 and W2, each from the same restored seed state, on the same script:

- **L** (commit-only limit): the script through ``engine.write``, nothing maintained.
- **IVM**: ``engine.write`` then ``LiveQueries.poll()`` after EVERY commit (the outbox
  read plus ``Catalog.commit``), then the fan-out: the ops of each changed query
  are JSON-encoded once and counted as delivered to each of its subscribers.
- **IVM, poll/10**: the same, but polling (and fanning out) after every 10th commit.
- **IVM through the hub**, as ``realtime.hub.Hub`` runs it on SQLite: the commit
  listener runs the step (poll + fan-out) on the committing thread when the hub's
  lock is free, else wakes a hub thread; **every step on the hub thread** is the
  same with the thread woken for every commit.
- **IVM in a second process** (bench/ivm_follower.py): the views are kept by a
  process that makes none of the writes, tailing the outbox every ``POLL_INTERVAL``
  as a Daphne process does, while this process commits back to back as in L.
- **Inline floor** (W1 only): a hand-written W1-only pipeline on the writing thread
  (json.loads, bisect, json.dumps), no rindle IVM code: the least any Python IVM on
  that thread could cost.
- **B1**: after each commit, every subscriber re-runs its query in plain SQL (Django
  cursor) and diffs it with its last result; capped to a prefix of the script.
- **B2**: the same once per distinct (family, binding), fanned out to its subscribers.

After every IVM run the CORRECTNESS GATE compares every maintained view with (a) the
reference evaluator over a fresh snapshot read from the database, (b) a hand-written
SQL re-query, and (c, on a sample) ``evaluate(query, rows, schema)`` over the store
rows; it also checks the store against the database and each view's footprint. A
first, untimed "checked pass" of the IVM also compares the touched views with SQL
after every commit and replays each view's ops into a client replica. A failed gate
prints loudly and the exit status is 3; targets only print PASS/FAIL (exit 0).
"""

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
perf = time.perf_counter

SIZES = {
    "default": {
        "w1_posts": 20_000,
        "w1_boards": 200,
        "w1_bound": 150,
        "w1_window": 20,
        "w1_subs": 1_000,
        "w1_commits": 2_000,
        "w1_batches": 20,
        "w1_batch_rows": 50,
        "w1_repeats": 3,
        "w1_b2_cap": 400,
        "w1_b1_cap": 200,
        "w2_users": 300,
        "w2_projects": 20,
        "w2_issues": 3_000,
        "w2_comments": 20_000,
        "w2_window": 50,
        "w2_subs": 500,
        "w2_commits": 1_000,
        "w2_repeats": 3,
        "w2_b2_cap": 150,
        "w2_b1_cap": 20,
        "ui_users": 1_000,
        "ui_issues": 10_000,
        "ui_comments": 50_000,
        "ui_pairs": 300,
        "ui_e2e_pairs": 40,
        "mem_subs": 10_000,
        "mem_queries": 60,
    },
    "quick": {
        "w1_posts": 20_000,
        "w1_boards": 200,
        "w1_bound": 150,
        "w1_window": 20,
        "w1_subs": 1_000,
        "w1_commits": 400,
        "w1_batches": 5,
        "w1_batch_rows": 50,
        "w1_repeats": 1,
        "w1_b2_cap": 100,
        "w1_b1_cap": 25,
        "w2_users": 300,
        "w2_projects": 20,
        "w2_issues": 3_000,
        "w2_comments": 20_000,
        "w2_window": 50,
        "w2_subs": 500,
        "w2_commits": 250,
        "w2_repeats": 1,
        "w2_b2_cap": 30,
        "w2_b1_cap": 4,
        "ui_users": 1_000,
        "ui_issues": 10_000,
        "ui_comments": 50_000,
        "ui_pairs": 60,
        "ui_e2e_pairs": 10,
        "mem_subs": 5_000,
        "mem_queries": 20,
    },
}

TARGETS = {
    "w1_ivm_vs_limit": 0.8,  # W1: IVM >= 0.8 x the commit-only limit (the issue)
    "w1_ivm_vs_b1": 100.0,  # W1: IVM >= 100 x B1 at 1,000 subscribers (the issue)
    "w2_ivm_vs_limit": 0.5,  # W2: IVM >= 0.5 x L_commit (ivm-anchors.md §6, "realistic")
    "ui_pair_ms": 0.25,  # UI views: <= 0.25 ms per add+remove pair (the issue)
}
ORIGINAL_PAIR_MS = (0.07, 0.13)  # the Rust original (rindle-original.md §5.3)
WORKLOAD_KEYS = ("w1", "w2", "ui", "mem")


class BenchError(RuntimeError):
    pass


class GateFailure(RuntimeError):
    pass


# --- command line ----------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="rindle IVM against re-querying (SQLite).")
    p.add_argument("--quick", action="store_true", help="short run (< 40 s): fewer commits")
    p.add_argument("--seed", type=int, default=20261129, help="RNG seed (printed)")
    p.add_argument("--only", default=None, help="subset of: " + ",".join(WORKLOAD_KEYS))
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the measurements, run W1 and W2 IVM once more under cProfile (the W1 "
        "batch tail separately) and print the top functions; the measured figures are not "
        "profiled",
    )
    p.add_argument("--json", default=None, help="results file (default bench/results/...)")
    args = p.parse_args(argv)
    args.sizes = dict(SIZES["quick" if args.quick else "default"])
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        unknown = [w for w in wanted if w not in WORKLOAD_KEYS]
        if unknown:
            p.error(f"unknown workload(s) {unknown}; choose from {list(WORKLOAD_KEYS)}")
        args.workloads = [w for w in WORKLOAD_KEYS if w in wanted]
    else:
        args.workloads = list(WORKLOAD_KEYS)
    return args


# --- small helpers -----------------------------------------------------------------------


_T0 = [time.perf_counter()]


def log(message):
    """A progress line, stamped with the seconds since the run started."""
    print(f"[{time.perf_counter() - _T0[0]:6.1f}s] {message}", flush=True)


def median(values):
    return statistics.median(values) if values else None


def pct(values, q):
    """The q-quantile (0..1) of ``values`` by nearest rank."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def rate(n, seconds):
    return n / seconds if seconds > 0 else float("inf")


def fmt_rate(x):
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def fmt_ratio(x):
    return "-" if x is None else f"{x:,.0f}x" if x >= 100 else f"{x:.2f}x"


def weights(n, s):
    """Zipf-like weights 1/rank**s for n items."""
    return [1.0 / (i + 1) ** s for i in range(n)]


def q(name):
    return '"' + name + '"'


def dumps(obj):
    return json.dumps(obj, separators=(",", ":"), default=str)


def apply_ops(ops, tx):
    """Run one commit's ops with the engine's row helpers (one transaction)."""
    for op in ops:
        kind = op[0]
        if kind == "i":
            tx.insert(op[1], op[2])
        elif kind == "u":
            tx.update(op[1], op[2], op[3])
        else:
            tx.delete(op[1], op[2])


def diff_nodes(old, new, pk):
    """Ops turning result ``old`` into ``new`` (rows matched on ``pk``), as B1/B2 emit."""
    before = {n[pk]: n for n in old}
    after = {n[pk]: n for n in new}
    ops = [{"op": "remove", "id": k} for k in before if k not in after]
    for k, n in after.items():
        was = before.get(k)
        if was is None:
            ops.append({"op": "add", "row": n})
        elif was != n:
            ops.append({"op": "edit", "row": n})
    if not ops and old != new:
        ops.append({"op": "order", "ids": list(after)})
    return ops


# --- the oracle ---------------------------------------------------------------------------


class IndexedSource:
    """
    ``evaluate.ListSource`` semantics (children whose correlated fields equal the
    parent's under the comparator; null never matches), found through a hash index
    built once per snapshot instead of a scan per parent.
    """

    def __init__(self, rows):
        from rindle_app.ivm.store import index_key

        self.rows = rows
        self._index_key = index_key
        self._indexes = {}

    def lookup(self, table, columns, key):
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
    return {(t, json.dumps(r, sort_keys=True, default=str)) for t, r in pairs}


def oracle(query, source, schema):
    """
    The reference evaluator's view of ``query`` over ``source``'s rows, and the rows it
    renders (as a ``row_set``: what the view's footprint must hold). A root
    ``column = literal`` conjunct picks the candidates by index (the rows for which
    ``holds`` could be true at all); ``Evaluator.select`` still filters them.
    """
    from rindle_app.ivm.ast import And, Simple
    from rindle_app.ivm.evaluate import Evaluator
    from rindle_app.ivm.store import index_key

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
    nodes = evaluator.level(query, candidates)
    if query.one:
        return (nodes[0] if nodes else None), row_set(seen)
    return nodes, row_set(seen)


# --- refill instrumentation (checked passes only) ----------------------------------------


class RefillCounter:
    """
    Counts, while installed, the window scans of ``View._scan`` (hydration: after is
    None; refill: after a bound), the root rows each examined, and the calls of
    ``View.apply`` (how many views a commit was routed to), by wrapping the class
    attributes; removed before any timed run.
    """

    def __init__(self):
        self.stats = Counter()

    def __enter__(self):
        from rindle_app.ivm.evaluate import Evaluator
        from rindle_app.ivm.view import View

        self._view, self._evaluator = View, Evaluator
        self._scan, self._holds = View._scan, Evaluator.holds
        stats, orig_scan, orig_holds = self.stats, self._scan, self._holds
        state = {"where": None, "kind": None}

        def scan(view, after, need):
            kind = "hydrate" if after is None else "refill"
            stats[f"{kind}_scans"] += 1
            outer = state["where"], state["kind"]
            state["where"], state["kind"] = view.query.where, kind
            try:
                for row in orig_scan(view, after, need):
                    stats[f"{kind}_rows_out"] += 1
                    state["where"], state["kind"] = outer
                    yield row
                    state["where"], state["kind"] = view.query.where, kind
            finally:
                state["where"], state["kind"] = outer

        def holds(evaluator, condition, row):
            if condition is state["where"] and condition is not None:
                stats[f"{state['kind']}_rows_examined"] += 1
            return orig_holds(evaluator, condition, row)

        orig_apply = self._apply = View.apply

        def apply(view, changes, affected=None):
            ops = orig_apply(view, changes, affected)
            stats["apply_calls"] += 1
            stats["apply_calls_with_ops"] += bool(ops)
            return ops

        View._scan, Evaluator.holds, View.apply = scan, holds, apply
        return self

    def __exit__(self, *exc):
        self._view._scan, self._evaluator.holds = self._scan, self._holds
        self._view.apply = self._apply
        return False


def commit_total(t):
    """
    Seconds of one IVM commit from its (write, poll, Catalog.commit, fan-out) times.
    ``Catalog.commit`` runs inside the poll, so it is not added again (until this was
    fixed, the IVM rates counted it twice).
    """
    write, poll, _catalog_commit, fanout = t
    return write + poll + fanout


# --- a workload with a family, a write script and the four variants ----------------------


class FamilyWorkload:
    """
    Base of W1 and W2: tables seeded once, a family bound for some bindings, subscribers
    spread over them, and a write script replayed from the restored seed state by each
    variant. Subclasses define the tables, the seed, the script and the SQL re-query.
    """

    key = None
    family = None
    node_pk = "id"

    def __init__(self, bench, rng):
        self.bench = bench
        self.engine = bench.engine
        self.sz = bench.sizes
        self.rng = rng
        self.seed_rows = {}  # table -> {pk tuple: row dict}
        self.touched = defaultdict(set)  # table -> {pk tuple} written by any script
        self.subscribers = {}  # subscriber id -> binding
        self.bindings = []
        self.template = None
        self.stats = {}

    # --- tables -------------------------------------------------------------------------

    TABLES = {}  # name -> (columns, pk columns, wire types)
    INDEXES = []

    def create_tables(self):
        for name, (columns, pk, types) in self.TABLES.items():
            self.engine.register_table(name, columns, [columns.index(c) for c in pk], types)
        for sql in self.INDEXES:
            self.engine.write(lambda tx, sql=sql: tx.execute(sql))

    def insert_sql(self, table):
        columns = self.TABLES[table][0]
        marks = ", ".join(["%s"] * len(columns))
        return f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) VALUES ({marks})"

    def pk_of(self, table, row):
        return tuple(row[c] for c in self.TABLES[table][1])

    def load_seed(self, rows_by_table):
        """Insert the seed (one transaction) and remember it for restores."""
        for table, rows in rows_by_table.items():
            self.seed_rows[table] = {self.pk_of(table, r): r for r in rows}

        def seed(tx):
            for table, rows in rows_by_table.items():
                columns = self.TABLES[table][0]
                tx.cursor.executemany(
                    self.insert_sql(table), [[r[c] for c in columns] for r in rows]
                )

        self.engine.write(seed)

    def restore(self):
        """Put every row any script touched back to its seed value; verify the tables."""

        def fn(tx):
            for table, pks in self.touched.items():
                pk_cols = self.TABLES[table][1]
                where = " AND ".join(f"{q(c)} = %s" for c in pk_cols)
                tx.cursor.executemany(f"DELETE FROM {q(table)} WHERE {where}", list(pks))
                seed = self.seed_rows[table]
                columns = self.TABLES[table][0]
                again = [[seed[pk][c] for c in columns] for pk in pks if pk in seed]
                if again:
                    tx.cursor.executemany(self.insert_sql(table), again)

        self.engine.write(fn)
        self.verify_seed_state()

    def verify_seed_state(self):
        from django.db import connection

        with connection.cursor() as cursor:
            for table, (columns, _pk, _types) in self.TABLES.items():
                cols = ", ".join(q(c) for c in columns)
                cursor.execute(f"SELECT {cols} FROM {q(table)}")
                got = {
                    self.pk_of(table, dict(zip(columns, r))): tuple(r) for r in cursor.fetchall()
                }
                want = {
                    k: tuple(_db_value(r[c]) for c in columns)
                    for k, r in self.seed_rows[table].items()
                }
                if got != want:
                    raise BenchError(f"{self.key}: restoring {table} did not give the seed back")

    # --- subscribers ----------------------------------------------------------------------

    def spread_subscribers(self, n, weight):
        """One subscriber per binding, the rest by ``weight(binding)``."""
        subs = list(self.bindings)
        w = [weight(b) for b in self.bindings]
        subs += self.rng.choices(self.bindings, w, k=max(0, n - len(self.bindings)))
        self.subscribers = {f"{self.key}-s{i:05d}": b for i, b in enumerate(subs)}

    def by_binding(self):
        out = defaultdict(list)
        for sub, b in self.subscribers.items():
            out[b].append(sub)
        return out

    # --- the live queries -----------------------------------------------------------------

    def start_live(self):
        from rindle_app.ivm.catalog import FamilyTemplate
        from rindle_app.ivm.live import LiveQueries

        t0 = perf()
        # As in the server: the engine hands each commit's outbox rows to the live
        # queries in process (read in its own transaction), so a poll reads nothing.
        live = LiveQueries(self.engine, handoff=True).start()
        t1 = perf()
        template = FamilyTemplate(self.template)
        keys = {b: live.catalog.bind(self.family, template, b).key for b in self.bindings}
        self.live_keys = keys
        t2 = perf()
        for sub, b in self.subscribers.items():
            live.catalog.attach(keys[b], sub)
        t3 = perf()
        self.stats["start_s"] = t1 - t0
        self.stats["bind_ms_per_binding"] = (t2 - t1) * 1e3 / max(1, len(self.bindings))
        self.stats["attach_us_per_subscriber"] = (t3 - t2) * 1e6 / max(1, len(self.subscribers))
        return live, keys

    # --- variants ---------------------------------------------------------------------------

    def run_limit(self, script):
        """L: the script through engine.write, nothing maintained. Per-commit seconds."""
        engine, times = self.engine, []
        gc.collect()
        for ops in script:
            t0 = perf()
            engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
            times.append(perf() - t0)
        return times

    def run_ivm(self, scripts, check=None, profile=None, poll_every=1):
        """
        IVM: engine.write, then LiveQueries.poll() and the fan-out after each commit
        (after every ``poll_every``-th commit and the last one of each script if > 1).
        Returns per script a list of (write, poll, catalog.commit, fanout) seconds,
        plus counters. ``check`` (a Checker) makes this an untimed checked pass.
        """
        live, keys = self.start_live()
        catalog, engine = live.catalog, self.engine
        binding_of = {k: b for b, k in keys.items()}
        spent = [0.0]
        real_commit = catalog.commit

        def timed_commit(version, changes):
            t = perf()
            try:
                return real_commit(version, changes)
            finally:
                spent[0] += perf() - t

        catalog.commit = timed_commit
        counts = Counter()
        changed = []  # per commit: bindings whose ops were not empty
        out = []
        if check is not None:
            check.begin(live, keys)
        gc.collect()
        profile = profile or {}  # {script index: cProfile.Profile} enabled during that script
        i = -1  # the commit's index over all scripts
        no_poll = (0, {}, [])
        for s_index, script in enumerate(scripts):
            if s_index in profile:
                profile[s_index].enable()
            times = []
            wall = perf()
            for j, ops in enumerate(script):
                i += 1
                spent[0] = 0.0
                before = check.before(i) if check is not None else None
                t0 = perf()
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
                t1 = perf()
                if poll_every == 1 or (j + 1) % poll_every == 0 or j + 1 == len(script):
                    _version, outputs, faults = live.poll()
                else:
                    _version, outputs, faults = no_poll
                t2 = perf()
                delivered = 0
                for key, key_ops in outputs.items():
                    message = dumps(key_ops)
                    n = len(catalog.queries[key].subscribers)
                    delivered += n
                    counts["bytes"] += n * len(message)
                t3 = perf()
                times.append((t1 - t0, t2 - t1, spent[0], t3 - t2))
                counts["messages"] += delivered
                counts["views_changed"] += len(outputs)
                counts["ops"] += sum(len(o) for o in outputs.values())
                changed.append(frozenset(binding_of.get(k) for k in outputs))
                if faults:
                    counts["faults"] += len(faults)
                    raise GateFailure(f"{self.key}: queries faulted: {faults}")
                if check is not None:
                    check.after(i, ops, outputs, before)
            wall = perf() - wall
            if s_index in profile:
                profile[s_index].disable()
            # The parts cannot add up to more than the loop took (a double count would).
            if sum(commit_total(t) for t in times) > wall:
                raise GateFailure(f"{self.key}: per-commit times exceed the loop's wall time")
            out.append(times)
        catalog.commit = real_commit
        live.stop()  # no handoff read in the other variants' commits
        return out, counts, changed, live

    def run_ivm_hub(self, script, inline=True):
        """
        IVM through a hub, as ``realtime.hub.Hub`` runs it: this thread commits the
        script through ``engine.write`` back to back. After each commit, the commit
        listener runs ``LiveQueries.poll()`` and the fan-out (one step) right there
        when the hub's lock is free, as the server does on SQLite (``inline``);
        otherwise, and always when ``inline`` is False (the server before it did
        this, and on Postgres), it wakes a hub thread that runs the step. A step
        applies every commit since the last one, so a busy hub coalesces. Returns
        (seconds from the first write to the last commit's delta ready, per commit
        commit->ready latency, counters (steps that applied commits, and how many
        of those ran on the committing thread), live).
        """
        live, _keys = self.start_live()
        catalog, engine = live.catalog, self.engine
        wake, stop, lock = threading.Event(), threading.Event(), threading.Lock()
        ready = []  # (version, perf()) after each step's fan-out
        counts = Counter()
        failure = []

        def step():  # under ``lock``
            version, outputs, faults = live.poll()
            for key, key_ops in outputs.items():
                message = dumps(key_ops)
                n = len(catalog.queries[key].subscribers)
                counts["messages"] += n
                counts["bytes"] += n * len(message)
            if not ready or version > ready[-1][0]:
                counts["polls"] += 1  # a step that applied commits
                ready.append((version, perf()))
            if faults:
                raise GateFailure(f"{self.key}: queries faulted: {faults}")

        def hub():
            try:
                while True:
                    wake.wait()
                    wake.clear()
                    with lock:
                        step()
                    if stop.is_set() and live.version >= last[0]:
                        return
            except BaseException as exc:  # reported by the committing thread
                failure.append(exc)

        def committed(cv):
            commits.append((cv, perf()))  # right after the COMMIT, before any step
            if inline and lock.acquire(blocking=False):
                try:
                    step()
                    counts["inline"] += 1
                    return
                finally:
                    lock.release()
            wake.set()

        last, commits = [None], []  # commits: (cv, perf()) as each commit's listener runs
        engine.add_commit_listener(committed)
        thread = threading.Thread(target=hub, name="bench-hub", daemon=True)
        gc.collect()
        thread.start()
        t_start = perf()
        try:
            for ops in script:
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
        finally:
            engine.remove_commit_listener(committed)
        last[0] = commits[-1][0]
        stop.set()
        wake.set()
        thread.join(60)
        live.stop()
        if failure:
            raise failure[0]
        if thread.is_alive() or live.version < last[0]:
            raise GateFailure(f"{self.key}: the hub did not catch up")
        elapsed = ready[-1][1] - t_start
        latencies, j = [], 0
        for cv, t in commits:
            while ready[j][0] < cv:
                j += 1
            latencies.append(ready[j][1] - t)
        return elapsed, latencies, counts, live

    def run_ivm_process(self, script):
        """
        IVM in a second process (bench/ivm_follower.py), as a Daphne process keeps the
        views while other processes make the writes: it tails the outbox every
        ``POLL_INTERVAL`` and fans out, on the other core, while this process commits
        the script back to back through ``engine.write``, as in L. Returns (seconds
        from the first write to the last commit's delta ready there, the writes'
        seconds, per commit commit->ready latency, the follower's report).
        """
        config = {
            "database_url": os.environ["DATABASE_URL"],
            "tables": list(self.TABLES),
            "template": self.template,
            "family": self.family,
            "bindings": self.bindings,
            "subscribers": list(self.subscribers.items()),
        }
        path = Path(tempfile.mkdtemp(prefix="rindle-bench-follower-")) / "config.json"
        path.write_text(json.dumps(config))
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.ivm_follower", str(path)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = child.stdout.readline()
            if not line.startswith("ready"):
                raise BenchError(f"{self.key}: the follower process did not start ({line!r})")
            engine, commits = self.engine, []
            gc.collect()
            t_start = perf()
            for ops in script:
                cv = engine.write(lambda tx, ops=ops: apply_ops(ops, tx)).cv
                commits.append((cv, perf()))
            written = perf() - t_start
            child.stdin.write(f"{commits[-1][0]}\n")
            child.stdin.flush()
            line = child.stdout.readline()
            if child.wait(60) != 0 or not line:
                raise BenchError(f"{self.key}: the follower process failed")
        finally:
            if child.poll() is None:
                child.kill()
            shutil.rmtree(path.parent, ignore_errors=True)
        report = json.loads(line)
        ready = report["ready"]
        latencies, j = [], 0
        for cv, t in commits:
            while ready[j][0] < cv:
                j += 1
            latencies.append(ready[j][1] - t)
        return ready[-1][1] - t_start, written, latencies, report

    def run_requery(self, script, per, cap):
        """
        B1 (per="subscriber") / B2 (per="binding"): after each commit re-run the SQL of
        each subscriber / distinct binding, diff it with the last result, emit if it
        changed. Returns per-commit seconds, counters and the changed bindings.
        """
        from django.db import connection

        engine = self.engine
        groups = self.by_binding()
        if per == "subscriber":
            askers = [(sub, b, 1) for sub, b in self.subscribers.items()]
        else:
            askers = [(b, b, len(groups[b])) for b in self.bindings]
        counts, changed, times = Counter(), [], []
        with connection.cursor() as cursor:
            last = {who: self.requery(cursor, b) for who, b, _n in askers}
            gc.collect()
            for ops in script[:cap]:
                t0 = perf()
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
                hit = set()
                for who, b, fanout in askers:
                    now = self.requery(cursor, b)
                    if now != last[who]:
                        message = dumps(diff_nodes(last[who], now, self.node_pk))
                        counts["messages"] += fanout
                        counts["bytes"] += fanout * len(message)
                        last[who] = now
                        hit.add(b)
                times.append(perf() - t0)
                changed.append(frozenset(hit))
        counts["queries_per_commit"] = len(askers)
        return times, counts, changed

    # --- the gate ---------------------------------------------------------------------------

    def gate(self, live, keys, label, literal=0):
        """Every view against a fresh snapshot (evaluator), a SQL re-query and a sample."""
        t0 = perf()
        catalog = live.catalog
        tables = [self.engine.tables.get(t) for t in self.TABLES]
        version, fresh, failures = self._fresh(tables, catalog.version)
        store = catalog.store
        for t in tables:
            want = {store.pk(t.name, r): r for r in fresh[t.name]}
            got = {pk: r for pk, r in ((store.pk(t.name, r), r) for r in store.rows(t.name))}
            if got != want:
                missing = len(set(want) - set(got))
                extra = len(set(got) - set(want))
                failures.append(
                    f"store {t.name} differs from the database ({missing} missing, "
                    f"{extra} extra, {len(want)} rows)"
                )
        views = []
        for b in self.bindings:
            view = catalog.queries[keys[b]].view
            views.append((b, catalog.queries[keys[b]].query, view.result(), view.footprint_rows()))
        self._check_views(views, fresh, failures)
        sample = []
        if literal:
            from rindle_app.ivm.evaluate import evaluate

            rows = {t.name: list(store.rows(t.name)) for t in tables}
            sample = self.rng.sample(self.bindings, min(literal, len(self.bindings)))
            for b in sample:
                shared = catalog.queries[keys[b]]
                if shared.view.result() != evaluate(shared.query, rows, self.engine.tables):
                    failures.append(f"{self.family}[{b!r}]: view != evaluate() over the store")
        return self._record_gate(label, failures, len(sample), t0)

    def gate_follower(self, report, label):
        """The gate for views kept in another process: its results and footprints, as sent."""
        from rindle_app.ivm.ast import parse
        from rindle_app.ivm.catalog import FamilyTemplate

        t0 = perf()
        tables = [self.engine.tables.get(t) for t in self.TABLES]
        _version, fresh, failures = self._fresh(tables, report["version"])
        template, views = FamilyTemplate(self.template), []
        for b in self.bindings:
            sent = report["views"].get(json.dumps(b))
            if sent is None:
                failures.append(f"{self.family}[{b!r}]: no view in the follower's report")
                continue
            query = parse(template.instantiate(b), self.engine.tables)
            views.append((b, query, sent["result"], [tuple(p) for p in sent["footprint"]]))
        self._check_views(views, fresh, failures)
        return self._record_gate(label, failures, 0, t0)

    def _fresh(self, tables, version):
        """A fresh snapshot of the workload's tables, and a failure if not at ``version``."""
        from rindle_app.stream.reader import snapshot

        at, fresh = snapshot(self.engine.using, tables)
        failures = []
        if at != version:
            failures.append(f"views at version {version}, database at {at}")
        return at, fresh, failures

    def _check_views(self, views, fresh, failures):
        """(binding, query, result, footprint pairs): each against the evaluator and SQL."""
        from django.db import connection

        source, schema = IndexedSource(fresh), self.engine.tables
        with connection.cursor() as cursor:
            for b, query, got, footprint in views:
                want, seen = oracle(query, source, schema)
                if got != want:
                    failures.append(
                        f"{self.family}[{b!r}]: view != reference evaluator "
                        f"{_first_difference(got, want)}"
                    )
                sql = self.requery(cursor, b)
                if got != sql:
                    failures.append(
                        f"{self.family}[{b!r}]: view != SQL re-query {_first_difference(got, sql)}"
                    )
                shown = row_set(footprint)
                if shown != seen:
                    failures.append(
                        f"{self.family}[{b!r}]: footprint != rendered rows "
                        f"({len(shown)} vs {len(seen)})"
                    )

    def _record_gate(self, label, failures, sample, t0):
        result = {
            "label": label,
            "views": len(self.bindings),
            "literal_evaluate_sample": sample,
            "seconds": round(perf() - t0, 3),
            "failures": failures[:20],
            "failure_count": len(failures),
            "pass": not failures,
        }
        self.bench.gates.append({"workload": self.key, **result})
        if failures:
            print(f"\n!!!!!!!! CORRECTNESS GATE FAILED: {self.key} {label} !!!!!!!!")
            for f in failures[:20]:
                print(f"!!   {f}")
            print("!!!!!!!! the numbers of this workload are INVALID !!!!!!!!\n", flush=True)
        return result

    # --- running it all --------------------------------------------------------------------

    def run(self):
        sz, key = self.sz, self.key
        t_setup = perf()
        self.setup()
        script, tail = self.make_scripts()
        self.stats["setup_s"] = perf() - t_setup
        n = len(script)
        repeats = sz[f"{key}_repeats"]
        log(f"{key}: setup {self.stats['setup_s']:.1f}s; {n} commits + {len(tail)} batch commits")

        # 1. Checked pass (untimed, also the warm-up): after each commit the views of the
        #    touched bindings are compared with SQL, every view every 50 commits.
        checker = Checker(self)
        with RefillCounter() as refills:
            _times, _counts, changed_checked, live = self.run_ivm([script, tail], check=checker)
        self.stats["refills"] = dict(refills.stats)
        self.stats["checked"] = checker.summary()
        literal = self.LITERAL_SAMPLE if not self.bench.args.quick or key == "w1" else 0
        self.gate(live, self.live_keys, "checked pass", literal=literal)
        del live
        self.restore()
        log(f"{key}: checked pass done (untimed; per-commit SQL checks, gate)")

        # 2. Timed repeats of L and IVM, rotated.
        variants = ["limit", "ivm", "ivm10", "hub", "hubthread", "proc"]
        if hasattr(self, "run_floor"):
            variants.append("floor")
        samples = {v: [] for v in variants}
        detail = {v: [] for v in variants}
        ivm_counts = []
        for rep in range(repeats):
            turn = rep % len(variants)
            order = variants[turn:] + variants[:turn]
            for variant in order:
                if variant == "floor":
                    times = self.run_floor(script)
                    detail["floor"].append({"times": times})
                    samples["floor"].append(rate(n, sum(times)))
                elif variant == "proc":
                    elapsed, written, latencies, report = self.run_ivm_process(script)
                    self.gate_follower(report, f"repeat {rep + 1}, second process")
                    detail["proc"].append(
                        {
                            "latencies": latencies,
                            "polls": report["polls"],
                            "busy": report["busy"],
                            "written": written,
                            "poll_interval": report["poll_interval"],
                        }
                    )
                    samples["proc"].append(rate(n, elapsed))
                elif variant in ("hub", "hubthread"):
                    inline = variant == "hub"
                    elapsed, latencies, counts, live = self.run_ivm_hub(script, inline=inline)
                    label = "hub" if inline else "hub thread"
                    self.gate(live, self.live_keys, f"repeat {rep + 1}, {label}", literal=0)
                    del live
                    detail[variant].append(
                        {
                            "latencies": latencies,
                            "polls": counts["polls"],
                            "inline": counts["inline"],
                        }
                    )
                    samples[variant].append(rate(n, elapsed))
                elif variant == "limit":
                    times = self.run_limit(script)
                    tail_times = self.run_limit(tail)
                    detail["limit"].append({"times": times, "tail": tail_times})
                    samples["limit"].append(rate(n, sum(times)))
                elif variant == "ivm10":
                    (times,), _counts, _chg, live = self.run_ivm([script], poll_every=10)
                    self.gate(live, self.live_keys, f"repeat {rep + 1}, poll/10", literal=0)
                    del live
                    detail["ivm10"].append({"times": times})
                    samples["ivm10"].append(rate(n, sum(commit_total(t) for t in times)))
                else:
                    (times, tail_times), counts, _chg, live = self.run_ivm([script, tail])
                    self.gate(live, self.live_keys, f"repeat {rep + 1}", literal=0)
                    del live
                    detail["ivm"].append({"times": times, "tail": tail_times})
                    samples["ivm"].append(rate(n, sum(commit_total(t) for t in times)))
                    ivm_counts.append(counts)
                self.restore()
            log(
                f"{key}: repeat {rep + 1}/{repeats}: L {samples['limit'][-1]:,.0f}/s, "
                f"IVM {samples['ivm'][-1]:,.0f}/s, IVM poll/10 {samples['ivm10'][-1]:,.0f}/s, "
                f"IVM hub {samples['hub'][-1]:,.0f}/s, "
                f"IVM hub thread {samples['hubthread'][-1]:,.0f}/s, "
                f"IVM second process {samples['proc'][-1]:,.0f}/s"
                + (f", inline floor {samples['floor'][-1]:,.0f}/s" if samples.get("floor") else "")
            )

        # 3. Baselines, once each, on a prefix of the same script.
        b2_times, b2_counts, b2_changed = self.run_requery(script, "binding", sz[f"{key}_b2_cap"])
        self.restore()
        log(f"{key}: B2 {rate(len(b2_times), sum(b2_times)):,.1f}/s over {len(b2_times)} commits")
        b1_times, b1_counts, _b1_changed = self.run_requery(
            script, "subscriber", sz[f"{key}_b1_cap"]
        )
        self.restore()
        log(f"{key}: B1 {rate(len(b1_times), sum(b1_times)):,.1f}/s over {len(b1_times)} commits")

        return self.summarize(
            n,
            samples,
            detail,
            ivm_counts,
            (b1_times, b1_counts),
            (b2_times, b2_counts),
            changed_checked,
            b2_changed,
        )

    def summarize(self, n, samples, detail, ivm_counts, b1, b2, ivm_changed, b2_changed):
        b1_times, b1_counts = b1
        b2_times, b2_counts = b2
        med_rep = sorted(range(len(samples["ivm"])), key=lambda i: samples["ivm"][i])
        mid = med_rep[len(med_rep) // 2]
        ivm_times = detail["ivm"][mid]["times"]
        per_commit = [commit_total(t) for t in ivm_times]
        write = [t[0] for t in ivm_times]
        poll = [t[1] for t in ivm_times]
        commit = [t[2] for t in ivm_times]
        fanout = [t[3] for t in ivm_times]
        lim = median(samples["limit"])
        ivm = median(samples["ivm"])

        def prefix_rate(times, k):
            return rate(k, sum(times[:k]))

        def hub_summary(variant):
            runs = detail[variant]
            return {
                "median_commits_s": median(samples[variant]),
                "commits_s": samples[variant],
                "over_limit": median(samples[variant]) / lim,
                "over_limit_per_repeat": [
                    a / b for a, b in zip(samples[variant], samples["limit"])
                ],
                "commits_per_poll": [n / max(1, d["polls"]) for d in runs],
                "steps_on_the_committing_thread": [d["inline"] / max(1, d["polls"]) for d in runs],
                "commit_to_delta_ready_us": {
                    "p50": median([pct(d["latencies"], 0.5) for d in runs]) * 1e6,
                    "p99": median([pct(d["latencies"], 0.99) for d in runs]) * 1e6,
                },
            }

        ivm_b1_prefix = median(
            [
                prefix_rate([commit_total(t) for t in d["times"]], len(b1_times))
                for d in detail["ivm"]
            ]
        )
        ivm_b2_prefix = median(
            [
                prefix_rate([commit_total(t) for t in d["times"]], len(b2_times))
                for d in detail["ivm"]
            ]
        )
        b1_rate = rate(len(b1_times), sum(b1_times))
        b2_rate = rate(len(b2_times), sum(b2_times))
        tail_rows = sum(len(ops) for ops in self.tail)
        lim_tail = median([rate(len(d["tail"]), sum(d["tail"])) for d in detail["limit"]])
        ivm_tail = median(
            [rate(len(d["tail"]), sum(commit_total(t) for t in d["tail"])) for d in detail["ivm"]]
        )
        agree = sum(1 for a, b in zip(ivm_changed, b2_changed) if a == b)
        counts = ivm_counts[mid]
        return {
            "sizes": self.describe_sizes(),
            "kinds": dict(self.kinds),
            "commits": n,
            "limit": {"median_commits_s": lim, "commits_s": samples["limit"]},
            "ivm": {
                "median_commits_s": ivm,
                "commits_s": samples["ivm"],
                "per_commit_us": {
                    "write_p50": pct(write, 0.5) * 1e6,
                    "poll_p50": pct(poll, 0.5) * 1e6,
                    "poll_mean": statistics.fmean(poll) * 1e6,
                    "catalog_commit_mean": statistics.fmean(commit) * 1e6,
                    "outbox_read_mean": statistics.fmean([p - c for p, c in zip(poll, commit)])
                    * 1e6,
                    "fanout_mean": statistics.fmean(fanout) * 1e6,
                    "total_p50": pct(per_commit, 0.5) * 1e6,
                    "total_p99": pct(per_commit, 0.99) * 1e6,
                    "delta_ready_p50": pct([p + f for p, f in zip(poll, fanout)], 0.5) * 1e6,
                    "delta_ready_p99": pct([p + f for p, f in zip(poll, fanout)], 0.99) * 1e6,
                },
                "catalog_commit_only_commits_s": rate(len(commit), sum(commit)),
                "views_changed_per_commit": counts["views_changed"] / max(1, len(self.all_ops)),
                "messages": counts["messages"],
                "bytes": counts["bytes"],
                "same_prefix_as_b1_commits_s": ivm_b1_prefix,
                "same_prefix_as_b2_commits_s": ivm_b2_prefix,
            },
            "ivm_poll_every_10": {
                "median_commits_s": median(samples["ivm10"]),
                "commits_s": samples["ivm10"],
                "over_limit": median(samples["ivm10"]) / lim,
            },
            "ivm_hub": hub_summary("hub"),
            "ivm_hub_thread": hub_summary("hubthread"),
            "ivm_second_process": {
                "median_commits_s": median(samples["proc"]),
                "commits_s": samples["proc"],
                "over_limit": median(samples["proc"]) / lim,
                "over_limit_per_repeat": [a / b for a, b in zip(samples["proc"], samples["limit"])],
                "writes_alone_commits_s": [rate(n, d["written"]) for d in detail["proc"]],
                "commits_per_poll": [n / max(1, d["polls"]) for d in detail["proc"]],
                "busy_us_per_commit": [d["busy"] * 1e6 / n for d in detail["proc"]],
                "poll_interval_s": detail["proc"][0]["poll_interval"],
                "commit_to_delta_ready_ms": {
                    "p50": median([pct(d["latencies"], 0.5) for d in detail["proc"]]) * 1e3,
                    "p99": median([pct(d["latencies"], 0.99) for d in detail["proc"]]) * 1e3,
                },
            },
            "inline_floor": {
                "median_commits_s": median(samples["floor"]) if samples.get("floor") else None,
                "commits_s": samples.get("floor", []),
                "over_limit": median(samples["floor"]) / lim if samples.get("floor") else None,
                "over_limit_per_repeat": [
                    a / b for a, b in zip(samples.get("floor", []), samples["limit"])
                ],
            },
            "derived_ivm_without_outbox_read_commits_s": rate(
                len(write), sum(write) + sum(commit) + sum(fanout)
            ),
            "b1": {
                "commits": len(b1_times),
                "commits_s": b1_rate,
                "queries_per_commit": b1_counts["queries_per_commit"],
                "messages": b1_counts["messages"],
            },
            "b2": {
                "commits": len(b2_times),
                "commits_s": b2_rate,
                "queries_per_commit": b2_counts["queries_per_commit"],
                "messages": b2_counts["messages"],
            },
            "batch_tail": {
                "commits": len(self.tail),
                "rows": tail_rows,
                "limit_commits_s": lim_tail,
                "ivm_commits_s": ivm_tail,
                "ivm_over_limit": ivm_tail / lim_tail if lim_tail else None,
            },
            "ratios": {
                "ivm_over_limit": ivm / lim,
                "ivm_over_limit_per_repeat": [
                    a / b for a, b in zip(samples["ivm"], samples["limit"])
                ],
                "ivm_over_b1_same_commits": ivm_b1_prefix / b1_rate,
                "ivm_over_b2_same_commits": ivm_b2_prefix / b2_rate,
                "ivm_full_script_over_b1": ivm / b1_rate,
                "ivm_full_script_over_b2": ivm / b2_rate,
            },
            "changed_views_agree_with_b2": {
                "commits_compared": len(b2_changed),
                "agreeing": agree,
            },
            "setup": {k: v for k, v in self.stats.items() if k not in ("refills", "checked")},
            "refills": self.stats.get("refills"),
            "checked_pass": self.stats.get("checked"),
        }


def _db_value(v):
    return int(v) if isinstance(v, bool) else v


def _first_difference(got, want):
    if isinstance(got, list) and isinstance(want, list):
        if len(got) != len(want):
            return f"(lengths {len(got)} vs {len(want)})"
        for i, (a, b) in enumerate(zip(got, want)):
            if a != b:
                keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                return (
                    f"(first at position {i}: keys {keys}: {[a.get(k) for k in keys]} vs "
                    f"{[b.get(k) for k in keys]})"
                )
    return f"({str(got)[:120]} vs {str(want)[:120]})"


class Checker:
    """
    The untimed checked pass: after each commit, the views of the bindings it touched
    are compared with the SQL re-query (all views every 50 commits); each view's ops
    are folded into a client replica that must end equal to its footprint; and a
    view whose result changed while its ops were empty (or the reverse) is counted.
    """

    EVERY = 50

    def __init__(self, workload):
        self.w = workload
        self.mismatches = []
        self.compared = 0
        self.silent_changes = Counter()  # result changed, no ops emitted
        self.noisy = 0  # ops emitted, result unchanged
        self.outside = 0  # ops for a binding the commit did not touch
        self.examples = []
        self.commits = 0

    def begin(self, live, keys):
        from django.db import connection

        self.live, self.keys = live, keys
        self.cursor = connection.cursor()
        catalog = live.catalog
        self.replicas = {}
        for k in keys.values():
            self.replicas[k] = row_set(catalog.queries[k].view.footprint_rows())

    def watched(self, i):
        """The bindings commit ``i`` can change (all of them for a rename)."""
        touched = self.w.touched_bindings(i)
        return self.w.bindings if touched is None else [b for b in touched if b in self.keys]

    def before(self, i):
        queries = self.live.catalog.queries
        return {b: queries[self.keys[b]].view.result() for b in self.watched(i)}

    def after(self, i, ops, outputs, before):
        catalog = self.live.catalog
        self.commits += 1
        for k, key_ops in outputs.items():
            replica = self.replicas[k]
            for op in key_ops:
                t = op["table"]
                if op["op"] == "add":
                    replica |= row_set([(t, op["row"])])
                elif op["op"] == "remove":
                    replica -= row_set([(t, op["row"])])
                else:
                    replica -= row_set([(t, op["old"])])
                    replica |= row_set([(t, op["new"])])
        binding_of = {k: b for b, k in self.keys.items()}
        outside = [binding_of[k] for k in outputs if binding_of[k] not in before]
        if outside and len(self.examples) < 3:
            self.examples.append({"commit": i, "ops_for_untouched_bindings": outside})
        self.outside += len(outside)
        for b, was in before.items():
            k = self.keys[b]
            now = catalog.queries[k].view.result()
            if now != was and k not in outputs:
                kind = self.w.kind_of(i)
                self.silent_changes[kind] += 1
                if len(self.examples) < 3:
                    self.examples.append(
                        {
                            "commit": i,
                            "kind": kind,
                            "binding": b,
                            "ops": ops,
                            "change": _first_difference(now, was),
                        }
                    )
            elif now == was and k in outputs:
                self.noisy += 1
        touched = list(before)
        if (i + 1) % self.EVERY == 0:
            touched = self.w.bindings
        for b in touched:
            got = catalog.queries[self.keys[b]].view.result()
            want = self.w.requery(self.cursor, b)
            self.compared += 1
            if got != want and len(self.mismatches) < 10:
                self.mismatches.append(
                    f"commit {i} ({self.w.kind_of(i)}): {self.w.family}[{b!r}] != SQL "
                    f"{_first_difference(got, want)}"
                )

    def summary(self):
        catalog = self.live.catalog
        bad_replicas = 0
        for k, replica in self.replicas.items():
            if replica != row_set(catalog.queries[k].view.footprint_rows()):
                bad_replicas += 1
        self.cursor.close()
        if self.mismatches or bad_replicas:
            failures = list(self.mismatches)
            if bad_replicas:
                failures.append(f"{bad_replicas} client replicas (seq 0 + ops) != footprint")
            self.w.bench.gates.append(
                {
                    "workload": self.w.key,
                    "label": "checked pass, per commit",
                    "failures": failures,
                    "failure_count": len(failures),
                    "pass": False,
                }
            )
            print(f"\n!!!!!!!! CORRECTNESS GATE FAILED: {self.w.key} per-commit check !!!!!!!!")
            for f in failures:
                print(f"!!   {f}")
            print("!!!!!!!!\n", flush=True)
        else:
            self.w.bench.gates.append(
                {
                    "workload": self.w.key,
                    "label": "checked pass, per commit",
                    "views_compared": self.compared,
                    "replicas": len(self.replicas),
                    "failure_count": 0,
                    "pass": True,
                }
            )
        return {
            "commits": self.commits,
            "views_compared_with_sql": self.compared,
            "mismatches": self.mismatches,
            "replicas_checked": len(self.replicas),
            "replicas_wrong": bad_replicas,
            "result_changed_without_ops": dict(self.silent_changes),
            "ops_without_result_change": self.noisy,
            "ops_for_untouched_bindings": self.outside,
            "examples": self.examples,
        }


# --- W1: the top-k family ----------------------------------------------------------------


class W1(FamilyWorkload):
    key = "w1"
    family = "board_top"
    TABLES = {
        "post": (
            ["id", "board", "score", "created_at", "title"],
            ["id"],
            ["int64", "int64", "int64", "number", "string"],
        )
    }
    INDEXES = [
        'CREATE INDEX IF NOT EXISTS "post_board_score" ON "post" ("board", "score" DESC, "id")'
    ]
    LITERAL_SAMPLE = 8
    SQL = (
        'SELECT "id", "board", "score", "created_at", "title" FROM "post" '
        'WHERE "board" = %s ORDER BY "score" DESC, "id" ASC LIMIT {limit}'
    )
    COLUMNS = ("id", "board", "score", "created_at", "title")

    def setup(self):
        sz, rng = self.sz, self.rng
        self.limit = sz["w1_window"]
        self.sql = self.SQL.format(limit=self.limit)
        self.template = {
            "table": "post",
            "where": {
                "type": "simple",
                "op": "=",
                "left": {"type": "column", "name": "board"},
                "right": {"type": "parameter"},
            },
            "orderBy": [["score", "desc"]],
            "limit": self.limit,
        }
        self.create_tables()
        boards = list(range(sz["w1_boards"]))
        self.board_weight = dict(zip(boards, weights(len(boards), 0.8)))
        rows = []
        picks = rng.choices(boards, [self.board_weight[b] for b in boards], k=sz["w1_posts"])
        for i, board in enumerate(picks):
            rows.append(
                {
                    "id": i,
                    "board": board,
                    "score": rng.randrange(1_000_000),
                    "created_at": float(i),
                    "title": f"post {i}",
                }
            )
        self.load_seed({"post": rows})
        self.bindings = sorted(rng.sample(boards, sz["w1_bound"]))
        self.spread_subscribers(sz["w1_subs"], lambda b: self.board_weight[b])

    def describe_sizes(self):
        sz = self.sz
        sizes = Counter(r["board"] for r in self.seed_rows["post"].values())
        bound = [sizes.get(b, 0) for b in self.bindings]
        return {
            "posts": sz["w1_posts"],
            "boards": sz["w1_boards"],
            "bindings": len(self.bindings),
            "posts_per_bound_board_min_median_max": [min(bound), median(bound), max(bound)],
            "window": self.limit,
            "subscribers": len(self.subscribers),
            "commits": sz["w1_commits"],
            "batch_tail": f"{sz['w1_batches']} x {sz['w1_batch_rows']} rows",
        }

    def requery(self, cursor, board):
        cursor.execute(self.sql, [board])
        cols = self.COLUMNS
        return [dict(zip(cols, r)) for r in cursor.fetchall()]

    # --- the script ---------------------------------------------------------------------

    def make_scripts(self):
        from sortedcontainers import SortedList

        sz, rng, limit = self.sz, self.rng, self.limit
        rows = {pk[0]: dict(r) for pk, r in self.seed_rows["post"].items()}
        order = defaultdict(SortedList)  # board -> (-score, id)
        for r in rows.values():
            order[r["board"]].add((-r["score"], r["id"]))
        bound_boards = [b for b in self.bindings]
        bw = [self.board_weight[b] for b in bound_boards]
        next_id = [max(rows) + 1]
        touched_b = []
        kinds = []

        def new_score(avoid):
            s = rng.randrange(1_000_000)
            return s if s != avoid else s + 1

        def window(b):
            return order[b][:limit]

        def put(row):
            rows[row["id"]] = row
            order[row["board"]].add((-row["score"], row["id"]))
            self.touched["post"].add((row["id"],))

        def drop(pid):
            row = rows.pop(pid)
            order[row["board"]].remove((-row["score"], pid))
            self.touched["post"].add((pid,))
            return row

        def update(pid, score):
            row = drop(pid)
            put({**row, "score": score})
            return ("u", "post", {"id": pid}, {"score": score}), row["board"]

        def insert(board, score):
            pid = next_id[0]
            next_id[0] += 1
            row = {
                "id": pid,
                "board": board,
                "score": score,
                "created_at": 1e6 + pid,
                "title": f"post {pid}",
            }
            put(row)
            return ("i", "post", dict(row)), board

        def delete(pid):
            row = drop(pid)
            return ("d", "post", {"id": pid}), row["board"]

        def bound_board(min_rows=1):
            for _ in range(50):
                b = rng.choices(bound_boards, bw)[0]
                if len(order[b]) >= min_rows:
                    return b
            return max(bound_boards, key=lambda b: len(order[b]))

        def one_op():
            r = rng.random()
            if r < 0.55:  # score update: half inside a window, half anywhere
                if rng.random() < 0.5:
                    b = bound_board()
                    _neg, pid = rng.choice(window(b))
                    s = max(0, rows[pid]["score"] + rng.randint(-20_000, 20_000))
                    s = s if s != rows[pid]["score"] else s + 1
                    return "update_window", update(pid, s)
                pid = rng.choice(list(rows)) if len(rows) < 64 else _random_key(rows, rng)
                return "update_any", update(pid, new_score(rows[pid]["score"]))
            if r < 0.75:  # insert: half into the top range of a bound board
                if rng.random() < 0.5:
                    b = bound_board()
                    w = window(b)
                    floor = -w[-1][0] if len(w) >= limit else 0
                    return "insert_top", insert(b, rng.randint(floor, floor + 50_000))
                b = rng.randrange(sz["w1_boards"])
                w = window(b)
                ceiling = -w[-1][0] if len(w) >= limit else 1_000_000
                return "insert_low", insert(b, rng.randint(0, max(0, ceiling - 1)))
            if r < 0.90:  # delete: a third the bound row, a third inside a window
                x = rng.random()
                if x < 1 / 3:
                    b = bound_board(limit)
                    return "delete_bound", delete(window(b)[-1][1])
                if x < 2 / 3:
                    b = bound_board()
                    return "delete_window", delete(rng.choice(window(b))[1])
                return "delete_any", delete(_random_key(rows, rng))
            # edits across the bound: out of the window, or into it
            b = bound_board(limit + 1)
            lst = order[b]
            if len(lst) <= limit:
                return "update_window", update(rng.choice(lst)[1], new_score(None))
            bound_score = -lst[limit - 1][0]
            if rng.random() < 0.5:
                pid = rng.choice(lst[:limit])[1]
                after = -lst[limit][0]
                return "cross_out", update(pid, max(0, after - rng.randint(1, 1000)))
            pid = rng.choice(lst[limit : limit + 10])[1]
            return "cross_in", update(pid, bound_score + rng.randint(1, 1000))

        script = []
        for _ in range(sz["w1_commits"]):
            kind, (op, board) = one_op()
            script.append([op])
            kinds.append(kind)
            touched_b.append({board})
        tail = []
        for _ in range(sz["w1_batches"]):
            ops, boards = [], set()
            while len(ops) < sz["w1_batch_rows"]:
                x = rng.random()
                if x < 0.15:  # insert then delete the same new row in one commit
                    b = bound_board()
                    op1, _ = insert(b, rng.randint(0, 1_100_000))
                    op2, _ = delete(op1[2]["id"])
                    ops += [op1, op2]
                    boards.add(b)
                    continue
                if x < 0.25:  # update then delete the same row
                    pid = _random_key(rows, rng)
                    op1, b = update(pid, new_score(rows[pid]["score"]))
                    op2, _ = delete(pid)
                    ops += [op1, op2]
                    boards.add(b)
                    continue
                _kind, (op, b) = one_op()
                ops.append(op)
                boards.add(b)
            tail.append(ops)
            kinds.append("batch")
            touched_b.append(boards)
        self.kinds = Counter(kinds[: len(script)])
        self.kinds["batch"] = len(tail)
        self._kinds = kinds
        self._touched = touched_b
        self.script, self.tail = script, tail
        self.all_ops = script + tail
        return script, tail

    def run_floor(self, script):
        """
        The inline floor, W1 only: the least work any Python pipeline on this thread
        could do per commit, with no rindle IVM code. The writer hands each commit's
        outbox rows over as for IVM; they are decoded with ``json.loads``; each board
        keeps a plain sorted list of (-score, id) kept with ``bisect``; a change at a
        bound board's position < 20 becomes ops, JSON-encoded once per board. No
        store, routing, footprint or edit consolidation. Per-commit seconds.
        """
        import bisect

        from rindle_app.stream.reader import snapshot

        engine, limit, bound = self.engine, self.limit, set(self.bindings)
        parts, rows = defaultdict(list), {}
        for r in self.seed_rows["post"].values():
            rows[r["id"]] = r
            parts[r["board"]].append((-r["score"], r["id"]))
        for part in parts.values():
            part.sort()
        head, handed = [snapshot(engine.using, [])[0]], []

        def deliver(_start, feed):
            handed.extend(feed)
            if feed:
                head[0] = feed[-1][0]

        engine.add_change_listener(lambda: head[0], deliver)
        times = []
        gc.collect()
        try:
            for ops in script:
                t0 = perf()
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
                out = {}
                for _seq, _table, old, new in handed:
                    for image, removed in ((old, True), (new, False)):
                        if image is None:
                            continue
                        row = json.loads(image)
                        board, part = row["board"], parts[row["board"]]
                        i = bisect.bisect_left(part, (-row["score"], row["id"]))
                        if removed:
                            del part[i]
                            del rows[row["id"]]
                        else:
                            part.insert(i, (-row["score"], row["id"]))
                            rows[row["id"]] = row
                        if i < limit and board in bound:
                            edge = limit - 1 if removed else limit
                            ops_out = out.setdefault(board, [])
                            ops_out.append({"op": "remove" if removed else "add", "row": row})
                            if len(part) > edge:
                                moved = rows[part[edge][1]]
                                ops_out.append({"op": "add" if removed else "remove", "row": moved})
                handed.clear()
                for board_ops in out.values():
                    dumps(board_ops)
                times.append(perf() - t0)
        finally:
            engine.remove_change_listener(deliver)
        from django.db import connection

        with connection.cursor() as cursor:
            for b in self.bindings:
                want = [r["id"] for r in self.requery(cursor, b)]
                if [pk for _key, pk in parts[b][:limit]] != want:
                    raise GateFailure(f"{self.key}: the inline floor's board {b} != SQL")
        return times

    def kind_of(self, i):
        return self._kinds[i] if i < len(self._kinds) else "?"

    def touched_bindings(self, i):
        return self._touched[i] if i < len(self._touched) else None


def _random_key(d, rng):
    """A random key of a dict without listing it every call (keys cached per size)."""
    cache = _random_key.cache
    if cache.get("size") != len(d) or cache.get("id") != id(d) or rng.random() < 0.05:
        cache["keys"] = list(d)
        cache["size"] = len(d)
        cache["id"] = id(d)
    while True:
        k = rng.choice(cache["keys"])
        if k in d:
            return k


_random_key.cache = {}


# --- W2: the issue list ------------------------------------------------------------------


class W2(FamilyWorkload):
    key = "w2"
    family = "project_issues"
    TABLES = {
        "w2_user": (["id", "name"], ["id"], ["int64", "string"]),
        "w2_issue": (
            ["id", "project_id", "title", "updated_at", "closed", "author_id"],
            ["id"],
            ["int64", "int64", "string", "number", "boolean", "int64"],
        ),
        "w2_comment": (
            ["id", "issue_id", "author_id", "body", "created_at"],
            ["id"],
            ["int64", "int64", "int64", "string", "number"],
        ),
        "w2_label": (["issue_id", "name"], ["issue_id", "name"], ["int64", "string"]),
    }
    INDEXES = [
        'CREATE INDEX IF NOT EXISTS "w2_issue_list" ON "w2_issue" '
        '("project_id", "closed", "updated_at" DESC, "id")',
        'CREATE INDEX IF NOT EXISTS "w2_comment_issue" ON "w2_comment" '
        '("issue_id", "created_at" DESC, "id")',
        'CREATE INDEX IF NOT EXISTS "w2_label_name" ON "w2_label" ("name", "issue_id")',
    ]
    LITERAL_SAMPLE = 1
    OTHER_LABELS = ("feature", "ui", "docs", "perf", "p1")

    def setup(self):
        sz, rng = self.sz, self.rng
        self.limit = sz["w2_window"]
        self.template = {
            "table": "w2_issue",
            "where": {
                "type": "and",
                "conditions": [
                    {
                        "type": "simple",
                        "op": "=",
                        "left": {"type": "column", "name": "project_id"},
                        "right": {"type": "parameter"},
                    },
                    {
                        "type": "simple",
                        "op": "=",
                        "left": {"type": "column", "name": "closed"},
                        "right": {"type": "literal", "value": False},
                    },
                    {
                        "type": "correlatedSubquery",
                        "op": "EXISTS",
                        "related": {
                            "correlation": {"parentField": ["id"], "childField": ["issue_id"]},
                            "subquery": {
                                "table": "w2_label",
                                "where": {
                                    "type": "simple",
                                    "op": "=",
                                    "left": {"type": "column", "name": "name"},
                                    "right": {"type": "literal", "value": "bug"},
                                },
                            },
                        },
                    },
                ],
            },
            "orderBy": [["updated_at", "desc"]],
            "limit": self.limit,
            "related": [
                {
                    "correlation": {"parentField": ["author_id"], "childField": ["id"]},
                    "subquery": {"table": "w2_user", "alias": "author", "one": True},
                },
                {
                    "correlation": {"parentField": ["id"], "childField": ["issue_id"]},
                    "subquery": {
                        "table": "w2_comment",
                        "alias": "comments",
                        "orderBy": [["created_at", "desc"]],
                        "limit": 3,
                    },
                },
                {
                    "correlation": {"parentField": ["id"], "childField": ["issue_id"]},
                    "subquery": {
                        "table": "w2_comment",
                        "alias": "commentCount",
                        "aggregate": "count",
                    },
                },
            ],
        }
        self.create_tables()
        projects = list(range(sz["w2_projects"]))
        self.project_weight = dict(zip(projects, weights(len(projects), 0.5)))
        users = [{"id": u, "name": f"user {u}"} for u in range(sz["w2_users"])]
        issues, labels, comments = [], [], []
        picks = rng.choices(projects, [self.project_weight[p] for p in projects], k=sz["w2_issues"])
        for i, p in enumerate(picks):
            issues.append(
                {
                    "id": i,
                    "project_id": p,
                    "title": f"issue {i}",
                    "updated_at": rng.random() * 1e6,
                    "closed": rng.random() < 0.2,
                    "author_id": rng.randrange(sz["w2_users"]),
                }
            )
            if rng.random() < 0.55:
                labels.append({"issue_id": i, "name": "bug"})
            for name in rng.sample(self.OTHER_LABELS, rng.randint(0, 2)):
                labels.append({"issue_id": i, "name": name})
        hot = weights(sz["w2_issues"], 0.3)
        rng.shuffle(hot)
        for c, i in enumerate(rng.choices(range(sz["w2_issues"]), hot, k=sz["w2_comments"])):
            comments.append(
                {
                    "id": c,
                    "issue_id": i,
                    "author_id": rng.randrange(sz["w2_users"]),
                    "body": f"comment {c}",
                    "created_at": rng.random() * 1e6,
                }
            )
        self.load_seed(
            {"w2_user": users, "w2_issue": issues, "w2_comment": comments, "w2_label": labels}
        )
        self.bindings = projects
        self.spread_subscribers(sz["w2_subs"], lambda p: self.project_weight[p])

    def describe_sizes(self):
        sz = self.sz
        issues = self.seed_rows["w2_issue"].values()
        labels = self.seed_rows["w2_label"]
        qual = Counter(
            r["project_id"] for r in issues if not r["closed"] and (r["id"], "bug") in labels
        )
        per = [qual.get(p, 0) for p in self.bindings]
        return {
            "users": sz["w2_users"],
            "projects": sz["w2_projects"],
            "issues": sz["w2_issues"],
            "comments": sz["w2_comments"],
            "labels": len(labels),
            "bindings": len(self.bindings),
            "qualifying_issues_per_project_min_median_max": [min(per), median(per), max(per)],
            "window": self.limit,
            "subscribers": len(self.subscribers),
            "commits": sz["w2_commits"],
        }

    ISSUE_COLS = ("id", "project_id", "title", "updated_at", "closed", "author_id")
    COMMENT_COLS = ("id", "issue_id", "author_id", "body", "created_at")

    def requery(self, cursor, project):
        """The view in plain SQL: one statement for the issues, one for the top-3 comments."""
        cursor.execute(
            'SELECT i."id", i."project_id", i."title", i."updated_at", i."closed", '
            'i."author_id", u."id", u."name", '
            '(SELECT COUNT(*) FROM "w2_comment" c WHERE c."issue_id" = i."id") '
            'FROM "w2_issue" i LEFT JOIN "w2_user" u ON u."id" = i."author_id" '
            'WHERE i."project_id" = %s AND i."closed" = 0 AND EXISTS (SELECT 1 FROM "w2_label" l '
            'WHERE l."issue_id" = i."id" AND l."name" = \'bug\') '
            f'ORDER BY i."updated_at" DESC, i."id" ASC LIMIT {self.limit}',
            [project],
        )
        nodes, by_id = [], {}
        for r in cursor.fetchall():
            node = dict(zip(self.ISSUE_COLS, r[:6]))
            node["closed"] = bool(node["closed"])
            node["author"] = {"id": r[6], "name": r[7]} if r[6] is not None else None
            node["comments"] = []
            node["commentCount"] = r[8]
            nodes.append(node)
            by_id[node["id"]] = node
        if by_id:
            marks = ", ".join(["%s"] * len(by_id))
            cursor.execute(
                'SELECT "id", "issue_id", "author_id", "body", "created_at" FROM ('
                'SELECT c.*, ROW_NUMBER() OVER (PARTITION BY c."issue_id" '
                'ORDER BY c."created_at" DESC, c."id" ASC) AS rn FROM "w2_comment" c '
                f'WHERE c."issue_id" IN ({marks})) WHERE rn <= 3 ORDER BY "issue_id", rn',
                list(by_id),
            )
            for r in cursor.fetchall():
                by_id[r[1]]["comments"].append(dict(zip(self.COMMENT_COLS, r)))
        return nodes

    # --- the script ---------------------------------------------------------------------

    def make_scripts(self):
        sz, rng, limit = self.sz, self.rng, self.limit
        issues = {pk[0]: dict(r) for pk, r in self.seed_rows["w2_issue"].items()}
        comments = {pk[0]: dict(r) for pk, r in self.seed_rows["w2_comment"].items()}
        labels = set(self.seed_rows["w2_label"])
        users = {pk[0]: dict(r) for pk, r in self.seed_rows["w2_user"].items()}
        by_project = defaultdict(set)
        for i in issues.values():
            by_project[i["project_id"]].add(i["id"])
        by_issue = defaultdict(set)
        for c in comments.values():
            by_issue[c["issue_id"]].add(c["id"])
        clock = [1e6]
        ids = {"issue": max(issues) + 1, "comment": max(comments) + 1}
        pw = [self.project_weight[p] for p in self.bindings]
        renames = Counter()

        def tick():
            clock[0] += 1.0
            return clock[0]

        def qualifies(i):
            return not issues[i]["closed"] and (i, "bug") in labels

        def window(p):
            found = [i for i in by_project[p] if qualifies(i)]
            found.sort(key=lambda i: (-issues[i]["updated_at"], i))
            return found[:limit]

        def top3(i):
            found = sorted(by_issue[i], key=lambda c: (-comments[c]["created_at"], c))
            return found[:3]

        def project():
            return rng.choices(self.bindings, pw)[0]

        def windowed_issue():
            for _ in range(20):
                w = window(project())
                if w:
                    return rng.choice(w)
            return rng.choice(list(issues))

        def touch(table, pk):
            self.touched[table].add(pk)

        def new_comment(i):
            cid = ids["comment"]
            ids["comment"] += 1
            row = {
                "id": cid,
                "issue_id": i,
                "author_id": rng.randrange(sz["w2_users"]),
                "body": f"comment {cid}",
                "created_at": tick(),
            }
            comments[cid] = row
            by_issue[i].add(cid)
            touch("w2_comment", (cid,))
            return ("i", "w2_comment", dict(row))

        def one_commit():
            r = rng.random()
            if r < 0.20:
                i = windowed_issue() if rng.random() < 0.7 else rng.choice(list(issues))
                return "comment_add", [new_comment(i)], {issues[i]["project_id"]}
            if r < 0.32:
                cid = None
                if rng.random() < 0.5:
                    for _ in range(10):
                        top = top3(windowed_issue())
                        if top:
                            cid = rng.choice(top)
                            break
                if cid is None:
                    cid = _random_key(comments, rng)
                row = comments.pop(cid)
                by_issue[row["issue_id"]].discard(cid)
                touch("w2_comment", (cid,))
                return (
                    "comment_delete",
                    [("d", "w2_comment", {"id": cid})],
                    {issues[row["issue_id"]]["project_id"]} if row["issue_id"] in issues else set(),
                )
            if r < 0.40:
                if rng.random() < 0.6:
                    p = project()
                    cands = [
                        i
                        for i in by_project[p]
                        if not issues[i]["closed"] and (i, "bug") not in labels
                    ]
                    if cands:
                        i = rng.choice(cands)
                        labels.add((i, "bug"))
                        touch("w2_label", (i, "bug"))
                        return (
                            "label_add_bug",
                            [("i", "w2_label", {"issue_id": i, "name": "bug"})],
                            {p},
                        )
                i = rng.choice(list(issues))
                free = [n for n in self.OTHER_LABELS if (i, n) not in labels]
                name = rng.choice(free) if free else None
                if name is None:
                    return one_commit()
                labels.add((i, name))
                touch("w2_label", (i, name))
                return (
                    "label_add_other",
                    [("i", "w2_label", {"issue_id": i, "name": name})],
                    {issues[i]["project_id"]},
                )
            if r < 0.48:
                if rng.random() < 0.6:
                    i = windowed_issue()
                    if (i, "bug") in labels:
                        labels.discard((i, "bug"))
                        touch("w2_label", (i, "bug"))
                        return (
                            "label_remove_bug",
                            [("d", "w2_label", {"issue_id": i, "name": "bug"})],
                            {issues[i]["project_id"]},
                        )
                others = [lb for lb in _sample_set(labels, rng, 30) if lb[1] != "bug"]
                if not others:
                    return one_commit()
                i, name = others[0]
                labels.discard((i, name))
                touch("w2_label", (i, name))
                return (
                    "label_remove_other",
                    [("d", "w2_label", {"issue_id": i, "name": name})],
                    {issues[i]["project_id"]},
                )
            if r < 0.75:
                i = windowed_issue() if rng.random() < 0.6 else rng.choice(list(issues))
                at = tick()
                issues[i]["updated_at"] = at
                touch("w2_issue", (i,))
                return (
                    "bump",
                    [("u", "w2_issue", {"id": i}, {"updated_at": at})],
                    {issues[i]["project_id"]},
                )
            if r < 0.85:
                if rng.random() < 0.5:
                    i = windowed_issue()
                    if not issues[i]["closed"]:
                        issues[i]["closed"] = True
                        touch("w2_issue", (i,))
                        return (
                            "close",
                            [("u", "w2_issue", {"id": i}, {"closed": True})],
                            {issues[i]["project_id"]},
                        )
                closed = [i for i in by_project[project()] if issues[i]["closed"]]
                if not closed:
                    return one_commit()
                i = rng.choice(closed)
                issues[i]["closed"] = False
                touch("w2_issue", (i,))
                return (
                    "reopen",
                    [("u", "w2_issue", {"id": i}, {"closed": False})],
                    {issues[i]["project_id"]},
                )
            if r < 0.95:
                if rng.random() < 0.7:
                    u = issues[windowed_issue()]["author_id"]
                else:
                    u = rng.randrange(sz["w2_users"])
                renames[u] += 1
                name = f"user {u} v{renames[u]}"
                users[u]["name"] = name
                touch("w2_user", (u,))
                return "rename", [("u", "w2_user", {"id": u}, {"name": name})], None
            # a new issue with its bug label and a first comment, in one commit
            p = project()
            i = ids["issue"]
            ids["issue"] += 1
            row = {
                "id": i,
                "project_id": p,
                "title": f"issue {i}",
                "updated_at": tick(),
                "closed": False,
                "author_id": rng.randrange(sz["w2_users"]),
            }
            issues[i] = row
            by_project[p].add(i)
            labels.add((i, "bug"))
            touch("w2_issue", (i,))
            touch("w2_label", (i, "bug"))
            ops = [
                ("i", "w2_issue", dict(row)),
                ("i", "w2_label", {"issue_id": i, "name": "bug"}),
                new_comment(i),
            ]
            return "new_issue", ops, {p}

        script, kinds, touched = [], [], []
        for _ in range(sz["w2_commits"]):
            kind, ops, projects = one_commit()
            script.append(ops)
            kinds.append(kind)
            touched.append(projects)
        self.kinds = Counter(kinds)
        self._kinds, self._touched = kinds, touched
        self.script, self.tail = script, []
        self.all_ops = script
        return script, []

    def kind_of(self, i):
        return self._kinds[i] if i < len(self._kinds) else "?"

    def touched_bindings(self, i):
        return self._touched[i] if i < len(self._touched) else None


def _sample_set(s, rng, k):
    """Up to k random elements of a set (a list copy per call, fine at this size)."""
    items = list(s)
    return rng.sample(items, min(k, len(items)))


# --- the original's realistic UI views ---------------------------------------------------


OPEN = {
    "type": "simple",
    "op": "!=",
    "left": {"type": "column", "name": "status"},
    "right": {"type": "literal", "value": "done"},
}
OWNER = {
    "correlation": {"parentField": ["ownerId"], "childField": ["id"]},
    "subquery": {"table": "user", "alias": "owner", "one": True},
}
COUNT = {
    "correlation": {"parentField": ["id"], "childField": ["issueId"]},
    "subquery": {"table": "comment", "alias": "commentCount", "aggregate": "count"},
}
RECENT3 = {
    "correlation": {"parentField": ["id"], "childField": ["issueId"]},
    "subquery": {
        "table": "comment",
        "alias": "recentComments",
        "orderBy": [["createdAt", "desc"]],
        "limit": 3,
    },
}
ALL_COMMENTS = {
    "correlation": {"parentField": ["id"], "childField": ["issueId"]},
    "subquery": {"table": "comment", "alias": "comments", "orderBy": [["createdAt", "asc"]]},
}


class UIViews:
    """
    The original's "realistic UI views" on the demo issue tracker's tables: six views,
    each alone in a catalog, timed per add+remove pair fed to ``Catalog.commit``
    directly (the IVM alone, as the original measured), and per pair end to end
    (``engine.write`` + ``LiveQueries.poll()`` twice).
    """

    ISSUE = ("id", "title", "status", "priority", "ownerId", "createdAt", "updatedAt")
    COMMENT = ("id", "issueId", "authorId", "body", "createdAt")

    def __init__(self, bench, rng):
        self.bench, self.engine, self.sz, self.rng = bench, bench.engine, bench.sizes, rng

    def setup(self):
        sz, rng = self.sz, self.rng
        statuses = ["backlog", "todo", "in-progress", "review", "done"]
        priorities = ["urgent", "high", "medium", "low"]
        n_users, n_issues = sz["ui_users"], sz["ui_issues"]
        users = [(f"u{u:05d}", f"user {u}") for u in range(n_users)]
        created = [float(c) * 10.0 for c in range(n_issues)]
        rng.shuffle(created)
        issues = [
            (
                f"i{i:06d}",
                f"issue {i}",
                rng.choice(statuses),
                rng.choice(priorities),
                users[rng.randrange(n_users)][0],
                created[i],
                created[i] + 5.0,
            )
            for i in range(n_issues)
        ]
        comments = [
            (
                f"c{c:07d}",
                issues[rng.randrange(n_issues)][0],
                users[rng.randrange(n_users)][0],
                f"comment {c}",
                float(rng.randrange(10 * n_issues)),
            )
            for c in range(sz["ui_comments"])
        ]
        self.max_created = max(created)

        def seed(tx):
            cur = tx.cursor
            cur.executemany('INSERT INTO "user" ("id", "name") VALUES (%s, %s)', users)
            cur.executemany(
                'INSERT INTO "issue" ("id", "title", "status", "priority", "ownerId", '
                '"createdAt", "updatedAt") VALUES (%s, %s, %s, %s, %s, %s, %s)',
                issues,
            )
            cur.executemany(
                'INSERT INTO "comment" ("id", "issueId", "authorId", "body", "createdAt") '
                "VALUES (%s, %s, %s, %s, %s)",
                comments,
            )

        self.engine.write(seed)
        self.users = [u[0] for u in users]
        by_issue = Counter(c[1] for c in comments)
        open_issues = sorted((i for i in issues if i[2] != "done"), key=lambda i: (-i[5], i[0]))
        self.page_bound = open_issues[49]
        self.page_next = open_issues[50]
        # the detail view: an issue with a few comments
        self.detail_id = next(i[0] for i in issues if 4 <= by_issue[i[0]] <= 8)
        self.max_comment_at = max(c[4] for c in comments)

    def views(self):
        v1 = {"table": "issue", "where": OPEN, "orderBy": [["createdAt", "desc"]], "limit": 50}
        v2 = {**v1, "related": [OWNER]}
        v3 = {**v1, "related": [OWNER, COUNT]}
        v4 = {**v1, "related": [OWNER, COUNT, RECENT3]}
        v5 = {
            "table": "issue",
            "where": {
                "type": "simple",
                "op": "=",
                "left": {"type": "column", "name": "id"},
                "right": {"type": "literal", "value": self.detail_id},
            },
            "one": True,
            "related": [OWNER, ALL_COMMENTS],
        }
        b = self.page_bound
        v6 = {**v4, "start": {"row": {"createdAt": b[5], "id": b[0]}, "exclusive": True}}
        return [
            ("newest 50 open", v1, "issue"),
            ("+ author", v2, "issue"),
            ("+ comment count", v3, "issue"),
            ("+ 3 recent comments", v4, "issue"),
            ("issue detail + comments", v5, "comment"),
            ("page 2 (start after the 50th)", v6, "issue_page2"),
        ]

    def pair_rows(self, how, n):
        """The row a pair inserts then deletes: (table, row)."""
        if how == "comment":
            return "comment", {
                "id": f"cnew{n:06d}",
                "issueId": self.detail_id,
                "authorId": self.users[0],
                "body": "new",
                "createdAt": self.max_comment_at + 1.0 + n,
            }
        if how == "issue_page2":
            at = (self.page_bound[5] + self.page_next[5]) / 2
        else:
            at = self.max_created + 10.0 + n
        return "issue", {
            "id": f"inew{n:06d}",
            "title": "new",
            "status": "todo",
            "priority": "low",
            "ownerId": self.users[n % len(self.users)],
            "createdAt": at,
            "updatedAt": at,
        }

    def requery(self, cursor, name):
        """Each view in plain SQL, in the reference evaluator's shape."""
        issue_cols = ", ".join(f'i."{c}"' for c in self.ISSUE)
        comment_cols = ", ".join(f'c."{c}"' for c in self.COMMENT)

        def comments_of(ids, limit, direction):
            if not ids:
                return {}
            marks = ", ".join(["%s"] * len(ids))
            cursor.execute(
                f"SELECT {', '.join(q(c) for c in self.COMMENT)} FROM (SELECT {comment_cols}, "
                f'ROW_NUMBER() OVER (PARTITION BY c."issueId" ORDER BY c."createdAt" '
                f'{direction}, c."id" ASC) AS rn FROM "comment" c WHERE c."issueId" IN ({marks})) '
                f'{f"WHERE rn <= {int(limit)} " if limit else ""}ORDER BY "issueId", rn',
                list(ids),
            )
            out = defaultdict(list)
            for r in cursor.fetchall():
                out[r[1]].append(dict(zip(self.COMMENT, r)))
            return out

        if name == "issue detail + comments":
            cursor.execute(
                f'SELECT {issue_cols}, u."id", u."name" FROM "issue" i LEFT JOIN "user" u '
                'ON u."id" = i."ownerId" WHERE i."id" = %s',
                [self.detail_id],
            )
            r = cursor.fetchone()
            if r is None:
                return None
            node = dict(zip(self.ISSUE, r[:7]))
            node["owner"] = {"id": r[7], "name": r[8]} if r[7] is not None else None
            node["comments"] = comments_of([node["id"]], None, "ASC").get(node["id"], [])
            return node
        owner = name != "newest 50 open"
        count = name in ("+ comment count", "+ 3 recent comments", "page 2 (start after the 50th)")
        recent = name in ("+ 3 recent comments", "page 2 (start after the 50th)")
        select = [issue_cols]
        joins = ""
        if owner:
            select.append('u."id", u."name"')
            joins = ' LEFT JOIN "user" u ON u."id" = i."ownerId"'
        if count:
            select.append('(SELECT COUNT(*) FROM "comment" c WHERE c."issueId" = i."id")')
        where, params = "i.\"status\" != 'done'", []
        if name.startswith("page 2"):
            b = self.page_bound
            where += ' AND (i."createdAt" < %s OR (i."createdAt" = %s AND i."id" > %s))'
            params = [b[5], b[5], b[0]]
        cursor.execute(
            f'SELECT {", ".join(select)} FROM "issue" i{joins} WHERE {where} '
            'ORDER BY i."createdAt" DESC, i."id" ASC LIMIT 50',
            params,
        )
        nodes = []
        for r in cursor.fetchall():
            node = dict(zip(self.ISSUE, r[:7]))
            k = 7
            if owner:
                node["owner"] = {"id": r[k], "name": r[k + 1]} if r[k] is not None else None
                k += 2
            if count:
                node["commentCount"] = r[k]
            nodes.append(node)
        if recent:
            top = comments_of([n["id"] for n in nodes], 3, "DESC")
            for n in nodes:
                n["recentComments"] = top.get(n["id"], [])
        return nodes

    def run(self):
        from django.db import connection

        from rindle_app.ivm.catalog import Catalog
        from rindle_app.ivm.evaluate import evaluate
        from rindle_app.ivm.live import LiveQueries
        from rindle_app.stream.reader import snapshot

        sz = self.sz
        t0 = perf()
        self.setup()
        tables = [self.engine.tables.get(t) for t in ("user", "issue", "comment")]
        version, fresh = snapshot(self.engine.using, tables)
        catalog = Catalog(self.engine.tables)
        catalog.load(version, fresh)
        live = LiveQueries(self.engine).start()
        setup_s = perf() - t0
        log(
            f"ui: setup {setup_s:.1f}s ({sz['ui_users']} users, {sz['ui_issues']} issues, "
            f"{sz['ui_comments']} comments)"
        )
        schema, store = self.engine.tables, catalog.store
        source = IndexedSource(fresh)
        results, failures, serial = [], [], [0]

        def pair_changes(how):
            serial[0] += 1
            table, row = self.pair_rows(how, serial[0])
            return table, row

        with connection.cursor() as cursor:
            for name, ast, how in self.views():
                gc.collect()
                h0 = perf()
                shared = catalog.register(ast)
                hydrate_ms = (perf() - h0) * 1e3
                key = shared.key
                # direct: Catalog.commit fed the insert, then the delete
                pairs, empty = [], 0
                for n in range(10 + sz["ui_pairs"]):
                    table, row = pair_changes(how)
                    v = catalog.version
                    a0 = perf()
                    out_add, f1 = catalog.commit(v + 1, [(table, None, row)])
                    a1 = perf()
                    out_del, f2 = catalog.commit(v + 2, [(table, row, None)])
                    a2 = perf()
                    if f1 or f2:
                        failures.append(f"{name}: faulted {f1 or f2}")
                        break
                    if key not in out_add or key not in out_del:
                        empty += 1
                    if n >= 10:  # the first 10 are warm-up
                        pairs.append((a1 - a0, a2 - a1))
                got = shared.view.result()
                want, seen = oracle(shared.query, source, schema)
                sql = self.requery(cursor, name)
                if got != want:
                    failures.append(
                        f"{name}: view != reference evaluator {_first_difference(got, want)}"
                    )
                if got != sql:
                    failures.append(f"{name}: view != SQL re-query {_first_difference(got, sql)}")
                footprint = row_set(shared.view.footprint_rows())
                if footprint != seen:
                    failures.append(f"{name}: footprint != rendered rows")
                literal = None
                if name in ("newest 50 open", "+ author", "issue detail + comments"):
                    rows = {t.name: list(store.rows(t.name)) for t in tables}
                    literal = got == evaluate(shared.query, rows, schema)
                    if not literal:
                        failures.append(f"{name}: view != evaluate() over the store")
                if empty:
                    failures.append(f"{name}: {empty} pairs did not change the view")
                catalog.destroy(key)

                # end to end: engine.write + poll, insert then delete
                lshared = live.catalog.register(ast)
                e2e = []
                for n in range(3 + sz["ui_e2e_pairs"]):
                    table, row = pair_changes(how)
                    pk = {"id": row["id"]}
                    e0 = perf()
                    self.engine.write(lambda tx, t=table, r=row: tx.insert(t, r))
                    _v, out_add, f1 = live.poll()
                    self.engine.write(lambda tx, t=table, pk=pk: tx.delete(t, pk))
                    _v, out_del, f2 = live.poll()
                    e1 = perf()
                    if f1 or f2 or lshared.key not in out_add or lshared.key not in out_del:
                        failures.append(f"{name}: end-to-end pair {n} did not change the view")
                        break
                    if n >= 3:
                        e2e.append(e1 - e0)
                if lshared.view.result() != sql:
                    failures.append(f"{name}: end-to-end view != SQL re-query")
                live.catalog.destroy(lshared.key)

                pair_ms = [(a + b) * 1e3 for a, b in pairs]
                results.append(
                    {
                        "view": name,
                        "pairs": len(pairs),
                        "hydrate_ms": hydrate_ms,
                        "pair_ms_median": median(pair_ms),
                        "pair_ms_p90": pct(pair_ms, 0.9),
                        "add_ms_median": median([a * 1e3 for a, _ in pairs]),
                        "remove_ms_median": median([b * 1e3 for _, b in pairs]),
                        "e2e_pairs": len(e2e),
                        "e2e_pair_ms_median": median([e * 1e3 for e in e2e]),
                        "literal_evaluate": literal,
                        "pair": "comment add+remove" if how == "comment" else "issue add+remove",
                    }
                )
                r = results[-1]
                log(
                    f"ui: {name:<32} pair {r['pair_ms_median']:.3f} ms, "
                    f"e2e {r['e2e_pair_ms_median'] or 0:.3f} ms"
                )

        # the database must be back where it started (every pair is net zero)
        _v2, again = snapshot(self.engine.using, tables)
        for t in tables:
            a = {store.pk(t.name, r): r for r in fresh[t.name]}
            b = {store.pk(t.name, r): r for r in again[t.name]}
            if a != b:
                failures.append(f"{t.name}: the database changed across the pairs")
        gate = {
            "workload": "ui",
            "label": "after the pairs",
            "views": len(results),
            "failures": failures[:20],
            "failure_count": len(failures),
            "pass": not failures,
        }
        self.bench.gates.append(gate)
        if failures:
            print("\n!!!!!!!! CORRECTNESS GATE FAILED: ui !!!!!!!!")
            for f in failures[:20]:
                print(f"!!   {f}")
            print("!!!!!!!! the numbers of this workload are INVALID !!!!!!!!\n", flush=True)
        return {
            "sizes": {
                "users": sz["ui_users"],
                "issues": sz["ui_issues"],
                "comments": sz["ui_comments"],
                "pairs_per_view": sz["ui_pairs"],
                "e2e_pairs_per_view": sz["ui_e2e_pairs"],
            },
            "setup_s": setup_s,
            "views": results,
        }


# --- memory --------------------------------------------------------------------------------


def measure_memory(bench, w1, w2):
    """
    tracemalloc bytes: the store per row; the first query of a shape (it also builds
    the store indexes the shape needs); each further idle query; each subscriber.
    """
    from rindle_app.ivm.catalog import Catalog, FamilyTemplate
    from rindle_app.stream.reader import snapshot

    out = {}
    engine = bench.engine
    n_subs = bench.sizes["mem_subs"]
    for w in (w1, w2):
        if w is None:
            continue
        tables = [engine.tables.get(t) for t in w.TABLES]
        version, rows = snapshot(engine.using, tables)
        n_rows = sum(len(r) for r in rows.values())
        template = FamilyTemplate(w.template)
        subs = [f"m-{w.key}-{i:06d}" for i in range(n_subs)]
        gc.collect()
        tracemalloc.start()
        try:
            m0 = tracemalloc.get_traced_memory()[0]
            catalog = Catalog(engine.tables)
            catalog.load(version, rows)
            gc.collect()
            m1 = tracemalloc.get_traced_memory()[0]
            first = catalog.bind(w.family, template, w.bindings[0])
            gc.collect()
            m2 = tracemalloc.get_traced_memory()[0]
            keys = [first.key] + [
                catalog.bind(w.family, template, b).key
                for b in w.bindings[1 : bench.sizes["mem_queries"]]
            ]
            gc.collect()
            m3 = tracemalloc.get_traced_memory()[0]
            for i, sub in enumerate(subs):
                catalog.attach(keys[i % len(keys)], sub)
            gc.collect()
            m4 = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        footprint = sum(len(catalog.queries[k].view.footprint) for k in keys)
        further = len(keys) - 1
        out[w.key] = {
            "store_rows": n_rows,
            "store_bytes_per_row": (m1 - m0) / n_rows,
            "first_query_bytes_incl_store_indexes": m2 - m1,
            "queries": len(keys),
            "bytes_per_further_idle_query": (m3 - m2) / further if further else None,
            "footprint_rows_per_query": footprint / len(keys),
            "subscribers": n_subs,
            "bytes_per_subscriber": (m4 - m3) / n_subs,
        }
        del catalog
        gc.collect()
    return out


# --- reporting ------------------------------------------------------------------------------


def verdict(ok):
    return "PASS" if ok else "FAIL"


def print_family(res, name):
    r = res
    s = r["sizes"]
    print()
    print(f"=== {name} ===")
    print("sizes: " + ", ".join(f"{k}={v}" for k, v in s.items()))
    print("script kinds: " + ", ".join(f"{k} {v}" for k, v in r["kinds"].items()))
    lim, ivm = r["limit"]["median_commits_s"], r["ivm"]["median_commits_s"]
    b1, b2 = r["b1"], r["b2"]
    measured = [
        ("IVM, poll + fan-out every 10th commit", "ivm_poll_every_10"),
        ("IVM through the hub, as the server runs it", "ivm_hub"),
        ("IVM, every step on the hub thread", "ivm_hub_thread"),
        ("IVM in a second process (tails the outbox)", "ivm_second_process"),
    ]
    rows = [
        ("L  commit-only limit", lim, r["limit"]["commits_s"], r["commits"]),
        ("IVM write + poll + fan-out, every commit", ivm, r["ivm"]["commits_s"], r["commits"]),
        *[
            (label, r[key]["median_commits_s"], r[key]["commits_s"], r["commits"])
            for label, key in measured
        ],
        (
            f"B2 re-query per binding ({b2['queries_per_commit']}/commit)",
            b2["commits_s"],
            None,
            b2["commits"],
        ),
        (
            f"B1 re-query per subscriber ({b1['queries_per_commit']}/commit)",
            b1["commits_s"],
            None,
            b1["commits"],
        ),
    ]
    print(
        "  L: engine.write only. IVM: engine.write, LiveQueries.poll() (outbox read + "
        "Catalog.commit), fan-out (ops"
    )
    print(
        "  JSON-encoded once per changed query, counted per subscriber). B2/B1: engine.write, "
        "then the view re-run in"
    )
    print(
        "  plain SQL (Django cursor) per binding / per subscriber, diffed, JSON-encoded if "
        "changed. Same script, same seed state."
    )
    print(f"  {'variant':<46}{'commits/s':>11}{'µs/commit':>11}   commits  (repeats)")
    for label, value, each, n in rows:
        spread = "" if each is None else "  (" + ", ".join(fmt_rate(x) for x in each) + ")"
        print(f"  {label:<46}{fmt_rate(value):>11}{1e6 / value:>11,.0f}   {n:>7}{spread}")
    pc = r["ivm"]["per_commit_us"]
    print(
        f"  IVM per commit (median repeat), µs: write p50 {pc['write_p50']:.0f}; poll p50 "
        f"{pc['poll_p50']:.0f} (mean {pc['poll_mean']:.0f} = outbox read "
        f"{pc['outbox_read_mean']:.0f} + Catalog.commit {pc['catalog_commit_mean']:.0f}); "
        f"fan-out {pc['fanout_mean']:.0f}"
    )
    print(
        f"  IVM commit->delta ready p50 {pc['delta_ready_p50']:.0f} µs, p99 "
        f"{pc['delta_ready_p99']:.0f} µs; Catalog.commit alone would allow "
        f"{fmt_rate(r['ivm']['catalog_commit_only_commits_s'])} commits/s"
    )
    print(
        f"  derived: write + Catalog.commit + fan-out without the outbox read would be "
        f"{fmt_rate(r['derived_ivm_without_outbox_read_commits_s'])} commits/s "
        f"({r['derived_ivm_without_outbox_read_commits_s'] / lim:.2f} x L)"
    )
    print(
        f"  IVM: {r['ivm']['views_changed_per_commit']:.2f} views changed per commit, "
        f"{r['ivm']['messages']:,} subscriber messages, {r['ivm']['bytes']:,} bytes"
    )
    bt = r["batch_tail"]
    if bt["commits"]:
        print(
            f"  batch tail ({bt['commits']} commits, {bt['rows']} row ops): L "
            f"{fmt_rate(bt['limit_commits_s'])}/s, IVM {fmt_rate(bt['ivm_commits_s'])}/s "
            f"-> {bt['ivm_over_limit']:.2f}x"
        )
    ra = r["ratios"]
    print("  ratios:")
    per = ", ".join(f"{x:.2f}" for x in ra["ivm_over_limit_per_repeat"])
    print(
        f"    IVM / L                              {ra['ivm_over_limit']:.2f}   (per repeat {per})"
    )
    print(f"    IVM poll/10 / L                      {r['ivm_poll_every_10']['over_limit']:.2f}")
    for label, hub in (("IVM hub / L", r["ivm_hub"]), ("IVM hub thread / L", r["ivm_hub_thread"])):
        per = ", ".join(f"{x:.2f}" for x in hub["over_limit_per_repeat"])
        cpp = ", ".join(f"{x:.2f}" for x in hub["commits_per_poll"])
        here = ", ".join(f"{x:.0%}" for x in hub["steps_on_the_committing_thread"])
        print(
            f"    {label:<37}{hub['over_limit']:.2f}   (per repeat {per}; commits per step "
            f"{cpp}; steps on the committing thread {here}; commit->delta ready p50 "
            f"{hub['commit_to_delta_ready_us']['p50']:.0f} µs, p99 "
            f"{hub['commit_to_delta_ready_us']['p99']:.0f} µs)"
        )
    sp = r["ivm_second_process"]
    per = ", ".join(f"{x:.2f}" for x in sp["over_limit_per_repeat"])
    cpp = ", ".join(f"{x:.0f}" for x in sp["commits_per_poll"])
    busy = ", ".join(f"{x:.0f}" for x in sp["busy_us_per_commit"])
    alone = ", ".join(fmt_rate(x) for x in sp["writes_alone_commits_s"])
    print(
        f"    IVM second process / L               {sp['over_limit']:.2f}   (per repeat {per}; "
        f"polls every {sp['poll_interval_s'] * 1e3:g} ms, commits per poll {cpp}; its busy "
        f"time {busy} µs per commit; the writes alone {alone}/s; commit->delta ready p50 "
        f"{sp['commit_to_delta_ready_ms']['p50']:.1f} ms, p99 "
        f"{sp['commit_to_delta_ready_ms']['p99']:.1f} ms)"
    )
    fl = r["inline_floor"]
    if fl["median_commits_s"]:
        per = ", ".join(f"{x:.2f}" for x in fl["over_limit_per_repeat"])
        print(
            f"    inline floor / L                     {fl['over_limit']:.2f}   (per repeat {per}; "
            "a hand-written W1-only pipeline on the writing thread: json.loads, bisect, json.dumps)"
        )
    print(
        f"    IVM / B2 (same {b2['commits']} commits)          "
        f"{fmt_ratio(ra['ivm_over_b2_same_commits'])}"
    )
    print(
        f"    IVM / B1 (same {b1['commits']} commits)           "
        f"{fmt_ratio(ra['ivm_over_b1_same_commits'])}"
    )
    agree = r["changed_views_agree_with_b2"]
    print(
        f"  views changed per commit, IVM vs B2: identical on {agree['agreeing']} of "
        f"{agree['commits_compared']} commits"
    )
    ref = r.get("refills") or {}
    if ref.get("refill_scans"):
        print(
            f"  window scans (checked pass): {ref.get('refill_scans', 0)} refills examined "
            f"{ref.get('refill_rows_examined', 0):,} root rows for "
            f"{ref.get('refill_rows_out', 0):,} rows admitted "
            f"({ref.get('refill_rows_examined', 0) / max(1, ref.get('refill_scans', 1)):.0f} "
            f"per refill); hydration examined "
            f"{ref.get('hydrate_rows_examined', 0) / max(1, ref.get('hydrate_scans', 1)):.0f} "
            "rows per view"
        )
    if ref.get("apply_calls"):
        commits = (r.get("checked_pass") or {}).get("commits") or 1
        print(
            f"  routing (checked pass): View.apply called {ref['apply_calls'] / commits:.1f} "
            f"times per commit (of {s['bindings']} views), "
            f"{ref.get('apply_calls_with_ops', 0) / commits:.2f} of them returned ops"
        )
    ck = r.get("checked_pass") or {}
    if ck.get("result_changed_without_ops"):
        print(
            f"  NOTE: views whose result changed but whose ops were EMPTY: "
            f"{ck['result_changed_without_ops']} (by commit kind)"
        )
    if ck.get("ops_without_result_change"):
        print(f"  NOTE: ops emitted without a result change: {ck['ops_without_result_change']}")
    if ck.get("ops_for_untouched_bindings"):
        print(
            f"  NOTE: ops for bindings the commit did not touch: {ck['ops_for_untouched_bindings']}"
        )
    st = r["setup"]
    print(
        f"  hydration: LiveQueries.start {st['start_s']:.2f}s, bind "
        f"{st['bind_ms_per_binding']:.1f} ms per binding, attach "
        f"{st['attach_us_per_subscriber']:.1f} µs per subscriber"
    )


def top_functions(prof, limit=14, sort="tottime"):
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.strip_dirs().sort_stats(sort).print_stats(limit)
    text = out.getvalue()
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return "\n".join(lines[start:])


def environment():
    sys.path.insert(0, str(ROOT))
    from bench.mutations import environment as env_of

    env = env_of("sqlite")
    env["rindle_app_sha1"] = source_fingerprint()
    return env


def source_fingerprint():
    """
    SHA-1 (12 hex) of the rindle_app sources this process imported: with uncommitted
    changes, the commit alone does not say which code was measured.
    """
    import hashlib

    digest = hashlib.sha1()
    for name, module in sorted(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name.startswith("rindle_app") and path and path.endswith(".py"):
            digest.update(name.encode())
            digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:12]


# --- main -------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        from rindle_app.engine import get_engine

        self.args = args
        self.sizes = args.sizes
        self.engine = get_engine()
        self.gates = []


def main(argv=None):
    args = parse_args(argv)
    started = _T0[0] = perf()
    tmpdir = tempfile.mkdtemp(prefix="rindle-bench-ivm-")
    path = str(Path(tmpdir) / "bench.sqlite3")
    try:
        os.environ["DATABASE_URL"] = f"sqlite:///{path}"
        os.environ.pop("RINDLE_TEST_DATABASE_NAME", None)
        os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
        os.environ["DJANGO_DEBUG"] = "0"
        sys.path.insert(0, str(ROOT))

        import logging

        import django

        django.setup()
        logging.getLogger("rindle").setLevel(logging.WARNING)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from bench.mutations import CpuMeter
        from rindle_app.ivm import catalog, evaluate, live, store, view  # noqa: F401

        env = environment()
        meter = CpuMeter()
        bench = Bench(args)
        mode = "quick" if args.quick else "default"
        print(
            f"rindle IVM benchmark: SQLite {env.get('sqlite')}, {mode} sizes, seed {args.seed}, "
            f"database {path} (fresh, migrated in this process)",
            flush=True,
        )
        results = {}
        w1 = w2 = None
        if "w1" in args.workloads:
            w1 = W1(bench, random.Random(args.seed))
            results["w1"] = w1.run()
        if "w2" in args.workloads:
            w2 = W2(bench, random.Random(args.seed + 1))
            results["w2"] = w2.run()
        if "ui" in args.workloads:
            results["ui"] = UIViews(bench, random.Random(args.seed + 2)).run()
        if "mem" in args.workloads:
            if w1 is None and w2 is None:
                print("mem: needs w1 and/or w2 data; running their setup only", flush=True)
                w1 = W1(bench, random.Random(args.seed))
                w1.setup()
            results["mem"] = measure_memory(bench, w1, w2)
            log("mem: done")
        profiles = {}
        if args.profile:
            for w in (w1, w2):
                if w is None or not hasattr(w, "script"):
                    continue
                profs = {0: cProfile.Profile()}
                if w.tail:
                    profs[1] = cProfile.Profile()
                w.run_ivm([w.script, w.tail], profile=profs)
                w.restore()
                RESULTS_DIR.mkdir(parents=True, exist_ok=True)
                for index, prof in profs.items():
                    name = w.key if index == 0 else f"{w.key}-batch-tail"
                    dump = RESULTS_DIR / f"profile-ivm-{name}.pstats"
                    prof.dump_stats(dump)
                    profiles[name] = {
                        "pstats": str(dump.relative_to(ROOT)),
                        "tottime": top_functions(prof, 16, "tottime"),
                        "cumulative": top_functions(prof, 22, "cumulative"),
                    }
            log("profiles done")
        env["loadavg_end"] = round(os.getloadavg()[0], 2)
        env["other_cpus_busy"] = meter.other_cpus()
        env["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        elapsed = perf() - started
        summary = report(args, env, results, bench.gates, profiles, elapsed)

        out = Path(args.json) if args.json else RESULTS_DIR / "ivm-sqlite.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "benchmark": "bench/ivm.py",
            "backend": "sqlite",
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": {
                "mode": mode,
                "seed": args.seed,
                "sizes": args.sizes,
                "workloads": args.workloads,
                "profile": args.profile,
            },
            "environment": env,
            "results": results,
            "gates": bench.gates,
            "targets": summary,
            "profiles": profiles,
            "elapsed_s": round(elapsed, 1),
        }
        out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"results written to {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
        if not all(g["pass"] for g in bench.gates):
            print("\nCORRECTNESS GATE FAILED: see the !!! lines above; the figures are invalid.")
            return 3
        return 0
    except GateFailure as exc:
        print(f"\n!!!!!!!! CORRECTNESS GATE FAILED: {exc} !!!!!!!!")
        return 3
    finally:
        if "django" in sys.modules:  # so bench/ is on sys.path
            from bench.mutations import stop_django

            stop_django()
        shutil.rmtree(tmpdir, ignore_errors=True)


def report(args, env, results, gates, profiles, elapsed):
    print()
    print("=" * 100)
    print(
        f"rindle IVM benchmark (SQLite {env.get('sqlite')}, Python {env.get('python')}, "
        f"Django {env.get('django')}, {env.get('cpus')} CPUs, commit {env.get('git_commit')}"
        f"{' + uncommitted rindle_app changes' if env.get('rindle_app_dirty') else ''}; "
        f"rindle_app sources sha1 {env.get('rindle_app_sha1')})"
    )
    other = env.get("other_cpus_busy")
    if other is not None:
        print(
            f"CPU used by other processes during the run: {other} of {env['cpus']} CPUs"
            + ("  NOTE: expect noisy numbers" if other > 0.25 else "")
        )
    summary = {}
    if "w1" in results:
        r = results["w1"]
        print_family(r, "W1 top-k family: post WHERE board = ? ORDER BY score DESC LIMIT 20")
        a = r["ratios"]["ivm_over_limit"]
        b = r["ratios"]["ivm_over_b1_same_commits"]
        summary["w1_ivm_vs_limit"] = {
            "value": a,
            "target": TARGETS["w1_ivm_vs_limit"],
            "pass": a >= TARGETS["w1_ivm_vs_limit"],
        }
        c = r["ivm_second_process"]["over_limit"]
        summary["w1_second_process_vs_limit"] = {
            "value": c,
            "target": TARGETS["w1_ivm_vs_limit"],
            "pass": c >= TARGETS["w1_ivm_vs_limit"],
        }
        summary["w1_ivm_vs_b1"] = {
            "value": b,
            "target": TARGETS["w1_ivm_vs_b1"],
            "subscribers": r["sizes"]["subscribers"],
            "pass": b >= TARGETS["w1_ivm_vs_b1"],
        }
    if "w2" in results:
        r = results["w2"]
        print_family(
            r,
            "W2 issue list: EXISTS(bug) AND NOT closed ORDER BY updated_at DESC "
            "LIMIT 50, one(author), comments LIMIT 3, count(comments)",
        )
        a = r["ratios"]["ivm_over_limit"]
        summary["w2_ivm_vs_limit"] = {
            "value": a,
            "target": TARGETS["w2_ivm_vs_limit"],
            "pass": a >= TARGETS["w2_ivm_vs_limit"],
        }
        c = r["ivm_second_process"]["over_limit"]
        summary["w2_second_process_vs_limit"] = {
            "value": c,
            "target": TARGETS["w2_ivm_vs_limit"],
            "pass": c >= TARGETS["w2_ivm_vs_limit"],
        }
    if "ui" in results:
        r = results["ui"]
        s = r["sizes"]
        print()
        print(
            f"=== the original's realistic UI views ({s['users']:,} users, {s['issues']:,} "
            f"issues, {s['comments']:,} comments) ==="
        )
        print(
            f"  {'view':<32}{'hydrate ms':>11}{'pair ms':>9}{'p90':>8}{'add':>8}{'remove':>8}"
            f"{'e2e pair ms':>13}  pair"
        )
        worst = 0.0
        for v in r["views"]:
            worst = max(worst, v["pair_ms_median"])
            print(
                f"  {v['view']:<32}{v['hydrate_ms']:>11.1f}{v['pair_ms_median']:>9.3f}"
                f"{v['pair_ms_p90']:>8.3f}{v['add_ms_median']:>8.3f}"
                f"{v['remove_ms_median']:>8.3f}{v['e2e_pair_ms_median'] or 0:>13.3f}  "
                f"{v['pair']}"
            )
        print(
            f"  pair = Catalog.commit(insert) + Catalog.commit(delete), median of "
            f"{s['pairs_per_view']}; e2e = engine.write + LiveQueries.poll() twice, median of "
            f"{s['e2e_pairs_per_view']}"
        )
        print(
            "  hydrate = Catalog.register; the first view that needs a store index (the ordered "
            "issue index, the comment"
        )
        print("  lookup by issueId) pays for building it: 'newest 50 open' and '+ comment count'")
        print(f"  the Rust original: {ORIGINAL_PAIR_MS[0]}-{ORIGINAL_PAIR_MS[1]} ms per pair")
        summary["ui_pair_ms"] = {
            "value": worst,
            "target": TARGETS["ui_pair_ms"],
            "pass": worst <= TARGETS["ui_pair_ms"],
            "views_passing": sum(
                1 for v in r["views"] if v["pair_ms_median"] <= TARGETS["ui_pair_ms"]
            ),
        }
    if "mem" in results:
        print()
        print("=== memory (tracemalloc) ===")
        for key, m in results["mem"].items():
            further = m["bytes_per_further_idle_query"]
            print(
                f"  {key}: store {m['store_bytes_per_row']:.0f} B/row ({m['store_rows']:,} rows); "
                f"first query {m['first_query_bytes_incl_store_indexes'] / 1024:,.0f} KiB "
                f"(incl. the store indexes it needs); each further idle query "
                f"{(further or 0) / 1024:,.1f} KiB ({m['footprint_rows_per_query']:.0f} "
                f"footprint rows); {m['bytes_per_subscriber']:.0f} B per subscriber "
                f"({m['subscribers']:,} attached over {m['queries']} queries)"
            )
    print()
    print("=== targets ===")
    labels = {
        "w1_ivm_vs_limit": "W1 IVM >= 0.8 x L, inline (writes and views, one core)",
        "w1_second_process_vs_limit": "W1 IVM >= 0.8 x L, views in a second process",
        "w1_ivm_vs_b1": "W1 IVM >= 100 x B1 (1,000 subscribers)",
        "w2_ivm_vs_limit": "W2 IVM >= 0.5 x L, inline (§6, informational)",
        "w2_second_process_vs_limit": "W2 IVM >= 0.5 x L, second process (informational)",
        "ui_pair_ms": "UI views <= 0.25 ms per add+remove pair (worst view)",
    }
    failed = {g["workload"] for g in gates if not g["pass"]}
    for k, v in summary.items():
        value = v["value"]
        shown = f"{value:.3f} ms" if k == "ui_pair_ms" else fmt_ratio(value)
        extra = f" ({v['views_passing']}/6 views pass)" if k == "ui_pair_ms" else ""
        if k.split("_")[0] in failed:
            v["invalid"] = True
            extra += "  INVALID: this workload's correctness gate failed"
        print(f"  {labels[k]:<58}{shown:>12}  -> {verdict(v['pass'])}{extra}")
    print()
    print("=== correctness gate ===")
    for g in gates:
        what = g.get("views") or g.get("views_compared")
        print(
            f"  {g['workload']:<4}{g['label']:<28}{verdict(g['pass'])}"
            f"{'' if g['pass'] else '  <-- ' + str(g['failure_count']) + ' failures'}"
            f"{'' if what is None else f'  ({what} views)'}"
        )
    if profiles:
        for key, p in profiles.items():
            print()
            print(
                f"=== cProfile of one IVM run of {key} (write + poll + fan-out per commit; "
                f"{p['pstats']}) ==="
            )
            print(p["tottime"])
            print(p["cumulative"])
    print(f"total time {elapsed:.1f}s; peak RSS {env.get('peak_rss_mib')} MiB")
    return summary


if __name__ == "__main__":
    sys.exit(main())
