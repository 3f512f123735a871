"""
bench/datascale.py's measurements of one variant on one database: a real Daphne
server started from the variant's checkout, the client process
(bench/datascale_client.py), the writer and the gate (bench/datascale_gate.py).
"""

import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
PATH = "/ws/rindle/"
SECRET_KEY = secrets.token_urlsafe(50)  # production mode (DEBUG off) needs a strong key
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


def child_env(url):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=SECRET_KEY,
        PYTHONUNBUFFERED="1",
        # SIGABRT dumps every thread's stack into the server's log (see dump_stacks).
        PYTHONFAULTHANDLER="1",
    )
    env.pop("RINDLE_TEST_DATABASE_NAME", None)
    return env


def run_child(kind, env, stdin=None, timeout=None):
    """``bench/datascale.py --child kind`` from this checkout; its last stdout line, parsed."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "datascale.py"), "--child", kind],
        env=env,
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {kind} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def proc_status(pid):
    """VmRSS and VmHWM of ``pid`` in MiB (Linux /proc)."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key = line.split(":", 1)[0]
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(line.split()[1]) / 1024
    return {"rss_mib": round(out["VmRSS"], 1), "hwm_mib": round(out["VmHWM"], 1)}


def free_port():
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Daphne:
    """One Daphne process serving ``project.asgi`` from checkout ``root``."""

    def __init__(self, root, env, log_dir, label):
        self.port = free_port()
        self.log_path = Path(log_dir) / f"daphne-{label}-{self.port}.log"
        self.log = open(self.log_path, "w")
        daphne = str(ROOT / ".venv" / "bin" / "daphne")
        cmd = [daphne, "-b", HOST, "-p", str(self.port), "--access-log", os.devnull]
        self.t_spawn = time.monotonic()
        self.proc = subprocess.Popen(
            [*cmd, "project.asgi:application"],
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def status(self):
        return proc_status(self.proc.pid)

    def tail(self, chars=3000):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def dump_stacks(self, name):
        """Abort the server, whose faulthandler writes every thread's stack to its log,
        and keep that log in bench/results/ (for a subscription that got no answer)."""
        import shutil
        import signal

        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.log.flush()
        keep = ROOT / "bench" / "results" / name
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.log_path, keep)
        return str(keep)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class Clients:
    """The client process, driven by JSON lines."""

    def __init__(self, env):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "datascale_client.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    def call(self, cmd, **fields):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the client process exited ({self.proc.poll()}) during {cmd!r}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise RuntimeError(f"client process, {cmd}: {reply}")
        return reply

    def dump_stacks(self, name):
        """Abort the server, whose faulthandler writes every thread's stack to its log,
        and keep that log in bench/results/ (for a subscription that got no answer)."""
        import shutil
        import signal

        self.proc.send_signal(signal.SIGABRT)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.log.flush()
        keep = ROOT / "bench" / "results" / name
        keep.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.log_path, keep)
        return str(keep)

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


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
    t0, t1 = answer["t_sent"], answer.get("t_seq0") or answer.get("t_answer") or answer["t_sent"]
    during = [rtt for _c, t, rtt in pings if t <= t1 and t + rtt >= t0]
    if not during:
        return None, 0
    return max(0.0, max(during) - idle_p50) * 1000, len(during)


def step(label, text):
    print(f"    {label}: {text}", flush=True)


def measure(label, root, url, meta, args, log_dir):
    """Every figure of one variant (checkout ``root``) on the database at ``url``."""
    env = child_env(url)
    token = meta["token"]
    issues = meta["issues"]
    from bench.datascale_data import issue_id

    out = {"variant": label}
    server = Daphne(root, env, log_dir, label)
    clients = Clients(env)
    try:
        out["start"] = start(server, clients, token, START_QUERY)
        out["after_first_frame"] = server.status()
        print(
            f"    {label}: first frame {out['start']['first_frame_s']:.2f} s, RSS "
            f"{out['after_first_frame']['rss_mib']:.0f} MiB",
            flush=True,
        )
        watched = [f"w{i}" for i in range(WATCHERS)]
        for name in watched:
            clients.call("open", name=name, subs=[START_QUERY], timeout=SUB_TIMEOUT_S)
        step(label, f"{WATCHERS} watchers open")
        clients.call("watch", conns=watched)
        time.sleep(1.0)  # the idle round trip
        answers = []
        for k, (name, qargs) in enumerate(SHAPES):
            if name == "issueDetail":
                qargs = issue_id(issues // 200 + 5, issues)
            sub = {"queryId": 2 + k, "name": name, "args": qargs}
            answers.append(
                clients.call("subscribe", conn="main", sub=sub, timeout=SUB_TIMEOUT_S)["answer"]
            )
            step(label, f"first {name}: {answers[-1]['kind']}")
            time.sleep(0.2)
        pings = clients.call("unwatch")["pings"]
        idle = [rtt for _c, t, rtt in pings if t + rtt < answers[0]["t_sent"]]
        idle_p50 = statistics.median(idle) if idle else 0.0
        shapes = {
            "issuesPage": {
                "first_ms": out["start"]["subscribe_to_seq0_ms"],
                "note": "the start subscription",
            }
        }
        for a in answers:
            delay, n = shape_delay(a, pings, idle_p50)
            entry = {"kind": a["kind"], "others_delayed_ms": delay, "pings_during": n}
            if a["kind"] == "nbatch":
                entry.update(first_ms=(a["t_seq0"] - a["t_sent"]) * 1000, rows=a["rows"])
            else:
                entry.update(code=a.get("code"))
            shapes[a["name"]] = entry
        out["shapes"] = shapes
        out["idle_ping_ms"] = idle_p50 * 1000
        out["after_shapes"] = server.status()
        targets = [issue_id(k * issues // EXTRA_SUBS + 3, issues) for k in range(EXTRA_SUBS)]
        t0 = time.monotonic()
        refused = []
        for half in range(2):
            subs = [
                {"queryId": 1 + k, "name": "issueDetail", "args": targets[half * 50 + k]}
                for k in range(EXTRA_SUBS // 2)
            ]
            r = clients.call("open", name=f"d{half}", subs=subs, timeout=SUB_TIMEOUT_S)
            refused += [a for a in r["answers"] if a["kind"] != "nbatch"]
        out["extra_subs_s"] = time.monotonic() - t0
        out["extra_subs_refused"] = [
            f"{a['name']} #{a['queryId']}: {a.get('code') or 'no answer'}" for a in refused
        ]
        time.sleep(0.5)
        out["after_extra_subs"] = server.status()
        step(label, f"+{EXTRA_SUBS} subscriptions in {out['extra_subs_s']:.2f} s")
        out["writes"] = writes(env, clients, targets, label, args)
        step(label, f"writes: {out['writes']}")
        dump = Path(log_dir) / f"dump-{label}.json"
        clients.call("dump", path=str(dump))
        out["gate"] = run_child(
            "gate", {**env, "DATASCALE_DUMP": str(dump), "DATASCALE_USER": meta["token_user"]}
        )
        out["server_log_tracebacks"] = server.tail(10**7).count("Traceback")
        lost = [n for n, sh in shapes.items() if sh.get("kind") == "none"]
        lost += [x for x in out["extra_subs_refused"] if x.endswith("no answer")]
        if lost:
            name = f"datascale-unanswered-{label}-{time.strftime('%Y%m%dT%H%M%S')}.log"
            out["unanswered"] = {"subscriptions": lost, "stacks": server.dump_stacks(name)}
            step(label, f"!!! unanswered subscriptions {lost}: stacks in {name}")
    finally:
        clients.stop()
        server.stop()
    out["users_only"] = users_only(root, env, token, log_dir, label)
    return out


def writes(env, clients, targets, label, args):
    """ORM writes from another process -> the frame carrying each, p50/p99 and missing."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "datascale.py"), "--child", "writer"],
        env={
            **env,
            "DATASCALE_TARGETS": json.dumps(targets),
            "DATASCALE_WRITES": str(args.writes),
            "DATASCALE_RATE": str(args.write_rate),
            "DATASCALE_LABEL": f"{label}-{time.time_ns()}",
        },
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError("the writer did not start")
    out, _ = proc.communicate("go\n", timeout=args.writes / args.write_rate + 120)
    commits = json.loads(out.strip().splitlines()[-1])
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


def users_only(root, env, token, log_dir, label):
    """A fresh server whose only subscription is ``users``: its RSS."""
    server = Daphne(root, env, log_dir, f"{label}-users")
    clients = Clients(env)
    try:
        r = start(server, clients, token, {"queryId": 1, "name": "users", "args": {}})
        first = server.status()
        time.sleep(2.0)  # anything still loading in the background
        later = server.status()
    finally:
        clients.stop()
        server.stop()
    return {
        "first_frame_s": r["first_frame_s"],
        "handshakes_reset": r["handshakes_reset"],
        "subscribes_unanswered": r["subscribes_unanswered"],
        "rss_mib": max(first["rss_mib"], later["rss_mib"]),
        "hwm_mib": max(first["hwm_mib"], later["hwm_mib"]),
    }


def pct(values, q):
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]
