#!/usr/bin/env python
"""
A room end to end (issue 17): two published ``@rindle/optimistic`` clients in Node
editing one issue's title, through a room, beside the same two clients on the slow
path, in one run.

    .venv/bin/python bench/room_live.py [--edits 200] [--burst 500] [--repeats 3]
        [--database-url URL]

One fresh database (a temporary SQLite file by default, or a dedicated
``rindle_bench_<pid>`` database next to the one a ``postgres://`` URL names), seeded
with one issue. Per repeat, Daphne serves it twice, one after the other:

- ``room``: ``ROOMS_ENABLED``; the second client's lease is room-served and the first
  upgrades through its doorbell, so each ``editTitle`` goes over the room socket to
  the room host, which applies it in memory, sends it to the peer and flushes (group
  commit) before it confirms;
- ``slow``: rooms off; each ``editTitle`` is a ``POST /api/rindle/mutate`` committed
  by the engine, and reaches the peer through the outbox and the hub.

Each run drives ``tests/e2e/node/room.mjs``: ``--edits`` alternating edits (A, then
B, each waiting until the other's view shows it: the mutation -> peer receipt
time, the client's own queue included), then a burst of ``--burst`` edits from A
sent back to back (mutations/s per doc: until B's view shows the last).

Printed: receipt p50/p99 and burst mutations/s per workload (medians over repeats),
the ratios room/slow, and the anchor (Replicache's per-space strategy, about 50
pushes/s per space) and the targets (>= 1,000 room mutations/s per doc; receipt p99
< 20 ms on loopback).
"""

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import room_raw  # noqa: E402
from bench.common import BenchError, django_database, environment, pct, write_results  # noqa: E402

NODE_DIR = ROOT / "tests" / "e2e" / "node"
ANCHOR_PUSHES = 50
TARGET_RATE = 1000
TARGET_P99_MS = 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--edits", type=int, default=200, help="alternating edits per run")
    p.add_argument("--burst", type=int, default=100, help="client back-to-back edits per run")
    p.add_argument("--raw", type=int, default=2000, help="raw-protocol mutations per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--database-url", default=None)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed():
    from django.contrib.auth import get_user_model

    from project.demo import models as demo

    demo.User.objects.create(id="ada", name="Ada")
    demo.Issue.objects.create(
        id="i1", title="t", status="todo", priority="low", owner_id="ada", created_at=1,
        updated_at=1,
    )  # fmt: skip
    return get_user_model().objects.create_user("ada")


def cookie_of(user):
    from django.conf import settings
    from django.test import Client

    http = Client()
    http.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={http.cookies[settings.SESSION_COOKIE_NAME].value}"


def serve(env, rooms, log):
    port = free_port()
    env = {
        **env,
        "RINDLE_ROOMS_ENABLED": "1" if rooms else "0",
        "DJANGO_DEBUG": "0",
        "DJANGO_SETTINGS_MODULE": "bench.settings_room_live",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        + ["project.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise BenchError("daphne did not start") from None
            time.sleep(0.05)


def run(env, rooms, args, cookie, log, rep):
    proc, port = serve(env, rooms, log)
    try:
        raw = asyncio.run(room_raw.run(port, cookie, args.raw, "room" if rooms else "main", rep))
        argv = ["node", "room.mjs", "--api", f"http://127.0.0.1:{port}"]
        argv += ["--ws", f"ws://127.0.0.1:{port}/ws/rindle/", "--issue", "i1"]
        argv += ["--edits", str(args.edits), "--burst", str(args.burst), "--cookie", cookie]
        if not rooms:
            argv.append("--no-room")
        out = subprocess.run(
            argv, cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=600
        )
        if out.returncode != 0:
            raise BenchError(f"room.mjs failed: {out.stderr[-2000:]}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        proc.terminate()
        proc.wait(10)
    if result["anomalies"] or result["rejected"]:
        raise BenchError(f"the clients reported {result['anomalies']} {result['rejected']}")
    if rooms != bool(result["roomsA"]):
        raise BenchError(f"room workload={rooms} but the clients' rooms are {result['roomsA']}")
    receipts = result["receiptsMs"]
    return {
        "p50": statistics.median(receipts),
        "p99": pct(receipts, 99),
        "rate": result["burst"]["n"] / (result["burst"]["ms"] / 1000),
        "raw_rate": raw["rate"],
        "raw_p50": raw["p50"],
        "raw_p99": raw["p99"],
        "raw_confirm_ms": raw["confirm_ms"],
        "receipts_ms": receipts,
    }


def main(argv=None):
    args = parse_args(argv)
    with django_database(args.database_url, quiet=True) as db:
        user = seed()
        cookie = cookie_of(user)
        env = dict(os.environ)  # DATABASE_URL names the bench database (django_database)
        from rindle_app.engine import shutdown

        shutdown()  # the servers are the database's only writers from here
        results = {"room": [], "slow": []}
        with tempfile.TemporaryFile("w+") as log:
            for rep in range(args.repeats):
                order = ("room", "slow") if rep % 2 == 0 else ("slow", "room")
                for name in order:
                    results[name].append(run(env, name == "room", args, cookie, log, rep))
        body = {}
        for name, runs in results.items():
            body[name] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        room, slow = body["room"], body["slow"]
        print(f"room live ({db.backend}, {args.repeats} repeats, medians)")
        print("  published clients (@rindle/optimistic, its queue included):")
        for name in ("room", "slow"):
            b = body[name]
            print(
                f"    {name:5} receipt p50 {b['p50']:6.1f} ms  p99 {b['p99']:6.1f} ms  "
                f"burst {b['rate']:8.0f} mutations/s"
            )
        print(f"  raw protocol ({args.raw} mutations back to back, the server's capacity):")
        for name in ("room", "slow"):
            b = body[name]
            print(
                f"    {name:5} {b['raw_rate']:8.0f} mutations/s  receipt p50 "
                f"{b['raw_p50']:6.1f} ms  p99 {b['raw_p99']:7.1f} ms  last confirmed at "
                f"{b['raw_confirm_ms']:7.1f} ms"
            )
        print(
            f"  ratio room/slow: client receipt p50 {room['p50'] / slow['p50']:.2f}x, "
            f"p99 {room['p99'] / slow['p99']:.2f}x; "
            f"raw rate {room['raw_rate'] / slow['raw_rate']:.1f}x"
        )
        print(
            f"  anchor: Replicache ~{ANCHOR_PUSHES} pushes/s per space: room raw "
            f"{room['raw_rate'] / ANCHOR_PUSHES:.0f}x; targets: >= {TARGET_RATE}/s per doc "
            f"({'met' if room['raw_rate'] >= TARGET_RATE else 'NOT met'}), client receipt p99 "
            f"< {TARGET_P99_MS} ms ({'met' if room['p99'] < TARGET_P99_MS else 'NOT met'})"
        )
        body["environment"] = environment(db.backend)
        write_results(args.json, "room_live.json", "room_live", db.backend, body)


if __name__ == "__main__":
    main()
