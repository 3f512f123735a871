"""
bench/datascale.py's measurements of one variant on one database: a real Daphne
server started from the variant's checkout, the client process
(bench/datascale_client.py), the writer and the gate (bench/datascale_gate.py).
"""

import statistics
import time
from pathlib import Path

from bench.datascale_procs import HOST, Clients, Daphne, Helper, child_env

PATH = "/ws/rindle/"
START_DEADLINE_S = 300.0  # spawn -> an answered subscription, at most
ANSWER_TIMEOUT_S = 60.0  # an accepted socket's subscribe unanswered this long is retried
SUB_TIMEOUT_S = 60.0  # a later subscription unanswered this long is recorded as such
WATCHERS = 4  # already-subscribed sockets pinging while a new shape is built
START_QUERY = {"queryId": 1, "name": "issuesPage", "args": {"limit": 50}}
# The demo's other named queries, each the first of its shape on the server, in order.
# tagOptions is every tag: past 1 % of the data, it is outside the issue's targets.
SHAPES = [
    ("users", {}),
    ("myIssues", {"limit": 50}),
    ("recentComments", {"limit": 30}),
    ("issueDetail", None),  # an issue id, filled in
    ("tagOptions", {}),
]
OUTSIDE_TARGETS = {"tagOptions"}
EXTRA_SUBS = 100  # issueDetail of distinct issues, over two sockets of 50


def start(server, clients, token, sub):
    """Spawn -> the first data frame of ``sub`` (the server was spawned just before)."""
    r = clients.call(
        "start",
        host=HOST,
        port=server.port,
        path=PATH,
        token=token,
        name="main",
        sub=sub,
        deadline=START_DEADLINE_S,
        answer_timeout=ANSWER_TIMEOUT_S,
    )
    a = r["answer"]
    if a["kind"] != "nbatch":
        raise RuntimeError(f"the first subscription was refused: {a}")
    return {
        "first_frame_s": a["t_seq0"] - server.t_spawn,
        "listening_s": r["t_listen"] - server.t_spawn,
        "accepted_s": r["t_accept"] - server.t_spawn,
        "subscribe_to_seq0_ms": (a["t_seq0"] - a["t_sent"]) * 1000,
        "refused_before_listening": r["refused"],
        "handshakes_reset": r["resets"],
        "subscribes_unanswered": r["unanswered"],
        "failures": r["failures"],
        "rows": a["rows"],
    }


def shape_delay(answer, pings, idle_p50):
    """The longest a watcher's ping overlapping the subscription waited, above idle."""
    t0, t1 = answer["t_sent"], answer.get("t_answer") or answer["t_sent"]
    during = [rtt for _c, t, rtt, *_kind in pings if t <= t1 and t + rtt >= t0]
    if not during:
        return None, 0
    return max(0.0, max(during) - idle_p50) * 1000, len(during)


_T0 = time.monotonic()


def step(label, text):
    print(f"    [{time.monotonic() - _T0:6.1f}s] {label}: {text}", flush=True)


def first_subscriptions(clients, label, watched_query, shapes, first_query_id, lock_sub):
    """
    Each of ``shapes`` [(name, args)] subscribed in turn on socket ``main`` while
    ``WATCHERS`` other sockets, subscribed to ``watched_query`` (a query the server
    already maintains), ping: per shape, subscribe -> seq 0 and how much longer than
    when idle the pings overlapping it waited. Also the idle round trip, in ms.
    Their lock pings re-subscribe ``lock_sub`` ({name, args}): a small query whose
    partitions the server already holds, so it warms nothing the shapes read.
    """
    watched = [f"w{i}" for i in range(WATCHERS)]
    clients.call(
        "open",
        conns=[{"name": n, "subs": [watched_query]} for n in watched],
        timeout=SUB_TIMEOUT_S,
    )
    clients.call("watch", conns=watched, lock_sub=lock_sub)
    time.sleep(0.5)  # the idle round trip
    answers = []
    for k, (name, qargs) in enumerate(shapes):
        sub = {"queryId": first_query_id + k, "name": name, "args": qargs}
        a = clients.call("subscribe", conn="main", sub=sub, timeout=SUB_TIMEOUT_S)["answer"]
        answers.append(a)
        took = a.get("t_answer")
        took = "" if took is None else f" after {(took - a['t_sent']) * 1000:.1f} ms"
        step(label, f"first {name}: {a['kind']} {a.get('code') or ''}{took}")
        time.sleep(0.1)
    pings = clients.call("unwatch")["pings"]
    clients.call("close", conns=watched)
    by_kind = {kind: [p for p in pings if p[3] == kind] for kind in ("ping", "lock")}
    idles = {}
    for kind, some in by_kind.items():
        idle = [rtt for _c, t, rtt, _k in some if t + rtt < answers[0]["t_sent"]]
        idles[kind] = statistics.median(idle) if idle else 0.0
    idle_p50 = idles["ping"]
    out = {}
    for a in answers:
        delay, n = shape_delay(a, by_kind["ping"], idle_p50)
        entry = {"kind": a["kind"], "others_delayed_ms": delay, "pings_during": n}
        # A cached re-subscribe of another socket: what waits for the hub's lock.
        entry["others_locked_ms"], _n = shape_delay(a, by_kind["lock"], idles["lock"])
        if a["kind"] == "nbatch":
            entry.update(first_ms=(a["t_seq0"] - a["t_sent"]) * 1000, rows=a["rows"])
        else:
            entry.update(code=a.get("code"))
            if a.get("t_answer") is not None:
                entry["refused_after_ms"] = (a["t_answer"] - a["t_sent"]) * 1000
        out[a["name"]] = entry
    return out, idle_p50 * 1000


def check_unanswered(out, server, label, shapes):
    lost = [n for n, sh in shapes.items() if sh.get("kind") == "none"]
    lost += [x for x in out.get("extra_subs_refused", ()) if x.endswith("no answer")]
    if lost:
        name = f"datascale-unanswered-{label}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        out["unanswered"] = {"subscriptions": lost, "stacks": server.dump_stacks(name)}
        step(label, f"!!! unanswered subscriptions {lost}: stacks in bench/results/{name}")


def measure(label, root, url, meta, args, log_dir):
    """Every figure of one variant (checkout ``root``) on the database at ``url``."""
    from bench.datascale_data import issue_id

    env = child_env(url)
    token, issues, user = meta["token"], meta["issues"], meta["token_user"]
    detail = issue_id(issues // 200 + 5, issues)  # the first issueDetail
    targets = [issue_id(k * issues // EXTRA_SUBS + 3, issues) for k in range(EXTRA_SUBS)]
    shapes = [(n, detail if n == "issueDetail" else a) for n, a in SHAPES]
    out = {"variant": label}
    helper = None
    server = Daphne(root, env, log_dir, label)
    clients = Clients(env)
    try:
        out["start"] = start(server, clients, token, START_QUERY)
        out["after_first_frame"] = server.status()
        step(
            label,
            f"first frame {out['start']['first_frame_s']:.2f} s after spawning, RSS "
            f"{out['after_first_frame']['rss_mib']:.0f} MiB",
        )
        # issuesPage of 1: its run is START_QUERY's, already read; its seq 0 is small.
        lock_sub = {"name": "issuesPage", "args": {"limit": 1}}
        out["shapes"], out["idle_ping_ms"] = first_subscriptions(
            clients, label, START_QUERY, shapes, 2, lock_sub
        )
        out["shapes"]["issuesPage"] = {
            "kind": "nbatch",
            "first_ms": out["start"]["subscribe_to_seq0_ms"],
            "note": "the start subscription: no watchers yet",
        }
        out["after_shapes"] = server.status()
        helper = Helper(env)  # Django starts up while the +100 subscriptions are made
        t0 = time.monotonic()
        conns = [
            {
                "name": f"d{half}",
                "subs": [
                    {"queryId": 1 + k, "name": "issueDetail", "args": targets[half * 50 + k]}
                    for k in range(EXTRA_SUBS // 2)
                ],
            }
            for half in range(2)
        ]
        answers = clients.call("open", conns=conns, timeout=SUB_TIMEOUT_S)["answers"]
        out["extra_subs_s"] = time.monotonic() - t0
        out["extra_subs_refused"] = [
            f"{a['name']} #{a['queryId']}: {a.get('code') or 'no answer'}"
            for a in answers
            if a["kind"] != "nbatch"
        ]
        time.sleep(0.5)
        out["after_extra_subs"] = server.status()
        step(label, f"+{EXTRA_SUBS} subscriptions in {out['extra_subs_s']:.2f} s")
        out["writes"] = writes(helper, clients, targets, label, args)
        step(label, f"writes: {out['writes']}")
        out["gate"] = gate(helper, clients, log_dir, f"{label}-main", user)
        check_unanswered(out, server, label, out["shapes"])
        out["server_log_tracebacks"] = server.tail(10**7).count("Traceback")
    finally:
        clients.stop()
        server.stop()
    try:
        out["users_only"] = users_only(root, env, token, log_dir, label, detail, helper, user)
    finally:
        if helper is not None:
            helper.stop()
    return out


def gate(helper, clients, log_dir, name, user):
    dump = Path(log_dir) / f"dump-{name}.json"
    clients.call("dump", path=str(dump))
    result = helper.call("gate", dump=str(dump), user=user)
    step(name, f"correctness gate {'PASS' if result['pass'] else 'FAIL'} ({result['checked']})")
    return result


def writes(helper, clients, targets, label, args):
    """ORM writes from another process -> the frame carrying each, p50/p99 and missing."""
    commits = helper.call(
        "write",
        targets=targets,
        count=args.writes,
        rate=args.write_rate,
        label=f"{label}-{time.time_ns()}",
    )["commits"]
    deadline = time.monotonic() + 10
    while True:
        edits = clients.call("edits")["edits"]
        missing = [title for title, _t in commits if title not in edits]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    lat = sorted((edits[title] - t) * 1000 for title, t in commits if title in edits)
    return {
        "samples": len(lat),
        "missing": len(missing),
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        "max_ms": lat[-1] if lat else None,
    }


# On the users-only server, after its RSS: the shapes again, first touching their tables.
FRESH_SHAPES = ("issueDetail", "recentComments", "myIssues", "issuesPage")


def users_only(root, env, token, log_dir, label, detail, helper, user):
    """
    A fresh server whose only subscription is ``users``: its RSS. Then, on that server,
    the first subscription of each of ``FRESH_SHAPES`` (issueDetail first: on the main
    server issuesPage has already read its tables), and the correctness gate.
    """
    server = Daphne(root, env, log_dir, f"{label}-users")
    clients = Clients(env)
    users = {"queryId": 1, "name": "users", "args": {}}
    try:
        r = start(server, clients, token, users)
        first = server.status()
        time.sleep(1.0)  # anything still loading in the background
        later = server.status()
        step(label, f"users only: first frame {r['first_frame_s']:.2f} s, {later}")
        out = {
            "first_frame_s": r["first_frame_s"],
            "handshakes_reset": r["handshakes_reset"],
            "subscribes_unanswered": r["subscribes_unanswered"],
            "rss_mib": max(first["rss_mib"], later["rss_mib"]),
            "hwm_mib": max(first["hwm_mib"], later["hwm_mib"]),
        }
        specs = dict(SHAPES)
        specs["issueDetail"], specs["issuesPage"] = detail, START_QUERY["args"]
        shapes = [(n, specs[n]) for n in FRESH_SHAPES]
        lock_sub = {"name": "users", "args": {}}
        out["shapes"], out["idle_ping_ms"] = first_subscriptions(
            clients, label, users, shapes, 2, lock_sub
        )
        if helper is not None:
            out["gate"] = gate(helper, clients, log_dir, f"{label}-users", user)
        check_unanswered(out, server, f"{label}-users", out["shapes"])
    finally:
        clients.stop()
        server.stop()
    return out


def pct(values, q):
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]
