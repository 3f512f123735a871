#!/usr/bin/env python
"""
Fan-out through real websockets (W3 of ``ivm-anchors.md`` §6): commit → client receipt.

    .venv/bin/python bench/ws.py [--quick] [--sizes 1,100,1000] [--rate 50] [--seconds 5]
        [--database-url postgres://user@host:5432/db]

One run, one fresh database (``DATABASE_URL``): a temporary SQLite file, or with
``--database-url postgres://...`` a dedicated ``rindle_bench_ws_<pid>`` database created
on that server; migrated and seeded with the demo's issue tracker in this process,
deleted (dropped) afterwards. Daphne serves it from a subprocess; the websocket
clients live in a second subprocess (bench/ws_clients.py, asyncio). Every client
subscribes the SAME query, the demo's ``issuesPage {limit: 50}`` (50 newest issues
with owner, tags and comment count), so the server maintains one shared query and fans
each commit out to N connections.

For each N this process commits single-row writes to the database at a steady rate
(``--rate``, capped so that rate x N <= ``--max-msgs``; the multi-process path: on
SQLite the server finds them by polling its outbox, on PostgreSQL through LISTEN/NOTIFY)
and records each commit's time and cv.
Variants, in a rotated order per N and repeat:

- **rindle**: N subscribers of ``/ws/rindle/``; latency = receipt of the first
  ``nbatch`` whose cv covers the commit − the commit's time, per (connection, commit).
- **group_send**: N connections of a bench-only consumer in the same server, fed by
  Channels ``group_send`` of one pre-encoded frame pair per commit (published over a
  websocket by this process); latency = receipt − publish time.
- **slow**: rindle with one extra connection that stops reading its socket.

Then **re-run**: after each of a few commits, this process runs the query's SQL N
times (``rindle_app.ivm.sql.run_query``, the Django cursor) and JSON-encodes each
result: the time a naive server needs before its last subscriber can be sent.

The correctness gate: every rindle client's replica (seq 0 plus every increment,
folded by primary key) equals the reference evaluator's rows over the database at the
end of the phase, and every client saw seq 0..k without a gap (a client told ``shed``
subscribes again, and its new epoch restarts at seq 0). A failure prints ``!!!`` and
the exit status is 3. Missed targets print FAIL and exit 0.
See bench/README.md ("bench/ws.py").
"""

import argparse
import functools
import http.client
import json
import os
import platform
import random
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
HOST = "127.0.0.1"
RINDLE_PATH = "/ws/rindle/"
GROUP_PATH = "/ws/bench-group/"
GROUP = "rindle-bench"
QUERY_NAME = "issuesPage"
QUERY_ARGS = {"limit": 50}
WINDOW = QUERY_ARGS["limit"]
TARGET_P99_S = 0.100  # rindle p99 at the largest size (1,000 subscribers)
TARGET_SLOW = 2.0  # fast clients' p99 with a slow client / without
STALL_S = 15.0  # after the last commit, stop waiting when nothing arrived for this long
WAIT_MAX_S = 300.0
VARIANTS = ("rindle", "group_send", "slow")
# The write mix: every write changes the window of issuesPage.
WRITES = (
    ("insert_issue", 0.35),  # a new newest issue enters; the 50th leaves
    ("update_issue", 0.30),  # title/status/updatedAt of an issue in the window
    ("add_comment", 0.15),  # the comment count of an issue in the window
    ("add_tag", 0.10),  # a tag of an issue in the window
    ("delete_issue", 0.10),  # an issue in the window; the 51st refills it
)


class BenchError(RuntimeError):
    pass


# --- the bench-only ASGI application (imported by the Daphne process) -----------------


def __getattr__(name):
    # ``daphne bench.ws:application`` looks this attribute up in the server process
    # only, after importing this module; nothing Django runs at import time.
    if name == "application":
        return _bench_application()
    raise AttributeError(name)


@functools.cache
def _bench_application():
    """
    The project's ASGI application unchanged, plus ``/ws/bench-group/``: a consumer
    that joins one group, or, with ``?role=pub``, ``group_send``s each frame list it
    receives to that group. It exists for the group_send comparison only.
    """
    from channels.generic.websocket import AsyncWebsocketConsumer
    from django.conf import settings

    from project.asgi import application as project_application
    from rindle_app.conf import rindle_settings

    # A thousand anonymous subscribers share one loopback address: the bench measures
    # fan-out, not admission, so the per-principal socket cap is lifted here.
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "WS_MAX_SOCKETS_PER_PRINCIPAL": None}
    rindle_settings.reload()

    class GroupFanOut(AsyncWebsocketConsumer):
        async def connect(self):
            self.publisher = b"role=pub" in self.scope.get("query_string", b"")
            await self.accept()
            if not self.publisher:
                await self.channel_layer.group_add(GROUP, self.channel_name)
                await self.send(text_data='{"t":"joined"}')

        async def disconnect(self, code):
            if not self.publisher:
                await self.channel_layer.group_discard(GROUP, self.channel_name)

        async def receive(self, text_data=None, bytes_data=None):
            if self.publisher and text_data:
                frames = json.loads(text_data)
                await self.channel_layer.group_send(
                    GROUP, {"type": "bench.frames", "frames": frames}
                )

        async def bench_frames(self, event):
            for frame in event["frames"]:
                await self.send(text_data=frame)

    group_application = GroupFanOut.as_asgi()

    async def application(scope, receive, send):
        if scope["type"] == "websocket" and scope["path"] == GROUP_PATH:
            return await group_application(scope, receive, send)
        return await project_application(scope, receive, send)

    return application


# --- command line ---------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="W3: websocket fan-out, commit to client receipt.")
    p.add_argument("--quick", action="store_true", help="2 s per variant, slow test at 100 only")
    p.add_argument("--sizes", default="1,100,1000", help="subscriber counts (1,100,1000)")
    p.add_argument("--rate", type=float, default=50.0, help="commits per second (50)")
    p.add_argument(
        "--max-msgs",
        type=float,
        default=2500.0,
        help="cap on the offered load, rate x N nbatch messages per second (2500): "
        "N=100 runs at 25 commits/s, N=1000 at 2.5",
    )
    p.add_argument("--seconds", type=float, default=None, help="seconds per variant (5; quick 2)")
    p.add_argument(
        "--slow-sizes",
        default=None,
        help="sizes that also run the slow-client variant (100,1000; quick 100)",
    )
    p.add_argument(
        "--rerun-queries",
        type=int,
        default=None,
        help="re-run baseline budget: queries per size (4000; quick 1500), at least 3 commits",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each variant per size, in a rotated order; figures are medians (1)",
    )
    p.add_argument("--issues", type=int, default=2000, help="seeded demo issues (2000)")
    p.add_argument("--seed", type=int, default=20261130, help="seed of the write script")
    p.add_argument(
        "--profile-server",
        action="store_true",
        help="run Daphne under cProfile (its event loop thread); writes "
        "bench/results/profile-ws-daphne.pstats and prints the top functions",
    )
    p.add_argument(
        "--servers",
        type=int,
        default=1,
        help="Daphne processes sharing the port (SO_REUSEPORT; 1). Above 1 the group_send "
        "variant is skipped: the in-memory channel layer does not cross processes",
    )
    p.add_argument(
        "--database-url",
        default=None,
        help="postgres://user@host:port/db: run on a fresh database rindle_bench_ws_<pid> "
        "created on that server (and dropped after); default: a temporary SQLite file",
    )
    p.add_argument("--json", default=None, help="results file (bench/results/ws-<backend>.json)")
    args = p.parse_args(argv)
    try:
        args.size_list = [int(s) for s in args.sizes.split(",") if s.strip()]
        slow = args.slow_sizes or ("100" if args.quick else "100,1000")
        args.slow_list = [int(s) for s in slow.split(",") if s.strip()]
    except ValueError:
        p.error("--sizes and --slow-sizes take comma-separated integers")
    if not args.size_list or min(args.size_list) < 1:
        p.error("--sizes needs positive integers")
    if args.servers < 1 or (args.servers > 1 and args.profile_server):
        p.error("--servers needs a positive count, and --profile-server one server")
    if args.seconds is None:
        args.seconds = 2.0 if args.quick else 5.0
    if args.rerun_queries is None:
        args.rerun_queries = 1500 if args.quick else 4000
    if args.rate <= 0 or args.seconds <= 0 or args.max_msgs <= 0 or args.repeats < 1:
        p.error("--rate, --seconds and --max-msgs must be positive, --repeats >= 1")
    if args.database_url and urlsplit(args.database_url).scheme not in (
        "postgres",
        "postgresql",
    ):
        p.error("--database-url takes a postgres:// URL (the default is a SQLite file)")
    return args


# --- the database -----------------------------------------------------------------------


class Database:
    """
    The run's fresh database: a SQLite file in ``tmpdir`` (the default), or, given a
    ``postgres://`` URL, a dedicated database ``rindle_bench_ws_<pid>`` created on that
    server through a connection to the URL's own database. ``url`` is DATABASE_URL.
    """

    def __init__(self, given, tmpdir):
        self.given = given
        self.backend = "postgresql" if given else "sqlite"
        self.name = None
        self.path = None
        self.created = False  # a PostgreSQL database that drop() must remove
        if given:
            parts = urlsplit(given)
            self.name = f"rindle_bench_ws_{os.getpid()}"
            self.url = urlunsplit((parts.scheme, parts.netloc, "/" + self.name, parts.query, ""))
        else:
            self.path = str(Path(tmpdir) / "bench.sqlite3")
            self.url = f"sqlite:///{self.path}"

    @property
    def label(self):
        return "SQLite" if self.backend == "sqlite" else "PostgreSQL"

    def create(self):
        if self.backend == "postgresql":
            import psycopg

            with psycopg.connect(self.given, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.name}"')
                admin.execute(f'CREATE DATABASE "{self.name}"')
            self.created = True

    def drop(self):
        """Drop the PostgreSQL database (the SQLite file goes with the temporary dir)."""
        if self.created:
            import psycopg

            with psycopg.connect(self.given, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            self.created = False

    def connect(self):
        """A new driver connection: stdlib sqlite3, or psycopg with autocommit off."""
        if self.backend == "sqlite":
            return sqlite3.connect(self.path)
        import psycopg

        return psycopg.connect(self.url, autocommit=False)

    def read(self, sql):
        """The rows of one SELECT as dicts, on a connection of its own."""
        conn = self.connect()
        try:
            cursor = conn.execute(sql)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]
        finally:
            conn.close()

    def version(self):
        if self.backend == "sqlite":
            return {"sqlite": sqlite3.sqlite_version}
        import psycopg

        conn = self.connect()
        try:
            server = conn.execute("SHOW server_version").fetchone()[0]
        finally:
            conn.close()
        return {"postgresql": server, "psycopg": psycopg.__version__}


# --- processes --------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def proc_cpu(pid):
    """User + system CPU seconds of process ``pid`` (Linux /proc), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def proc_rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Server:
    """
    Daphne serving ``bench.ws:application`` (the project's app plus the group route).
    With ``servers`` > 1, that many Daphne processes, each on its own listening socket
    of the same port (``SO_REUSEPORT``, handed over with ``--fd``): the kernel spreads
    the connections over them, as a deployment with one process per core would.
    """

    def __init__(self, env, tmpdir, profile=None, servers=1):
        self.log_path = Path(tmpdir) / "daphne.log"
        self.log = open(self.log_path, "w")
        daphne = str(ROOT / ".venv" / "bin" / "daphne")
        # cProfile sees the event loop thread only (Daphne, Channels, the consumers),
        # not the hub thread.
        prefix = [sys.executable, "-m", "cProfile", "-o", str(profile)] if profile else []
        tail = ["--access-log", os.devnull, "bench.ws:application"]
        self.procs = []
        if servers == 1:
            self.port = free_port()
            cmd = [*prefix, daphne, "-b", HOST, "-p", str(self.port), *tail]
            self.procs.append(
                subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
            )
        else:
            self.port = 0
            for _ in range(servers):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                sock.bind((HOST, self.port))
                self.port = sock.getsockname()[1]
                sock.listen(1024)
                fd = sock.fileno()
                cmd = [daphne, "--fd", str(fd), *tail]
                self.procs.append(
                    subprocess.Popen(
                        cmd,
                        cwd=ROOT,
                        env=env,
                        stdout=self.log,
                        stderr=subprocess.STDOUT,
                        pass_fds=(fd,),
                    )
                )
                sock.close()  # the child holds it now
        self.proc = self.procs[0]
        self.pids = [proc.pid for proc in self.procs]
        self.pid = self.pids[0]

    def cpu(self):
        """CPU seconds of every server process."""
        values = [proc_cpu(pid) for pid in self.pids]
        return None if None in values else sum(values)

    def rss_kib(self):
        values = [proc_rss_kib(pid) for pid in self.pids]
        return None if None in values else sum(values)

    def wait_ready(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise BenchError(f"daphne exited with {proc.returncode}:\n{self.tail()}")
            self.log.flush()
            listening = self.log_path.read_text(errors="replace").count("Listening on")
            try:
                conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                if listening >= len(self.procs):
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise BenchError(f"daphne did not answer in {timeout} s:\n{self.tail()}")

    def tail(self, chars=4000):
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def log_counts(self):
        text = self.log_path.read_text(errors="replace")
        marker = "shedding slow connection "
        # The project logs each rindle record twice (its own handler, then the root's),
        # so count the connections named, not the lines.
        shed = {line.rsplit(marker, 1)[1] for line in text.splitlines() if marker in line}
        return {
            "lines": text.count("\n"),
            "tracebacks": text.count("Traceback"),
            "shed_connections": len(shed),
            "errors": sum(1 for line in text.splitlines() if "ERROR" in line),
        }

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()


class Clients:
    """The client process (bench/ws_clients.py), driven by JSON lines."""

    def __init__(self, env):
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "ws_clients.py")],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.pid = self.proc.pid

    def call(self, cmd, **fields):
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise BenchError(f"the client process exited ({self.proc.poll()}) during {cmd!r}")
        reply = json.loads(line)
        if not reply.get("ok"):
            raise BenchError(f"client process, {cmd}: {reply}")
        return reply

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
                self.proc.wait()


# --- writes -----------------------------------------------------------------------------


class Writer:
    """
    Single-row commits, each changing the window of issuesPage: on SQLite through the
    stdlib driver (WAL, the engine's synchronous level), on PostgreSQL through psycopg
    (autocommit off, one transaction per write). The cv of a commit is the outbox
    high-water read inside its transaction, before COMMIT.
    """

    def __init__(self, db, seed, outbox, notify=None):
        self.pg = db.backend == "postgresql"
        self.notify = notify  # PostgreSQL: a channel each commit also notifies (a probe's)
        if self.pg:
            self.conn = db.connect()  # psycopg, autocommit off
        else:
            self.conn = sqlite3.connect(db.path, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute("PRAGMA busy_timeout=20000")
        self.rng = random.Random(seed)
        self.outbox = outbox
        self.created = self.conn.execute('SELECT MAX("createdAt") FROM issue').fetchone()[0] or 0
        self.users = [
            r[0] for r in self.conn.execute("""SELECT id FROM "user" WHERE id != 'unassigned'""")
        ]
        if self.pg:
            self.conn.rollback()  # end the read transaction: nothing is open between writes
        self.serial = 0
        self.kinds = [k for k, _ in WRITES]
        self.weights = [w for _, w in WRITES]
        self.counts = dict.fromkeys(self.kinds, 0)

    def window(self):
        return [
            r[0]
            for r in self.conn.execute(
                f'SELECT id FROM issue ORDER BY "createdAt" DESC, id ASC LIMIT {WINDOW}'
            )
        ]

    def statement(self):
        rng = self.rng
        self.serial += 1
        key = f"w{self.serial}"
        kind = rng.choices(self.kinds, self.weights)[0]
        self.counts[kind] += 1
        self.created += 1000.0
        now = self.created
        if kind == "insert_issue":
            return (
                'INSERT INTO issue (id, title, status, priority, "ownerId", "createdAt", '
                '"updatedAt") VALUES (?, ?, ?, ?, ?, ?, ?)',
                (key, f"Bench issue {key}", "todo", "medium", rng.choice(self.users), now, now),
            )
        target = rng.choice(self.window())
        if kind == "update_issue":
            status = rng.choice(["backlog", "todo", "in-progress", "review", "done"])
            return (
                'UPDATE issue SET title = ?, status = ?, "updatedAt" = ? WHERE id = ?',
                (f"Edited {key}", status, now, target),
            )
        if kind == "add_comment":
            return (
                'INSERT INTO comment (id, "issueId", "authorId", body, "createdAt") '
                "VALUES (?, ?, ?, ?, ?)",
                (key, target, rng.choice(self.users), f"comment {key}", now),
            )
        if kind == "add_tag":
            return ('INSERT INTO tag (id, "issueId", name) VALUES (?, ?, ?)', (key, target, key))
        return ("DELETE FROM issue WHERE id = ?", (target,))

    def commit(self):
        """One commit; returns (cv, commit time). The time is taken when COMMIT returns."""
        if self.pg:
            return self.commit_pg()
        sql, params = self.statement()
        execute = self.conn.execute
        execute("BEGIN IMMEDIATE")
        execute(sql, params)
        cv = execute(f"SELECT MAX(seq) FROM {self.outbox}").fetchone()[0]
        execute("COMMIT")
        return cv, time.monotonic()

    def commit_pg(self):
        # One transaction: psycopg (autocommit off) opens it at the window read inside
        # statement(). MAX(seq) is this transaction's own highest seq only because this
        # connection is the database's only writer during the run (the server and the
        # clients only read); with concurrent writers, another transaction's seq, not yet
        # committed or committed later, could be higher.
        sql, params = self.statement()
        execute = self.conn.execute
        try:
            execute(sql.replace("?", "%s"), params)
            cv = execute(f"SELECT MAX(seq) FROM {self.outbox}").fetchone()[0]
            if self.notify is not None:
                execute("SELECT pg_notify(%s, '')", [self.notify])
            self.conn.commit()
        except BaseException:
            self.conn.rollback()
            raise
        return cv, time.monotonic()

    def close(self):
        self.conn.close()


def steady(rate, count, action):
    """``action()`` ``count`` times at ``rate`` per second (open loop: a late tick runs at
    once and the schedule does not slip); returns the results."""
    period = 1.0 / rate
    start = time.monotonic() + 0.02
    out = []
    for i in range(count):
        delay = start + i * period - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        out.append(action())
    return out


# --- the reference: what a replica must hold --------------------------------------------


class IndexedRows:
    """Rows by table for the reference evaluator, children found through hash indexes."""

    def __init__(self, rows):
        self.rows = rows
        self.indexes = {}

    def children(self, related, parent):
        keys = tuple(parent.get(f) for f in related.parent_fields)
        if any(k is None for k in keys):
            return []
        table, fields = related.subquery.table, tuple(related.child_fields)
        index = self.indexes.get((table, fields))
        if index is None:
            index = self.indexes[(table, fields)] = {}
            for row in self.rows.get(table, ()):
                index.setdefault(tuple(row.get(f) for f in fields), []).append(row)
        return index.get(keys, [])


def expected_view(db, query, schema):
    """
    The rows a replica of ``query`` must hold now: the reference evaluator (evaluate.py)
    over every row of the database, each rendered row as ``[table, cells]`` in the
    column order of the normalized hello; also the root ids by plain SQL.
    """
    from rindle_app.ivm.evaluate import Evaluator
    from rindle_app.ivm.normalized import normalized_table_schemas

    columns = {t["name"]: t["columns"] for t in normalized_table_schemas(query, schema)}
    # A connection of the bench's own (the run's database, either backend), not the
    # server's: each read is one statement, so it sees every committed write.
    rows = {
        table: db.read(f'SELECT * FROM "{table}"') for table in ("issue", "user", "tag", "comment")
    }
    root_ids = [
        r["id"]
        for r in db.read(f'SELECT id FROM issue ORDER BY "createdAt" DESC, id ASC LIMIT {WINDOW}')
    ]
    evaluator = Evaluator(IndexedRows(rows), schema)
    seen = {}
    numeric = db.backend == "postgresql"

    def visit(table, row, _key):
        cells = [row.get(c) for c in columns[table]]
        seen[canonical(table, cells, numeric)] = None

    evaluator.visit = visit
    evaluator.level(query, rows[query.table])
    return set(seen), root_ids


def canonical(table, cells, numeric=False):
    """
    A rendered row as text. ``numeric`` (PostgreSQL) compares numbers as JSON numbers:
    an integral float is written as an int. There the capture trigger's ``to_jsonb``
    prints a double precision 1711266665000 as ``1711266665000`` in increments, while
    seq 0 and the reference (psycopg floats) give ``1711266665000.0``: the same JSON
    number, which the gate must not count as a difference.
    """
    if numeric:
        cells = [int(c) if isinstance(c, float) and c.is_integer() else c for c in cells]
    return json.dumps([table, cells], separators=(",", ":"))


# --- latency ----------------------------------------------------------------------------


def percentile(sorted_values, q):
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(round(q * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def distribution(values):
    values = sorted(values)
    if not values:
        return {"count": 0, "p50": None, "p99": None, "max": None, "mean": None}
    return {
        "count": len(values),
        "p50": percentile(values, 0.50),
        "p99": percentile(values, 0.99),
        "max": values[-1],
        "mean": statistics.fmean(values),
    }


def latencies(commits, receipts):
    """
    Per commit (cv, t): the first receipt (epoch, seq, cv, t) whose cv covers it, minus
    t. Returns (latencies, commits never covered). Commits coalesced into one batch are
    each covered by that batch; after a shed, the new epoch's seq 0 covers every commit
    it includes.
    """
    out, missing, j = [], 0, 0
    for cv, t in commits:
        while j < len(receipts) and receipts[j][2] < cv:
            j += 1
        if j == len(receipts):
            missing += 1
            continue
        out.append(receipts[j][3] - t)
    return out, missing


# --- the benchmark ----------------------------------------------------------------------


class Bench:
    def __init__(self, args, db, tmpdir, server, clients, query, schema):
        from rindle_app.engine.capture import OUTBOX

        self.args = args
        self.db = db
        self.tmpdir = Path(tmpdir)
        self.server = server
        self.clients = clients
        self.query = query
        self.schema = schema
        self.writer = Writer(db, args.seed, OUTBOX)
        self.phase_no = 0
        self.failures = []
        self.group_frame_bytes = None

    def fail(self, message):
        self.failures.append(message)
        print(f"!!! {message}", flush=True)

    # --- one phase ------------------------------------------------------------------

    def phase(self, variant, n):
        """Open n connections, drive the commits, collect: the variant's figures."""
        from bench.common import machine_busy

        self.phase_no += 1
        kind = "group" if variant == "group_send" else "rindle"
        subscribe = {"queryId": 1, "name": QUERY_NAME, "args": QUERY_ARGS, "mode": "normalized"}
        opened = self.clients.call(
            "open",
            kind=kind,
            n=n,
            slow=variant == "slow",
            host=HOST,
            port=self.server.port,
            path=GROUP_PATH if kind == "group" else RINDLE_PATH,
            subscribe=subscribe,
        )
        if opened["failures"]:
            raise BenchError(f"{variant} N={n}: connections failed: {opened['failures']}")
        publisher = None
        rate = self.rate_for(n)
        if kind == "group":
            from bench.ws_clients import BlockingWebSocket

            publisher = BlockingWebSocket(HOST, self.server.port, GROUP_PATH + "?role=pub")
            messages = self.group_messages(self.commits_for(n))
            sent = iter(messages)

            def action():
                cv, text = next(sent)
                publisher.send_text(text)
                return cv, time.monotonic()

        else:
            action = self.writer.commit
        time.sleep(0.3)  # let the subscribe traffic settle
        rss_before = self.server.rss_kib()
        cpu0 = (self.server.cpu(), opened["cpu"], os.times(), machine_busy())
        started = time.monotonic()
        commits = steady(rate, self.commits_for(n), action)
        commit_span = time.monotonic() - started
        rss_end = self.server.rss_kib()
        last_cv = commits[-1][0]
        waited = self.clients.call("wait", cv=last_cv, stall=STALL_S, timeout=WAIT_MAX_S)
        cpu1 = (self.server.cpu(), waited["cpu"], os.times(), machine_busy())
        path = str(self.tmpdir / f"phase-{self.phase_no}.json")
        self.clients.call("collect", path=path, drain=3.0, cv=last_cv)
        rss_drained = self.server.rss_kib()
        data = json.loads(Path(path).read_text())
        expected = None
        if kind == "rindle":
            expected = expected_view(self.db, self.query, self.schema)
        self.clients.call("close")
        if publisher is not None:
            publisher.close()
        result = self.analyze(variant, n, commits, data, expected)
        wall = cpu1[3][1] - cpu0[3][1] if cpu0[3] and cpu1[3] else None
        own = (cpu1[2].user + cpu1[2].system) - (cpu0[2].user + cpu0[2].system)
        server_cpu = cpu1[0] - cpu0[0] if cpu0[0] is not None and cpu1[0] is not None else None
        client_cpu = cpu1[1] - cpu0[1]
        result.update(
            {
                "rate": rate,
                "last_cv": last_cv,
                "open_seconds": opened["seconds"],
                "commit_span_s": commit_span,
                "caught_up_after_s": waited["seconds"],
                "behind_after_wait": waited["behind"],
                "rss_kib": {"before": rss_before, "end": rss_end, "after_drain": rss_drained},
                "cpu_s": {"server": server_cpu, "clients": client_cpu, "bench": own},
                "wall_s": wall,
            }
        )
        if wall and cpu0[3] and cpu1[3]:
            busy = cpu1[3][0] - cpu0[3][0]
            result["other_cpus_busy"] = round(
                max(0.0, busy - (server_cpu or 0) - client_cpu - own) / wall, 2
            )
        if waited["behind"]:
            self.fail(
                f"{variant} N={n}: {waited['behind']} connection(s) had not received cv "
                f"{last_cv} {waited['seconds']:.0f} s after the last commit (nothing arrived "
                f"for {STALL_S:g} s, or {WAIT_MAX_S:g} s passed)"
            )
        return result

    def rate_for(self, n):
        """Commits per second at size n: --rate, capped so that rate x n <= --max-msgs."""
        return min(self.args.rate, self.args.max_msgs / n)

    def commits_for(self, n):
        return max(1, int(round(self.rate_for(n) * self.args.seconds)))

    def group_messages(self, count):
        """Pre-encoded (cv, publisher text) per commit: an nbatch and a progress, shaped
        like rindle's frames for an insert that enters the window (add one issue, remove
        another)."""
        a, b = self.db.read(
            'SELECT id, title, status, priority, "ownerId", "createdAt", "updatedAt" '
            'FROM issue ORDER BY "createdAt" DESC LIMIT 2'
        )
        ops = json.dumps(
            [
                {"table": "issue", "op": "add", "row": list(a.values())},
                {"table": "issue", "op": "remove", "row": list(b.values())},
            ],
            separators=(",", ":"),
        )
        out = []
        for cv in range(1, count + 1):
            batch = (
                f'{{"t":"nbatch","queryId":1,"batch":{{"epoch":1,"seq":{cv},'
                f'"normalizedFp":"0000000000000000","ops":{ops},"cv":{cv}}}}}'
            )
            progress = f'{{"t":"progress","frame":{{"cvMin":{cv}}}}}'
            out.append((cv, json.dumps([batch, progress])))
        self.group_frame_bytes = len(out[0][1])
        return out

    def analyze(self, variant, n, commits, data, expected):
        conns = data["connections"]
        if len(conns) != n:
            self.fail(f"{variant} N={n}: {len(conns)} connections reported, expected {n}")
        samples, missing, received = [], 0, 0
        lasts = []
        per_commit = {}  # cv -> latencies of the connections that got it
        gaps = errors = shed = sheds = 0
        for c in conns:
            # everything after the first seq 0, which came before the phase
            receipts = [r for r in c["receipts"] if r[0] > 1 or r[1] > 0]
            lat, miss = latencies(commits, receipts)
            samples.extend(lat)
            if not miss:
                for (cv, _t), value in zip(commits, lat):
                    per_commit.setdefault(cv, []).append(value)
            missing += miss
            received += len(receipts)
            if receipts:
                lasts.append(receipts[-1][3])
            gaps += bool(c["seq_gap"] or c["cv_backwards"])
            errors += bool(c["errors"] or c["other"])
            shed += bool(c["sheds"])
            sheds += c["sheds"]
        first_commit = commits[0][1]
        span = (max(lasts) - first_commit) if lasts else None
        frames = sum(c["frames"] for c in conns)
        volume = sum(c["bytes"] for c in conns)
        result = {
            "variant": variant,
            "n": n,
            "commits": len(commits),
            "latency_s": distribution(samples),
            # diagnostic: each commit's fastest, median and slowest receipt (s)
            "per_commit_s": [
                [cv, min(v), sorted(v)[len(v) // 2], max(v)] for cv, v in sorted(per_commit.items())
            ],
            "missing": missing,
            "nbatch_received": received,
            "nbatch_per_s": received / span if span else None,
            "bytes_per_frame": volume / frames if frames else None,
            "connections_with_gaps": gaps,
            "connections_with_errors": errors,
            "connections_shed": shed,
            "sheds": sheds,
        }
        label = f"{variant} N={n}"
        if missing:
            self.fail(f"{label}: {missing} (connection, commit) pairs never delivered")
        if gaps:
            self.fail(f"{label}: {gaps} connection(s) saw a seq gap or a cv going back")
        if errors:
            sample = next(c for c in conns if c["errors"] or c["other"])
            self.fail(f"{label}: {errors} connection(s) got error frames, e.g. {sample}")
        if expected is not None:
            self.gate(label, data, expected, result)
        if data.get("slow"):
            s = data["slow"]
            result["slow_client"] = {
                "shed": s["shed"],
                "errors": s["errors"],
                "cv_when_paused": s["cv_when_paused"],
                "nbatch_received": sum(1 for r in s["receipts"] if r[1] > 0),
                "last_cv": s["receipts"][-1][2] if s["receipts"] else None,
                "seq_gap": s["seq_gap"],
                "fold_problems": s.get("fold_problems", [])[:3],
            }
            if s["seq_gap"] and not s["shed"]:
                self.fail(f"{label}: the slow client saw a seq gap without being shed")
        return result

    def gate(self, label, data, expected, result):
        rows, root_ids = expected
        views = data["views"]
        wrong = 0
        numeric = self.db.backend == "postgresql"
        for view in views:
            held = {canonical(t, cells, numeric) for t, cells in view["rows"]}
            issue_ids = {cells[0] for t, cells in view["rows"] if t == "issue"}
            ok = held == rows and issue_ids == set(root_ids)
            if not ok:
                wrong += len(view["holders"])
                extra, lacking = sorted(held - rows)[:3], sorted(rows - held)[:3]
                self.fail(
                    f"{label}: {len(view['holders'])} replica(s) differ from the database "
                    f"({len(held)} rows vs {len(rows)}); extra {extra}, missing {lacking}"
                )
        problems = [p for c in data["connections"] for p in c.get("fold_problems", [])]
        if problems:
            self.fail(f"{label}: folding the ops failed: {problems[:3]}")
        result["gate"] = {
            "replicas_checked": sum(len(v["holders"]) for v in views),
            "replicas_wrong": wrong,
            "rows_expected": len(rows),
            "distinct_replicas": len(views),
        }

    # --- the re-run baseline ---------------------------------------------------------

    def rerun(self, n):
        """After each of a few commits, the query's SQL n times and a JSON encode of each
        result: commit → the last subscriber's result ready, per commit."""
        from django.db import connection

        from rindle_app.ivm.sql import run_query

        commits = max(3, min(self.commits_for(n), self.args.rerun_queries // n))
        times, query_s = [], []
        dumps = json.dumps
        for _ in range(commits):
            _cv, t = self.writer.commit()
            for _ in range(n):
                q0 = time.monotonic()
                dumps(run_query(self.query, connection, self.schema), separators=(",", ":"))
                query_s.append(time.monotonic() - q0)
            times.append(time.monotonic() - t)
        return {
            "variant": "rerun",
            "n": n,
            "commits": commits,
            "ready_s": distribution(times),
            "query_s": distribution(query_s),
        }


# --- reporting --------------------------------------------------------------------------


def environment(db):
    from django import get_version

    env = {
        "python": platform.python_version(),
        "django": get_version(),
        **db.version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    try:
        import daphne

        env["daphne"] = daphne.__version__
    except (ImportError, AttributeError):
        pass
    from bench.common import git_state

    env.update(git_state())
    try:
        env["loadavg_start"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    return env


def ms(value):
    return "-" if value is None else f"{value * 1000:,.1f}"


def ratio_text(a, b):
    if a is None or b is None or b <= 0:
        return "-", None
    r = a / b
    return f"{r:.2f}", r


def report(args, db, env, results, reruns, server_log, elapsed):
    print()
    print(
        f"W3 websocket fan-out on {db.label}: query {QUERY_NAME} {json.dumps(QUERY_ARGS)} "
        f"(one shared query); {args.seconds:g} s of commits per variant at {args.rate:g}/s, "
        f"capped to {args.max_msgs:,.0f} / N; sizes {args.size_list}"
    )
    print(
        "environment: "
        + ", ".join(f"{k}={v}" for k, v in env.items() if k not in ("platform", "loadavg_start"))
    )
    print()
    header = (
        f"  {'variant':<11}{'N':>6}{'rate':>6}{'commits':>8}{'p50 ms':>9}{'p99 ms':>10}"
        f"{'max ms':>10}{'msgs/s':>8}{'drain s':>8}{'shed':>6}{'B/frm':>6}{'srv':>6}"
        f"{'cli':>6}{'other':>6}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    by_key = {}
    for r in results:
        by_key.setdefault((r["variant"], r["n"]), []).append(r)
        lat = r["latency_s"]
        wall = r.get("wall_s") or 0
        cpu = r["cpu_s"]
        srv = f"{cpu['server'] / wall:.2f}" if wall and cpu["server"] is not None else "-"
        cli = f"{cpu['clients'] / wall:.2f}" if wall else "-"
        rate = f"{r['nbatch_per_s']:,.0f}" if r["nbatch_per_s"] else "-"
        size = f"{r['bytes_per_frame']:,.0f}" if r["bytes_per_frame"] else "-"
        other = r.get("other_cpus_busy")
        print(
            f"  {r['variant']:<11}{r['n']:>6}{r['rate']:>6g}{r['commits']:>8}{ms(lat['p50']):>9}"
            f"{ms(lat['p99']):>10}{ms(lat['max']):>10}{rate:>8}"
            f"{r['caught_up_after_s']:>8.1f}{r['connections_shed']:>6}{size:>6}{srv:>6}"
            f"{cli:>6}{'-' if other is None else other:>6}"
        )
    print(
        "  latency: commit (group_send: publish) → receipt, per connection and commit.\n"
        "  msgs/s: nbatch frames delivered per second (each is followed by a progress frame).\n"
        "  drain s: last commit → every client holds it. shed: fast connections told 'shed'\n"
        "  (they re-subscribe). B/frm: bytes per increment frame. srv, cli, other: cores busy\n"
        "  in the server, the client process and other processes during the phase."
    )
    for r in results:
        offered = r["rate"] * r["n"]
        if r["caught_up_after_s"] > 1.0 or (r["nbatch_per_s"] or 0) < 0.8 * offered:
            print(
                f"  NOTE {r['variant']} N={r['n']}: the server fell behind: "
                f"{r['nbatch_per_s'] or 0:,.0f} of {offered:,.0f} offered msgs/s delivered; "
                f"clients caught up {r['caught_up_after_s']:.1f} s after the last commit"
            )
    print()
    print(f"  {'re-run N×':<11}{'N':>6}{'commits':>9}{'p50 ms':>9}{'p99 ms':>9}{'1 query':>10}")
    for r in reruns:
        print(
            f"  {'re-run':<11}{r['n']:>6}{r['commits']:>9}{ms(r['ready_s']['p50']):>9}"
            f"{ms(r['ready_s']['p99']):>9}{ms(r['query_s']['p50']):>10}"
        )
    print(
        "  (commit → the N-th re-run result encoded, in this process; 1 query: p50 of one "
        "run_query + json.dumps)"
    )

    def pick(variant, n, field="p99"):
        runs = by_key.get((variant, n))
        if not runs:
            return None
        values = [r["latency_s"][field] for r in runs if r["latency_s"][field] is not None]
        return statistics.median(values) if values else None

    print()
    print("ratios")
    summary = {"ratios": {}, "targets": {}}
    reruns_by_n = {r["n"]: r for r in reruns}
    for n in args.size_list:
        text, value = ratio_text(pick("rindle", n), pick("group_send", n))
        print(f"  N={n:<6} rindle p99 / group_send p99: {text}")
        summary["ratios"][f"rindle_p99_over_group_send_p99_n{n}"] = value
        rr = reruns_by_n.get(n)
        if rr:
            text, value = ratio_text(pick("rindle", n, "p50"), rr["ready_s"]["p50"])
            print(f"  N={n:<6} rindle p50 / re-run p50:     {text}")
            summary["ratios"][f"rindle_p50_over_rerun_p50_n{n}"] = value
            text, value = ratio_text(pick("rindle", n), rr["ready_s"]["p99"])
            print(f"  N={n:<6} rindle p99 / re-run p99:     {text}")
            summary["ratios"][f"rindle_p99_over_rerun_p99_n{n}"] = value
    print(
        "  (below 1: rindle is faster. rindle and group_send are measured to the client;\n"
        "   re-run only until its results are encoded, before any send: a lower bound.)"
    )
    print()
    for n in args.size_list:
        runs = by_key.get(("slow", n))
        if not runs:
            continue
        with_p99, without = pick("slow", n), pick("rindle", n)
        text, value = ratio_text(with_p99, without)
        shed = any(r["slow_client"]["shed"] for r in runs)
        print(
            f"  slow client, N={n}: fast p99 {ms(with_p99)} ms with it, {ms(without)} ms "
            f"without ({text}x); shed: {'yes' if shed else 'no'}"
        )
        for r in runs:
            s, rss = r["slow_client"], r["rss_kib"]
            print(
                f"    after reading again for up to 3 s it held {s['nbatch_received']} "
                f"increments for {r['commits']} commits (its last cv {s['last_cv']}, the "
                f"last commit's {r['last_cv']}); server RSS {rss['before'] / 1024:,.1f} MiB "
                f"before, {rss['end'] / 1024:,.1f} MiB at the last commit, "
                f"{rss['after_drain'] / 1024:,.1f} MiB after it read again"
            )
        summary["targets"][f"slow_client_n{n}"] = {
            "rule": f"fast p99 with a slow client <= {TARGET_SLOW} x without",
            "ratio": value,
            "pass": value is not None and value <= TARGET_SLOW,
            "shed": shed,
        }
    p99 = pick("rindle", 1000)
    verdict = p99 is not None and p99 <= TARGET_P99_S
    print()
    print(
        f"target rindle p99 <= {TARGET_P99_S * 1000:.0f} ms at 1,000 subscribers: "
        + (f"{ms(p99)} ms -> {'PASS' if verdict else 'FAIL'}" if p99 else "not measured")
    )
    summary["targets"]["p99_at_1000"] = {
        "rule": f"rindle p99 <= {TARGET_P99_S * 1000:.0f} ms at N=1000",
        "p99_s": p99,
        "pass": verdict if p99 else None,
    }
    for key, t in summary["targets"].items():
        if key.startswith("slow_client"):
            value = "-" if t["ratio"] is None else f"{t['ratio']:.2f}"
            print(
                f"target slow client moves fast p99 by <= {TARGET_SLOW:g}x "
                f"({key.rsplit('_', 1)[1]}): {value} -> {'PASS' if t['pass'] else 'FAIL'}"
            )
    print(
        f"server log: {server_log['lines']} lines, {server_log['tracebacks']} tracebacks, "
        f"{server_log['shed_connections']} connections shed"
    )
    print(f"total time {elapsed:.1f}s")
    return summary


def print_profile(path, limit=30):
    import pstats

    if not path.exists():
        print(f"no server profile at {path}")
        return
    print(f"\n=== Daphne event loop thread, top functions by own time ({path}) ===")
    pstats.Stats(str(path)).strip_dirs().sort_stats("tottime").print_stats(limit)


# --- main -------------------------------------------------------------------------------


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    tmpdir = tempfile.mkdtemp(prefix="rindle-bench-ws-")
    db = Database(args.database_url, tmpdir)
    server = clients = bench = None
    try:
        db.create()
        os.environ["DATABASE_URL"] = db.url
        os.environ.pop("RINDLE_TEST_DATABASE_NAME", None)
        os.environ.pop("REDIS_URL", None)  # one server process: the in-memory channel layer
        os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
        os.environ["DJANGO_DEBUG"] = "0"
        sys.path.insert(0, str(ROOT))

        import io

        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connections

        from rindle_app.engine import get_engine, shutdown
        from rindle_app.ivm.ast import parse
        from rindle_app.named import resolve

        call_command("migrate", verbosity=0)
        call_command("rindle_seed_demo", issues=args.issues, seed=1, stdout=io.StringIO())
        schema = get_engine().tables
        query = parse(resolve(QUERY_NAME, QUERY_ARGS), schema)
        shutdown()
        connections.close_all()
        env = environment(db)

        child_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        profile = RESULTS_DIR / "profile-ws-daphne.pstats" if args.profile_server else None
        if profile:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            profile.unlink(missing_ok=True)
        server = Server(child_env, tmpdir, profile, args.servers)
        server.wait_ready()
        clients = Clients(child_env)
        bench = Bench(args, db, tmpdir, server, clients, query, schema)
        where = "a temporary file" if db.backend == "sqlite" else f"database {db.name}"
        print(
            f"{db.label} ({where}): seeded {args.issues} issues; daphne pids {server.pids} "
            f"on port {server.port}; clients pid {clients.pid}",
            flush=True,
        )

        results, reruns = [], []
        for i, n in enumerate(args.size_list):
            variants = [v for v in VARIANTS if v != "slow" or n in args.slow_list]
            if args.servers > 1:
                variants.remove("group_send")
            for rep in range(args.repeats):
                k = (i + rep) % len(variants)
                for variant in variants[k:] + variants[:k]:
                    r = bench.phase(variant, n)
                    r["repeat"] = rep + 1
                    results.append(r)
                    lat = r["latency_s"]
                    print(
                        f"N={n} {variant}: {r['commits']} commits, p50 {ms(lat['p50'])} ms, "
                        f"p99 {ms(lat['p99'])} ms, max {ms(lat['max'])} ms "
                        f"(opened in {r['open_seconds']:.1f} s)",
                        flush=True,
                    )
            rr = bench.rerun(n)
            reruns.append(rr)
            print(
                f"N={n} re-run: {rr['commits']} commits, p50 {ms(rr['ready_s']['p50'])} ms, "
                f"p99 {ms(rr['ready_s']['p99'])} ms",
                flush=True,
            )
        server_log = server.log_counts()
        if server_log["tracebacks"]:
            bench.fail(f"the server logged {server_log['tracebacks']} traceback(s):")
            print(server.tail(3000))
        env["writes"] = bench.writer.counts
        summary = report(args, db, env, results, reruns, server_log, time.perf_counter() - started)
        valid = not bench.failures
        if not valid:
            print(
                f"!!! correctness gate FAILED ({len(bench.failures)} problem(s)); "
                "the figures are invalid"
            )
        else:
            print("correctness gate: every replica equals the database; no seq gaps; ok")

        from bench.common import write_results

        body = {
            "config": {
                "sizes": args.size_list,
                "slow_sizes": args.slow_list,
                "rate": args.rate,
                "max_msgs": args.max_msgs,
                "seconds": args.seconds,
                "repeats": args.repeats,
                "rerun_queries": args.rerun_queries,
                "issues": args.issues,
                "seed": args.seed,
                "quick": args.quick,
                "query": {"name": QUERY_NAME, "args": QUERY_ARGS},
                "group_publish_bytes": bench.group_frame_bytes,
            },
            "environment": env,
            "valid": valid,
            "failures": bench.failures,
            "phases": results,
            "rerun": reruns,
            "server_log": server_log,
            **summary,
        }
        write_results(args.json, f"ws-{db.backend}.json", "bench/ws.py", db.backend, body)
        return 0 if valid else 3
    finally:
        if bench is not None:
            bench.writer.close()
        if clients is not None:
            clients.stop()
        if server is not None:
            server.stop()
            try:  # kept for a look after the run (bench/results/ is git-ignored)
                RESULTS_DIR.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(server.log_path, RESULTS_DIR / "ws-daphne.log")
            except OSError:
                pass
            if args.profile_server:
                print_profile(RESULTS_DIR / "profile-ws-daphne.pstats")
        shutil.rmtree(tmpdir, ignore_errors=True)
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django never set up
            pass
        try:
            db.drop()
        except Exception as exc:
            print(f"!!! could not drop {db.name}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
