#!/usr/bin/env python
"""
The latency floor and the cost of capture (issue 16, "Also"), on SQLite, in one run.

    .venv/bin/python bench/floor.py [--writes 100] [--repeats 2] [--rate 50] [--rounds 8]
        [--cpu-writes 60] [--alone-writes 500] [--rows 5000] [--baseline-rev 7aded0f]

One database of the demo's shape (``bench.startup.generate``: ``--rows`` synced rows,
capture intact) is copied three times: for this checkout ("rindle"), for the code
before (``--baseline-rev``, checked out into a temporary git worktree: "before"),
and without its capture triggers ("plain"). Each copy is served by its own Daphne
process (``bench.startup.Daphne``) running ``bench/floor_server.py``: the project
plus ``POST /floor/write``, an ORM ``update()`` of a title ``issuesPage`` shows, in a
transaction, stamped with ``time.monotonic()`` at its commit.

1. ORM write -> subscriber frame, one subscriber of ``issuesPage {limit: 50}`` (the
   websocket client process of bench/ws.py, ``bench/ws_clients.py``), ``--writes``
   writes at ``--rate`` per phase, ``--repeats`` phases per cell, rindle and before
   in another order each time (the samples pooled):
   - same process: the write is made by the serving process (the POST);
   - another process: a Django process of its own makes the same ORM writes on the
     same file (``--child-writer``).
   Latency = the frame's receipt (the client stamps its bytes' arrival) - the commit.
2. CPU per ORM write with 0 subscribers: ``--rounds`` rounds (each in another order)
   of ``--cpu-writes`` sequential POSTs to each server; the server process's CPU
   time (/proc) over the round / the writes. "plain" is Django without rindle
   (``FLOOR_PLAIN=1``: not installed, no triggers); rindle and before have capture
   and a started hub (a socket opened and closed before) with nothing subscribed.
   Then the write alone: a Django process of each variant's code that only makes
   ORM writes, ``--rounds`` blocks of ``--alone-writes``, interleaved like the
   servers' rounds; its ``time.process_time()`` per write (the request handling a
   server adds to every write is left out, so the capture's share shows).

Targets (issue 16): same process p50 <= 1 ms, another process p50 <= 2 ms, CPU per
write <= 1.1x plain. Results: bench/results/floor-<time>.json; figures:
docs/benchmarks.md.
"""

import argparse
import http.client
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import interleaved, median, rotated, write_results  # noqa: E402
from bench.startup import HOST, Daphne, env_for, free_port, generate  # noqa: E402
from bench.ws import Clients, distribution, latencies, proc_cpu, steady  # noqa: E402

QUERY = {"queryId": 1, "name": "issuesPage", "args": {"limit": 50}, "mode": "normalized"}
APP = "bench.floor_server:application"
# main just before the same-process commit hook and the burst fixes
BASELINE_REV = "7aded0f"
TARGETS = {"same_p50_s": 0.001, "other_p50_s": 0.002, "cpu_ratio": 1.1}
VARIANTS = ("rindle", "before")
WHERE = ("same", "other")


def server_env(path, plain=False):
    env = env_for(path)
    env["DJANGO_SETTINGS_MODULE"] = "bench.floor_server"
    if plain:
        env["FLOOR_PLAIN"] = "1"
    return env


def copy_database(source, target, plain=False):
    """A copy of the database file; ``plain``: without rindle's triggers."""
    src, dst = sqlite3.connect(source), sqlite3.connect(target)
    try:
        src.backup(dst)
        if plain:
            names = dst.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE '\\_rindle%' "
                "ESCAPE '\\'"
            ).fetchall()
            for (name,) in names:
                dst.execute(f'DROP TRIGGER "{name}"')
            dst.commit()
    finally:
        src.close()
        dst.close()


class Served:
    """One Daphne of a variant and a keep-alive HTTP connection to it."""

    def __init__(self, name, root, env, log_dir):
        self.name, self.env = name, env
        self.server = Daphne(root, env, Path(log_dir) / f"{name}.log", free_port(), app=APP)
        self.http = None
        self.n = 0

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: daphne exited, see its log")
            try:
                self.write(with_cv=True)
                return self
            except OSError:
                self.http = None
                time.sleep(0.1)
        raise RuntimeError(f"{self.name}: daphne did not answer in {timeout} s")

    def write(self, with_cv=False):
        """One ORM write by the server; (cv, commit time)."""
        self.n += 1
        if self.http is None:
            self.http = http.client.HTTPConnection(HOST, self.server.port, timeout=30)
        query = f"n={self.n}&cv=1" if with_cv else f"n={self.n}"
        self.http.request("POST", f"/floor/write?{query}", body=b"")
        response = self.http.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{self.name}: HTTP {response.status}: {body[:300]!r}")
        reply = json.loads(body)
        return reply["cv"], reply["t"]

    def cpu(self):
        return proc_cpu(self.server.proc.pid)

    def stop(self):
        if self.http is not None:
            self.http.close()
        self.server.stop()


# --- 1. latency -------------------------------------------------------------------------


def latency_phase(served, args, tmpdir, where):
    """p50/p99 of ORM write -> frame with the writes made ``where`` ("same"/"other")."""
    clients = Clients(served.env)
    try:
        opened = clients.call(
            "open", kind="rindle", n=1, slow=False, host=HOST, port=served.server.port,
            path="/ws/rindle/", subscribe=QUERY,
        )  # fmt: skip
        assert opened["opened"] == 1, opened
        if where == "same":
            commits = steady(args.rate, args.writes, lambda: served.write(with_cv=True))
        else:
            commits = child_writes(served.env, args)
        clients.call("wait", cv=commits[-1][0], stall=5, timeout=60)
        path = str(Path(tmpdir) / f"{served.name}-{where}.json")
        clients.call("collect", path=path, drain=0.5, cv=commits[-1][0])
    finally:
        clients.stop()
    (conn,) = json.loads(Path(path).read_text())["connections"]
    receipts = [r for r in conn["receipts"] if r[0] > 1 or r[1] > 0]  # not seq 0
    lat, missing = latencies(commits, receipts)
    result = distribution(lat)
    print(
        f"  {served.name:6} {where:5} process: p50 {ms(result['p50'])} ms, "
        f"p99 {ms(result['p99'])} ms ({missing} missing)",
        flush=True,
    )
    return lat, missing


def latencies_interleaved(servers, args, tmpdir):
    """Every latency phase ``--repeats`` times, the variants in another order each time."""
    pooled = {(v, w): [] for v in VARIANTS for w in WHERE}
    missing = dict.fromkeys(pooled, 0)
    for rep in range(args.repeats):
        for where in WHERE:
            for v in rotated(list(VARIANTS), rep):
                lat, miss = latency_phase(servers[v], args, tmpdir, where)
                pooled[v, where].extend(lat)
                missing[v, where] += miss
    return {
        v: {w: {**distribution(pooled[v, w]), "missing": missing[v, w]} for w in WHERE}
        for v in VARIANTS
    }


def child_writes(env, args):
    """The ORM writes of another Django process on the same file; its (cv, t) list."""
    out = subprocess.run(
        [sys.executable, __file__, "--child-writer", "--writes", str(args.writes)]
        + ["--rate", str(args.rate)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode != 0:
        raise RuntimeError(f"the writer process failed:\n{out.stderr[-3000:]}")
    return [tuple(c) for c in json.loads(out.stdout.strip().splitlines()[-1])]


def child_writer(args):
    import django

    django.setup()
    from bench.floor_server import orm_write

    orm_write(0, True)  # connect, find the target: not timed
    time.sleep(0.2)
    counter = iter(range(1, 10**9))
    commits = steady(args.rate, args.writes, lambda: orm_write(next(counter), True))
    print(json.dumps(commits))


# --- 2. CPU per write -------------------------------------------------------------------


def cpu_phase(servers, args):
    """µs of server CPU per ORM write, per variant, over interleaved rounds."""
    for served in servers.values():  # warm: imports, the connection, the statement cache
        for _ in range(50):
            served.write()

    def per_write(name, _tag):
        served = servers[name]
        before = served.cpu()
        for _ in range(args.cpu_writes):
            served.write()
        return (served.cpu() - before) / args.cpu_writes * 1e6

    return interleaved(list(servers), args.rounds, per_write, unit=" µs", label="CPU round")


# The write alone, in a Django process of its own that stays up: each line read is a
# number of ORM writes to make, answered with the CPU time per write they took.
ALONE = """
import sys, time
import django
django.setup()
from bench.floor_server import orm_write
n = 0
for line in sys.stdin:
    started = time.process_time()
    for _ in range(int(line)):
        n += 1
        orm_write(n, False)
    print((time.process_time() - started) / int(line), flush=True)
"""


def alone_phase(servers, roots, args):
    """µs of CPU per ORM write in a process that only writes, per variant."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", ALONE],
            cwd=roots[name],
            env=servers[name].env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in servers
    }

    def block(name, n):
        proc = procs[name]
        proc.stdin.write(f"{n}\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{name}: the writing process exited ({proc.wait()})")
        return float(line) * 1e6

    try:
        for name in procs:
            block(name, 100)  # warm: the connection, the statement cache, the target

        def per_write(name, _tag):
            return block(name, args.alone_writes)

        return interleaved(list(servers), args.rounds, per_write, unit=" µs", label="alone")
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait(30)


def start_hub(served):
    """Open and close one socket: the hub starts, and nothing stays subscribed."""
    clients = Clients(served.env)
    try:
        clients.call(
            "open", kind="rindle", n=1, slow=False, host=HOST, port=served.server.port,
            path="/ws/rindle/", subscribe=QUERY,
        )  # fmt: skip
        clients.call("close")
    finally:
        clients.stop()
    time.sleep(1.5)  # the hub's next step sees nothing subscribed and disarms the watcher


# --- the run ----------------------------------------------------------------------------


def ms(value):
    return "-" if value is None else f"{value * 1000:.2f}"


def spread(samples, variant):
    """``median µs (min-max), ratio x plain`` of one variant's rounds."""
    values, plain = samples[variant], median(samples["plain"])
    return (
        f"{median(values):,.0f} µs ({min(values):,.0f}-{max(values):,.0f}), "
        f"{median(values) / plain:.2f}x plain"
    )


def verdict(ok):
    return "ok" if ok else "FAIL"


def report(results, args):
    lat, cpu = results["latency"], results["cpu_us_per_write"]
    print()
    print(
        f"SQLite, {args.repeats} x {args.writes} ORM writes at {args.rate:g}/s per cell, "
        f"1 subscriber of issuesPage; before = {args.baseline_rev}"
    )
    print("variant | same process p50 / p99 | another process p50 / p99")
    for v in VARIANTS:
        s, o = lat[v]["same"], lat[v]["other"]
        print(f"{v} | {ms(s['p50'])} / {ms(s['p99'])} ms | {ms(o['p50'])} / {ms(o['p99'])} ms")
    alone = results["alone_us_per_write"]
    print(
        f"CPU per ORM write, 0 subscribers: the server ({args.rounds} x {args.cpu_writes} "
        f"POSTs) | the write alone ({args.rounds} x {args.alone_writes}); medians (range)"
    )
    for v in ("plain", *VARIANTS):
        print(f"{v} | {spread(cpu, v)} | {spread(alone, v)}")
    ratios = [median(c["rindle"]) / median(c["plain"]) for c in (cpu, alone)]
    same, other = lat["rindle"]["same"]["p50"], lat["rindle"]["other"]["p50"]
    print(
        f"targets: same p50 <= 1 ms {verdict(same is not None and same <= 0.001)}, "
        f"other p50 <= 2 ms {verdict(other is not None and other <= 0.002)}, CPU <= 1.1x "
        + ", ".join(
            f"{what} {verdict(r <= TARGETS['cpu_ratio'])} ({r:.2f}x)"
            for what, r in zip(("server", "write alone"), ratios, strict=True)
        )
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--writes", type=int, default=100, help="writes per latency phase (100)")
    p.add_argument("--repeats", type=int, default=2, help="latency phases per variant (2)")
    p.add_argument("--rate", type=float, default=50.0, help="latency writes per second (50)")
    p.add_argument("--rounds", type=int, default=8, help="CPU rounds (8)")
    p.add_argument("--cpu-writes", type=int, default=60, help="writes per CPU round (60)")
    p.add_argument("--alone-writes", type=int, default=500, help="writes per alone round (500)")
    p.add_argument("--rows", type=int, default=5000, help="synced rows generated (5000)")
    p.add_argument("--baseline-rev", default=BASELINE_REV, help="the 'before' variant's code")
    p.add_argument("--child-writer", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.child_writer:
        child_writer(args)
        return 0
    started = time.monotonic()
    tmpdir = Path(tempfile.mkdtemp(prefix="rindle-bench-floor-"))
    before = tmpdir / "before"
    servers = {}
    try:
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(before), args.baseline_rev],
            cwd=ROOT,
            check=True,
        )
        shutil.copy(ROOT / "bench" / "floor_server.py", before / "bench" / "floor_server.py")
        source = str(tmpdir / "source.sqlite3")
        counts, captured = generate(source, args.rows)
        print(f"generated {counts} ({captured} outbox rows)", flush=True)
        roots = {"rindle": ROOT, "before": before, "plain": ROOT}
        for name in roots:
            path = str(tmpdir / f"{name}.sqlite3")
            copy_database(source, path, plain=name == "plain")
            env = server_env(path, plain=name == "plain")
            servers[name] = Served(name, roots[name], env, tmpdir)
        for served in servers.values():
            served.wait_ready()
        results = {"config": vars(args)}
        print("latency:", flush=True)
        results["latency"] = latencies_interleaved(servers, args, tmpdir)
        for v in VARIANTS:
            start_hub(servers[v])
        results["cpu_us_per_write"] = cpu_phase(servers, args)
        results["alone_us_per_write"] = alone_phase(servers, roots, args)
    finally:
        for served in servers.values():
            served.stop()
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT)
        logs = ROOT / "bench" / "results" / "floor-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for log in tmpdir.glob("*.log"):
            shutil.copy(log, logs / log.name)
        shutil.rmtree(tmpdir, ignore_errors=True)
    report(results, args)
    results["seconds"] = time.monotonic() - started
    name = f"floor-{time.strftime('%Y%m%dT%H%M%S')}.json"
    write_results(None, name, "floor", "sqlite", results)
    print(f"{results['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.floor_server")
    sys.exit(main())
