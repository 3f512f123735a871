"""bench/datascale.py's report: a table per backend, the fits, the targets, the exit status."""

from bench.datascale_run import FRESH_SHAPES, OUTSIDE_TARGETS

MIB = 1024 * 1024
TARGETS = {
    "rss_mib": 300.0,
    "users_only_mib": 200.0,
    "first_frame_s": 2.0,
    "new_shape_ms": 100.0,
    "others_delayed_ms": 10.0,
}
SHAPE_ORDER = ("issuesPage", "users", "myIssues", "recentComments", "issueDetail", "tagOptions")


def fit(points):
    """Least squares ``y = a + b x`` over ``points`` [(x, y)]: (a, b), or None below 2 x's."""
    points = [(x, y) for x, y in points if y is not None]
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def get(v, *path):
    for key in path:
        if not isinstance(v, dict) or key not in v:
            return None
        v = v[key]
    return v


def new_shape_worst(v):
    """(worst first-subscription ms, worst others-delayed ms) over the shapes in target,
    on the main server and on the users-only one."""
    entries = [
        s
        for shapes in (get(v, "shapes") or {}, get(v, "users_only", "shapes") or {})
        for n, s in shapes.items()
        if n not in OUTSIDE_TARGETS
    ]
    firsts = [s["first_ms"] for s in entries if s.get("first_ms") is not None]
    delays = [s["others_delayed_ms"] for s in entries if s.get("others_delayed_ms") is not None]
    lost = sum(1 for s in entries if s.get("kind") == "none")
    worst = max(firsts) if firsts else None
    return (float("inf") if lost else worst), (max(delays) if delays else None)


def shape_reader(where, name, key):
    def read(v):
        s = get(v, *where, name)
        if s is None:
            return None
        if key == "first_ms" and s.get("kind") == "none":
            return "no answer"
        if key == "first_ms" and s.get("kind") not in (None, "nbatch"):
            after = s.get("refused_after_ms")
            return "refused" + ("" if after is None else f" {after:,.0f}")
        return s.get(key)

    return read


def rows_of(entry):
    metrics = [
        ("start -> first frame, s", lambda v: get(v, "start", "first_frame_s")),
        ("  port listening after, s", lambda v: get(v, "start", "listening_s")),
        ("  handshakes reset", lambda v: get(v, "start", "handshakes_reset")),
        ("  subscribes unanswered", lambda v: get(v, "start", "subscribes_unanswered")),
        ("RSS after first frame, MiB", lambda v: get(v, "after_first_frame", "rss_mib")),
        ("VmHWM after first frame, MiB", lambda v: get(v, "after_first_frame", "hwm_mib")),
        ("RSS +100 subscriptions, MiB", lambda v: get(v, "after_extra_subs", "rss_mib")),
        ("VmHWM +100 subscriptions, MiB", lambda v: get(v, "after_extra_subs", "hwm_mib")),
        ("  +100 subscriptions took, s", lambda v: get(v, "extra_subs_s")),
        ("users only: RSS, MiB", lambda v: get(v, "users_only", "rss_mib")),
        ("users only: VmHWM, MiB", lambda v: get(v, "users_only", "hwm_mib")),
        ("users only: start -> first frame, s", lambda v: get(v, "users_only", "first_frame_s")),
        ("users only: handshakes reset", lambda v: get(v, "users_only", "handshakes_reset")),
        ("first subscription of a shape, ms (after issuesPage)", lambda v: ""),
    ]
    for name in SHAPE_ORDER:
        outside = " (not in target)" if name in OUTSIDE_TARGETS else ""
        first = "  (the start subscription)" if name == "issuesPage" else ""
        metrics.append((f"  {name}{outside}{first}", shape_reader(("shapes",), name, "first_ms")))
        if name != "issuesPage":
            reader = shape_reader(("shapes",), name, "others_delayed_ms")
            metrics.append(("    others delayed by it, ms", reader))
            reader = shape_reader(("shapes",), name, "others_locked_ms")
            metrics.append(("    others' re-subscribe delayed, ms", reader))
    metrics.append(("first subscription of a shape, ms (fresh, after users)", lambda v: ""))
    for name in FRESH_SHAPES:
        where = ("users_only", "shapes")
        metrics.append((f"  {name}", shape_reader(where, name, "first_ms")))
        metrics.append(
            ("    others delayed by it, ms", shape_reader(where, name, "others_delayed_ms"))
        )
        metrics.append(
            ("    others' re-subscribe delayed, ms", shape_reader(where, name, "others_locked_ms"))
        )
    metrics += [
        ("idle ping round trip, ms", lambda v: get(v, "idle_ping_ms")),
        ("write -> frame p50, ms", lambda v: get(v, "writes", "p50_ms")),
        ("write -> frame p99, ms", lambda v: get(v, "writes", "p99_ms")),
        ("  writes missing / samples", lambda v: _pair(get(v, "writes"), "missing", "samples")),
        ("correctness gate, main server", lambda v: _gate(get(v, "gate"), v)),
        ("correctness gate, users-only server", lambda v: _gate(get(v, "users_only", "gate"), v)),
    ]
    return metrics


def _pair(d, a, b):
    return None if d is None else f"{d.get(a)} / {d.get(b)}"


def _gate(g, v):
    if g is None:
        return "error" if get(v, "error") else None
    return f"{'PASS' if g['pass'] else 'FAIL'} ({g['checked']})"


def fmt(x):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return f"{x:,}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.2f}"


def ratio(b, a):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return f"{a / b:.2f}"
    return ""


def print_all(results):
    status = 0
    commits = results["config"]["commits"]
    labels = [x for x in ("before", "after") if x in commits]
    for backend in dict.fromkeys(e["backend"] for e in results["scale"]):
        entries = [e for e in results["scale"] if e["backend"] == backend]
        sides = " beside ".join(f"{x} ({commits[x]})" for x in labels)
        print(f"\n=== {backend}: data scale, {sides} ===")
        for e in entries:
            d = e["data"]
            print(
                f"\n{d['rows']:,} synced rows ({d['tables']}); generated in {d['fill_s']} s, "
                f"outbox {d['captured']:,} captured, pruned to {d['outbox_left']}"
            )
            both = len(labels) == 2
            head = "".join(f" {x:>12}" for x in labels) + (f" {'after/before':>13}" if both else "")
            print(f"  {'':<44}{head}")
            for name, read in rows_of(e):
                values = [read(e["variants"].get(x, {})) for x in labels]
                cells = "".join(f" {fmt(x):>12}" for x in values)
                print(f"  {name:<44}{cells}" + (f" {ratio(*values):>13}" if both else ""))
            for label in labels:
                v = e["variants"].get(label, {})
                if "error" in v:
                    print(f"  !!! {label}: {v['error'][:500]}")
                    status = max(status, 1)
                for lost in (v.get("unanswered"), get(v, "users_only", "unanswered")):
                    if lost:
                        print(f"  !!! {label}: subscriptions never answered: {lost}")
                for g in (v.get("gate"), get(v, "users_only", "gate")):
                    if g is not None and not g["pass"]:
                        print(f"  !!! CORRECTNESS GATE FAILED ({label}): {g['failures'][:5]}")
                        status = 3
                    if g is not None and g.get("refused"):
                        print(f"  ({label}: not compared, refused by the server: {g['refused']})")
        results.setdefault("fits", {})[backend] = print_fits(entries, labels)
        print_targets(entries, labels)
    ivm = results.get("ivm")
    if ivm:
        from bench import datascale_ivm

        datascale_ivm.report(ivm)
        if not all(r["gate_pass"] for r in ivm.values()):
            status = 3
    if status == 3:
        print("\nCORRECTNESS GATE FAILED: the figures above are void.")
    return status


def print_fits(entries, labels):
    print("\n  fit over the sizes (least squares)")
    fits = {}
    for label in labels:
        rss = fit(
            [
                (e["data"]["rows"], get(e["variants"].get(label), "after_first_frame", "rss_mib"))
                for e in entries
            ]
        )
        start = fit(
            [
                (e["data"]["rows"], get(e["variants"].get(label), "start", "first_frame_s"))
                for e in entries
            ]
        )
        if rss is None or start is None:
            print(f"    {label}: needs two sizes")
            continue
        print(
            f"    {label:<7} RSS after first frame = {rss[0]:,.0f} MiB + "
            f"{rss[1] * MIB:,.0f} bytes/row; start -> first frame = {start[0]:.2f} s + "
            f"{start[1] * 1e6:.2f} s per million rows"
        )
        fits[label] = {
            "rss_intercept_mib": rss[0],
            "bytes_per_row": rss[1] * MIB,
            "start_intercept_s": start[0],
            "s_per_million_rows": start[1] * 1e6,
        }
    return fits


def print_targets(entries, labels):
    e = max(entries, key=lambda x: x["data"]["rows"])
    rows = e["data"]["rows"]
    where = "" if rows >= 3_000_000 else f" (measured at {rows:,} rows; the targets are at 3M)"
    print(f"\n  targets{where}")
    for label in labels:
        v = e["variants"].get(label)
        if not v or "error" in v:
            continue
        first, delayed = new_shape_worst(v)
        resets = sum(
            get(v, *where, key) or 0
            for where in (("start",), ("users_only",))
            for key in ("handshakes_reset", "subscribes_unanswered")
        )
        checks = [
            (
                "RSS +100 subscriptions <= 300 MiB",
                get(v, "after_extra_subs", "rss_mib"),
                TARGETS["rss_mib"],
                "MiB",
            ),
            (
                "users only <= 200 MiB",
                get(v, "users_only", "rss_mib"),
                TARGETS["users_only_mib"],
                "MiB",
            ),
            (
                "start -> first frame <= 2 s",
                get(v, "start", "first_frame_s"),
                TARGETS["first_frame_s"],
                "s",
            ),
            ("first subscription of a new shape <= 100 ms", first, TARGETS["new_shape_ms"], "ms"),
            ("other sockets delayed <= 10 ms", delayed, TARGETS["others_delayed_ms"], "ms"),
        ]
        for name, value, limit, unit in checks:
            verdict = "-" if value is None else ("PASS" if value <= limit else "FAIL")
            print(f"    {label:<7} {name:<46} {fmt(value):>9} {unit:<3} {verdict}")
        verdict = "PASS" if resets == 0 else "FAIL"
        print(f"    {label:<7} {'0 handshakes reset or unanswered':<46} {resets:>9}     {verdict}")
