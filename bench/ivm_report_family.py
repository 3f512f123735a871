"""The printed tables of one family workload (W1 or W2) of bench/ivm.py."""

from bench.ivm_base import fmt_rate, fmt_ratio


def print_family(r, name):
    """The variants' table, the IVM's parts, the ratios and the checked pass's notes."""
    s = r["sizes"]
    print()
    print(f"=== {name} ===")
    print("sizes: " + ", ".join(f"{k}={v}" for k, v in s.items()))
    print("script kinds: " + ", ".join(f"{k} {v}" for k, v in r["kinds"].items()))
    _print_variants(r)
    _print_ivm_parts(r)
    _print_ratios(r)
    _print_checked(r)


def _print_variants(r):
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


def _print_ivm_parts(r):
    lim = r["limit"]["median_commits_s"]
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


def _print_ratios(r):
    b1, b2 = r["b1"], r["b2"]
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


def _print_checked(r):
    s = r["sizes"]
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
