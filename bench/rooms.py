#!/usr/bin/env python
"""
Room flushes (issue 17): what a room host's write-behind costs per batch and per
mutation, against the slow path, in one run.

    .venv/bin/python bench/rooms.py [--mutations 2000] [--sizes 1,10,100,500]
        [--repeats 3] [--database-url URL]

One fresh database (a temporary SQLite file by default, or a dedicated
``rindle_bench_<pid>`` database next to the one a ``postgres://`` URL names),
migrated in this process. Each workload applies ``--mutations`` mutations of one doc,
each inserting one row into the captured table ``bench_room_row``:

- ``flush_<b>``: ``engine.commit_room_flush`` batches of b mutations, each batch the
  rows plus the room-ledger co-edit of its client, at the doc's current epoch
  (fence, identity, effects, ledger, downgrade watermark and cursor in one
  transaction); ``flush_cas_<b>`` the same with CAS (every add checks the key is
  absent first);
- ``slow``: the slow path, each mutation its own engine transaction
  (``engine.mutate``: a mutator inserting the row, with the client ledger upsert);
- ``raw``: the physical limit of the same rows, the driver inserting b rows per
  transaction with no capture bookkeeping beyond the table's trigger.

Printed: mutations/s and ms per batch per workload (medians of the repeats), and
the ratio of each flush size to the slow path. What this does not measure: the room
host's in-memory apply and broadcast (not built yet), so it is the write authority's
ceiling, not a room's end-to-end mutation rate.
"""

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    BenchError,
    django_database,
    environment,
    raw_connection,
    rotated,
    write_results,
)

TABLE = "bench_room_row"
PAYLOAD = "p" * 64


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--mutations", type=int, default=2000, help="mutations per workload run")
    p.add_argument("--sizes", default="1,10,100,500", help="flush batch sizes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--database-url", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    if args.mutations < 1 or args.repeats < 1 or min(args.sizes) < 1:
        p.error("--mutations, --repeats and every size must be >= 1")
    return args


class Bench:
    def __init__(self, db):
        from django.db import connection

        from rindle_app.engine import get_engine, mutator

        def bench_room_insert(tx, args, user):
            tx.insert(TABLE, {"id": args["id"], "doc": args["doc"], "payload": PAYLOAD})

        mutator("benchRoomInsert")(bench_room_insert)
        self.engine = get_engine()
        self.engine.register_table(TABLE, ["id", "doc", "payload"], [0], ["string"] * 3)
        self.backend = db.backend
        self.raw = raw_connection(db.backend, connection.settings_dict)
        mark = "?" if db.backend == "sqlite" else "%s"
        self.raw_sql = f'INSERT INTO "{TABLE}" (id, doc, payload) VALUES ({mark}, {mark}, {mark})'

    def flush(self, tag, n, size, cas=False):
        engine, doc, client = self.engine, f"doc-{tag}", f"c-{tag}"
        epoch = engine.claim_room_epoch(doc)
        t0 = time.perf_counter()
        for start in range(0, n, size):
            mids = range(start + 1, min(n, start + size) + 1)
            changes = [
                {
                    "table": TABLE,
                    "op": "add",
                    "row": {"id": f"{tag}-{m}", "doc": doc, "payload": PAYLOAD},
                }
                for m in mids
            ]
            lmid = {"client_id": client, "last_mutation_id": mids[-1]}
            changes.append({"table": "_rindle_client_mutations", "op": "add", "row": lmid})
            result = engine.commit_room_flush(
                changes, f"room:{doc}", str(mids[-1]), doc=doc, epoch=epoch, cas=cas
            )
            if not result.applied:
                raise BenchError(f"flush {mids[-1]} of {doc} was not applied")
        return time.perf_counter() - t0

    def slow(self, tag, n):
        engine, client = self.engine, f"c-{tag}"
        t0 = time.perf_counter()
        for mid in range(1, n + 1):
            args = {"id": f"{tag}-{mid}", "doc": tag}
            result = engine.mutate(client, mid, "benchRoomInsert", args, user=None)
            if result.status != "applied":
                raise BenchError(f"mutation {mid} was {result.status}")
        return time.perf_counter() - t0

    def raw_batches(self, tag, n, size):
        conn = self.raw
        t0 = time.perf_counter()
        for start in range(0, n, size):
            rows = [
                (f"{tag}-{m}", tag, PAYLOAD) for m in range(start + 1, min(n, start + size) + 1)
            ]
            cur = conn.cursor()
            if self.backend == "sqlite":  # the raw connection autocommits: one transaction
                cur.execute("BEGIN IMMEDIATE")
            cur.executemany(self.raw_sql, rows)
            if self.backend == "sqlite":
                cur.execute("COMMIT")
            else:
                conn.commit()
        return time.perf_counter() - t0

    def run(self, key, n):
        tag = f"{key}-{uuid.uuid4().hex[:8]}"
        kind, _, size = key.rpartition("_")
        if key == "slow":
            return self.slow(tag, n)
        if kind == "flush":
            return self.flush(tag, n, int(size))
        if kind == "flush_cas":
            return self.flush(tag, n, int(size), cas=True)
        if kind == "raw":
            return self.raw_batches(tag, n, int(size))
        raise BenchError(f"unknown workload {key}")


def main(argv=None):
    args = parse_args(argv)
    with django_database(args.database_url, quiet=True) as db:
        bench = Bench(db)
        keys = ["slow"]
        for size in args.sizes:
            keys += [f"flush_{size}", f"flush_cas_{size}", f"raw_{size}"]
        for key in keys:  # warm-up
            bench.run(key, min(50, args.mutations))
        seconds = {key: [] for key in keys}
        for rep in range(args.repeats):
            for key in rotated(keys, rep):
                seconds[key].append(bench.run(key, args.mutations))
        n = args.mutations
        results = {}
        for key in keys:
            med = statistics.median(seconds[key])
            size = 1 if key == "slow" else int(key.rpartition("_")[2])
            results[key] = {
                "mutations_s": n / med,
                "ms_per_batch": med / -(-n // size) * 1000,
                "runs_s": seconds[key],
            }
        slow = results["slow"]["mutations_s"]
        print(f"\nroom flushes, {db.backend}, {n} mutations per run, medians of {args.repeats}")
        print(f"  {'workload':<16} {'mutations/s':>12} {'ms/batch':>9} {'x slow path':>11}")
        for key in keys:
            r = results[key]
            print(
                f"  {key:<16} {r['mutations_s']:>12,.0f} {r['ms_per_batch']:>9.2f} "
                f"{r['mutations_s'] / slow:>10.1f}x"
            )
        for size in args.sizes:
            flush, raw = results[f"flush_{size}"], results[f"raw_{size}"]
            print(
                f"  batch {size}: flush / raw driver = "
                f"{flush['mutations_s'] / raw['mutations_s']:.2f}"
            )
        write_results(
            args.json,
            f"rooms-{db.backend}.json",
            "rooms",
            db.backend,
            {"config": vars(args), "environment": environment(db.backend), "results": results},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
