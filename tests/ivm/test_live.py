"""Live queries over the database: hydrate at a version, then apply only later commits."""

import threading
import time

import pytest
from django.db import connection

from project.demo.models import Comment, Issue, User
from rindle_app.ivm.live import LiveQueries
from rindle_app.ivm.sql import run_query
from rindle_app.testing import fresh_result, outbox_high_water, publish_watermark
from tests.support import demo
from tests.support.threads import OpenTransaction

pytestmark = pytest.mark.django_db(transaction=True)

ISSUES_WITH_COMMENTS = {
    "table": "issue",
    "orderBy": [["createdAt", "desc"]],
    "limit": 5,
    "related": [
        {
            "correlation": {"parentField": ["id"], "childField": ["issueId"]},
            "subquery": {
                "table": "comment",
                "alias": "comments",
                "orderBy": [["createdAt", "asc"]],
            },
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
}


def poll(live, timeout=5.0):
    """A hub's step: the watermarker publishes (here the test does), then the tail reads."""
    publish_watermark(timeout=timeout)
    return live.poll()


def fresh(live, shared):
    """The query evaluated from scratch on a new snapshot of the database."""
    return fresh_result(live.engine, shared.query)


def issue(i, owner="u1", at=None):
    created = float(at if at is not None else i)
    return demo.issue(f"i{i}", title=f"Issue {i}", owner=owner, created=created, updated=float(i))


def test_a_hydrated_query_follows_engine_and_orm_writes(engine):
    """After each poll the view equals the query re-run on the database."""
    User.objects.create(id="u1", name="Ann")
    Issue.objects.bulk_create([issue(i) for i in range(1, 9)])
    publish_watermark()
    live = LiveQueries(engine).start()
    assert live.version == outbox_high_water()
    shared = live.catalog.register(ISSUES_WITH_COMMENTS)
    assert [r["id"] for r in shared.view.result()] == ["i8", "i7", "i6", "i5", "i4"]
    assert shared.view.result() == run_query(shared.query, connection, live.engine.tables)

    engine.write(
        lambda tx: tx.insert(
            "comment",
            {"id": "c1", "issueId": "i7", "authorId": "u1", "body": "hi", "createdAt": 1.5},
        )
    )
    Issue.objects.filter(id="i8").delete()  # leaves the window: i3 refills it
    User.objects.filter(id="u1").update(name="Anne")
    version, outputs, faults = poll(live)
    assert faults == [] and version == outbox_high_water()
    assert shared.view.result() == fresh(live, shared)
    # ...and the same query run as SQL by the database itself.
    assert shared.view.result() == run_query(shared.query, connection, live.engine.tables)
    ops = outputs[shared.key]
    assert {(o["table"], o["op"]) for o in ops} >= {
        ("issue", "remove"),
        ("issue", "add"),
        ("comment", "add"),
        ("user", "edit"),
    }
    assert live.poll() == (version, {}, [])  # nothing new: nothing sent


def test_writes_during_hydration_are_neither_lost_nor_doubled(engine):
    """A snapshot taken while a writer runs continues exactly where its version ends."""
    User.objects.create(id="u1", name="Ann")
    stop = threading.Event()
    written = []

    def writer():
        n = 0
        while not stop.is_set() and n < 400:
            n += 1
            engine.write(
                lambda tx, n=n: tx.insert(
                    "comment",
                    {
                        "id": f"c{n:04}",
                        "issueId": "i1",
                        "authorId": "u1",
                        "body": "x",
                        "createdAt": float(n),
                    },
                )
            )
            written.append(n)

    demo.create_issue("i1", created=1)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        while len(written) < 20:
            pass
        live = LiveQueries(engine).start()  # mid-stream
        shared = live.catalog.register(
            {"table": "comment", "orderBy": [["createdAt", "asc"]], "select": ["id"]}
        )
        while len(written) < 60:
            poll(live)
    finally:
        stop.set()
        thread.join(30)
    poll(live)
    ids = [r["id"] for r in shared.view.result()]
    assert ids == sorted(set(ids)), "a change was applied twice"
    assert ids == [f"c{n:04}" for n in written], "a change was lost"
    assert live.version == outbox_high_water()


def test_snapshot_rows_and_change_images_agree(engine):
    """A row read at hydration equals the same row arriving later as a change."""
    User.objects.create(id="u1", name="Ann")
    Comment.objects.create(id="c1", issue_id="i1", author_id="u1", body="b", created_at=0.1 + 0.2)
    publish_watermark()  # the catalog starts at the published version: c1 is in it
    live = LiveQueries(engine).start()
    row = live.catalog.store.get("comment", live.catalog.store.pk("comment", {"id": "c1"}))
    Comment.objects.filter(id="c1").update(body="b2")
    _, _, _ = poll(live)
    changed = live.catalog.store.get("comment", live.catalog.store.pk("comment", {"id": "c1"}))
    assert row["createdAt"] == changed["createdAt"] == 0.1 + 0.2
    assert {k: v for k, v in row.items() if k != "body"} == {
        k: v for k, v in changed.items() if k != "body"
    }
    with connection.cursor() as cursor:
        cursor.execute('SELECT "createdAt" FROM comment')
        assert cursor.fetchone()[0] == row["createdAt"]


def test_commits_handed_over_in_process_need_no_outbox_read(engine, vendor):
    """With the handoff, a poll after the engine's own commits reads nothing."""
    from django.test.utils import CaptureQueriesContext

    User.objects.create(id="u1", name="Ann")
    Issue.objects.bulk_create([issue(i) for i in range(1, 9)])
    publish_watermark()
    live = LiveQueries(engine, handoff=True).start()
    try:
        shared = live.catalog.register(ISSUES_WITH_COMMENTS)
        for n in range(1, 6):
            engine.write(
                lambda tx, n=n: tx.insert(
                    "comment",
                    {
                        "id": f"c{n}",
                        "issueId": "i8",
                        "authorId": "u1",
                        "body": "x",
                        "createdAt": float(n),
                    },
                )
            )
            publish_watermark()
            with CaptureQueriesContext(connection) as reads:
                version, outputs, _ = live.poll()
            assert version == outbox_high_water()
            assert len(reads) == (0 if vendor == "sqlite" else 1)
            assert shared.key in outputs
            assert shared.view.result() == fresh(live, shared)
        # Writes outside the engine interleave: the engine's next read hands them over
        # too (SQLite's write lock orders them), or the poll reads them.
        for n in range(6, 12):
            User.objects.filter(id="u1").update(name=f"Ann {n}")
            if n % 2:
                Issue.objects.filter(id=f"i{n - 5}").delete()
            engine.write(lambda tx, n=n: tx.update("issue", {"id": "i8"}, {"title": f"t{n}"}))
            poll(live)
            assert live.version == outbox_high_water()
            assert shared.view.result() == fresh(live, shared)
            assert shared.view.result() == run_query(shared.query, connection, live.engine.tables)
        User.objects.filter(id="u1").update(name="last")  # no engine commit after it
        poll(live)
        assert live.version == outbox_high_water()
        assert shared.view.result() == fresh(live, shared)
    finally:
        live.stop()


def test_a_transaction_committing_after_a_higher_seq_is_not_skipped(engine, vendor):
    """
    Postgres: a transaction takes seq N and stays open while seq N+1 commits. The tail
    must not move past N until N's transaction ends (the outbox fence); then both arrive.
    """
    if vendor != "postgresql":
        pytest.skip("SQLite's write lock already commits seqs in order")
    User.objects.create(id="u1", name="Ann")
    live = LiveQueries(engine).start()
    users = live.catalog.register({"table": "user"})
    with OpenTransaction(lambda: User.objects.create(id="u-late", name="late"), hold=10):
        User.objects.create(id="u-early", name="early")  # a higher seq, committed first
        poll(live, timeout=0.1)  # the watermark cannot pass the open transaction
        assert "u-early" not in {r["id"] for r in users.view.rows()}  # held at the fence
    deadline = time.monotonic() + 5
    while live.version < outbox_high_water() and time.monotonic() < deadline:
        poll(live)  # the hub's loop, once the watermark moves
        time.sleep(0.02)
    assert {r["id"] for r in users.view.rows()} == {"u1", "u-early", "u-late"}
    assert live.version == outbox_high_water()


def test_a_stopped_handoff_is_no_longer_fed(engine, vendor):
    """stop() unregisters: the writer stops reading and handing rows to it."""
    if vendor != "sqlite":
        pytest.skip("the handoff is SQLite's")
    live = LiveQueries(engine, handoff=True).start()
    engine.write(lambda tx: tx.insert("user", {"id": "u1", "name": "Ann"}))
    assert live._handed
    live.stop()
    assert engine._writer._change_listeners == []
    live._handed.clear()
    engine.write(lambda tx: tx.insert("user", {"id": "u2", "name": "Bo"}))
    assert not live._handed


def test_reloading_one_table_keeps_the_others_and_applies_each_change_once(engine):
    """A table re-read at its own version H: its changes up to H are not applied twice."""
    engine.register_table("lv_a", ["id", "n"], [0], ["string", "int64"])
    engine.register_table("lv_b", ["id"], [0], ["string"])
    try:
        live = LiveQueries(engine).start()
        a = live.catalog.register({"table": "lv_a", "orderBy": [["id", "asc"]]})
        b = live.catalog.register({"table": "lv_b", "orderBy": [["id", "asc"]]})
        # Commits the catalog has not polled yet, on both tables.
        engine.write(lambda tx: tx.insert("lv_a", {"id": "a1", "n": 1}))
        engine.write(lambda tx: tx.insert("lv_b", {"id": "b1"}))
        with connection.cursor() as cursor:
            cursor.execute('ALTER TABLE "lv_a" ADD COLUMN "tag" TEXT')
        engine.register_existing_table("lv_a")
        live.catalog.destroy(a.key)
        live.reload_table("lv_a")
        engine.write(lambda tx: tx.update("lv_a", {"id": "a1"}, {"tag": "x"}))
        engine.write(lambda tx: tx.insert("lv_b", {"id": "b2"}))
        _version, outputs, _faults = poll(live)
        # lv_b's query saw both its adds, once each; lv_a holds the new shape.
        assert sorted(op["row"]["id"] for op in outputs[b.key] if op["op"] == "add") == [
            "b1",
            "b2",
        ]
        rows = live.catalog.store.scan("lv_a", (("id", "asc"),))
        assert list(rows) == [{"id": "a1", "n": 1, "tag": "x"}]
        a2 = live.catalog.register({"table": "lv_a", "orderBy": [["id", "asc"]]})
        assert [r["cols"] for r in live.catalog.snapshot(a2.key)] == fresh(live, a2)
        live.stop()
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE IF EXISTS "lv_a"')
            cursor.execute('DROP TABLE IF EXISTS "lv_b"')


def test_a_snapshot_during_an_open_transaction_does_not_wait_and_misses_nothing(engine, vendor):
    """
    Postgres: seq N's transaction is open while N+1 commits, and a catalog starts
    then. Its reads take no lock, so it answers at once, at the published watermark
    (below N: neither N nor N+1 is in its views yet); once N commits and the
    watermark passes it, the tail brings both, once each.
    """
    if vendor != "postgresql":
        pytest.skip("SQLite's write lock already commits seqs in order")
    with OpenTransaction(lambda: User.objects.create(id="u-late", name="late"), hold=10):
        User.objects.create(id="u-early", name="early")
        started = time.monotonic()
        live = LiveQueries(engine).start()
        assert time.monotonic() - started < 1.0, "the snapshot waited for the open transaction"
        users = live.catalog.register({"table": "user", "orderBy": [["id", "asc"]]})
        assert [r["id"] for r in users.view.rows()] == []
    deadline = time.monotonic() + 5
    while live.version < outbox_high_water() and time.monotonic() < deadline:
        poll(live)
    assert [r["id"] for r in users.view.rows()] == ["u-early", "u-late"]
    assert users.view.result() == fresh(live, users)
    assert live.version == outbox_high_water()
