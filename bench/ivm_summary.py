"""A ``FamilyWorkload``'s figures: its timed samples folded into the results dict."""

import statistics

from bench.common import median, pct
from bench.ivm_base import commit_total, rate


def summarize(w, n, samples, detail, ivm_counts, b1, b2, ivm_changed, b2_changed):
    """The results of workload ``w``: ``n`` commits, the variants' samples and the baselines."""
    b1_times, b1_counts = b1
    b2_times, b2_counts = b2
    med_rep = sorted(range(len(samples["ivm"])), key=lambda i: samples["ivm"][i])
    mid = med_rep[len(med_rep) // 2]
    lim = median(samples["limit"])
    ivm = median(samples["ivm"])
    ivm_b1_prefix = _prefix_rate(detail, len(b1_times))
    ivm_b2_prefix = _prefix_rate(detail, len(b2_times))
    b1_rate = rate(len(b1_times), sum(b1_times))
    b2_rate = rate(len(b2_times), sum(b2_times))
    ivm_block = _ivm(w, samples, detail["ivm"][mid]["times"], ivm_counts[mid])
    ivm_block["same_prefix_as_b1_commits_s"] = ivm_b1_prefix
    ivm_block["same_prefix_as_b2_commits_s"] = ivm_b2_prefix
    agree = sum(1 for a, b in zip(ivm_changed, b2_changed) if a == b)
    return {
        "sizes": w.describe_sizes(),
        "kinds": dict(w.kinds),
        "commits": n,
        "limit": {"median_commits_s": lim, "commits_s": samples["limit"]},
        "ivm": ivm_block,
        "ivm_poll_every_10": {
            "median_commits_s": median(samples["ivm10"]),
            "commits_s": samples["ivm10"],
            "over_limit": median(samples["ivm10"]) / lim,
        },
        "ivm_hub": _hub(n, samples, detail, "hub", lim),
        "ivm_hub_thread": _hub(n, samples, detail, "hubthread", lim),
        "ivm_second_process": _second_process(n, samples, detail["proc"], lim),
        "inline_floor": _floor(samples, lim),
        "derived_ivm_without_outbox_read_commits_s": _without_outbox_read(
            detail["ivm"][mid]["times"]
        ),
        "b1": _baseline(b1_times, b1_rate, b1_counts),
        "b2": _baseline(b2_times, b2_rate, b2_counts),
        "batch_tail": _batch_tail(w, detail),
        "ratios": {
            "ivm_over_limit": ivm / lim,
            "ivm_over_limit_per_repeat": [a / b for a, b in zip(samples["ivm"], samples["limit"])],
            "ivm_over_b1_same_commits": ivm_b1_prefix / b1_rate,
            "ivm_over_b2_same_commits": ivm_b2_prefix / b2_rate,
            "ivm_full_script_over_b1": ivm / b1_rate,
            "ivm_full_script_over_b2": ivm / b2_rate,
        },
        "changed_views_agree_with_b2": {
            "commits_compared": len(b2_changed),
            "agreeing": agree,
        },
        "setup": {k: v for k, v in w.stats.items() if k not in ("refills", "checked")},
        "refills": w.stats.get("refills"),
        "checked_pass": w.stats.get("checked"),
    }


def _prefix_rate(detail, k):
    """Median over the IVM repeats of the rate of their first ``k`` commits."""
    return median([rate(k, sum([commit_total(t) for t in d["times"]][:k])) for d in detail["ivm"]])


def _ivm(w, samples, ivm_times, counts):
    """The inline IVM's rates and per-commit parts, from the median repeat."""
    per_commit = [commit_total(t) for t in ivm_times]
    write = [t[0] for t in ivm_times]
    poll = [t[1] for t in ivm_times]
    commit = [t[2] for t in ivm_times]
    fanout = [t[3] for t in ivm_times]
    return {
        "median_commits_s": median(samples["ivm"]),
        "commits_s": samples["ivm"],
        "per_commit_us": {
            "write_p50": pct(write, 0.5) * 1e6,
            "poll_p50": pct(poll, 0.5) * 1e6,
            "poll_mean": statistics.fmean(poll) * 1e6,
            "catalog_commit_mean": statistics.fmean(commit) * 1e6,
            "outbox_read_mean": statistics.fmean([p - c for p, c in zip(poll, commit)]) * 1e6,
            "fanout_mean": statistics.fmean(fanout) * 1e6,
            "total_p50": pct(per_commit, 0.5) * 1e6,
            "total_p99": pct(per_commit, 0.99) * 1e6,
            "delta_ready_p50": pct([p + f for p, f in zip(poll, fanout)], 0.5) * 1e6,
            "delta_ready_p99": pct([p + f for p, f in zip(poll, fanout)], 0.99) * 1e6,
        },
        "catalog_commit_only_commits_s": rate(len(commit), sum(commit)),
        "views_changed_per_commit": counts["views_changed"] / max(1, len(w.all_ops)),
        "messages": counts["messages"],
        "bytes": counts["bytes"],
    }


def _without_outbox_read(ivm_times):
    write = [t[0] for t in ivm_times]
    commit = [t[2] for t in ivm_times]
    fanout = [t[3] for t in ivm_times]
    return rate(len(write), sum(write) + sum(commit) + sum(fanout))


def _hub(n, samples, detail, variant, lim):
    runs = detail[variant]
    return {
        "median_commits_s": median(samples[variant]),
        "commits_s": samples[variant],
        "over_limit": median(samples[variant]) / lim,
        "over_limit_per_repeat": [a / b for a, b in zip(samples[variant], samples["limit"])],
        "commits_per_poll": [n / max(1, d["polls"]) for d in runs],
        "steps_on_the_committing_thread": [d["inline"] / max(1, d["polls"]) for d in runs],
        "commit_to_delta_ready_us": {
            "p50": median([pct(d["latencies"], 0.5) for d in runs]) * 1e6,
            "p99": median([pct(d["latencies"], 0.99) for d in runs]) * 1e6,
        },
    }


def _second_process(n, samples, runs, lim):
    return {
        "median_commits_s": median(samples["proc"]),
        "commits_s": samples["proc"],
        "over_limit": median(samples["proc"]) / lim,
        "over_limit_per_repeat": [a / b for a, b in zip(samples["proc"], samples["limit"])],
        "writes_alone_commits_s": [rate(n, d["written"]) for d in runs],
        "commits_per_poll": [n / max(1, d["polls"]) for d in runs],
        "busy_us_per_commit": [d["busy"] * 1e6 / n for d in runs],
        "poll_interval_s": runs[0]["poll_interval"],
        "commit_to_delta_ready_ms": {
            "p50": median([pct(d["latencies"], 0.5) for d in runs]) * 1e3,
            "p99": median([pct(d["latencies"], 0.99) for d in runs]) * 1e3,
        },
    }


def _floor(samples, lim):
    floor = samples.get("floor")
    return {
        "median_commits_s": median(samples["floor"]) if floor else None,
        "commits_s": samples.get("floor", []),
        "over_limit": median(samples["floor"]) / lim if floor else None,
        "over_limit_per_repeat": [
            a / b for a, b in zip(samples.get("floor", []), samples["limit"])
        ],
    }


def _baseline(times, commits_s, counts):
    return {
        "commits": len(times),
        "commits_s": commits_s,
        "queries_per_commit": counts["queries_per_commit"],
        "messages": counts["messages"],
    }


def _batch_tail(w, detail):
    lim_tail = median([rate(len(d["tail"]), sum(d["tail"])) for d in detail["limit"]])
    ivm_tail = median(
        [rate(len(d["tail"]), sum(commit_total(t) for t in d["tail"])) for d in detail["ivm"]]
    )
    return {
        "commits": len(w.tail),
        "rows": sum(len(ops) for ops in w.tail),
        "limit_commits_s": lim_tail,
        "ivm_commits_s": ivm_tail,
        "ivm_over_limit": ivm_tail / lim_tail if lim_tail else None,
    }
