"""
The published rindle clients judge the server.

Daphne serves this test run's database on a loopback port; ``tests/e2e/node/judge.mjs`` runs
the npm packages ``@rindle/remote``, ``@rindle/optimistic`` and ``@rindle/client`` (0.9.0)
against it, unchanged, and prints what they materialize. After every step (an ORM write, a
confirmed mutation, a rejected one, a socket cut with a mutation in flight, a server
restart) every client view must equal a fresh read of the same named query from the
database, through the SQL oracle. Each query is checked twice: on the writer (one
connection holding every query and pushing every mutation) and on a solo observer (a
connection of its own, so its view is built from that query's footprint alone). When the
flat encoder exists, a flat ``RemoteBackend`` is judged too.

Two server bugs the judge found have a test each: a Postgres transaction that commits
after a higher outbox seq never reached the clients, and a count over a table with a read
rule never hydrated in the published optimistic client.

Needs ``node`` and ``tests/e2e/node/node_modules`` (``make install``): skipped without them,
except under CI=true where their absence fails.
"""

import json
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test import Client as HttpClient

from project.demo.models import Comment, Issue, Tag, User
from rindle_app.ivm.ast import parse
from rindle_app.ivm.sql import run_query
from rindle_app.models import ChangeEvent, ClientMutation
from rindle_app.named import resolve
from tests.conftest import CI, child_env
from tests.support.adapters import HIDDEN_BODY
from tests.support.processes import free_port
from tests.support.threads import OpenTransaction

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[3]
NODE_DIR = ROOT / "tests" / "e2e" / "node"
FLAT = (ROOT / "rindle_app" / "realtime" / "flat.py").exists()
CLIENT_ID = "judge-writer"
STEP_TIMEOUT = 10
BOOT_TIMEOUT = 30
MISSING = "<missing>"

# key -> (named query, args as the client sends them)
QUERIES = {
    "page": ("issuesPage", {"limit": 50}),
    "top2": ("issuesPage", {"limit": 2}),
    "byOwner": ("issuesPage", {"limit": 10, "filter": [{"axis": "owner", "value": "ada"}]}),
    "byTag": ("issuesPage", {"limit": 10, "filter": [{"axis": "tag", "value": "ap"}]}),
    "mine": ("myIssues", {"limit": 10}),
    "detail": ("issueDetail", "i1"),
    "ghost": ("issueDetail", "i9"),
    "recent": ("recentComments", {"limit": 3}),
    "users": ("users", None),
    "tags": ("tagOptions", None),
}


def node_or_skip():
    node = shutil.which("node")
    if node is None:
        problem = "node is not installed"
    elif not (NODE_DIR / "node_modules" / "@rindle" / "optimistic").is_dir():
        problem = "tests/e2e/node/node_modules is missing (run `make install`)"
    else:
        return node
    if CI:
        pytest.fail(f"{problem} (CI=true: the published-client judge must run)")
    pytest.skip(problem)


def run_node(node, argv, server, *, timeout=60, log_tail=4000):
    """
    Run ``node argv...`` in tests/e2e/node against ``server``: its last line of stdout,
    parsed as JSON (the scripts print their result there). A failing script fails the
    test with its stderr and the tail of the server's log.
    """
    out = subprocess.run(
        [node, *argv],
        cwd=NODE_DIR,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, f"{out.stderr}\n{server.log(tail=log_tail)}"
    return json.loads(out.stdout.strip().splitlines()[-1])


class Server:
    """Daphne serving the project on 127.0.0.1:``port``, against this test's database."""

    def __init__(self, port, log_path, settings_module="project.settings", app=None, **env):
        self.port = port
        self.log_path = log_path
        self.settings_module = settings_module
        self.app = app or "project.asgi:application"  # the ASGI application Daphne serves
        self.env = env  # more environment (REDIS_URL: the channel layer)
        self.proc = None

    def start(self):
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)] + [self.app],
            cwd=ROOT,
            env=child_env(
                DJANGO_DEBUG="0", DJANGO_SETTINGS_MODULE=self.settings_module, **self.env
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + BOOT_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"daphne exited with {self.proc.returncode}:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    pytest.fail(f"daphne did not listen in {BOOT_TIMEOUT} s:\n{self.log()}")
                time.sleep(0.05)

    def stop(self, sig=signal.SIGKILL):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
        if self.proc is not None:
            self.proc.wait(10)

    def log(self, tail=4000):
        text = Path(self.log_path).read_text()
        return text[-tail:] if tail else text


class Judge:
    """``judge.mjs`` in a child process: one JSON command a line in, one reply a line out."""

    def __init__(
        self, node, port, stderr_path, *, user="", cookie="", flat=False, client=CLIENT_ID
    ):
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")
        argv = [node, "judge.mjs", "--url", f"ws://127.0.0.1:{port}/ws/rindle/"]
        argv += ["--client", client, "--user", user, "--cookie", cookie]
        self.proc = subprocess.Popen(
            argv + (["--flat"] if flat else []),
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
        )
        self.replies = queue.Queue()
        self.last_id = 0
        threading.Thread(target=self._read, daemon=True).start()
        self._reply(0)

    def _read(self):
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def _reply(self, wanted):
        while True:
            try:
                line = self.replies.get(timeout=STEP_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"the judge did not answer in {STEP_TIMEOUT} s:\n{self.stderr()}")
            if line is None:
                pytest.fail(f"the judge exited ({self.proc.poll()}):\n{self.stderr()}")
            reply = json.loads(line)
            if reply.get("id") == wanted:
                if not reply["ok"]:
                    pytest.fail(f"the judge refused a command: {reply['error']}")
                return reply

    def call(self, cmd, **fields):
        self.last_id += 1
        self.proc.stdin.write(json.dumps({"id": self.last_id, "cmd": cmd, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._reply(self.last_id)

    def state(self):
        return self.call("state")["state"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("quit")
                self.proc.wait(5)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        self._stderr.close()

    def stderr(self):
        return Path(self.stderr_path).read_text()[-4000:]


# --- expectations -----------------------------------------------------------------------


def expected_views(engine, user, keys):
    """The view of each query in ``keys``, read now from the database by the SQL oracle."""
    tables = engine.tables
    views = {}
    for key in keys:
        name, args = QUERIES[key]
        views[key] = run_query(parse(resolve(name, args, user), tables), connection, tables)
    return views


def shaped(got, want):
    """``got`` cut down to the keys ``want`` has, level by level (a client row may carry
    columns its query reads but does not select, such as an order column)."""
    if isinstance(want, dict) and isinstance(got, dict):
        return {k: shaped(got.get(k, MISSING), v) for k, v in want.items()}
    if isinstance(want, list) and isinstance(got, list):
        return [shaped(g, w) for g, w in zip(got, want)] + got[len(want) :]
    return got


def view_problems(state, expected):
    problems = []
    for key, want in expected.items():
        view = state["views"][key]
        sides = [("writer", view), ("solo", view["solo"])]
        if "flat" in view:
            sides.append(("flat", view["flat"]))
        for side, got in sides:
            if got["resultType"] != "complete":
                problems.append(f"{key} ({side}): resultType {got['resultType']}")
            elif shaped(got["data"], want) != want:
                problems.append(
                    f"{key} ({side}):\n  client {json.dumps(shaped(got['data'], want))}"
                    f"\n  server {json.dumps(want)}"
                )
    return problems


def outbox_tail(n=20):
    events = ChangeEvent.objects.order_by("-seq")[:n]
    return "\n".join(f"#{e.seq} txid={e.txid} {e.op} {e.table} {e.key}" for e in reversed(events))


def db_lmid():
    row = ClientMutation.objects.filter(client_id=CLIENT_ID).first()
    return row.last_mutation_id if row else 0


class Run:
    """The judge, the server and the expectations of one test, with the step loop."""

    def __init__(self, judge, server, engine, user):
        self.judge = judge
        self.server = server
        self.engine = engine
        self.user = user
        self.keys = []

    def subscribe(self, key):
        name, args = QUERIES[key]
        self.judge.call("subscribe", key=key, name=name, args=args)
        self.keys.append(key)

    def unsubscribe(self, key):
        self.judge.call("unsubscribe", key=key)
        self.keys.remove(key)

    def settle(self, step, until=None, timeout=STEP_TIMEOUT):
        """
        Wait until every client view equals the database (and ``until(state)`` holds, when
        given); fail with the differences, the wire and the server log otherwise.
        """
        deadline = time.monotonic() + timeout
        while True:
            state = self.judge.state()
            problems = view_problems(state, expected_views(self.engine, self.user, self.keys))
            if until is not None and not problems:
                extra = until(state)
                if extra:
                    problems.append(extra)
            if not problems:
                return state
            if time.monotonic() > deadline:
                frames = self.judge.call("frames")["frames"][-60:]
                wire = "\n".join(f"{d:5} {t[:400]}" for d, t in frames)
                pytest.fail(
                    f"step {step!r}: the clients did not converge on the database in "
                    f"{timeout} s\n" + "\n".join(problems) + f"\n--- writer pending "
                    f"{state['pending']} lmid {state['confirmedLmid']} (db {db_lmid()})"
                    f"\n--- last frames of the writer's socket:\n{wire}"
                    f"\n--- outbox tail:\n{outbox_tail()}"
                    f"\n--- server log:\n{self.server.log()}\n--- judge stderr:\n"
                    f"{self.judge.stderr()}"
                )
            time.sleep(0.05)

    def confirmed(self, mid):
        """An ``until``: the writer has nothing pending and has seen ``mid`` confirmed."""

        def check(state):
            if state["pending"] or state["confirmedLmid"] < mid:
                return f"mid {mid}: pending {state['pending']}, lmid {state['confirmedLmid']}"
            return None

        return check


def reconnected(connects):
    """An ``until``: the writer opened a socket since it had ``connects`` of them."""

    def check(state):
        return None if state["connects"] > connects else "the writer has not reconnected"

    return check


def rebooted(state):
    """An ``until``: the writer has seen a second server boot id."""
    return None if len(set(state["bootIds"])) == 2 else f"boot ids seen: {state['bootIds']}"


def both(*checks):
    """An ``until`` holding when every one of ``checks`` holds."""
    return lambda state: next((p for p in (c(state) for c in checks) if p), None)


def pushes_of(judge, mid):
    """How many times the writer handed the envelope of ``mid`` to a socket."""
    return judge.state()["pushes"].get(str(mid), 0)


def applied_once(tag_id, mid):
    """The tag of ``mid`` exists once, was inserted once, and its lmid was written once."""
    assert Tag.objects.filter(id=tag_id).count() == 1
    inserts = ChangeEvent.objects.filter(table="tag", op="add")
    assert [e.new["id"] for e in inserts].count(tag_id) == 1
    ledger = ChangeEvent.objects.filter(table="_rindle_client_mutations")
    assert [e.new["last_mutation_id"] for e in ledger if e.new].count(mid) == 1
    assert db_lmid() == mid


# --- the data ------------------------------------------------------------------------------


def issue(n, owner, created, **fields):
    values = {"title": f"Issue {n}", "status": "todo", "priority": "medium", **fields}
    return Issue.objects.create(
        id=f"i{n}", owner_id=owner, created_at=created, updated_at=created, **values
    )


def seed():
    with transaction.atomic():
        for uid, name in [("ada", "Ada Lovelace"), ("bob", "Bob"), ("cy", "Cy")]:
            User.objects.create(id=uid, name=name)
        issue(1, "ada", 1.0)
        issue(2, "bob", 2.0, status="review")
        issue(3, "ada", 3.0, status="done")
        issue(4, "bob", 4.0, priority="low")
        for tid, issue_id, name in [("t1", "i1", "ui"), ("t2", "i1", "bug"), ("t3", "i3", "api")]:
            Tag.objects.create(id=tid, issue_id=issue_id, name=name)
        for cid, issue_id, author, at in [("c1", "i1", "bob", 10.0), ("c2", "i2", "ada", 11.0)]:
            Comment.objects.create(
                id=cid, issue_id=issue_id, author_id=author, body=f"comment {cid}", created_at=at
            )


def session_cookie(user):
    http = HttpClient()
    http.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={http.cookies[settings.SESSION_COOKIE_NAME].value}"


@pytest.fixture
def start(engine, tmp_path):
    """
    ``start(keys, settings_module=...)``: seed the data, boot Daphne, start the judge
    signed in as ada and subscribe the queries ``keys``; everything stops after the test.
    """
    node = node_or_skip()
    started = []

    def start(keys=tuple(QUERIES), settings_module="project.settings"):
        seed()
        ada = get_user_model().objects.create_user("ada")
        server = Server(free_port(), tmp_path / "daphne.log", settings_module)
        started.append(server)
        server.start()
        judge = Judge(
            node,
            server.port,
            tmp_path / "judge.stderr",
            user="ada",
            cookie=session_cookie(ada),
            flat=FLAT,
        )
        started.append(judge)
        run = Run(judge, server, engine, ada)
        for key in keys:
            run.subscribe(key)
        return run

    yield start
    for process in reversed(started):
        if isinstance(process, Judge):
            process.close()
        else:
            process.stop()


@pytest.fixture
def run(start):
    return start()


def test_published_clients_agree_with_the_database(run):
    """
    After every step every view of every client equals the database: hydration, ORM
    writes, confirmed, rejected and no-op mutations, a burst, three socket cuts with a
    mutation in flight (each applied exactly once) and a server restart.
    """
    judge = run.judge

    # --- hydrate ---------------------------------------------------------------------------
    state = run.settle("hydrate")
    assert state["confirmedLmid"] == 0 and state["pending"] == []
    assert len(state["bootIds"]) == 1

    # --- ORM writes from this process, each its own step ------------------------------------
    with transaction.atomic():
        issue(5, "cy", 5.0, priority="high")
        Tag.objects.create(id="t4", issue_id="i5", name="apex")
    run.settle("orm: a new issue with a tag, in one transaction")
    Issue.objects.filter(id="i1").update(title="Issue one, renamed", updated_at=6.0)
    run.settle("orm: edit a title")
    Comment.objects.create(id="c3", issue_id="i1", author_id="cy", body="hi", created_at=12.0)
    run.settle("orm: a comment")
    User.objects.filter(id="bob").update(name="Bobby")
    run.settle("orm: rename a user seen through several paths")
    Tag.objects.filter(id="t3").delete()
    run.settle("orm: delete a tag (an EXISTS filter drops its issue)")
    Comment.objects.filter(id="c2").delete()
    run.settle("orm: delete the last comment of an issue (its count goes to 0)")
    Issue.objects.filter(id="i2").update(created_at=100.0)
    run.settle("orm: move an issue to the top of the top-2 window")
    with transaction.atomic():
        Issue.objects.filter(id="i2").update(created_at=2.0)
        Tag.objects.filter(issue_id="i5").delete()
        Issue.objects.filter(id="i5").delete()
    run.settle("orm: delete the newest issue (the top-2 window refills)")
    issue(9, "ada", 9.0)
    run.settle("orm: the issue a detail view waits for appears")
    Issue.objects.filter(id="i9").delete()
    run.settle("orm: and goes again")

    User.objects.bulk_create(
        [User(id="u-astral", name="\U0001f600 astral"), User(id="u-bmp", name="\ufffd bmp")]
    )
    Tag.objects.create(id="t-uni", issue_id="i2", name="\u00f1and\u00fa")
    Issue.objects.filter(id="i2").update(title='a "quote", a \\ and a\nnew line')
    run.settle("orm: text the wire must escape and the comparator order bytewise")

    # --- unsubscribe, a write those queries would see, subscribe again ---------------------
    run.unsubscribe("top2")
    run.unsubscribe("detail")
    run.settle("two queries unsubscribed")
    Issue.objects.filter(id="i1").update(created_at=200.0)
    run.settle("orm: a write while they are away")
    run.subscribe("top2")
    run.subscribe("detail")
    run.settle("the two queries subscribed again")
    Issue.objects.filter(id="i1").update(created_at=1.0)
    run.settle("orm: and a write after")

    # --- mutations pushed by the client, confirmed ------------------------------------------
    args = {"id": "i1", "status": "done", "updatedAt": 20}
    mid = judge.call("mutate", name="setStatus", args=args)["mid"]
    run.settle("setStatus confirmed", until=run.confirmed(mid))
    assert db_lmid() == mid and Issue.objects.get(id="i1").status == "done"

    args = {
        "id": "i6",
        "title": "Made by the client",
        "status": "todo",
        "priority": "urgent",
        "owner": "ada",
        "tags": [{"id": "t6", "name": "ops"}],
        "description": "the description",
        "descriptionCommentId": "c6",
        "createdAt": 30,
    }
    mid = judge.call("mutate", name="createIssue", args=args)["mid"]
    run.settle("createIssue (signed in) confirmed", until=run.confirmed(mid))
    assert Comment.objects.get(id="c6").author_id == "ada"

    # --- comments bump their issue's updatedAt, predicted and confirmed ----------------------
    def predicted_updated_at(reply, issue_id):
        page = reply["state"]["views"]["page"]["data"]
        return next(row["updatedAt"] for row in page if row["id"] == issue_id)

    args = {"id": "c8", "issueId": "i6", "body": "a comment", "createdAt": 31, "updatedAt": 32}
    reply = judge.call("mutate", name="addComment", args=args)
    assert predicted_updated_at(reply, "i6") == 32
    run.settle("addComment confirmed", until=run.confirmed(reply["mid"]))
    assert Issue.objects.get(id="i6").updated_at == 32
    args = {"id": "c8", "issueId": "i6", "body": "a comment, edited", "updatedAt": 33}
    reply = judge.call("mutate", name="editComment", args=args)
    assert predicted_updated_at(reply, "i6") == 33
    run.settle("editComment confirmed", until=run.confirmed(reply["mid"]))
    assert Issue.objects.get(id="i6").updated_at == 33
    assert Comment.objects.get(id="c8").body == "a comment, edited"
    # cy's comment: the server's author gate makes the edit a no-op, which snaps back.
    before = Issue.objects.get(id="i1").updated_at
    args = {"id": "c3", "issueId": "i1", "body": "not mine", "updatedAt": 34}
    reply = judge.call("mutate", name="editComment", args=args)
    assert predicted_updated_at(reply, "i1") == 34
    run.settle("editComment of cy's comment, a no-op", until=run.confirmed(reply["mid"]))
    assert Issue.objects.get(id="i1").updated_at == before
    assert Comment.objects.get(id="c3").body == "hi"

    # --- a rejected mutation: the prediction shows, then snaps back -------------------------
    title = Issue.objects.get(id="i2").title
    args = {"id": "i2", "title": "cheap spam", "updatedAt": 40}
    reply = judge.call("mutate", name="editTitle", args=args)
    mid = reply["mid"]
    predicted = {row["id"]: row["title"] for row in reply["state"]["views"]["page"]["data"]}
    assert predicted["i2"] == "cheap spam"
    state = run.settle("editTitle rejected", until=run.confirmed(mid))
    assert db_lmid() == mid and Issue.objects.get(id="i2").title == title
    assert [r["mid"] for r in state["rejected"]] == [mid]
    assert "spam" in state["rejected"][0]["reason"]

    # --- accepted as a no-op: deleting someone else's issue snaps back, unreported ----------
    reply = judge.call("mutate", name="deleteIssue", args={"id": "i4"})
    mid = reply["mid"]
    assert "i4" not in {row["id"] for row in reply["state"]["views"]["page"]["data"]}
    state = run.settle("deleteIssue of bob's issue, a no-op", until=run.confirmed(mid))
    assert Issue.objects.filter(id="i4").exists() and mid not in {
        r["mid"] for r in state["rejected"]
    }
    mid = judge.call("mutate", name="deleteIssue", args={"id": "i6"})["mid"]
    run.settle("deleteIssue of ada's own issue", until=run.confirmed(mid))
    assert not Issue.objects.filter(id="i6").exists() and not Tag.objects.filter(id="t6")

    # --- a burst: mutations back to back, one settle --------------------------------------
    # (Only the server's engine writes here: an ORM write racing its commits is the subject
    # of test_a_writer_committing_after_a_later_seq_is_not_lost.)
    burst = [
        ("setPriority", {"id": "i3", "priority": "high"}),
        ("addTag", {"id": "t5", "issueId": "i3", "name": "apple"}),
        ("setStatus", {"id": "i3", "status": "not-a-status"}),  # bad args: rejected
        ("editTitle", {"id": "i3", "title": "  Issue three  "}),
        ("removeTag", {"id": "t1", "issueId": "i1"}),
        ("addComment", {"id": "c7", "issueId": "i3", "body": "burst", "createdAt": 45}),
    ]
    mids = []
    for n, (name, args) in enumerate(burst):
        args = args if name == "addComment" else {**args, "updatedAt": 41 + n}
        mids.append(judge.call("mutate", name=name, args=args)["mid"])
    state = run.settle("a burst of mutations", until=run.confirmed(mids[-1]))
    assert [r["mid"] for r in state["rejected"]][-1] == mids[2]
    assert Issue.objects.get(id="i3").title == "Issue three"

    # --- the socket is cut; the envelope never left -----------------------------------------
    connects = judge.state()["connects"]
    args = {"id": "t7", "issueId": "i2", "name": "alpha", "updatedAt": 60}
    mid = judge.call("mutate", name="addTag", args=args, kill="before")["mid"]
    run.settle("cut before the push", until=both(reconnected(connects), run.confirmed(mid)))
    applied_once("t7", mid)
    assert pushes_of(judge, mid) >= 2, "the pending envelope was not re-sent after reconnect"

    # --- the server applied the push, the client never heard; the socket is cut -------------
    judge.call("deafen")
    args = {"id": "t8", "issueId": "i3", "name": "beta", "updatedAt": 61}
    mid = judge.call("mutate", name="addTag", args=args)["mid"]
    deadline = time.monotonic() + STEP_TIMEOUT
    while db_lmid() < mid:
        assert time.monotonic() < deadline, "the server did not apply the deaf client's push"
        time.sleep(0.02)
    state = judge.state()
    assert state["pending"] == [mid]
    judge.call("kill")
    run.settle("cut after the push", until=both(reconnected(state["connects"]), run.confirmed(mid)))
    applied_once("t8", mid)
    assert pushes_of(judge, mid) == 2, "the re-sent envelope keeps its mid and is absorbed"

    # --- a push and a socket cut racing -----------------------------------------------------
    connects = judge.state()["connects"]
    args = {"id": "t9", "issueId": "i4", "name": "gamma", "updatedAt": 62}
    mid = judge.call("mutate", name="addTag", args=args, kill="after")["mid"]
    run.settle("cut right after the push", until=both(reconnected(connects), run.confirmed(mid)))
    applied_once("t9", mid)

    # --- the server restarts: a new bootId; a mutation and an ORM write while it is down ----
    run.server.stop()
    args = {"id": "i4", "priority": "urgent", "updatedAt": 80}
    mid = judge.call("mutate", name="setPriority", args=args)["mid"]
    Issue.objects.filter(id="i3").update(title="Edited while the server was down")
    run.server.start()
    judge.call("reopenFlat")
    run.settle("server restart", until=both(rebooted, run.confirmed(mid)), timeout=20)
    assert Issue.objects.get(id="i4").priority == "urgent" and db_lmid() == mid

    # --- and it keeps serving -----------------------------------------------------------------
    Comment.objects.create(id="c9", issue_id="i4", author_id="ada", body="after", created_at=90.0)
    run.settle("orm: a comment after the restart")
    args = {"id": "i4", "owner": "cy", "updatedAt": 91}
    mid = judge.call("mutate", name="setOwner", args=args)["mid"]
    run.settle("setOwner (a one-relationship changes) after the restart", until=run.confirmed(mid))

    # Recovered is not enough: neither side may have complained on the way.
    assert "[rindle" not in judge.stderr(), judge.stderr()
    log = run.server.log(tail=None)
    assert "Traceback" not in log and " ERROR " not in log, log[-4000:]


def test_a_writer_committing_after_a_later_seq_is_not_lost(run):
    """
    A change whose outbox seq is below one already committed still reaches the clients
    (once a bug: the tail moved past it; now the outbox fence holds the tail back).
    """
    if connection.vendor == "sqlite":
        pytest.skip("SQLite serializes writers: a lower seq never commits after a higher one")
    run.settle("hydrate")
    late = OpenTransaction(
        lambda: Tag.objects.create(id="late", issue_id="i2", name="late"),  # takes seq N
        timeout=STEP_TIMEOUT,
        hold=STEP_TIMEOUT,
    )
    with late:
        # seq N+1 commits first; the server must hold it back (the outbox fence) rather
        # than move past N: give it time to get that wrong
        Comment.objects.create(id="c-early", issue_id="i2", author_id="cy", body="x", created_at=7)
        time.sleep(0.5)
    run.settle("the earlier seq commits", timeout=3)


def test_a_count_under_a_read_rule_hydrates(start, settings):
    """
    A countAs over a table with a read rule reaches the clients, the rule applied. The
    client names the count's synthetic table from its own AST, so the server must name
    it without the rule it compiled in (once a bug: the hello was refused).
    """
    settings.RINDLE = {**settings.RINDLE, "ADAPTER": "tests.support.adapters.HideComments"}
    run = start(["page"], settings_module="tests.e2e.judges.settings_read_rules")
    Comment.objects.create(
        id="c-hidden", issue_id="i1", author_id="bob", body=HIDDEN_BODY, created_at=13.0
    )
    run.settle("hydrate under a read rule", timeout=3)
