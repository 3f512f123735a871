#!/usr/bin/env python
"""
A fleet on PostgreSQL (issue 15): what app servers cost writers, what one long
transaction costs everyone, and how far the outbox grows.

    .venv/bin/python bench/fleet.py [--quick] [--seconds 6] [--repeats 3]
        [--database-url postgres://postgres@127.0.0.1:5432/test] [--only tx,long,latency,week]

One run, one fresh database per variant (``rindle_bench_fleet_<pid>_<variant>``),
migrated and seeded with the demo's issue tracker by that variant's code, dropped
afterwards. Workloads:

- **tx**: one writer process runs short transactions (one UPDATE of a synced row,
  COMMIT) for ``--seconds`` while 0, 2 or 4 serving processes are attached. Variants:
  - ``rindle``: that many Daphne processes, each with ``--subscribers`` websocket
    subscribers of ``issuesPage`` (the embedded watermarker runs in whichever wins its
    lease; every process tails the published safe_seq);
  - ``before``: the same Daphne processes and subscribers running the code this issue
    replaces (``--baseline-rev``, checked out into a temporary git worktree), where
    every serving process takes the EXCLUSIVE side of the outbox fence itself after
    every commit notification;
  - 0 servers is the physical limit: the writer alone.
  Ratios: tx/s at N servers over tx/s at 0, per variant (target >= 0.9 at 4).
- **long**: 2 servers attached; another session holds a synced-table transaction open
  for 5 s. Short-write p99 inside that window (target < 100 ms) and one SSR read
  (``POST /api/rindle/read``) started 1 s into it (target < 1 s), per variant.
- **latency**: commit -> client receipt across processes (2 Daphne servers, the
  commits made by this process), beside the physical limit: commit -> the commit's
  NOTIFY arriving in another process.
- **week**: a simulated three weeks (fake clock) of writes at a steady rate with
  retention (7-day age) run every simulated hour: outbox rows at the end, beside the
  rows without retention and the bound age x rate.

Results go to bench/results/fleet-<time>.json. Figures: docs/benchmarks.md.
"""

import argparse
import json
import os
import random
import secrets
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ws import HOST, Clients, free_port, latencies  # noqa: E402

QUERY = {"queryId": 1, "name": "issuesPage", "args": {"limit": 50}, "mode": "normalized"}
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/test"
LONG_TX_SECONDS = 5.0
VARIANTS = ("rindle", "before")
SECRET_KEY = secrets.token_urlsafe(50)
PROBE_CHANNEL = "rindle_bench_probe"  # the latency workload's physical limit (a NOTIFY a commit)
WRITER_NAME = "rindle-bench-fleet-writer"  # production mode (DEBUG off) needs a strong key
# The code before the watermarker: main just before issue 15's first commit.
BASELINE_REV = "ebf88de"


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def ms(value):
    return "-" if value is None else f"{value * 1000:,.1f}"


def us(value):
    return "-" if value is None else f"{value * 1e6:,.0f}"


def cpu_seconds(pid):
    """User + system CPU seconds a process has used so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --- the database ----------------------------------------------------------------------


class FleetDatabase:
    def __init__(self, given, suffix):
        parts = urlsplit(given)
        self.given = given
        self.name = f"rindle_bench_fleet_{os.getpid()}_{suffix}"
        self.url = urlunsplit((parts.scheme, parts.netloc, "/" + self.name, parts.query, ""))

    def create(self, issues, root):
        """Create, then migrate and seed with the code of checkout ``root``."""
        import psycopg

        with psycopg.connect(self.given, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}"')
            admin.execute(f'CREATE DATABASE "{self.name}"')
        env = child_env(self.url)
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "migrate", "--noinput", "-v0"], env=env, cwd=root, check=True)
        seed = [*manage, "rindle_seed_demo", "--issues", str(issues), "--seed", "1"]
        subprocess.run(seed, env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)
        return self

    def drop(self):
        import psycopg

        with psycopg.connect(self.given, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def connect(self, autocommit=False):
        import psycopg

        return psycopg.connect(self.url, autocommit=autocommit)


def child_env(url):
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DATABASE_URL")}
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=SECRET_KEY,
        PYTHONUNBUFFERED="1",
    )
    env.pop("RINDLE_TEST_DATABASE_NAME", None)
    return env


# --- children (run by this file with --child) -----------------------------------------


def child_writer():
    """Short transactions for FLEET_SECONDS: one UPDATE of a synced row, COMMIT."""
    import psycopg

    seconds = float(os.environ["FLEET_SECONDS"])
    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://")
    conn = psycopg.connect(url, application_name=WRITER_NAME)
    # Never the first issue: the long transaction of the "long" workload holds it.
    sql = "SELECT id FROM issue WHERE id > (SELECT min(id) FROM issue)"
    ids = [r[0] for r in conn.execute(sql).fetchall()]
    conn.commit()
    rng = random.Random(7)
    samples = []  # (start monotonic, duration)
    print("ready", flush=True)
    sys.stdin.readline()  # go
    end = time.monotonic() + seconds
    while True:
        t0 = time.monotonic()
        if t0 >= end:
            break
        conn.execute(
            'UPDATE issue SET "updatedAt" = "updatedAt" + 1 WHERE id = %s', [rng.choice(ids)]
        )
        conn.commit()
        samples.append((t0, time.monotonic() - t0))
    print(json.dumps({"samples": samples}), flush=True)


def child_notify_probe():
    """
    The physical limit of cross-process delivery: stamp the arrival of each commit's
    NOTIFY on the probe's own channel (the latency writer sends one per commit;
    capture's own notification is sent only while the watermarker sleeps).
    """
    import psycopg

    conn = psycopg.connect(os.environ["DATABASE_URL"].replace("postgres://", "postgresql://"))
    conn.autocommit = True
    conn.execute(f"LISTEN {PROBE_CHANNEL}")
    print("ready", flush=True)
    stamps = []
    deadline = time.monotonic() + float(os.environ["FLEET_SECONDS"]) + 5
    while time.monotonic() < deadline:
        for _n in conn.notifies(timeout=0.2, stop_after=256):
            stamps.append(time.monotonic())
    print(json.dumps({"stamps": stamps}), flush=True)


CHILDREN = {
    "writer": child_writer,
    "notify-probe": child_notify_probe,
}


def spawn(kind, env, **extra):
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", kind],
        env={**env, **{k: str(v) for k, v in extra.items()}},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"child {kind} did not start: {line!r}")
    return proc


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- attached servers -----------------------------------------------------------------


class Daphne:
    """One Daphne process serving ``project.asgi`` from checkout ``root``."""

    def __init__(self, env, root, log_dir):
        self.port = free_port()
        self.log_path = Path(log_dir) / f"daphne-{self.port}.log"
        self.log = open(self.log_path, "w")
        daphne = str(ROOT / ".venv" / "bin" / "daphne")
        cmd = [daphne, "-b", HOST, "-p", str(self.port), "--access-log", os.devnull]
        self.proc = subprocess.Popen(
            [*cmd, "project.asgi:application"],
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout=60):
        import http.client

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited: {self.log_path.read_text()[-3000:]}")
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"daphne did not answer: {self.log_path.read_text()[-3000:]}")

    def stop(self):
        stop(self.proc)
        self.log.close()


class Fleet:
    """n Daphne processes of a variant's checkout, each with its subscribers."""

    def __init__(self, n, db, root, tmpdir, subscribers):
        self.n, self.db, self.root = n, db, root
        self.env = child_env(db.url)
        self.servers, self.clients = [], []
        self.tmpdir, self.subscribers = tmpdir, subscribers

    def __enter__(self):
        self.servers = [Daphne(self.env, self.root, self.tmpdir) for _ in range(self.n)]
        for server in self.servers:
            server.wait_ready()
            clients = Clients(self.env)
            self.clients.append(clients)
            clients.call(
                "open",
                kind="rindle",
                n=self.subscribers,
                slow=False,
                host=HOST,
                port=server.port,
                path="/ws/rindle/",
                subscribe=QUERY,
            )
        time.sleep(1.0)  # subscribe traffic settles; the lease is won
        return self

    def cpu_seconds(self):
        """CPU seconds used so far by each serving process (the writer's cost to them)."""
        return [cpu_seconds(server.proc.pid) for server in self.servers]

    def client_cpu_seconds(self):
        """CPU seconds used so far by the bench's own subscriber processes, together."""
        return sum(cpu_seconds(clients.pid) for clients in self.clients)

    def __exit__(self, *exc):
        for c in self.clients:
            c.stop()
        for s in self.servers:
            s.stop()


class WaitSampler:
    """
    Where the writer's time goes: every 5 ms, what pg_stat_activity says its backend
    waits on (a lock, the client - i.e. the writer process itself -, or nothing: running).
    With ``/proc/stat``, how busy the machine's cores were meanwhile.
    """

    def __init__(self, db):
        import threading

        self.db, self.counts, self._stop = db, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        conn = self.db.connect(autocommit=True)
        sql = "SELECT wait_event_type FROM pg_stat_activity WHERE application_name = %s"
        while not self._stop.wait(0.005):
            row = conn.execute(sql, [WRITER_NAME]).fetchone()
            if row is not None:
                key = row[0] or "running"
                self.counts[key] = self.counts.get(key, 0) + 1
        conn.close()

    @staticmethod
    def _cpu():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields) - fields[3] - fields[4], sum(fields)

    def __enter__(self):
        self._cpu0 = self._cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        busy, total = (b - a for a, b in zip(self._cpu0, self._cpu()))
        self.machine_busy = busy / total if total else None

    def shares(self):
        n = sum(self.counts.values()) or 1
        return {k: round(v / n, 3) for k, v in sorted(self.counts.items())}


def run_writer(env, seconds, during=None, db=None):
    """
    One writer child for ``seconds``; ``during(t0)`` runs meanwhile. Its samples,
    what ``during`` returned, and (with ``db``) the ``WaitSampler``.
    """
    proc = spawn("writer", env, FLEET_SECONDS=seconds)
    sampler = WaitSampler(db) if db is not None else None
    t0 = time.monotonic()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    if sampler is not None:
        with sampler:
            extra = during(t0) if during is not None else None
            out, _ = proc.communicate(timeout=seconds + 120)
    else:
        extra = during(t0) if during is not None else None
        out, _ = proc.communicate(timeout=seconds + 120)
    samples = json.loads(out.strip().splitlines()[-1])["samples"]
    return samples, extra, sampler


# --- workloads ------------------------------------------------------------------------


def workload_tx(args, dbs, tmpdir):
    rows = []
    for rep in range(args.repeats):
        order = [(v, n) for v in VARIANTS for n in args.server_counts]
        random.Random(rep).shuffle(order)
        for variant, n in order:
            db = dbs[variant]
            with Fleet(n, db, args.roots[variant], tmpdir, args.subscribers) as fleet:
                cpu0, clients0 = fleet.cpu_seconds(), fleet.client_cpu_seconds()
                samples, _, sampler = run_writer(child_env(db.url), args.seconds, db=db)
                cpu1, clients1 = fleet.cpu_seconds(), fleet.client_cpu_seconds()
            rate = len(samples) / args.seconds
            # each serving process's CPU per commit: the fan-out and upkeep a commit costs
            per_server = [(b - a) / max(1, len(samples)) for a, b in zip(cpu0, cpu1)]
            cpu_per_commit = statistics.median(per_server) if per_server else None
            # the subscribers run on the same 2 cores: what they take is not the servers'
            clients_cpu = (clients1 - clients0) / max(1, len(samples)) if n else None
            lat = [d for _t, d in samples]
            waits = sampler.shares()
            rows.append(
                {
                    "variant": variant,
                    "n": n,
                    "rep": rep,
                    "tx_s": rate,
                    "p99_s": pct(lat, 0.99),
                    "writer_waits": waits,
                    "machine_busy": sampler.machine_busy,
                    "server_cpu_per_commit_s": cpu_per_commit,
                    "subscribers_cpu_per_commit_s": clients_cpu,
                }
            )
            print(
                f"tx {variant:<7} servers={n}: {rate:,.0f} tx/s, p99 {ms(pct(lat, 0.99))} ms; "
                f"CPU per commit per server {us(cpu_per_commit)} us, all subscriber "
                f"processes {us(clients_cpu)} us; "
                f"writer backend waiting on a lock {waits.get('Lock', 0):.0%} of samples; "
                f"cores busy {sampler.machine_busy:.0%}",
                flush=True,
            )
    summary = {}
    for variant in VARIANTS:
        base = statistics.median(r["tx_s"] for r in rows if r["variant"] == variant and r["n"] == 0)
        for n in args.server_counts:
            med = statistics.median(
                r["tx_s"] for r in rows if r["variant"] == variant and r["n"] == n
            )
            runs = [r for r in rows if r["variant"] == variant and r["n"] == n]
            lock = statistics.median(r["writer_waits"].get("Lock", 0) for r in runs)
            busy = statistics.median(r["machine_busy"] for r in runs)
            cpu = [r["server_cpu_per_commit_s"] for r in runs if r["server_cpu_per_commit_s"]]
            sub = [r["subscribers_cpu_per_commit_s"] for r in runs]
            sub = [x for x in sub if x]
            summary[f"{variant}_{n}"] = {
                "server_cpu_per_commit_s": statistics.median(cpu) if cpu else None,
                "subscribers_cpu_per_commit_s": statistics.median(sub) if sub else None,
                "tx_s": med,
                "ratio_to_0": med / base if base else None,
                "writer_lock_share": lock,
                "machine_busy": busy,
            }
    return {"runs": rows, "summary": summary}


def ssr_read(port):
    import http.client

    body = json.dumps({"name": QUERY["name"], "args": QUERY["args"]})
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    conn.request("POST", "/api/rindle/read", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return time.monotonic() - t0, resp.status


def workload_long(args, dbs, tmpdir):
    out = {}
    for variant in VARIANTS:
        db = dbs[variant]
        with Fleet(2, db, args.roots[variant], tmpdir, args.subscribers) as fleet:
            holder = db.connect()

            def during(t0, holder=holder, fleet=fleet, db=db):
                time.sleep(1.0)
                start = time.monotonic()
                holder.execute(
                    'UPDATE issue SET "updatedAt" = "updatedAt" + 1 '
                    "WHERE id = (SELECT min(id) FROM issue)"
                )
                time.sleep(1.0)
                took = ssr_read(fleet.servers[0].port)
                left = LONG_TX_SECONDS - (time.monotonic() - start)
                if left > 0:
                    time.sleep(left)
                holder.commit()
                return start, time.monotonic(), took

            samples, (w0, w1, ssr), _ = run_writer(
                child_env(db.url), LONG_TX_SECONDS + 4, during=during
            )
            holder.close()
        inside = [d for t, d in samples if w0 <= t < w1]
        out[variant] = {
            "writes_in_window": len(inside),
            "p50_s": pct(inside, 0.5),
            "p99_s": pct(inside, 0.99),
            "max_s": max(inside) if inside else None,
            "ssr_s": ssr[0],
            "ssr_status": ssr[1],
        }
        print(
            f"long {variant:<7}: {len(inside)} short writes in the 5 s window, p99 "
            f"{ms(pct(inside, 0.99))} ms, max {ms(max(inside) if inside else None)} ms; "
            f"SSR read {ssr[0]:.3f} s (HTTP {ssr[1]})",
            flush=True,
        )
    return out


def workload_latency(args, dbs, tmpdir):
    from bench.ws import Writer

    db = dbs["rindle"]
    env = child_env(db.url)
    with Fleet(2, db, ROOT, tmpdir, args.subscribers) as fleet:
        probe = spawn("notify-probe", env, FLEET_SECONDS=args.seconds)

        class _Db:  # what bench.ws.Writer needs of a database
            backend = "postgresql"

            def connect(self):
                return db.connect()

        from rindle_app.engine.capture import OUTBOX

        writer = Writer(_Db(), 3, OUTBOX, notify=PROBE_CHANNEL)
        commits, rate = [], args.rate
        start = time.monotonic()
        period = 1.0 / rate
        i = 0
        while time.monotonic() - start < args.seconds:
            delay = start + i * period - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            commits.append(writer.commit_pg())
            i += 1
        writer.close()
        last = commits[-1][0]
        samples, missing = [], 0
        for k, clients in enumerate(fleet.clients):
            clients.call("wait", cv=last, stall=10, timeout=60)
            path = str(Path(tmpdir) / f"lat{k}.json")
            clients.call("collect", path=path, drain=1.0, cv=last)
            for c in json.loads(Path(path).read_text())["connections"]:
                receipts = [r for r in c["receipts"] if r[0] > 1 or r[1] > 0]
                lat, miss = latencies(commits, receipts)
                samples.extend(lat)
                missing += miss
        out, _ = probe.communicate(timeout=args.seconds + 30)
    stamps = json.loads(out.strip().splitlines()[-1])["stamps"]
    # The physical limit: commit -> its NOTIFY in another process (the first NOTIFY
    # arriving after the commit: the payloads are empty).
    arrivals = sorted(stamps)
    notify = []
    j = 0
    for _cv, t in commits:
        while j < len(arrivals) and arrivals[j] < t:
            j += 1
        if j < len(arrivals):
            notify.append(arrivals[j] - t)
    result = {
        "commits": len(commits),
        "receipts_missing": missing,
        "rindle": {"p50_s": pct(samples, 0.5), "p99_s": pct(samples, 0.99)},
        "notify": {"p50_s": pct(notify, 0.5), "p99_s": pct(notify, 0.99)},
    }
    print(
        f"latency: commit -> client receipt across processes p50 {ms(pct(samples, 0.5))} ms, "
        f"p99 {ms(pct(samples, 0.99))} ms ({missing} missing); commit -> NOTIFY p50 "
        f"{ms(pct(notify, 0.5))} ms, p99 {ms(pct(notify, 0.99))} ms",
        flush=True,
    )
    return result


def workload_week(args, dbs, tmpdir):
    """Three simulated weeks, retention every simulated hour on a fake clock."""
    env = {**child_env(dbs["rindle"].url), "FLEET_WEEK_RATE": str(args.week_rate)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", "week"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    print(
        f"week: {result['hours']} simulated hours at {result['rate_per_hour']} writes/h: "
        f"{result['rows_with_retention']:,} outbox rows with retention, "
        f"{result['rows_without']:,} without; bound age x rate = {result['bound']:,}",
        flush=True,
    )
    return result


def child_week():
    """
    Writes at a steady simulated rate, their outbox rows stamped with the fake clock,
    and Retention(now=fake clock) every simulated hour.
    """
    import datetime as dt

    import django

    django.setup()
    from django.db import connection

    from rindle_app.engine.capture import OUTBOX
    from rindle_app.stream.retention import Retention

    rate = int(os.environ["FLEET_WEEK_RATE"])
    hours = 21 * 24
    age = dt.timedelta(days=7)
    clock = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    retention = Retention("default", age=age, now=lambda: clock[0])
    written = 0
    with connection.cursor() as cursor:
        # The seed's rows were captured "now": they are the simulation's first hour.
        cursor.execute(f"UPDATE {OUTBOX} SET created_at = %s", [clock[0]])
        cursor.execute("SELECT count(*), COALESCE(MAX(seq), 0) FROM " + OUTBOX)
        seeded, mark = cursor.fetchone()
        cursor.execute("SELECT min(id) FROM issue")
        target = cursor.fetchone()[0]
    for _hour in range(hours):
        with connection.cursor() as cursor:
            for _ in range(rate):
                cursor.execute(
                    'UPDATE issue SET "updatedAt" = "updatedAt" + 1 WHERE id = %s', [target]
                )
            written += rate
            cursor.execute(f"UPDATE {OUTBOX} SET created_at = %s WHERE seq > %s", [clock[0], mark])
            cursor.execute("SELECT COALESCE(MAX(seq), 0) FROM " + OUTBOX)
            mark = cursor.fetchone()[0]
        publish_now()
        retention.run_once()
        clock[0] += dt.timedelta(hours=1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM " + OUTBOX)
        kept = cursor.fetchone()[0]
    print(
        json.dumps(
            {
                "hours": hours,
                "rate_per_hour": rate,
                "rows_with_retention": kept,
                "rows_without": seeded + written,
                "bound": int(age.total_seconds() / 3600 * rate) + rate,
            }
        )
    )


def publish_now():
    """Publish safe_seq once (what the watermarker does every refresh interval)."""
    from rindle_app.stream.watermark import Watermarker

    w = Watermarker("default", owner="bench-week")
    try:
        w.step()
    finally:
        w.close()


CHILDREN["week"] = child_week


# --- main ------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_URL)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--servers", default="0,2,4")
    p.add_argument("--subscribers", type=int, default=20)
    p.add_argument("--rate", type=float, default=50.0, help="commits/s of the latency workload")
    p.add_argument("--week-rate", type=int, default=20, help="writes per simulated hour")
    p.add_argument("--issues", type=int, default=500)
    p.add_argument("--only", default="tx,long,latency,week")
    p.add_argument("--baseline-rev", default=BASELINE_REV, help="the 'before' variant's code")
    p.add_argument("--quick", action="store_true", help="1 repeat of 3 s")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.repeats = 3.0, 1
    args.server_counts = [int(x) for x in args.servers.split(",")]
    args.workloads = args.only.split(",")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.child:
        CHILDREN[args.child]()
        return 0
    if not urlsplit(args.database_url).scheme.startswith("postgres"):
        print("bench/fleet.py measures a PostgreSQL fleet: pass --database-url postgres://...")
        return 2
    tmpdir = tempfile.mkdtemp(prefix="rindle-bench-fleet-")
    before = Path(tmpdir) / "before"
    subprocess.run(
        ["git", "worktree", "add", "-q", "--detach", str(before), args.baseline_rev],
        cwd=ROOT,
        check=True,
    )
    args.roots = {"rindle": ROOT, "before": before}
    dbs = {v: FleetDatabase(args.database_url, v) for v in VARIANTS}
    results = {"config": {k: v for k, v in vars(args).items() if k not in ("child", "roots")}}
    try:
        for variant, db in dbs.items():
            db.create(args.issues, args.roots[variant])
        for name in ("tx", "long", "latency", "week"):
            if name in args.workloads:
                results[name] = globals()[f"workload_{name}"](args, dbs, tmpdir)
    finally:
        for db in dbs.values():
            db.drop()
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT)
    report(results)
    out = ROOT / "bench" / "results" / f"fleet-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"results: {out.relative_to(ROOT)}")
    return 0


def report(results):
    print()
    print("ratios")
    tx = results.get("tx")
    if tx:
        for key, value in tx["summary"].items():
            variant, n = key.rsplit("_", 1)
            ratio = value["ratio_to_0"]
            print(
                f"  tx/s, {variant:<7} {n} servers: {value['tx_s']:,.0f}"
                f" ({'-' if ratio is None else f'{ratio:.2f}'}x the writer alone); writer "
                f"waiting on a lock {value['writer_lock_share']:.0%}, cores busy "
                f"{value['machine_busy']:.0%}, CPU per commit per server "
                f"{us(value['server_cpu_per_commit_s'])} us, subscribers "
                f"{us(value['subscribers_cpu_per_commit_s'])} us"
            )
        r4 = tx["summary"].get("rindle_4", {}).get("ratio_to_0")
        if r4 is not None:
            print(f"  target >= 0.9x at 4 servers: {'PASS' if r4 >= 0.9 else 'FAIL'} ({r4:.2f})")
    long = results.get("long")
    if long:
        for variant, v in long.items():
            print(
                f"  long tx, {variant:<7}: short-write p99 {ms(v['p99_s'])} ms "
                f"(target < 100), max {ms(v['max_s'])} ms, {v['writes_in_window']} writes; "
                f"SSR {v['ssr_s']:.3f} s, HTTP {v['ssr_status']} (target < 1 s, 200)"
            )
    lat = results.get("latency")
    if lat and lat["notify"]["p50_s"]:
        print(
            f"  latency p50: client receipt / NOTIFY = "
            f"{lat['rindle']['p50_s'] / lat['notify']['p50_s']:.1f}x"
        )
    week = results.get("week")
    if week:
        print(
            f"  week: rows with retention / without = "
            f"{week['rows_with_retention'] / max(1, week['rows_without']):.2f}; "
            f"/ bound = {week['rows_with_retention'] / max(1, week['bound']):.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
