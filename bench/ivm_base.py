"""
What every part of bench/ivm.py shares: the sizes and targets, the command line, the
progress log, rates, and the row-op helpers the write scripts are made of.
"""

import argparse
import time

from bench.common import pick_workloads

perf = time.perf_counter

DEFAULT_SIZES = {
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
}
SIZES = {
    "default": DEFAULT_SIZES,
    # --quick: the same data, fewer commits, repeats, pairs and subscribers.
    "quick": {
        **DEFAULT_SIZES,
        "w1_commits": 400,
        "w1_batches": 5,
        "w1_repeats": 1,
        "w1_b2_cap": 100,
        "w1_b1_cap": 25,
        "w2_commits": 250,
        "w2_repeats": 1,
        "w2_b2_cap": 30,
        "w2_b1_cap": 4,
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
    args.workloads = pick_workloads(p, args.only, WORKLOAD_KEYS)
    return args


# --- small helpers -----------------------------------------------------------------------


_T0 = [time.perf_counter()]


def start_clock():
    """Restart the progress log's clock: the seconds of the run, from now."""
    _T0[0] = perf()
    return _T0[0]


def log(message):
    """A progress line, stamped with the seconds since the run started."""
    print(f"[{time.perf_counter() - _T0[0]:6.1f}s] {message}", flush=True)


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


def by_share(r, shares, rest):
    """The callable whose cumulative share ``(bound, fn)`` first exceeds ``r``; else ``rest``."""
    for bound, fn in shares:
        if r < bound:
            return fn
    return rest


def latencies(commits, ready):
    """Per commit ``(cv, t)``, the seconds until the first ``(version, t)`` at or past it."""
    out, j = [], 0
    for cv, t in commits:
        while ready[j][0] < cv:
            j += 1
        out.append(ready[j][1] - t)
    return out


def commit_total(t):
    """
    Seconds of one IVM commit from its (write, poll, Catalog.commit, fan-out) times.
    ``Catalog.commit`` runs inside the poll, so it is not added again (until this was
    fixed, the IVM rates counted it twice).
    """
    write, poll, _catalog_commit, fanout = t
    return write + poll + fanout


def db_value(v):
    return int(v) if isinstance(v, bool) else v


def first_difference(got, want):
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


def random_key(d, rng):
    """A random key of a dict without listing it every call (keys cached per size)."""
    cache = random_key.cache
    if cache.get("size") != len(d) or cache.get("id") != id(d) or rng.random() < 0.05:
        cache["keys"] = list(d)
        cache["size"] = len(d)
        cache["id"] = id(d)
    while True:
        k = rng.choice(cache["keys"])
        if k in d:
            return k


random_key.cache = {}


def sample_set(s, rng, k):
    """Up to k random elements of a set (a list copy per call, fine at this size)."""
    items = list(s)
    return rng.sample(items, min(k, len(items)))


def print_gate_failure(what, failures):
    """The loud lines of a failed correctness gate (at most 20 failures shown)."""
    print(f"\n!!!!!!!! CORRECTNESS GATE FAILED: {what} !!!!!!!!")
    for f in failures[:20]:
        print(f"!!   {f}")
    print("!!!!!!!! the numbers of this workload are INVALID !!!!!!!!\n", flush=True)
