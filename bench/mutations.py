#!/usr/bin/env python
"""
Mutation throughput of the rindle engine against plain Django and the raw driver.

    .venv/bin/python bench/mutations.py [--n 2000] [--repeats 5] [--database-url URL]

One run, one fresh database (a temporary SQLite file by default, or a dedicated
``rindle_bench_<pid>`` database created next to the one a ``postgres://`` URL names
and dropped afterwards), migrated in this process. Every workload inserts one row
per operation into the SAME captured table ``bench_row`` (registered with
``engine.register_table``, so its capture trigger appends one outbox row per insert),
one transaction per operation unless noted. See bench/README.md.

Each workload runs ``--repeats`` times with ``--n`` operations, in a rotated
(interleaved) order per repeat, after one short warm-up; the median ops/s of the
repeats is reported, with ratios, and written to bench/results/mutations-<backend>.json.
The target of the issue (engine >= 0.7 x plain ORM, on SQLite) is printed as
PASS/FAIL; the exit status is 0 either way and non-zero only on errors.
"""

import argparse
import cProfile
import os
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the checkout root is on sys.path first)
    RESULTS_DIR,
    BenchError,
    CpuMeter,
    django_database,
    environment,
    interleaved,
    loadavg,
    pick_workloads,
    raw_connection,
    rotated,
    top_functions,
    write_results,
)

TABLE = "bench_row"
TARGET = 0.7  # engine >= TARGET x plain ORM (the SQLite target)
PAYLOAD = "p" * 64

# key -> (title, what it measures). Order is the printing order.
WORKLOADS = {
    "engine": (
        "engine",
        "get_engine().mutate(client, mid, 'benchInsert', args): the mutator does "
        "tx.insert('bench_row', row); 1 caller thread, so 1 mutation per commit",
    ),
    "engine_owned": (
        "engine, owned client id",
        "same as engine, with owner= the caller's principal key, as sockets and "
        "POST /api/rindle/mutate pass it (the id's owner is checked and claimed)",
    ),
    "engine_orm": (
        "engine, ORM mutator",
        "same, but the mutator is BenchRow.objects.create(**args) (Django ORM on the "
        "writer connection)",
    ),
    "engine_write": (
        "engine.write (no lmid)",
        "diagnostic: get_engine().write(lambda tx: tx.insert(...)), the writer round "
        "trip without the mutation protocol (no lmid read/upsert)",
    ),
    "plain_orm": (
        "plain ORM",
        "BASELINE: with transaction.atomic(): BenchRow.objects.create(...) on the "
        "caller's own Django connection, 1 transaction per insert",
    ),
    "plain_sql": (
        "plain Django SQL",
        "with transaction.atomic(): connection.cursor().execute('INSERT INTO "
        '"bench_row" ...\'), 1 transaction per insert',
    ),
    "physical": (
        "physical limit",
        "raw driver, no Django: sqlite3 BEGIN IMMEDIATE; INSERT; COMMIT per row "
        "(postgres: psycopg, autocommit off, commit per insert)",
    ),
    "engine_concurrent": (
        "engine concurrent",
        "T threads, each its own client id, calling get_engine().mutate(... "
        "'benchInsert' ...); n mutations in total (group commit)",
    ),
}


# --- command line ----------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="Mutation throughput of the rindle engine vs plain Django and the raw driver."
    )
    p.add_argument("--n", type=int, default=2000, help="operations per workload run (2000)")
    p.add_argument("--repeats", type=int, default=5, help="runs of each workload (5)")
    p.add_argument(
        "--database-url",
        default=None,
        help="default: a fresh temporary SQLite file. A postgres:// URL names the server "
        "(and the database to connect to for CREATE/DROP DATABASE); the benchmark "
        "runs in a dedicated rindle_bench_<pid> database that is dropped afterwards. "
        "A sqlite:// URL is used as-is and kept.",
    )
    p.add_argument("--threads", type=int, default=8, help="threads of engine_concurrent (8)")
    p.add_argument("--warmup", type=int, default=200, help="warm-up operations per workload")
    p.add_argument(
        "--only",
        default=None,
        help="comma-separated subset of workloads: " + ",".join(WORKLOADS),
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the caller thread (during engine workloads) and the writer thread; "
        "prints the top functions and writes .pstats files to bench/results/ "
        "(timings are inflated while profiling)",
    )
    p.add_argument(
        "--django-debug",
        action="store_true",
        help="run with DEBUG=True, the project settings' own default (Django then logs every "
        "query of its cursors); the benchmark's default is DEBUG=False, as in production",
    )
    p.add_argument(
        "--cpus",
        default=None,
        help="pin the process to these CPUs first (e.g. '0'): on some VMs waking a thread "
        "on an idle CPU is slow, which the engine's caller/writer hand-off pays twice per "
        "request; pinning to one CPU removes that noise (default: no pinning)",
    )
    p.add_argument("--json", default=None, help="results file (default: bench/results/...)")
    args = p.parse_args(argv)
    if args.n < 1 or args.repeats < 1 or args.threads < 1 or args.warmup < 0:
        p.error("--n, --repeats and --threads must be >= 1, --warmup >= 0")
    if args.cpus:
        try:
            args.cpu_set = sorted({int(c) for c in args.cpus.split(",") if c.strip()})
        except ValueError:
            p.error("--cpus takes a comma-separated list of CPU numbers")
    else:
        args.cpu_set = None
    args.workloads = pick_workloads(p, args.only, WORKLOADS)
    return args


# --- the benchmark -----------------------------------------------------------------------


class Bench:
    def __init__(self, args, db):
        from django.db import connection, models, transaction

        from rindle_app.engine import get_engine, mutator

        self.args = args
        self.db = db
        self.connection = connection
        self.transaction = transaction
        self.run_token = uuid.uuid4().hex[:8]
        self.inserted = 0

        class BenchRow(models.Model):
            """An unmanaged model over the engine-registered table, for the ORM workloads."""

            id = models.TextField(primary_key=True)
            client = models.TextField()
            payload = models.TextField()

            class Meta:
                app_label = "rindle_bench"
                db_table = TABLE
                managed = False

        self.BenchRow = BenchRow

        def bench_insert(tx, args, user):
            tx.insert(
                TABLE, {"id": args["id"], "client": args["client"], "payload": args["payload"]}
            )

        def bench_insert_orm(tx, args, user):
            BenchRow.objects.create(id=args["id"], client=args["client"], payload=args["payload"])

        mutator("benchInsert")(bench_insert)
        mutator("benchInsertOrm")(bench_insert_orm)

        self.engine = get_engine()
        self.engine.register_table(TABLE, ["id", "client", "payload"], [0], ["string"] * 3)
        self.raw = self._raw_connection()
        self.caller_profile = cProfile.Profile() if args.profile else None

    # --- the raw driver --------------------------------------------------------------

    def _raw_connection(self):
        # The engine's writer durability (RINDLE SQLITE_SYNCHRONOUS, NORMAL by default).
        mark = "?" if self.db.backend == "sqlite" else "%s"
        self.raw_sql = (
            f'INSERT INTO "{TABLE}" ("id", "client", "payload") VALUES ({mark}, {mark}, {mark})'
        )
        return raw_connection(self.db.backend, self.connection.settings_dict)

    # --- workloads: each returns the elapsed seconds of n operations -----------------

    def _rows(self, tag, n, client=None):
        client = client or tag
        return [{"id": f"{tag}-{i}", "client": client, "payload": PAYLOAD} for i in range(n)]

    def _profiled(self, fn):
        if self.caller_profile is None:
            return fn()
        self.caller_profile.enable()
        try:
            return fn()
        finally:
            self.caller_profile.disable()

    def run_engine(self, tag, n, name="benchInsert", owner=None):
        engine, rows, client = self.engine, self._rows(tag, n), tag

        def timed():
            t0 = time.perf_counter()
            for mid, row in enumerate(rows, 1):
                result = engine.mutate(client, mid, name, row, user=None, owner=owner)
                if result.status != "applied":
                    raise BenchError(f"{name} mutation {mid} was {result.status}: {result.reason}")
            return time.perf_counter() - t0

        return self._profiled(timed)

    def run_engine_owned(self, tag, n):
        return self.run_engine(tag, n, owner="u:bench")

    def run_engine_orm(self, tag, n):
        return self.run_engine(tag, n, name="benchInsertOrm")

    def run_engine_write(self, tag, n):
        engine, rows = self.engine, self._rows(tag, n)

        def timed():
            t0 = time.perf_counter()
            for row in rows:
                engine.write(lambda tx, row=row: tx.insert(TABLE, row))
            return time.perf_counter() - t0

        return self._profiled(timed)

    def run_plain_orm(self, tag, n):
        atomic, create, rows = (
            self.transaction.atomic,
            self.BenchRow.objects.create,
            self._rows(tag, n),
        )
        t0 = time.perf_counter()
        for row in rows:
            with atomic():
                create(**row)
        return time.perf_counter() - t0

    def run_plain_sql(self, tag, n):
        atomic, connection = self.transaction.atomic, self.connection
        sql = f'INSERT INTO "{TABLE}" ("id", "client", "payload") VALUES (%s, %s, %s)'
        params = [(r["id"], r["client"], r["payload"]) for r in self._rows(tag, n)]
        t0 = time.perf_counter()
        for p in params:
            with atomic():
                with connection.cursor() as cursor:
                    cursor.execute(sql, p)
        return time.perf_counter() - t0

    def run_physical(self, tag, n):
        conn, sql = self.raw, self.raw_sql
        params = [(r["id"], r["client"], r["payload"]) for r in self._rows(tag, n)]
        if self.db.backend == "sqlite":
            execute = conn.execute
            t0 = time.perf_counter()
            for p in params:
                execute("BEGIN IMMEDIATE")
                execute(sql, p)
                execute("COMMIT")
            return time.perf_counter() - t0
        commit = conn.commit
        with conn.cursor() as cur:
            t0 = time.perf_counter()
            for p in params:
                cur.execute(sql, p)
                commit()
            return time.perf_counter() - t0

    def run_engine_concurrent(self, tag, n):
        engine, threads = self.engine, self.args.threads
        share = [n // threads + (1 if i < n % threads else 0) for i in range(threads)]
        work = [self._rows(f"{tag}-t{i}", share[i]) for i in range(threads)]
        barrier = threading.Barrier(threads + 1)
        errors = []

        def worker(rows):
            try:
                barrier.wait()
                for mid, row in enumerate(rows, 1):
                    result = engine.mutate(row["client"], mid, "benchInsert", row, user=None)
                    if result.status != "applied":
                        raise BenchError(f"mutation {mid} was {result.status}: {result.reason}")
            except BaseException as exc:  # re-raised in the main thread
                errors.append(exc)

        pool = [threading.Thread(target=worker, args=(w,), daemon=True) for w in work]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in pool:
            t.join()
        elapsed = time.perf_counter() - t0
        if errors:
            raise errors[0]
        return elapsed

    def run(self, key, tag, n):
        elapsed = getattr(self, f"run_{key}")(f"{self.run_token}-{tag}", n)
        self.inserted += n
        return elapsed

    # --- checks -------------------------------------------------------------------------

    def check(self):
        """Every insert landed, and every one was captured into the outbox."""
        from rindle_app.engine.capture import OUTBOX

        with self.connection.cursor() as cursor:
            like = f"{self.run_token}-%"
            cursor.execute(f'SELECT COUNT(*) FROM "{TABLE}" WHERE "id" LIKE %s', [like])
            rows = cursor.fetchone()[0]
            cursor.execute(
                f"SELECT COUNT(*) FROM {OUTBOX} WHERE \"table\" = %s AND op = 'add'", [TABLE]
            )
            captured = cursor.fetchone()[0]
        if rows != self.inserted:
            raise BenchError(f"{rows} rows in {TABLE}, expected {self.inserted}")
        if self.db.fresh and captured != rows:
            raise BenchError(f"{captured} captured inserts of {TABLE}, expected {rows}")
        return {"rows": rows, "captured": captured}

    def close(self):
        try:
            self.raw.close()
        except Exception:
            pass


# --- writer-thread profiling ------------------------------------------------------------

WRITER_PROFILES = []


def profile_writer_thread():
    """Run every engine writer thread under cProfile (install before the engine starts)."""
    from rindle_app.engine.writer import Writer

    original = Writer._serve

    def _serve(self):
        prof = cProfile.Profile()
        WRITER_PROFILES.append(prof)
        prof.enable()
        try:
            original(self)
        finally:
            prof.disable()

    Writer._serve = _serve


# --- reporting ----------------------------------------------------------------------------


def ratio(results, a, b):
    if a in results and b in results and results[b]["median_ops_s"]:
        return results[a]["median_ops_s"] / results[b]["median_ops_s"]
    return None


def paired(results, a, b):
    """Per-repeat ratios a/b (each pair ran in the same repeat, close in time)."""
    if a not in results or b not in results:
        return None
    return [x / y for x, y in zip(results[a]["ops_s"], results[b]["ops_s"])]


def report(args, db, results, env, checks, elapsed_total):
    backend = db.backend
    print()
    print(
        f"rindle mutation benchmark: {backend}, n={args.n} ops per run, repeats={args.repeats}, "
        f"threads={args.threads}, DEBUG={args.django_debug}"
        + (f", pinned to CPUs {args.cpu_set}" if args.cpu_set else "")
    )
    print(f"database: {db.describe()}")
    print(
        "environment: "
        + ", ".join(
            f"{k}={v}"
            for k, v in env.items()
            if k not in ("platform", "loadavg_start", "loadavg_end", "other_cpus_busy")
        )
    )
    if args.profile:
        print("NOTE: --profile is on; every timing below is inflated by cProfile.")
    other = env.get("other_cpus_busy")
    if other is not None:
        who = "other processes" if backend == "sqlite" else "other processes (incl. postgres)"
        print(f"CPU used by {who} during the workloads: {other} of {env['cpus']} CPUs")
        if backend == "sqlite" and other > 0.25:
            print(
                "NOTE: other processes competed for the CPU: expect noisy numbers. (A busy "
                "machine can also make the engine FASTER: see --cpus in bench/README.md.)"
            )
    print()
    header = f"  {'workload':<24}{'median ops/s':>13}{'min..max ops/s':>22}{'median µs/op':>14}"
    print(header)
    print("  " + "-" * (len(header) - 2))
    for key in args.workloads:
        r = results[key]
        spread = f"{r['min_ops_s']:,.0f}..{r['max_ops_s']:,.0f}"
        print(
            f"  {r['title']:<24}{r['median_ops_s']:>13,.0f}{spread:>22}"
            f"{1e6 / r['median_ops_s']:>14,.0f}"
        )
    print()
    print("what each line measures (every line inserts one row per op into the captured")
    print(f"table {TABLE!r}, whose trigger appends one outbox row; 1 transaction per op")
    print("except engine concurrent, whose requests share group commits):")
    for key in args.workloads:
        title, what = WORKLOADS[key]
        if key == "engine_concurrent":
            what = what.replace("T threads", f"{args.threads} threads")
        print(f"  {title:<24}{what}")
    print()
    ratios = {
        "engine / plain ORM": ratio(results, "engine", "plain_orm"),
        "engine, owned id / engine": ratio(results, "engine_owned", "engine"),
        "engine, ORM mutator / plain ORM": ratio(results, "engine_orm", "plain_orm"),
        "engine / physical limit": ratio(results, "engine", "physical"),
        "plain ORM / physical limit": ratio(results, "plain_orm", "physical"),
        "engine-concurrent / plain ORM": ratio(results, "engine_concurrent", "plain_orm"),
        "engine-concurrent / engine": ratio(results, "engine_concurrent", "engine"),
    }
    pairs = {
        "engine / plain ORM": paired(results, "engine", "plain_orm"),
        "engine, owned id / engine": paired(results, "engine_owned", "engine"),
        "engine, ORM mutator / plain ORM": paired(results, "engine_orm", "plain_orm"),
        "engine / physical limit": paired(results, "engine", "physical"),
        "plain ORM / physical limit": paired(results, "plain_orm", "physical"),
        "engine-concurrent / plain ORM": paired(results, "engine_concurrent", "plain_orm"),
        "engine-concurrent / engine": paired(results, "engine_concurrent", "engine"),
    }
    print(f"ratios of medians{'':<17}(per-repeat ratios min..max)")
    for name, value in ratios.items():
        if value is not None:
            spread = pairs[name]
            print(f"  {name:<34}{value:6.2f}   ({min(spread):.2f}..{max(spread):.2f})")
    target = ratios["engine / plain ORM"]
    verdict = None
    if target is not None:
        verdict = target >= TARGET
        scope = "" if backend == "sqlite" else " (the target is defined for SQLite: informational)"
        print()
        print(
            f"target engine >= {TARGET} x plain ORM: {target:.2f} -> "
            f"{'PASS' if verdict else 'FAIL'}{scope}"
        )
    print(f"checks: {checks['rows']} rows inserted, {checks['captured']} captured; ok")
    print(f"total time {elapsed_total:.1f}s")
    return {
        "ratios": {k: v for k, v in ratios.items() if v is not None},
        "per_repeat_ratios": {k: v for k, v in pairs.items() if v is not None},
        "target": {
            "rule": f"engine >= {TARGET} x plain ORM",
            "applies": backend == "sqlite",
            "ratio": target,
            "pass": verdict,
        },
    }


# --- main ------------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    if args.cpu_set:  # before any thread starts: new threads inherit the affinity
        os.sched_setaffinity(0, args.cpu_set)
    started = time.perf_counter()
    with django_database(args.database_url, debug=args.django_debug) as db:
        return _run(args, db, started)


def _run(args, db, started):
    bench = None
    try:
        if args.profile:
            profile_writer_thread()

        bench = Bench(args, db)
        env = environment(db.backend)
        keys = args.workloads

        meter = CpuMeter()
        for key in keys:  # warm-up: caches, prepared statements, the writer thread
            if args.warmup:
                bench.run(key, f"warm-{key}", min(args.warmup, args.n))

        samples = interleaved(
            keys, args.repeats, lambda key, tag: args.n / bench.run(key, tag, args.n)
        )
        orders = [rotated(keys, rep) for rep in range(args.repeats)]

        checks = bench.check()
        results = {}
        for key in keys:
            ops = samples[key]
            results[key] = {
                "title": WORKLOADS[key][0],
                "measures": WORKLOADS[key][1],
                "median_ops_s": statistics.median(ops),
                "min_ops_s": min(ops),
                "max_ops_s": max(ops),
                "ops_s": ops,
            }
        env["loadavg_end"] = loadavg()
        env["other_cpus_busy"] = meter.other_cpus()
        summary = report(args, db, results, env, checks, time.perf_counter() - started)

        from rindle_app.engine import shutdown

        shutdown()  # drains the writer (and ends its profile)
        if args.profile:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            profiles = [("caller", bench.caller_profile)] + [
                (f"writer{i}", p) for i, p in enumerate(WRITER_PROFILES)
            ]
            for name, prof in profiles:
                path = RESULTS_DIR / f"profile-{db.backend}-{name}.pstats"
                prof.dump_stats(path)
                print(f"\n=== {name} thread, top functions by own time ({path}) ===")
                print(top_functions(prof))

        body = {
            "config": {
                "n": args.n,
                "repeats": args.repeats,
                "threads": args.threads,
                "warmup": args.warmup,
                "django_debug": args.django_debug,
                "cpus": args.cpu_set,
                "profile": args.profile,
                "table": TABLE,
                "payload_bytes": len(PAYLOAD),
            },
            "environment": env,
            "database": db.describe(),
            "workloads": results,
            "orders": orders,
            "checks": checks,
            **summary,
        }
        write_results(
            args.json, f"mutations-{db.backend}.json", "bench/mutations.py", db.backend, body
        )
        return 0
    finally:
        if bench is not None:
            bench.close()


if __name__ == "__main__":
    sys.exit(main())
