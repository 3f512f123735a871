#!/usr/bin/env python
"""
Data scale (issue 16): memory and start-up of a serving process against the number
of synced rows, two checkouts side by side on the same databases.

    .venv/bin/python bench/datascale.py [--quick] [--backend sqlite,postgres]
        [--sizes 25k,250k,1m,3m] [--before REF] [--after PATH] [--only scale,ivm]

- **Data** (bench/datascale_data.py): the demo's issue tracker at N synced rows,
  bulk-generated with set-based SQL through the capture triggers (never bypassed),
  once per (backend, size) into a database both variants then use: a SQLite file
  in a temp dir, or the PostgreSQL database ``rindle_bench_scale`` (dropped after).
  The outbox is then pruned as production prunes it (7-day retention).
- **Variants**: ``before`` is ``--before`` (a commit, checked out into a temporary
  ``git worktree add --detach`` with the shared .venv symlinked, removed after);
  ``after`` is the checkout at ``--after`` (default: this one).
- **scale** (bench/datascale_run.py), per variant, database and size, with a real
  Daphne process and a websocket client speaking the protocol (bearer token):
  spawn -> the first nbatch of ``issuesPage`` (retrying the handshake, counting
  resets and unanswered subscribes); RSS and VmHWM after it and after +100
  ``issueDetail`` subscriptions; the first subscription of each other shape (and
  how much longer 4 already-subscribed sockets' pings waited meanwhile); ORM
  writes from another process -> the frame (p50/p99); a fresh server watching only
  ``users`` (its RSS); and the correctness gate: every replica against the query
  re-run in SQL. A failed gate voids the figures: exit status 3.
  Then, per variant, least squares over the sizes: bytes per row (RSS after the
  first frame) and seconds per million rows (to the first frame).
- **ivm** (bench/datascale_ivm.py): bench/ivm.py --quick (W1, W2, UI views) of
  each variant, side by side.

Targets (issue 16, at 3M rows; printed at the largest size run): RSS <= 300 MiB,
users-only <= 200 MiB, start -> first frame <= 2 s with 0 resets, the first
subscription of a new shape <= 100 ms, other sockets delayed <= 10 ms. Missed
targets print FAIL and exit 0. Results: bench/results/datascale-<time>.json.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import datascale_report as report  # noqa: E402
from bench.datascale_procs import child_env, run_child  # noqa: E402
from bench.datascale_run import measure  # noqa: E402

BEFORE_REV = "9581caf"  # main before issue 16: every process loads every synced table
DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/test"
PG_NAME = "rindle_bench_scale"
SIZES = {"25k": 25_000, "250k": 250_000, "1m": 1_000_000, "3m": 3_000_000}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="25k and 250k, 100 writes (< 5 min)")
    p.add_argument("--backend", default="sqlite,postgres")
    p.add_argument("--sizes", default=None, help="of 25k,250k,1m,3m (default: all)")
    p.add_argument("--before", default=BEFORE_REV, help="the 'before' commit")
    p.add_argument("--after", default=str(ROOT), help="the 'after' checkout (a path)")
    p.add_argument("--only", default="scale,ivm", help="scale and/or ivm")
    p.add_argument("--variants", default="before,after", help="before and/or after")
    p.add_argument("--database-url", default=DEFAULT_PG, help="a PostgreSQL server to use")
    p.add_argument("--writes", type=int, default=None, help="write samples (200; quick 100)")
    p.add_argument("--write-rate", type=float, default=None, help="writes/s (20; quick 50)")
    p.add_argument("--json", default=None)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sizes = args.sizes or ("25k,250k" if args.quick else "25k,250k,1m,3m")
    try:
        args.size_list = [SIZES[s.strip().lower()] for s in sizes.split(",")]
    except KeyError as exc:
        p.error(f"unknown size {exc}; choose from {', '.join(SIZES)}")
    args.backends = [b.strip() for b in args.backend.split(",")]
    if set(args.backends) - {"sqlite", "postgres"}:
        p.error("--backend takes sqlite and/or postgres")
    args.parts = [x.strip() for x in args.only.split(",")]
    if set(args.parts) - {"scale", "ivm"}:
        p.error("--only takes scale and/or ivm")
    args.variant_list = [v.strip() for v in args.variants.split(",")]
    args.writes = args.writes or (100 if args.quick else 200)
    args.write_rate = args.write_rate or (50.0 if args.quick else 20.0)
    if set(args.variant_list) - {"before", "after"}:
        p.error("--variants takes before and/or after")
    return args


class Database:
    """One generated database of a (backend, size): its URL, made and dropped here."""

    def __init__(self, backend, size, tmpdir, pg_url):
        self.backend, self.size = backend, size
        if backend == "sqlite":
            self.path = Path(tmpdir) / f"scale-{size}.sqlite3"
            self.url = f"sqlite:///{self.path}"
        else:
            parts = urlsplit(pg_url)
            self.admin = urlunsplit(("postgresql", *parts[1:]))
            self.url = urlunsplit((parts.scheme, parts.netloc, "/" + PG_NAME, "", ""))

    def create(self):
        if self.backend == "postgres":
            import psycopg

            with psycopg.connect(self.admin, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')
                admin.execute(f'CREATE DATABASE "{PG_NAME}"')
        env = {**child_env(self.url), "DATASCALE_ROWS": str(self.size)}
        return run_child("generate", env)

    def drop(self):
        if self.backend == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.path}{suffix}").unlink(missing_ok=True)
            return
        import psycopg

        with psycopg.connect(self.admin, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{PG_NAME}" WITH (FORCE)')


def checkout_before(rev, tmpdir):
    path = Path(tmpdir) / "before"
    subprocess.run(
        ["git", "worktree", "add", "-q", "--detach", str(path), rev], cwd=ROOT, check=True
    )
    (path / ".venv").symlink_to((ROOT / ".venv").resolve())
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True
    ).stdout.strip()
    return path, sha


def describe(path):
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=path,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return f"{sha[:12]}{' (uncommitted changes)' if dirty else ''}"


def run_scale(args, roots, tmpdir, results):
    for backend in args.backends:
        for size in args.size_list:
            db = Database(backend, size, tmpdir, args.database_url)
            print(f"{backend} {size:,} rows: generating", flush=True)
            try:
                meta = db.create()
                print(
                    f"  {meta['rows']:,} rows ({meta['tables']}) in {meta['fill_s']} s, "
                    f"{meta['captured']:,} captured; outbox pruned to {meta['outbox_left']}",
                    flush=True,
                )
                token = meta.pop("token")
                entry = {"backend": backend, "size": size, "data": meta, "variants": {}}
                for label in args.variant_list:
                    try:
                        entry["variants"][label] = measure(
                            label, roots[label], db.url, {**meta, "token": token}, args, tmpdir
                        )
                    except Exception as exc:  # the other variant and sizes still run
                        print(f"  !!! {label}: {type(exc).__name__}: {exc}", flush=True)
                        entry["variants"][label] = {"error": f"{type(exc).__name__}: {exc}"}
                results["scale"].append(entry)
            finally:
                db.drop()


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        from bench import datascale_data, datascale_gate

        children = {"generate": datascale_data.generate, **datascale_gate.CHILDREN}
        children[args.child]()
        return 0
    started = time.monotonic()
    tmpdir = tempfile.mkdtemp(prefix="rindle-bench-datascale-")
    roots, before = {"after": Path(args.after).resolve()}, None
    results = {
        "config": {
            "sizes": args.size_list,
            "backends": args.backends,
            "parts": args.parts,
            "writes": args.writes,
            "write_rate": args.write_rate,
            "before": args.before,
            "after": str(roots["after"]),
            "quick": args.quick,
        },
        "scale": [],
    }
    try:
        if "before" in args.variant_list:
            before, sha = checkout_before(args.before, tmpdir)
            roots["before"] = before
        results["config"]["commits"] = {k: describe(roots[k]) for k in args.variant_list}
        print(f"datascale: {results['config']['commits']}; temp dir {tmpdir}", flush=True)
        if "scale" in args.parts:
            run_scale(args, roots, tmpdir, results)
        if "ivm" in args.parts:
            from bench import datascale_ivm

            results["ivm"] = datascale_ivm.run({k: roots[k] for k in args.variant_list}, tmpdir)
    finally:
        if before is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT)
        keep = os.environ.get("DATASCALE_KEEP_TMP")
        if not keep:
            shutil.rmtree(tmpdir, ignore_errors=True)
    results["elapsed_s"] = round(time.monotonic() - started, 1)
    status = report.print_all(results)
    out = (
        Path(args.json)
        if args.json
        else (ROOT / "bench" / "results" / f"datascale-{time.strftime('%Y%m%dT%H%M%S')}.json")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"results: {out}; total {results['elapsed_s']} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
