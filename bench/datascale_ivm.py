"""
bench/datascale.py's IVM part: the existing workloads (bench/ivm.py --quick: W1, W2
and the UI views) run once per variant, each from its own checkout (so "before" runs
its own bench/ivm.py and its own rindle_app), one after the other; their key figures
side by side with after/before ratios.

bench/ivm.py's correctness gate also checks the store against the database
(``bench/ivm_checks.py``); a store that holds only some partitions may fail that
check while its views are right. A failed gate is reported per variant, with the
tail of its output, and makes datascale's exit status 3.
"""

import json
import subprocess
import sys
from pathlib import Path

WORKLOADS = "w1,w2,ui"


def run_variant(label, root, log_dir):
    """bench/ivm.py --quick in checkout ``root``: (results JSON or None, exit status, log)."""
    out = Path(log_dir) / f"ivm-{label}.json"
    log = Path(log_dir) / f"ivm-{label}.log"
    env_drop = ("DATABASE_URL", "REDIS_URL", "RINDLE_TEST_DATABASE_NAME")
    import os

    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    cmd = [sys.executable, "bench/ivm.py", "--quick", "--only", WORKLOADS, "--json", str(out)]
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    body = json.loads(out.read_text()) if out.exists() else None
    return body, rc, log


def store_only(gate):
    return bool(gate["failures"]) and all(
        f.startswith("store ") and "differs from the database" in f for f in gate["failures"]
    )


def key_figures(body):
    """The figures compared: commits/s and ratios of W1 and W2, the UI views' pair times."""
    if body is None:
        return {}
    res, fig = body["results"], {}
    for w in ("w1", "w2"):
        r = res.get(w)
        if not r:
            continue
        fig[f"{w} IVM commits/s"] = r["ivm"]["median_commits_s"]
        fig[f"{w} L (commit only) commits/s"] = r["limit"]["median_commits_s"]
        fig[f"{w} IVM / L"] = r["ratios"]["ivm_over_limit"]
        fig[f"{w} IVM hub / L"] = r["ivm_hub"]["median_commits_s"] / r["limit"]["median_commits_s"]
        fig[f"{w} IVM second process / L"] = r["ivm_second_process"]["over_limit"]
        fig[f"{w} IVM / B1"] = r["ratios"]["ivm_over_b1_same_commits"]
        fig[f"{w} commit->delta p50 us"] = r["ivm"]["per_commit_us"]["delta_ready_p50"]
        fig[f"{w} commit->delta p99 us"] = r["ivm"]["per_commit_us"]["delta_ready_p99"]
    for v in res.get("ui", {}).get("views", []):
        fig[f"ui {v['view']} pair ms"] = v["pair_ms_median"]
        fig[f"ui {v['view']} hydrate ms"] = v["hydrate_ms"]
    return fig


# Figures where less is better (times); the rest are rates and ratios (more is better).
def lower_is_better(name):
    return name.endswith(" ms") or name.endswith(" us")


def run(roots, log_dir):
    """Both variants' runs and the side-by-side; returns the JSON part."""
    runs = {}
    for label, root in roots.items():
        print(f"ivm: bench/ivm.py --quick --only {WORKLOADS} in {root} ({label})", flush=True)
        body, rc, log = run_variant(label, root, log_dir)
        gates = body.get("gates", []) if body else []
        failed = [g for g in gates if not g["pass"]]
        runs[label] = {
            "exit": rc,
            # Failed only on "the store holds every row of the database": what a store
            # that loads partitions on demand is expected to fail (see the docstring).
            "store_check_only": bool(failed) and all(store_only(g) for g in failed),
            "gate_pass": rc == 0 and bool(gates) and all(g["pass"] for g in gates),
            "gates_failed": [g for g in gates if not g["pass"]][:10],
            "figures": key_figures(body),
            "log": str(log),
            "log_tail": "" if rc == 0 else Path(log).read_text(errors="replace")[-3000:],
        }
    return runs


def report(runs):
    before, after = runs.get("before", {}), runs.get("after", {})
    print("\n=== IVM workloads (bench/ivm.py --quick), before beside after ===")
    print(f"  {'figure':<44} {'before':>10} {'after':>10} {'after/before':>13}")
    names = list(dict.fromkeys([*before.get("figures", {}), *after.get("figures", {})]))
    for name in names:
        b, a = before.get("figures", {}).get(name), after.get("figures", {}).get(name)
        ratio = f"{a / b:.2f}" if a is not None and b else "-"
        note = " (lower is better)" if lower_is_better(name) else ""
        print(f"  {name:<44} {fmt(b):>10} {fmt(a):>10} {ratio:>13}{note}")
    for label, r in runs.items():
        state = "PASS" if r["gate_pass"] else f"FAIL (exit {r['exit']})"
        print(f"  correctness gate, {label}: {state}; log {r['log']}")
        if r.get("store_check_only"):
            print(
                f"    {label}: every failure is bench/ivm.py's check that the store holds the "
                "whole database (bench/ivm_checks.py Gates.gate), which a store holding only "
                "the watched partitions fails by design; the views themselves passed"
            )
        if not r["gate_pass"]:
            for g in r["gates_failed"]:
                print(f"    !!! {g}")
            print("    " + r["log_tail"].replace("\n", "\n    ")[-1500:])


def fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3f}" if abs(v) < 1 else f"{v:.2f}"
