#!/usr/bin/env python
"""
Ingest throughput: producer writes and change-source batches through the engine,
beside the same rows through plain Django SQL and through the raw driver, in one run.

    .venv/bin/python bench/ingest.py [--batches 200] [--rows 100] [--repeats 5]
                                     [--producers 100000] [--database-url URL]

Every workload writes ``--batches`` batches of ``--rows`` rows into the SAME captured
table (its trigger appends one outbox row per row), one transaction per batch:

- producer: ``engine.producer_write(name, seq, changes)``: admission, the rows, the
  offset upsert (itself captured) in one writer transaction;
- source: ``engine.apply_source_batch(name, offset, changes)``: the cursor upsert
  instead of the offset;
- plain SQL (the obvious alternative): ``with transaction.atomic(): cursor.executemany``
  of the same INSERT on the caller's own Django connection;
- physical limit: the raw driver, ``executemany`` and COMMIT per batch, no Django.

Then the census read cost at ``--producers`` producers: ``ProducerCensus.get()``
beside the ``COUNT(*)`` a scrape would otherwise run. The median of the interleaved
repeats is reported with ratios; results go to bench/results/ingest-<backend>.json.
"""

import statistics
import sys
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
    raw_connection,
    write_results,
)

TABLE = "bench_ingest"
PAYLOAD = "p" * 64
WORKLOADS = {
    "producer": "engine.producer_write: admission + rows + offset upsert, one transaction",
    "source": "engine.apply_source_batch: dedup + rows + cursor upsert, one transaction",
    "plain_sql": "BASELINE: transaction.atomic() + cursor.executemany(INSERT) per batch",
    "physical": "raw driver: executemany(INSERT) + COMMIT per batch, no Django",
}


parse_args = counts_parser(
    __doc__,
    [
        ("batches", 200, "batches per workload run (200)"),
        ("rows", 100, "rows per batch (100)"),
        ("producers", 100_000, "census size (100000)"),
    ],
)


class Bench:
    def __init__(self, args, db):
        from django.db import connection, transaction

        from rindle_app.engine import get_engine

        self.args, self.db = args, db
        self.connection, self.transaction = connection, transaction
        self.engine = get_engine()
        self.engine.register_table(TABLE, ["id", "batch", "payload"], [0], ["string"] * 3)
        self.raw = raw_connection(db.backend, self.connection.settings_dict)
        self.written = 0
        ph = "?" if db.backend == "sqlite" else "%s"
        self.raw_sql = f'INSERT INTO "{TABLE}" ("id", "batch", "payload") VALUES ({ph}, {ph}, {ph})'
        self.sql = f'INSERT INTO "{TABLE}" ("id", "batch", "payload") VALUES (%s, %s, %s)'

    def batches(self, tag):
        n, rows = self.args.batches, self.args.rows
        return [[(f"{tag}-{b}-{r}", f"{tag}-{b}", PAYLOAD) for r in range(rows)] for b in range(n)]

    @staticmethod
    def changes(batch):
        return [
            {"table": TABLE, "op": "add", "row": {"id": i, "batch": b, "payload": p}}
            for i, b, p in batch
        ]

    def run_producer(self, tag):
        work = [self.changes(b) for b in self.batches(tag)]
        write = self.engine.producer_write
        t0 = time.perf_counter()
        for seq, changes in enumerate(work, 1):
            if not write(tag, seq, changes).applied:
                raise RuntimeError("a producer write was not applied")
        return time.perf_counter() - t0

    def run_source(self, tag):
        work = [self.changes(b) for b in self.batches(tag)]
        apply = self.engine.apply_source_batch
        t0 = time.perf_counter()
        for offset, changes in enumerate(work, 1):
            if not apply(tag, str(offset), changes).applied:
                raise RuntimeError("a source batch was not applied")
        return time.perf_counter() - t0

    def run_plain_sql(self, tag):
        work, atomic, connection, sql = (
            self.batches(tag),
            self.transaction.atomic,
            self.connection,
            self.sql,
        )
        t0 = time.perf_counter()
        for batch in work:
            with atomic(), connection.cursor() as cursor:
                cursor.executemany(sql, batch)
        return time.perf_counter() - t0

    def run_physical(self, tag):
        work, conn, sql = self.batches(tag), self.raw, self.raw_sql
        if self.db.backend == "sqlite":
            t0 = time.perf_counter()
            for batch in work:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(sql, batch)
                conn.execute("COMMIT")
            return time.perf_counter() - t0
        t0 = time.perf_counter()
        with conn.cursor() as cur:
            for batch in work:
                cur.executemany(sql, batch)
                conn.commit()
        return time.perf_counter() - t0

    def check(self):
        """Every row landed once and was captured once."""
        with self.connection.cursor() as cursor:
            cursor.execute(f'SELECT COUNT(*) FROM "{TABLE}"')
            rows = cursor.fetchone()[0]
            cursor.execute(
                "SELECT COUNT(*) FROM _rindle_change_events WHERE \"table\" = %s AND op = 'add'",
                [TABLE],
            )
            captured = cursor.fetchone()[0]
        if rows != self.written or captured != rows:
            raise RuntimeError(f"{rows} rows, {captured} captured, expected {self.written}")
        return {"rows": rows, "captured": captured}

    def census(self):
        """ns per census read vs ms per COUNT(*), at --producers distinct producers."""
        n = self.args.producers
        existing = self.engine.producer_census.get()
        with self.transaction.atomic(), self.connection.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO _rindle_producer_offsets (producer, seq, digest, owner) "
                "VALUES (%s, 1, NULL, NULL)",
                [(f"census-{i}",) for i in range(n)],
            )
        self.engine.seed_producer_census()
        total = self.engine.producer_census.get()
        if total != existing + n:
            raise RuntimeError(f"census {total}, expected {existing + n}")
        get = self.engine.producer_census.get
        reads = 1_000_000
        t0 = time.perf_counter()
        for _ in range(reads):
            get()
        census_ns = (time.perf_counter() - t0) / reads * 1e9
        counts = []
        for _ in range(9):
            with self.connection.cursor() as cursor:
                t0 = time.perf_counter()
                cursor.execute("SELECT COUNT(*) FROM _rindle_producer_offsets")
                cursor.fetchone()
                counts.append(time.perf_counter() - t0)
        count_ms = statistics.median(counts) * 1e3
        return {"producers": total, "census_get_ns": census_ns, "count_star_ms": count_ms}


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    with django_database(args.database_url) as db:
        bench = Bench(args, db)
        env = environment(db.backend)
        keys = list(WORKLOADS)
        meter = CpuMeter()
        for key in keys:  # warm-up
            getattr(bench, f"run_{key}")(f"warm-{key}")
            bench.written += args.batches * args.rows

        def rate(key, tag):
            elapsed = getattr(bench, f"run_{key}")(tag)
            bench.written += args.batches * args.rows
            return args.batches / elapsed

        samples = interleaved(keys, args.repeats, rate, unit=" batches/s")
        env["other_cpus_busy"] = meter.other_cpus()
        checks = bench.check()
        census = bench.census()
        med = {k: statistics.median(v) for k, v in samples.items()}
        print()
        print(
            f"rindle ingest benchmark: {db.backend}, {args.batches} batches x {args.rows} rows "
            f"per run, repeats={args.repeats}; CPU used by other processes: "
            f"{env['other_cpus_busy']} of {env['cpus']}"
        )
        print(f"  {'workload':<12}{'batches/s':>11}{'rows/s':>11}{'min..max batches/s':>22}")
        for key in keys:
            spread = f"{min(samples[key]):,.0f}..{max(samples[key]):,.0f}"
            print(f"  {key:<12}{med[key]:>11,.0f}{med[key] * args.rows:>11,.0f}{spread:>22}")
        for key in keys:
            print(f"    {key:<10}{WORKLOADS[key]}")
        ratios = {
            "producer / plain SQL": med["producer"] / med["plain_sql"],
            "source / plain SQL": med["source"] / med["plain_sql"],
            "producer / physical": med["producer"] / med["physical"],
            "source / physical": med["source"] / med["physical"],
            "plain SQL / physical": med["plain_sql"] / med["physical"],
        }
        print("ratios of medians:")
        for name, value in ratios.items():
            print(f"  {name:<24}{value:6.2f}")
        print(
            f"census at {census['producers']:,} producers: get() {census['census_get_ns']:.0f} ns "
            f"vs COUNT(*) {census['count_star_ms']:.2f} ms "
            f"({census['count_star_ms'] * 1e6 / census['census_get_ns']:,.0f}x)"
        )
        print(f"checks: {checks['rows']} rows, {checks['captured']} captured; ok")
        print(f"total time {time.perf_counter() - started:.1f}s")
        body = {
            "config": vars(args),
            "environment": env,
            "batches_per_s": samples,
            "median_batches_per_s": med,
            "ratios": ratios,
            "census": census,
            "checks": checks,
        }
        write_results(args.json, f"ingest-{db.backend}.json", "bench/ingest.py", db.backend, body)
        return 0


if __name__ == "__main__":
    sys.exit(main())
