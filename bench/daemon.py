#!/usr/bin/env python
"""
The daemon control plane (issue 18) beside the Django-native routes, in one run.

    .venv/bin/python bench/daemon.py [--mutations 1000] [--leases 100]
        [--repeats 3] [--database-url URL]

One fresh database (a temporary SQLite file by default, or a dedicated
``rindle_bench_<pid>`` database next to the one a ``postgres://`` URL names),
migrated in this process. Requests go through the whole Django and DRF stack in
process (the test client: no network, no Daphne), so the figures compare the
routes, not the transports. The workloads:

- ``sql_txn``: ``POST /execute-sql-txn``, one client's mids in order, each one
  ``INSERT`` of a demo ``user`` row with the lmid upsert (the original's mutation
  path: its api-server renders the SQL);
- ``mutate``: ``POST /api/rindle/mutate``, the same insert by a registered mutator,
  one envelope a request;
- ``materialize_frame``: ``POST /materialize`` of the users AST, then a websocket
  (``channels.testing``, in process) subscribing its lease, timed to the first
  ``progress`` frame (hydrated);
- ``lease_frame``: ``POST /api/rindle/query`` of a named query over the same AST
  and the same subscribe, timed the same way;
- ``pinned_frame``: the same as ``materialize_frame`` with ``policy: {kind:
  "pinned"}`` (a re-assert of one pin each time): the view is kept warm between the
  sockets, where the others' last subscriber leaving tears it down.

Printed: mutations/s of the two write paths and their ratio; median and p90 ms to
the first frame of the three lease paths and their ratios.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    BenchError,
    django_database,
    environment,
    pct,
    rotated,
    write_results,
)

AST = {"table": "user", "orderBy": [["id", "asc"]], "limit": 50}
INSERT = 'INSERT INTO "user" (id, name) VALUES (?, ?)'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("--mutations", type=int, default=1000, help="mutations per write run")
    p.add_argument("--leases", type=int, default=100, help="leases per frame run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--database-url", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if min(args.mutations, args.leases, args.repeats) < 1:
        p.error("--mutations, --leases and --repeats must be >= 1")
    return args


class Bench:
    def __init__(self):
        from django.contrib.auth import get_user_model
        from rest_framework.test import APIClient

        from rindle_app import tokens
        from rindle_app.engine import get_engine, mutator
        from rindle_app.named import named_query

        def bench_daemon_user(tx, args, user):
            tx.insert("user", {"id": args["id"], "name": "bench"})

        mutator("benchDaemonUser")(bench_daemon_user)
        named_query("benchDaemonUsers")(lambda args, ctx: dict(AST))
        self.engine = get_engine()
        owner = get_user_model().objects.create_user(f"bench-{uuid.uuid4().hex[:6]}")
        self.daemon = self._client(APIClient, tokens.create(owner, ["daemon"])[0])
        self.app_token = tokens.create(owner, ["read", "mutate"])[0]
        self.app = self._client(APIClient, self.app_token)
        from project.asgi import application

        self.asgi = application

    @staticmethod
    def _client(cls, raw):
        client = cls()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
        return client

    @staticmethod
    def post(client, url, body):
        response = client.post(url, json.dumps(body), content_type="application/json")
        if response.status_code != 200:
            raise BenchError(f"{url}: {response.status_code} {response.content[:300]!r}")
        return response.json()

    def sql_txn(self, tag, n):
        t0 = time.perf_counter()
        for mid in range(1, n + 1):
            statement = {"sql": INSERT, "params": [f"{tag}-{mid}", "bench"]}
            body = {"clientID": tag, "mid": mid, "statements": [statement]}
            if self.post(self.daemon, "/execute-sql-txn", body)["applied"] is not True:
                raise BenchError(f"mid {mid} was not applied")
        return time.perf_counter() - t0

    def mutate(self, tag, n):
        t0 = time.perf_counter()
        for mid in range(1, n + 1):
            env = {"clientID": tag, "mid": mid, "name": "benchDaemonUser"}
            env["args"] = {"id": f"{tag}-{mid}"}
            if self.post(self.app, "/api/rindle/mutate", {"envelope": env})["accepted"] is not True:
                raise BenchError(f"mid {mid} was not accepted")
        return time.perf_counter() - t0

    def frames(self, lease_of, n, bearer=None):
        """
        Seconds from each lease request to its first ``progress`` frame; ``bearer``:
        the socket presents the token its lease was minted for (a ``/materialize``
        lease is minted for nobody, as the original's browser holds it).
        """
        from asgiref.sync import sync_to_async
        from channels.testing import WebsocketCommunicator

        async def one(query_id):
            t0 = time.perf_counter()
            token = await sync_to_async(lease_of, thread_sensitive=False)()
            headers = [(b"origin", b"http://localhost")]
            if bearer is not None:
                headers.append((b"authorization", f"Bearer {bearer}".encode()))
            ws = WebsocketCommunicator(self.asgi, "/ws/rindle/", headers=headers)
            connected, _ = await ws.connect()
            if not connected:
                raise BenchError("the websocket refused the handshake")
            frame = {"t": "subscribe", "queryId": query_id, "leaseToken": token}
            await ws.send_to(text_data=json.dumps({**frame, "mode": "normalized"}))
            while True:
                reply = json.loads(await ws.receive_from(timeout=10))
                if reply.get("t") == "queryError":
                    raise BenchError(f"the lease was refused: {reply}")
                if reply.get("t") == "progress":
                    break
            elapsed = time.perf_counter() - t0
            await ws.disconnect()
            return elapsed

        async def run():
            return [await one(i + 1) for i in range(n)]

        return asyncio.run(run())

    def materialize_lease(self):
        return self.post(self.daemon, "/materialize", {"ast": AST})["leaseToken"]

    def pinned_lease(self):
        body = {"ast": AST, "policy": {"kind": "pinned", "name": "bench"}}
        return self.post(self.daemon, "/materialize", body)["leaseToken"]

    def query_lease(self):
        return self.post(self.app, "/api/rindle/query", {"name": "benchDaemonUsers"})["leaseToken"]

    def run(self, key, n):
        tag = f"{key}-{uuid.uuid4().hex[:8]}"
        if key == "sql_txn":
            return self.sql_txn(tag, n)
        if key == "mutate":
            return self.mutate(tag, n)
        if key == "materialize_frame":
            return self.frames(self.materialize_lease, n)
        if key == "lease_frame":
            return self.frames(self.query_lease, n, bearer=self.app_token)
        if key == "pinned_frame":
            return self.frames(self.pinned_lease, n)
        raise BenchError(f"unknown workload {key}")


def main(argv=None):
    args = parse_args(argv)
    with django_database(args.database_url, quiet=True) as db:
        bench = Bench()
        writes = ["sql_txn", "mutate"]
        frames = ["materialize_frame", "lease_frame", "pinned_frame"]
        for key in writes:  # warm-up
            bench.run(key, min(50, args.mutations))
        for key in frames:
            bench.run(key, min(5, args.leases))
        seconds = {key: [] for key in writes}
        latencies = {key: [] for key in frames}
        for rep in range(args.repeats):
            for key in rotated(writes, rep):
                seconds[key].append(bench.run(key, args.mutations))
            for key in rotated(frames, rep):
                latencies[key].extend(bench.run(key, args.leases))
        results = {}
        for key in writes:
            results[key] = {
                "mutations_s": args.mutations / statistics.median(seconds[key]),
                "runs_s": seconds[key],
            }
        for key in frames:
            ms = [s * 1000 for s in latencies[key]]
            results[key] = {"median_ms": statistics.median(ms), "p90_ms": pct(ms, 0.9)}
        print(f"\ndaemon plane, {db.backend}, medians of {args.repeats} repeats")
        for key in writes:
            print(f"  {key:<18} {results[key]['mutations_s']:>10,.0f} mutations/s")
        ratio = results["sql_txn"]["mutations_s"] / results["mutate"]["mutations_s"]
        print(f"  /execute-sql-txn / /api/rindle/mutate = {ratio:.2f}")
        for key in frames:
            r = results[key]
            print(f"  {key:<18} {r['median_ms']:>8.2f} ms median {r['p90_ms']:>8.2f} ms p90")
        ratio = results["materialize_frame"]["median_ms"] / results["lease_frame"]["median_ms"]
        print(f"  /materialize / /api/rindle/query to the first frame = {ratio:.2f}")
        ratio = results["pinned_frame"]["median_ms"] / results["materialize_frame"]["median_ms"]
        print(f"  pinned / unpinned /materialize to the first frame = {ratio:.2f}")
        write_results(
            args.json,
            f"daemon-{db.backend}.json",
            "daemon",
            db.backend,
            {"config": vars(args), "environment": environment(db.backend), "results": results},
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
