#!/usr/bin/env python
"""
Start-up and waiting between sockets, before and after (issue 16, items 1 to 3).

    .venv/bin/python bench/startup.py [--rows 1000000] [--tabs 16] [--runs 1]
        [--before REF (default 9581caf)] [--quick]

One SQLite database of the demo's shape is generated once (``--rows`` synced rows:
users, then issues with their tags and comments, inserted set-based through a
recursive CTE with the capture triggers intact, so the outbox holds a row per row).
Each variant ("before": a temporary ``git worktree`` of REF; "after": this checkout)
then serves that same file from a real Daphne process, ``--runs`` times:

1. Start. As soon as Daphne is spawned, ``--tabs`` browser-like clients open a
   socket each, as a page does: a handshake Daphne resets (it waits at most 5 s) is
   retried after 0.25 s; once accepted, the client sends ``init`` and subscribes
   ``users`` and waits for the seq-0 batch. Each ends "answered", "closed" (the
   server closed the socket after accepting it, with the code) or "unanswered" (no
   frame in 60 s). Reported: the handshakes reset, the outcomes, and spawn →
   first data frame (median and slowest tab).
2. Busy. On the started server, socket B (subscribed to ``users``) sends unknown
   frames one after another, each answered with an error, first while nothing else
   happens, then while socket A's subscribe to a shape nobody had builds its first
   query (``recentComments``), then a cached re-subscribe of B while A builds
   ``issueDetail``. Reported: B's round trips idle and during the build (median,
   max), A's first-query time, and how long B's re-subscribe waited past A's answer.

The "before" variant's start is where issue 16's "accepted but never answered" hang
shows: its dead handshakes resume when the hub has loaded and count under the
clients' one address, so a live socket is closed with 4429 right after its accept.
Results go to ``bench/results/startup-<time>.json``.
"""

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ws_clients import WebSocket  # noqa: E402

HOST = "127.0.0.1"
SECRET_KEY = "bench-startup-" + "k" * 50
ANSWER_TIMEOUT = 60.0
RETRY_SECONDS = 0.25
TAG_NAMES = ["bug", "feature", "ui", "backend", "perf", "docs", "infra", "security", "ux", "api"]
STATUSES = ["backlog", "todo", "in-progress", "review", "done"]
PRIORITIES = ["urgent", "high", "medium", "low"]


# --- the database ----------------------------------------------------------------------


def env_for(path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(
        DATABASE_URL=f"sqlite:///{path}",
        DJANGO_SETTINGS_MODULE="project.settings",
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=SECRET_KEY,
        PYTHONUNBUFFERED="1",
    )
    env.pop("RINDLE_TEST_DATABASE_NAME", None)
    return env


def case(column, names):
    arms = " ".join(f"WHEN {i} THEN '{name}'" for i, name in enumerate(names))
    return f"CASE {column} % {len(names)} {arms} END"


def generate(path, rows):
    """Migrate a fresh file, seed the demo's users, then about ``rows`` synced rows."""
    env = env_for(path)
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    subprocess.run([*manage, "rindle_seed_demo", "--issues", "0"], cwd=ROOT, env=env, check=True)
    issues = max(1, rows // 5)  # 1 issue, 1.5 tags and 2.5 comments on average
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(
        "CREATE TEMP TABLE people AS SELECT row_number() OVER (ORDER BY id) - 1 AS k, id "
        "FROM \"user\" WHERE id <> 'unassigned'"
    )
    (people,) = db.execute("SELECT count(*) FROM people").fetchone()
    n = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?)"
    issue_id = "'b-i' || printf('%07d', i)"
    db.execute("BEGIN")
    db.execute(
        f"{n} INSERT INTO issue (id, title, status, priority, ownerId, createdAt, updatedAt) "
        f"SELECT {issue_id}, 'Bulk issue ' || i, {case('i', STATUSES)}, "
        f"{case('i', PRIORITIES)}, CASE WHEN i % 10 = 0 THEN 'unassigned' ELSE "
        f"(SELECT id FROM people WHERE k = i % {people}) END, "
        "1704067200000.0 + i * 3600000.0, 1704067200000.0 + i * 3600000.0 FROM n",
        [issues],
    )
    db.execute(
        f"{n}, k(j) AS (VALUES (0), (1), (2)) INSERT INTO tag (id, issueId, name) "
        f"SELECT {issue_id} || '-t' || j, {issue_id}, {case('(i + j)', TAG_NAMES)} "
        "FROM n, k WHERE j < i % 4",
        [issues],
    )
    db.execute(
        f"{n}, k(j) AS (VALUES (0), (1), (2), (3)) "
        "INSERT INTO comment (id, issueId, authorId, body, createdAt) "
        f"SELECT {issue_id} || '-c' || j, {issue_id}, "
        f"(SELECT id FROM people WHERE k = (i + j) % {people}), "
        "'Steps to reproduce are in the linked thread.', "
        "1704067200000.0 + i * 3600000.0 + j * 600000.0 FROM n, k WHERE j <= i % 4",
        [issues],
    )
    db.execute("COMMIT")
    counts = {
        t: db.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]
        for t in ("user", "issue", "tag", "comment")
    }
    (captured,) = db.execute("SELECT count(*) FROM _rindle_change_events").fetchone()
    db.close()
    return counts, captured


# --- the server ------------------------------------------------------------------------


class Daphne:
    """Daphne serving ``app`` from checkout ``root`` (bench/floor.py passes its own)."""

    def __init__(self, root, env, log_path, port, app="project.asgi:application"):
        self.port = port
        self.log = open(log_path, "w")
        daphne = str(ROOT / ".venv" / "bin" / "daphne")
        self.proc = subprocess.Popen(
            [daphne, "-b", HOST, "-p", str(port), "--access-log", os.devnull, app],
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.spawned = time.monotonic()

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def free_port():
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Socket:
    """One client socket: its text frames as JSON, and how the server closed it."""

    def __init__(self):
        self.frames = asyncio.Queue()
        self.ws = None

    async def open(self, port, timeout=30.0):
        loop = asyncio.get_running_loop()
        _, ws = await loop.create_connection(
            lambda: WebSocket(HOST, port, "/ws/rindle/", self._text), HOST, port
        )
        try:
            await asyncio.wait_for(asyncio.shield(ws.open), timeout)
        except BaseException:
            ws.transport.abort()
            raise
        self.ws = ws
        return self

    def _text(self, t, payload):
        self.frames.put_nowait((t, json.loads(payload)))

    def send(self, frame):
        self.ws.send_text(json.dumps(frame))

    async def next(self, timeout):
        """The next frame, or None when the socket was closed first."""
        getter = asyncio.ensure_future(self.frames.get())
        done, _ = await asyncio.wait(
            [getter, self.ws.lost], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if getter in done:
            return getter.result()
        getter.cancel()
        if self.ws.lost in done:
            return None
        raise TimeoutError

    async def until(self, kind, timeout=ANSWER_TIMEOUT):
        """(receipt time, frame) of the next ``kind`` frame; None if the socket closed."""
        while True:
            got = await self.next(timeout)
            if got is not None and got[1]["t"] in ("queryError", "error"):
                raise RuntimeError(f"the server refused: {got[1]}")
            if got is None or got[1]["t"] == kind:
                return got

    def close(self):
        if self.ws is not None:
            self.ws.close()


async def tab(port, index, spawned):
    """A browser tab during the start: retry a reset handshake, then wait for the data."""
    resets = 0
    while True:
        try:
            sock = await Socket().open(port)
            break
        except ConnectionRefusedError:  # Daphne not listening yet
            await asyncio.sleep(0.05)
        except (TimeoutError, ConnectionError, OSError):
            resets += 1
            await asyncio.sleep(RETRY_SECONDS)
    sock.send({"t": "init", "clientID": f"tab-{index}"})
    sock.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    try:
        got = await sock.until("nbatch")
    except TimeoutError:
        outcome, at = "unanswered", None
    else:
        outcome = "answered" if got is not None else "closed"
        at = got[0] - spawned if got is not None else None
    sock.close()
    return {"resets": resets, "outcome": outcome, "first_frame_s": at}


async def start_phase(server, tabs):
    results = await asyncio.gather(*(tab(server.port, i, server.spawned) for i in range(tabs)))
    times = [r["first_frame_s"] for r in results if r["first_frame_s"] is not None]
    outcomes = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    return {
        "resets": sum(r["resets"] for r in results),
        "outcomes": outcomes,
        "first_frame_median_s": statistics.median(times) if times else None,
        "first_frame_max_s": max(times) if times else None,
        "rss_mib": server.rss_mib(),
    }


async def round_trip(sock):
    started = time.monotonic()
    sock.send({"t": "nonsense"})
    _t, frame = await sock.next(30)
    assert frame["t"] == "error", frame
    return time.monotonic() - started


async def busy_phase(port):
    b = await Socket().open(port)
    b.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    await b.until("progress")
    idle = [await round_trip(b) for _ in range(30)]
    a = await Socket().open(port)
    asked = time.monotonic()
    a.send(
        {
            "t": "subscribe",
            "queryId": 1,
            "name": "recentComments",
            "args": {"limit": 20},
            "mode": "normalized",
        }
    )
    answer = asyncio.ensure_future(a.until("nhello"))
    during = []
    while not answer.done():
        during.append(await round_trip(b))
    first_query = answer.result()[0] - asked
    # A cached re-subscribe of B while A builds another new shape.
    a.send(
        {
            "t": "subscribe",
            "queryId": 2,
            "name": "issueDetail",
            "args": "b-i0000042",
            "mode": "normalized",
        }
    )
    await asyncio.sleep(0.01)
    again = time.monotonic()
    b.send({"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"})
    a_second = asyncio.ensure_future(a.until("nhello"))
    b_hello = await b.until("nhello")
    a_hello = await a_second
    a.close()
    b.close()
    return {
        "idle_median_ms": statistics.median(idle) * 1000,
        "during_median_ms": statistics.median(during) * 1000,
        "during_max_ms": max(during) * 1000,
        "during_count": len(during),
        "first_query_ms": first_query * 1000,
        "second_build_ms": (a_hello[0] - again) * 1000,
        "resubscribe_ms": (b_hello[0] - again) * 1000,
    }


def serve(variant, root, path, args, log_dir):
    runs = []
    for run in range(args.runs):
        port = free_port()
        server = Daphne(root, env_for(path), Path(log_dir) / f"{variant}-{run}.log", port)
        try:
            start = asyncio.run(start_phase(server, args.tabs))
            busy = asyncio.run(busy_phase(port))
        finally:
            server.stop()
        refused = (Path(log_dir) / f"{variant}-{run}.log").read_text().count("refused a socket")
        runs.append({"start": start, "busy": busy, "refused_4429": refused})
        print(f"  {variant} run {run + 1}: {json.dumps(runs[-1])}", flush=True)
    return runs


def report(results):
    print()
    print(f"{results['rows']} synced rows, {results['tabs']} tabs, SQLite")
    head = (
        "variant | resets | answered | closed | unanswered | 4429 | first frame median / max"
        " | B idle | B during build: median / max | first query | resubscribe"
    )
    print(head)
    for variant, runs in results["variants"].items():
        for r in runs:
            s, b, o = r["start"], r["busy"], r["start"]["outcomes"]
            print(
                f"{variant} | {s['resets']} | {o.get('answered', 0)} | {o.get('closed', 0)} | "
                f"{o.get('unanswered', 0)} | {r['refused_4429']} | "
                f"{fmt(s['first_frame_median_s'])} / {fmt(s['first_frame_max_s'])} s | "
                f"{b['idle_median_ms']:.2f} ms | {b['during_median_ms']:.2f} / "
                f"{b['during_max_ms']:.1f} ms ({b['during_count']}) | "
                f"{b['first_query_ms']:.0f} ms | {b['resubscribe_ms']:.0f} ms "
                f"(build {b['second_build_ms']:.0f} ms)"
            )


def fmt(value):
    return "-" if value is None else f"{value:.2f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tabs", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--before", default="9581caf")
    parser.add_argument("--quick", action="store_true", help="100k rows, 8 tabs")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.tabs = 100_000, 8
    tmpdir = Path(tempfile.mkdtemp(prefix="rindle-bench-startup-"))
    before = tmpdir / "before"
    path = str(tmpdir / "scale.sqlite3")
    try:
        subprocess.run(
            ["git", "worktree", "add", "-q", "--detach", str(before), args.before],
            cwd=ROOT,
            check=True,
        )
        started = time.monotonic()
        counts, captured = generate(path, args.rows)
        print(f"generated {counts} ({captured} outbox rows) in {time.monotonic() - started:.0f} s")
        results = {"rows": sum(counts.values()), "tabs": args.tabs, "variants": {}}
        for variant, root in (("before", before), ("after", ROOT)):
            results["variants"][variant] = serve(variant, root, path, args, tmpdir)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT)
        logs = ROOT / "bench" / "results" / "startup-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for log in tmpdir.glob("*.log"):
            shutil.copy(log, logs / log.name)
        shutil.rmtree(tmpdir, ignore_errors=True)
    report(results)
    out = ROOT / "bench" / "results" / f"startup-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps({"config": vars(args), **results}, indent=1))
    print(f"results: {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
