#!/usr/bin/env python
"""
The demo's own mutators (project/demo/mutators.py) through the engine, one mutation
per commit, per mutator.

    .venv/bin/python bench/demo_mutators.py [--n 1000] [--repeats 5] [--database-url URL]

One fresh database (a temporary SQLite file by default, or a dedicated
``rindle_bench_<pid>`` database next to the one a ``postgres://`` URL names), migrated
in this process. Each workload sends ``--n`` mutations of one demo mutator with
``get_engine().mutate(...)`` as a signed-in user, one caller thread, so one mutation
per commit (validation of the arguments by the mutator's serializer included).
``createIssue`` creates the issues the other workloads then edit. The workloads run
``--repeats`` times in a rotated order after a short warm-up; the median mutations/s
of the repeats, and the median CPU time of the process per mutation (caller and
writer threads), are reported and written to bench/results/demo_mutators-<backend>.json.
"""

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402  (the checkout root is on sys.path first)
    BenchError,
    django_database,
    environment,
    interleaved,
    pick_workloads,
    write_results,
)

T0 = 1_704_067_200_000.0
# Every workload but createIssue edits the issues createIssue made, round robin.
WORKLOADS = ["createIssue", "editTitle", "setStatus", "setOwner", "addTag", "addComment"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--n", type=int, default=1000, help="mutations per workload run (1000)")
    p.add_argument("--repeats", type=int, default=5, help="runs of each workload (5)")
    p.add_argument("--warmup", type=int, default=100, help="warm-up mutations per workload")
    p.add_argument("--database-url", default=None, help="default: a fresh temporary SQLite file")
    p.add_argument("--only", default=None, help="comma-separated subset: " + ",".join(WORKLOADS))
    p.add_argument("--json", default=None, help="results file (default: bench/results/...)")
    args = p.parse_args(argv)
    if args.n < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--n and --repeats must be >= 1, --warmup >= 0")
    args.workloads = pick_workloads(p, args.only, WORKLOADS)
    return args


def args_of(name, tag, i, issues):
    """The arguments of the ``i``-th mutation ``name`` of run ``tag``."""
    issue = issues[i % len(issues)] if issues else None
    at = T0 + i
    if name == "createIssue":
        return {
            "id": f"{tag}-i{i}",
            "title": f"Issue {i}",
            "status": "todo",
            "priority": "low",
            "owner": "ada",
            "tags": [{"id": f"{tag}-i{i}-t0", "name": "bug"}],
            "description": "Steps to reproduce.",
            "descriptionCommentId": f"{tag}-i{i}-c0",
            "createdAt": at,
        }
    if name == "editTitle":
        return {"id": issue, "title": f"Title {tag} {i}", "updatedAt": at}
    if name == "setStatus":
        return {"id": issue, "status": ("todo", "done")[i % 2], "updatedAt": at}
    if name == "setOwner":
        return {"id": issue, "owner": ("ada", "alan", "grace")[i % 3], "updatedAt": at}
    if name == "addTag":
        return {"id": f"{tag}-t{i}", "issueId": issue, "name": f"tag{i}", "updatedAt": at}
    if name == "addComment":
        return {"id": f"{tag}-c{i}", "issueId": issue, "body": "Me too.", "createdAt": at}
    raise BenchError(f"no arguments for {name}")


def main(argv=None):
    args = parse_args(argv)
    with django_database(args.database_url, quiet=True) as db:
        from django.contrib.auth import get_user_model

        import project.demo.mutators  # noqa: F401  (registers the demo's mutators)
        from project.demo import models as demo
        from rindle_app.engine import get_engine

        engine = get_engine()
        user = get_user_model().objects.create_user("ada")
        run_token = uuid.uuid4().hex[:8]
        issues = []
        # CPU time of this process (caller and writer thread) per mutation: less
        # sensitive than the rate to other processes on a shared machine.
        cpu_us = {key: [] for key in WORKLOADS}

        def run(name, tag, n):
            client = f"{run_token}-{tag}"
            batch = [args_of(name, f"{run_token}-{tag}", i, issues) for i in range(n)]
            t0, cpu0 = time.perf_counter(), time.process_time()
            for mid, mutation_args in enumerate(batch, 1):
                result = engine.mutate(client, mid, name, mutation_args, user=user)
                if result.status != "applied":
                    raise BenchError(f"{name} {mid} was {result.status}: {result.reason}")
            elapsed = time.perf_counter() - t0
            cpu_us[name].append((time.process_time() - cpu0) * 1e6 / n)
            if name == "createIssue":
                issues.extend(a["id"] for a in batch)
            return n / elapsed

        env = environment(db.backend)
        keys = ["createIssue"] + [k for k in args.workloads if k != "createIssue"]
        run("createIssue", "seed", max(args.warmup, 1))  # issues to edit from the start
        for key in keys:
            if args.warmup:
                run(key, f"warm-{key}", args.warmup)
        samples = interleaved(keys, args.repeats, lambda key, tag: run(key, tag, args.n))

        if demo.Issue.objects.filter(id__startswith=run_token).count() != len(issues):
            raise BenchError("an issue createIssue applied is missing")
        print()
        print(f"demo mutators: {db.backend}, n={args.n} per run, repeats={args.repeats}")
        print(
            f"  {'mutator':<14}{'median mutations/s':>20}{'min..max':>18}{'µs/mutation':>14}"
            f"{'CPU µs/mutation':>17}"
        )
        results = {}
        for key in keys:
            ops = samples[key]
            median = statistics.median(ops)
            cpu = statistics.median(cpu_us[key][-len(ops) :])
            results[key] = {"median_ops_s": median, "ops_s": ops, "median_cpu_us": cpu}
            spread = f"{min(ops):,.0f}..{max(ops):,.0f}"
            print(f"  {key:<14}{median:>20,.0f}{spread:>18}{1e6 / median:>14,.0f}{cpu:>17,.0f}")
        body = {
            "config": {"n": args.n, "repeats": args.repeats, "warmup": args.warmup},
            "environment": env,
            "results": results,
        }
        write_results(
            args.json, f"demo_mutators-{db.backend}.json", "demo_mutators", db.backend, body
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
