#!/usr/bin/env python
"""
Usage-ledger cost: the record() hot path beside a bare dict increment, and the
flush of 10k namespaces beside the ORM's bulk_create of the same rows, in one run.

    .venv/bin/python bench/flow.py [--calls 1000000] [--namespaces 10000]
                                   [--repeats 5] [--database-url URL]

Hot path (no database): ``--calls`` calls over 64 namespaces whose slots exist,
all on one UTC day, each workload ``--repeats`` times in rotated order, median
calls/s reported:

- record: ``ledger.record(ns, at, transfer)`` with a prebuilt Transfer (no session);
- record+session: the same with a session id (a set insertion per call);
- dict +=: BASELINE, ``counts[ns] += n``: one bare dict increment, inline;
- call+lock+dict: a function call that takes a lock and does four dict increments,
  the cheapest Python shape of "count a transfer safely from several threads".

Also the memory blocks the interpreter holds after 100k more record() calls than
before them (``sys.getallocatedblocks``): the record path allocates nothing that
outlives the call.

Flush (``--database-url`` as bench/mutations.py; SQLite by default): a fresh node
records one transfer (with a session) for each of ``--namespaces`` namespaces, then

- flush (insert): the first flush, which inserts every row;
- flush (update): a second transfer everywhere, then a flush that updates every row;
- flush (idle): a flush with nothing changed (reads tombstones, deletes aged rows);
- bulk_create: BASELINE, ``FlowDayRecord.objects.bulk_create`` of the same number of
  new rows in one transaction (what a naive ORM flush would pay for the inserts).

Results go to bench/results/flow-<backend>.json.
"""

import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the checkout root is on sys.path first)
    CpuMeter,
    counts_parser,
    django_database,
    environment,
    interleaved,
    write_results,
)

DAY_MS = 86_400_000
NOW = 20_000 * DAY_MS + 12 * 3_600_000  # a fixed noon, UTC
HOT = {
    "record": "ledger.record(ns, at, Transfer(...)): slot exists, same day, no session",
    "record_session": "the same with Transfer(session=...): one set insertion per call",
    "dict": "BASELINE: counts[ns] += n, a bare dict increment inline",
    "call_lock_dict": "a function call: with lock: four dict increments",
}


parse_args = counts_parser(
    __doc__,
    [
        ("calls", 1_000_000, "hot-path calls per run"),
        ("namespaces", 10_000, "namespaces flushed"),
    ],
)


# --- the hot path -----------------------------------------------------------------------


class HotPath:
    def __init__(self, calls):
        from rindle_app.flow import FlowLedger, Transfer

        class NoStore:
            """The hot path never reaches the store; start() reads it once."""

            def tombstones(self, since=0):
                return []

            def node_rows(self, node, day):
                return []

        self.calls = calls
        self.names = [f"tenant-{i}" for i in range(64)]
        self.ledger = FlowLedger(NoStore(), node="bench-hot", retention_days=90).start(NOW)
        self.transfer = Transfer(1_200, 48_000, 0, 32_000)
        self.with_session = Transfer(1_200, 48_000, 0, 32_000, session="session-1")
        for name in self.names:
            self.ledger.record(name, NOW, self.transfer)
        self.counts = dict.fromkeys(self.names, 0)
        self.wide = {name: [0, 0, 0, 0] for name in self.names}
        self.lock = threading.Lock()

    def run_record(self, transfer=None):
        record, names, at = self.ledger.record, self.names, NOW
        transfer = transfer or self.transfer
        t0 = time.perf_counter()
        for i in range(self.calls):
            record(names[i & 63], at, transfer)
        return time.perf_counter() - t0

    def run_record_session(self):
        return self.run_record(self.with_session)

    def run_dict(self):
        counts, names, n = self.counts, self.names, self.transfer.bytes_out
        t0 = time.perf_counter()
        for i in range(self.calls):
            counts[names[i & 63]] += n
        return time.perf_counter() - t0

    def run_call_lock_dict(self):
        wide, lock, names, t = self.wide, self.lock, self.names, self.transfer

        def count(name, at, transfer):
            with lock:
                row = wide[name]
                row[0] += transfer.bytes_in
                row[1] += transfer.bytes_out
                row[2] += transfer.bulk_bytes_out
                row[3] += 1

        t0 = time.perf_counter()
        for i in range(self.calls):
            count(names[i & 63], NOW, t)
        return time.perf_counter() - t0

    def retained_blocks(self, calls=100_000):
        """Interpreter memory blocks still held after ``calls`` more record() calls."""
        record, names, t = self.ledger.record, self.names, self.with_session
        for i in range(1000):  # the set already holds the session id
            record(names[i & 63], NOW, t)
        before = sys.getallocatedblocks()
        for i in range(calls):
            record(names[i & 63], NOW, t)
        return sys.getallocatedblocks() - before


# --- the flush ----------------------------------------------------------------------------


def flush_runs(n, rep):
    from django.db import transaction

    from rindle_app.flow import FlowLedger, FlowStore, Transfer
    from rindle_app.models import FlowDayRecord

    ledger = FlowLedger(FlowStore(), node=f"bench-flush-{rep}", retention_days=90).start(NOW)
    names = [f"ns-{rep}-{i}" for i in range(n)]
    for i, name in enumerate(names):
        ledger.record(name, NOW, Transfer(1_000 + i, 50_000, session=f"s{i}"))
    out = {}
    t0 = time.perf_counter()
    written = ledger.flush(NOW)
    out["flush_insert"] = time.perf_counter() - t0
    assert written == n, written
    for i, name in enumerate(names):
        ledger.record(name, NOW + 1, Transfer(10, 20, session=f"t{i}"))
    t0 = time.perf_counter()
    written = ledger.flush(NOW + 1)
    out["flush_update"] = time.perf_counter() - t0
    assert written == n, written
    t0 = time.perf_counter()
    assert ledger.flush(NOW + 2) == 0
    out["flush_idle"] = time.perf_counter() - t0

    objs = [
        FlowDayRecord(
            namespace=name,
            day=NOW // DAY_MS,
            node=f"bench-orm-{rep}",
            bytes_in=1_000 + i,
            bytes_out=50_000,
            transfers=1,
            sessions="[1]",
            last_seen_ms=NOW,
        )
        for i, name in enumerate(names)
    ]
    t0 = time.perf_counter()
    with transaction.atomic():
        FlowDayRecord.objects.bulk_create(objs, batch_size=1000)
    out["bulk_create"] = time.perf_counter() - t0
    # Check: the ledger's rows hold both transfers of every namespace.
    stored = FlowDayRecord.objects.filter(node=ledger.node)
    assert stored.count() == n
    assert sum(stored.values_list("transfers", flat=True)) == 2 * n
    return out


# --- main ---------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    with django_database(args.database_url) as db:
        env = environment(db.backend)
        meter = CpuMeter()

        hot = HotPath(args.calls)
        keys = list(HOT)
        for key in keys:  # warm-up
            getattr(hot, f"run_{key}")()
        samples = interleaved(
            keys,
            args.repeats,
            lambda key, _tag: args.calls / getattr(hot, f"run_{key}")(),
            label="hot repeat",
        )
        retained = hot.retained_blocks()

        flushes = {k: [] for k in ("flush_insert", "flush_update", "flush_idle", "bulk_create")}
        for rep in range(args.repeats):
            for key, seconds in flush_runs(args.namespaces, rep).items():
                flushes[key].append(seconds)
            print(
                f"flush repeat {rep + 1}/{args.repeats}: "
                + ", ".join(f"{k} {v[-1] * 1000:,.0f} ms" for k, v in flushes.items()),
                flush=True,
            )
        env["other_cpus_busy"] = meter.other_cpus()

        med = {k: statistics.median(v) for k, v in samples.items()}
        fmed = {k: statistics.median(v) for k, v in flushes.items()}
        ratios = {
            "record / dict +=": med["record"] / med["dict"],
            "record+session / dict +=": med["record_session"] / med["dict"],
            "record / call+lock+dict": med["record"] / med["call_lock_dict"],
            "flush (insert) time / bulk_create time": fmed["flush_insert"] / fmed["bulk_create"],
        }
        print()
        print(
            f"rindle flow benchmark: {db.backend}; {args.calls:,} hot-path calls per run, "
            f"{args.namespaces:,} namespaces flushed, repeats={args.repeats}; CPU used by "
            f"other processes: {env['other_cpus_busy']} of {env['cpus']}"
        )
        print(f"  {'hot path':<18}{'calls/s':>14}{'ns/call':>10}{'min..max calls/s':>26}")
        for key in keys:
            spread = f"{min(samples[key]):,.0f}..{max(samples[key]):,.0f}"
            print(f"  {key:<18}{med[key]:>14,.0f}{1e9 / med[key]:>10,.0f}{spread:>26}")
        for key in keys:
            print(f"    {key:<16}{HOT[key]}")
        print(f"  memory blocks retained after 100,000 more record() calls: {retained}")
        print(f"  {'flush':<18}{'median ms':>14}{'rows/s':>14}")
        for key, value in fmed.items():
            rows = 0 if key == "flush_idle" else args.namespaces
            rate = f"{rows / value:>14,.0f}" if rows else f"{'-':>14}"
            print(f"  {key:<18}{value * 1000:>14,.1f}{rate}")
        print("ratios:")
        for name, value in ratios.items():
            print(f"  {name:<32}{value:8.3f}")
        print(f"total time {time.perf_counter() - started:.1f}s")

        body = {
            "config": {
                "calls": args.calls,
                "namespaces": args.namespaces,
                "repeats": args.repeats,
            },
            "environment": env,
            "hot_path": {
                k: {"measures": HOT[k], "median_calls_s": med[k], "calls_s": samples[k]}
                for k in keys
            },
            "retained_blocks_per_100k_records": retained,
            "flush_seconds": {k: {"median": fmed[k], "runs": flushes[k]} for k in flushes},
            "ratios": ratios,
        }
        write_results(args.json, f"flow-{db.backend}.json", "bench/flow.py", db.backend, body)


if __name__ == "__main__":
    main()
