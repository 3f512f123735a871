"""
Readers take no lock: hydration, the tail and the SSR read use the published
safe_seq, never the exclusive side of the outbox fence, so an open transaction on a
synced table delays nothing but its own changes, and every view still equals SQL.
"""

import random
import threading
import time

import pytest
from django.db import DatabaseError, connection, connections, transaction
from rest_framework.test import APIClient

from project.demo.models import Comment, Issue, User
from rindle_app import tokens
from rindle_app.ivm.live import LiveQueries
from rindle_app.ivm.sql import run_query
from rindle_app.testing import fresh_result, outbox_high_water, publish_watermark
from tests.support.demo import issue
from tests.support.wire import simple

from .reader_support import ShortWrites, held_user, postgres_only

pytestmark = pytest.mark.django_db(transaction=True)

QUERIES = [
    {"table": "user", "orderBy": [["id", "asc"]]},
    {
        "table": "issue",
        "orderBy": [["createdAt", "desc"]],
        "limit": 4,
        "related": [
            {
                "correlation": {"parentField": ["id"], "childField": ["issueId"]},
                "subquery": {"table": "comment", "alias": "comments", "orderBy": [["id", "asc"]]},
            },
            {
                "correlation": {"parentField": ["id"], "childField": ["issueId"]},
                "subquery": {"table": "comment", "alias": "commentCount", "aggregate": "count"},
            },
            {
                "correlation": {"parentField": ["ownerId"], "childField": ["id"]},
                "subquery": {"table": "user", "alias": "owner", "one": True},
            },
        ],
    },
    {"table": "comment", "where": simple("issueId", "=", "i1"), "orderBy": [["id", "asc"]]},
]


def seed():
    User.objects.bulk_create([User(id=f"u{n}", name=f"user {n}") for n in range(3)])
    Issue.objects.bulk_create(
        [issue(f"i{n}", title=f"issue {n}", owner=f"u{n % 3}", created=float(n)) for n in range(6)]
    )


def register(live):
    return [live.catalog.register(q) for q in QUERIES]


def assert_views_equal_sql(live, views, when):
    for shared in views:
        want = run_query(shared.query, connection, live.engine.tables)
        assert shared.view.result() == want, f"{when}: {shared.query.table} differs from SQL"
        assert shared.view.result() == fresh_result(live.engine, shared.query)


def test_a_hydration_during_an_open_transaction_answers_at_once_and_blocks_no_write(engine):
    """
    While another session holds a synced-table transaction open, a hydration finishes
    in under a second and short writes keep committing (p99 < 100 ms); the open
    transaction's row arrives once it commits, and the views equal SQL.
    """
    postgres_only()
    seed()
    publish_watermark()
    with held_user("u-open"), ShortWrites() as writes:
        User.objects.create(id="u-after", name="committed above the open one")
        durations, lives = [], []
        for _ in range(5):
            started = time.monotonic()
            lives.append(LiveQueries(engine).start())
            durations.append(time.monotonic() - started)
            time.sleep(0.05)
        assert publish_watermark(timeout=0.05) is None  # the watermark waits for it
    assert max(durations) < 1.0, durations
    assert len(writes.latencies) > 20 and writes.p99() < 0.1, writes.p99()
    live = lives[-1]
    views = register(live)
    # The catalog stands at the published watermark, below the open transaction's
    # seq: neither it nor what committed above it is in the views yet.
    assert not {"u-after", "u-open"} & {r["id"] for r in views[0].view.rows()}
    publish_watermark()
    live.poll()
    assert {"u-after", "u-open"} <= {r["id"] for r in views[0].view.rows()}
    assert live.version == outbox_high_water()
    assert_views_equal_sql(live, views, "after the open transaction committed")


def _reader(engine):
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("reader")
    token, _ = tokens.create(user, ["read"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def _ssr(client):
    response = client.post("/api/rindle/read", {"name": "users", "args": None}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_the_ssr_read_during_an_open_transaction_answers_at_once_and_blocks_no_write(engine):
    """
    POST /api/rindle/read while another session holds a synced-table transaction open
    answers in under a second, and short writes meanwhile stay under 100 ms (p99).
    """
    postgres_only()
    seed()
    client = _reader(engine)
    _ssr(client)
    with held_user("u-open"), ShortWrites() as writes:
        durations = []
        for _ in range(10):
            started = time.monotonic()
            body = _ssr(client)
            durations.append(time.monotonic() - started)
            time.sleep(0.03)
    assert max(durations) < 1.0, durations
    assert len(writes.latencies) > 20 and writes.p99() < 0.1, writes.p99()
    assert "u-open" not in {r["cols"]["id"] for r in body["rows"]}


def test_the_ssr_version_never_claims_a_change_its_rows_lack(engine):
    """
    With seq N still open and N+1 committed, the SSR rows hold N+1 but cvMin stays
    below N (the published watermark): a client never believes it has N. Once N
    commits and the watermark passes it, cvMin is the high-water mark and the rows
    hold both.
    """
    postgres_only()
    seed()
    client = _reader(engine)
    publish_watermark()
    with held_user("u-open"):
        open_seq = outbox_high_water()  # the open transaction's seq is not visible yet
        User.objects.create(id="u-early", name="early")
        publish_watermark(timeout=0.05)
        body = _ssr(client)
        ids = {r["cols"]["id"] for r in body["rows"]}
        assert "u-early" in ids and "u-open" not in ids
        assert body["cvMin"] <= open_seq < outbox_high_water()
    publish_watermark()
    body = _ssr(client)
    assert {"u-early", "u-open"} <= {r["cols"]["id"] for r in body["rows"]}
    assert body["cvMin"] == outbox_high_water()


class Writers:
    """
    Outside writers (threads with connections of their own): random short and long
    transactions on issues and comments, some rolled back, some failing on a
    deadlock or a lock conflict (and so rolled back too).
    """

    def __init__(self, count, seed, duration):
        self.count, self.seed, self.duration = count, seed, duration
        self.threads = []
        self.committed = 0
        self.errors = []

    def start(self):
        for n in range(self.count):
            thread = threading.Thread(target=self._run, args=(n,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def join(self):
        for thread in self.threads:
            thread.join(30)
        assert not self.errors, self.errors

    def _run(self, n):
        rng = random.Random(self.seed * 100 + n)
        deadline = time.monotonic() + self.duration
        k = 0
        try:
            while time.monotonic() < deadline:
                k += 1
                kind = rng.choice(["short", "short", "short", "long", "rollback"])
                try:
                    with transaction.atomic():
                        for _ in range(rng.randint(1, 3)):
                            self._change(rng, f"w{self.seed}-{n}-{k}-{rng.random():.6f}")
                        if kind == "long":
                            time.sleep(rng.uniform(0.05, 0.3))
                        if kind == "rollback":
                            raise _Rollback
                    self.committed += 1
                except _Rollback:
                    pass
                except DatabaseError:  # a deadlock or lock timeout: rolled back
                    pass
        except Exception as exc:
            self.errors.append(exc)
        finally:
            connections.close_all()

    def _change(self, rng, token):
        issue = f"i{rng.randrange(6)}"
        action = rng.randrange(4)
        if action == 0:
            Issue.objects.filter(id=issue).update(title=token, created_at=rng.uniform(0, 10))
        elif action == 1:
            Comment.objects.create(
                id=f"c-{token}",
                issue_id=rng.choice([issue, "i1"]),
                author_id="u1",
                body=token,
                created_at=rng.random(),
            )
        elif action == 2:
            victim = Comment.objects.filter(issue_id=issue).order_by("id").first()
            if victim is not None:
                victim.delete()
        else:
            User.objects.filter(id=f"u{rng.randrange(3)}").update(name=token)


class _Rollback(Exception):
    pass


def test_views_equal_sql_with_a_concurrent_outside_writer_while_hydrating_and_tailing(engine):
    """
    Differential: outside writers run short and long transactions and rollbacks while
    catalogs hydrate mid-stream and tail behind a watermark that advances as a
    watermarker's would; after every round each maintained view of every catalog
    equals re-running its query in SQL, and no hydration waited.
    """
    seed()
    publish_watermark()
    writers_per_round = 2 if connection.vendor == "postgresql" else 1
    lives = [LiveQueries(engine).start()]
    views = {id(lives[0]): register(lives[0])}
    for round_ in range(3):
        writers = Writers(writers_per_round, round_, duration=1.2).start()
        hydrated = False
        started_round = time.monotonic()
        while any(t.is_alive() for t in writers.threads):
            publish_watermark(timeout=0.05)
            for live in lives:
                live.poll()
            if not hydrated and time.monotonic() - started_round > 0.5:
                started = time.monotonic()
                live = LiveQueries(engine).start()  # mid-stream, transactions open
                assert time.monotonic() - started < 1.0, "the hydration waited"
                lives.append(live)
                views[id(live)] = register(live)
                hydrated = True
            time.sleep(0.02)
        writers.join()
        assert writers.committed > 0
        publish_watermark()
        for live in lives:
            live.poll()
            assert live.version == outbox_high_water()
            assert_views_equal_sql(live, views[id(live)], f"round {round_}")


def test_changes_committed_above_the_start_version_arrive_once(engine):
    """
    Committed above the published watermark when a catalog starts, a comment and an
    edit are not in its views (they read the database corrected to that version);
    when the watermark passes them the step sends each of them once, with the next
    comment, and the views, counts included, equal SQL.
    """
    seed()
    publish_watermark()
    live_before = LiveQueries(engine).start()
    before = register(live_before)
    Comment.objects.create(id="c-held", issue_id="i5", author_id="u1", body="x", created_at=1)
    Issue.objects.filter(id="i5").update(title="renamed while unpublished")
    live = LiveQueries(engine).start()  # the watermark has not passed them yet (PostgreSQL)
    views = register(live)
    publish_watermark()
    Comment.objects.create(id="c-next", issue_id="i5", author_id="u2", body="y", created_at=2)
    publish_watermark()
    for catalog, shared in ((live, views), (live_before, before)):
        _version, outputs, _faults = catalog.poll()
        assert catalog.version == outbox_high_water()
        sent = {
            (op["table"], op["op"], (op.get("row") or op.get("new"))["id"])
            for op in outputs[shared[1].key]
            if op["table"] in ("issue", "comment")
        }
        if catalog is live:
            # PostgreSQL: c-held is above the published watermark the catalog started
            # at, so the step brings it; SQLite: the watermark is the newest seq, so it
            # was in the views from the start and is not sent again.
            held = {("comment", "add", "c-next")}
            if connection.vendor == "postgresql":
                held.add(("comment", "add", "c-held"))
            assert {k for k in sent if k[2] in ("c-held", "c-next")} == held, sent
            ops = outputs[shared[1].key]
            ids = [
                (op["table"], op["op"], (op.get("row") or op.get("new"))["id"])
                for op in ops
                if op["table"] in ("issue", "comment")
            ]
            assert len(ids) == len(set(ids)), ids  # nothing sent twice
        assert_views_equal_sql(catalog, shared, "after the watermark passed the held rows")
    top = views[1].view.result()[0]
    assert top["id"] == "i5" and top["commentCount"] == 2
