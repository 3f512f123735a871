"""bench/ivm.py's run: one fresh SQLite database, the chosen workloads, the report."""

import cProfile
import os
import random
import resource
import sys
from pathlib import Path

from bench.common import (
    RESULTS_DIR,
    ROOT,
    CpuMeter,
    django_database,
    top_functions,
    write_results,
)
from bench.common import environment as machine
from bench.ivm_base import GateFailure, log, parse_args, perf, start_clock


class Bench:
    """What every workload of one run shares: the arguments, sizes, engine and gates."""

    def __init__(self, args):
        from rindle_app.engine import get_engine

        self.args = args
        self.sizes = args.sizes
        self.engine = get_engine()
        self.gates = []


def environment():
    env = machine("sqlite")
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


def main(argv=None):
    args = parse_args(argv)
    started = start_clock()
    try:
        with django_database(None, quiet=True) as db:
            return run(args, db, started)
    except GateFailure as exc:
        print(f"\n!!!!!!!! CORRECTNESS GATE FAILED: {exc} !!!!!!!!")
        return 3


def run(args, db, started):
    """Every chosen workload, the optional profiles, the report and the results file."""
    from bench.ivm_report import report
    from rindle_app.ivm import catalog, evaluate, live, store, view  # noqa: F401

    env = environment()
    meter = CpuMeter()
    bench = Bench(args)
    mode = "quick" if args.quick else "default"
    print(
        f"rindle IVM benchmark: SQLite {env.get('sqlite')}, {mode} sizes, seed {args.seed}, "
        f"database {db.path} (fresh, migrated in this process)",
        flush=True,
    )
    results, w1, w2 = run_workloads(bench, args)
    profiles = run_profiles((w1, w2)) if args.profile else {}
    env["loadavg_end"] = round(os.getloadavg()[0], 2)
    env["other_cpus_busy"] = meter.other_cpus()
    env["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    elapsed = perf() - started
    summary = report(args, env, results, bench.gates, profiles, elapsed)
    body = {
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
    write_results(args.json, "ivm-sqlite.json", "bench/ivm.py", "sqlite", body, default=str)
    if not all(g["pass"] for g in bench.gates):
        print("\nCORRECTNESS GATE FAILED: see the !!! lines above; the figures are invalid.")
        return 3
    return 0


def run_workloads(bench, args):
    """``(results, w1, w2)``: each chosen workload run, each from its own seed."""
    from bench.ivm_memory import measure_memory
    from bench.ivm_ui import UIViews
    from bench.ivm_w1 import W1
    from bench.ivm_w2 import W2

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
    return results, w1, w2


def run_profiles(workloads):
    """W1 and W2 IVM once more under cProfile (the W1 batch tail apart): their top functions."""
    profiles = {}
    for w in workloads:
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
                "tottime": top_functions(prof, 16, "tottime", header=False),
                "cumulative": top_functions(prof, 22, "cumulative", header=False),
            }
    log("profiles done")
    return profiles
