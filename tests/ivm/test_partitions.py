"""
The live catalog's partition store (``ivm.partitions``): partitions read on demand,
corrected to the catalog's version while other writers run ahead of it, forgotten
past ``STORE_MAX_ROWS``, and never a whole table.

The oracle is the database itself: a query's view must equal the query re-run in a
fresh snapshot, at the catalog's version (recorded before the database moved on)
and again after the catalog catches up.
"""

import random
import threading

import pytest
from django.db import close_old_connections, connection
from django.test.utils import CaptureQueriesContext

from project.demo.models import Comment, Issue, User
from rindle_app.exceptions import ResnapshotRequired
from rindle_app.ivm import partitions
from rindle_app.ivm.ast import parse
from rindle_app.ivm.live import LiveQueries
from rindle_app.testing import fresh_result, outbox_high_water, publish_watermark
from tests.conftest import examples
from tests.stream.reader_support import prune
from tests.support.demo import create_issue, issue
from tests.support.wire import exists, rel, simple

pytestmark = pytest.mark.django_db(transaction=True)


def newest(limit=4, **extra):
    return {"table": "issue", "orderBy": [["createdAt", "desc"]], "limit": limit, **extra}


COMMENTS = rel(["id"], ["issueId"], {"table": "comment", "alias": "comments"})

QUERIES = {
    # A window over the whole table (paged from the database), with its subtrees.
    "newest": newest(
        related=[
            COMMENTS,
            rel(["id"], ["issueId"], {"table": "comment", "alias": "n", "aggregate": "count"}),
            rel(["ownerId"], ["id"], {"table": "user", "alias": "owner", "one": True}),
        ]
    ),
    # A guarded window (one partition, kept in order).
    "mine": {
        "table": "issue",
        "where": simple("ownerId", "=", "u1"),
        "orderBy": [["createdAt", "asc"]],
        "limit": 3,
    },
    # A row-local filter the page read narrows by, and an EXISTS it cannot.
    "open_with_comments": {
        "table": "issue",
        "where": {
            "type": "and",
            "conditions": [
                simple("status", "!=", "done"),
                exists(["id"], ["issueId"], {"table": "comment"}),
            ],
        },
        "orderBy": [["title", "asc"]],
        "limit": 3,
    },
    # A window that starts after a row (a second page): its run starts there too.
    "page_two": newest(3, start={"row": {"createdAt": 4.0, "id": "i3"}, "exclusive": True}),
    # A window over the child table, each row with its parent.
    "recent_comments": {
        "table": "comment",
        "orderBy": [["createdAt", "desc"]],
        "limit": 3,
        "related": [rel(["issueId"], ["id"], {"table": "issue", "alias": "issue", "one": True})],
    },
}


def seed(issues=10, comments=12):
    User.objects.bulk_create([User(id=f"u{n}", name=f"User {n}") for n in range(1, 4)])
    Issue.objects.bulk_create(
        [
            issue(f"i{n}", owner=f"u{1 + n % 3}", created=float(n % 7), title=f"Issue {n % 5}")
            for n in range(issues)
        ]
    )
    Comment.objects.bulk_create(
        [
            Comment(
                id=f"c{n}",
                issue_id=f"i{n % issues}",
                author_id="u1",
                body="x",
                created_at=float(n % 5),
            )
            for n in range(comments)
        ]
    )


def random_writes(rng, count, serial):
    """``count`` ORM writes, each its own commit: the outside writer the catalog trails."""
    for _ in range(count):
        serial[0] += 1
        n = serial[0]
        kind = rng.randrange(9)
        issue_id = f"i{rng.randrange(14)}"
        if kind == 0:
            Issue.objects.filter(id=issue_id).delete()
            create_issue(
                issue_id,
                owner=f"u{rng.randrange(1, 4)}",
                created=float(rng.randrange(9)),
                title=f"Issue {rng.randrange(5)}",
            )
        elif kind == 1:
            Issue.objects.filter(id=issue_id).update(created_at=float(rng.randrange(9)))
        elif kind == 2:
            Issue.objects.filter(id=issue_id).update(owner_id=f"u{rng.randrange(1, 4)}")
        elif kind == 3:
            Issue.objects.filter(id=issue_id).update(status=rng.choice(["todo", "done"]))
        elif kind == 4:
            Issue.objects.filter(id=issue_id).delete()
        elif kind == 5:
            Comment.objects.create(
                id=f"n{n}",
                issue_id=issue_id,
                author_id="u2",
                body="y",
                created_at=float(rng.randrange(6)),
            )
        elif kind == 6:
            Comment.objects.filter(id__in=list(_some_comment(rng))).update(issue_id=issue_id)
        elif kind == 7:
            Comment.objects.filter(id__in=list(_some_comment(rng))).delete()
        else:  # a primary key that changes: the old key leaves, the new one arrives
            Comment.objects.filter(id__in=list(_some_comment(rng))).update(id=f"m{n}")


def _some_comment(rng):
    ids = list(Comment.objects.order_by("id").values_list("id", flat=True)[:40])
    return [rng.choice(ids)] if ids else []


def results(live, shared):
    return {name: q.view.result() for name, q in shared.items()}


def fresh(live, shared):
    return {name: fresh_result(live.engine, q.query) for name, q in shared.items()}


def test_queries_read_behind_the_database_see_exactly_the_catalogs_version(engine):
    """
    The catalog stands at V while an outside writer commits past it: every partition
    and page read now (the store forgotten first) is corrected back to V, so each view
    equals the database as it was at V; after the catalog catches up, as it is now.
    """
    rng = random.Random(16)
    serial = [0]
    seed()
    publish_watermark()
    live = LiveQueries(engine).start()
    for _round in range(examples(6)):
        random_writes(rng, 6, serial)
        publish_watermark()
        live.poll()
        shared = {name: live.catalog.register(ast) for name, ast in QUERIES.items()}
        at_version = fresh(live, shared)  # nothing committed since the poll: this is V
        assert results(live, shared) == at_version

        random_writes(rng, 8, serial)  # the database moves on; the catalog does not poll
        for q in shared.values():
            live.catalog.destroy(q.key)
        live.catalog.store.clear()
        shared = {name: live.catalog.register(ast) for name, ast in QUERIES.items()}
        assert results(live, shared) == at_version

        publish_watermark()
        live.poll()
        assert results(live, shared) == fresh(live, shared)


def test_views_stay_exact_when_the_store_forgets_partitions(engine, settings):
    """
    With ``STORE_MAX_ROWS`` far below what the queries read, partitions are forgotten
    and read again at the version of that moment: every view still equals SQL after
    every commit, and the store never holds much more than the bound.
    """
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "STORE_MAX_ROWS": 6}
    rng = random.Random(61)
    serial = [0]
    seed(issues=14, comments=30)
    publish_watermark()
    live = LiveQueries(engine).start()
    assert live.catalog.store.max_rows == 6
    shared = {name: live.catalog.register(ast) for name, ast in QUERIES.items()}
    for _round in range(examples(12)):
        random_writes(rng, 3, serial)
        publish_watermark()
        live.poll()
        assert results(live, shared) == fresh(live, shared)
        # The bound, plus at most the partition being read when it was crossed.
        assert live.catalog.store.rows_held <= 6 + 30


def test_starting_reads_no_table_and_a_partition_holds_only_its_rows(engine):
    """
    A start reads the stream's state and no synced table; one issue's detail holds
    that issue and its comments, not the 300 issues and 900 comments of the tables.
    """
    seed(issues=300, comments=900)
    publish_watermark()
    with CaptureQueriesContext(connection) as reads:
        live = LiveQueries(engine).start()
    tables = ('"issue"', '"comment"', '"user"')
    assert not [q["sql"] for q in reads.captured_queries if any(t in q["sql"] for t in tables)]
    detail = {
        "table": "issue",
        "where": simple("id", "=", "i7"),
        "one": True,
        "orderBy": [["id", "asc"]],
        "related": [COMMENTS],
    }
    shared = live.catalog.register(detail)
    assert len(shared.view.result()["comments"]) == 3
    assert live.catalog.store.rows_held <= 1 + 3 + 1
    assert shared.view.result() == fresh_result(engine, shared.query)


def test_a_window_over_a_whole_table_holds_a_page_not_the_table(engine):
    """
    ``newest`` over 400 issues reads one page; deleting its rows refills it in order
    (from the page kept as its run, then from the database), still without the table.
    """
    seed(issues=400, comments=0)
    publish_watermark()
    live = LiveQueries(engine).start()
    shared = live.catalog.register(QUERIES["newest"])
    # One page (64 rows), counted in its run and again as each row's key partition
    # (the same row objects), and the owners it renders: far from the 400 rows.
    assert live.catalog.store.rows_held <= 3 * 64
    for round_ in range(6):
        shown = [row["id"] for row in shared.view.result()]
        Issue.objects.filter(id__in=shown[:2]).delete()
        # Rows past the run's last key: one arrives there, one moves there; neither may
        # join the run, or a refill past it would yield them out of order.
        create_issue(f"late{round_}", created=-1.0)
        Issue.objects.filter(id=f"i{300 + round_}").update(created_at=-2.0)
        # A block from the top, so the refills run through the run and past it.
        top = Issue.objects.order_by("-created_at", "id").values_list("id", flat=True)[:20]
        Issue.objects.filter(id__in=list(top)).delete()
        publish_watermark()
        live.poll()
        assert shared.view.result() == fresh_result(engine, shared.query)
    assert live.catalog.store.rows_held < 200


def test_a_read_below_the_horizon_asks_for_a_resnapshot(engine):
    """Changes above the catalog's version were pruned: no correction is possible, so it says so."""
    seed(issues=3, comments=0)
    publish_watermark()
    live = LiveQueries(engine).start()
    Issue.objects.filter(id="i1").update(created_at=99.0)
    publish_watermark()
    prune(outbox_high_water())
    with pytest.raises(ResnapshotRequired):
        live.catalog.register(QUERIES["newest"])


def test_an_outside_writer_running_throughout_leaves_every_view_exact(engine):
    """
    A thread writes without pause while the catalog polls, forgets its store and
    registers its queries again and again: when the writer stops and the catalog
    catches up, every view equals SQL.
    """
    seed()
    publish_watermark()
    live = LiveQueries(engine).start()
    stop = threading.Event()
    failures = []

    def writer():
        rng, serial = random.Random(7), [1000]
        try:
            while not stop.is_set():
                random_writes(rng, 1, serial)
        except Exception as exc:  # the test fails on it below
            failures.append(exc)
        finally:
            close_old_connections()

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        shared = {}
        for round_ in range(examples(20)):
            publish_watermark()
            live.poll()
            if round_ % 4 == 0:
                for q in shared.values():
                    live.catalog.destroy(q.key)
                live.catalog.store.clear()
            shared = {name: live.catalog.register(ast) for name, ast in QUERIES.items()}
    finally:
        stop.set()
        thread.join(30)
    assert not failures
    publish_watermark()
    live.poll()
    assert results(live, shared) == fresh(live, shared)


# --- reading ahead of the hub's lock (Catalog.read_ahead / install_ahead) ------------


def _parsed(live):
    return {name: parse(ast, live.catalog.schema) for name, ast in QUERIES.items()}


def _cold(live, shared):
    for q in shared.values():
        live.catalog.destroy(q.key)
    live.catalog.store.clear()


@pytest.mark.parametrize("mode", ["behind", "between", "past"])
def test_a_query_read_ahead_is_installed_at_exactly_the_catalogs_version(engine, mode):
    """
    Every query's partitions and pages are read WITHOUT the lock at the catalog's
    version V0, an outside writer commits, then they are installed and the queries
    registered at the catalog's version V of that moment: each view equals the
    database at V (recorded before the writer moved on again), and after the catalog
    catches up, the database now. ``behind``: V is V0, the reads saw commits above
    it (undone). ``between``: the catalog polled to a V the reads already hold
    (undone down to V, not V0). ``past``: the catalog polled past what the reads
    hold (the commits it applied meanwhile are applied over them).
    """
    rng = random.Random(f"ahead-{mode}")
    serial = [0]
    seed()
    publish_watermark()
    live = LiveQueries(engine).start()
    store = live.catalog.store
    parsed = _parsed(live)
    shared = {}
    for _round in range(examples(5)):
        random_writes(rng, 4, serial)
        publish_watermark()
        live.poll()
        _cold(live, shared)
        if mode == "behind":
            at_version = {n: fresh_result(engine, q) for n, q in parsed.items()}
            random_writes(rng, 6, serial)
            publish_watermark()
            aheads = {n: live.catalog.read_ahead(ast) for n, ast in QUERIES.items()}
        elif mode == "between":
            random_writes(rng, 6, serial)
            publish_watermark()
            aheads = {n: live.catalog.read_ahead(ast) for n, ast in QUERIES.items()}
            live.poll()
            at_version = {n: fresh_result(engine, q) for n, q in parsed.items()}
        else:
            aheads = {n: live.catalog.read_ahead(ast) for n, ast in QUERIES.items()}
            random_writes(rng, 6, serial)
            publish_watermark()
            live.poll()
            at_version = {n: fresh_result(engine, q) for n, q in parsed.items()}
        assert all(a.version < live.catalog.version for a in aheads.values()) == (mode != "behind")
        random_writes(rng, 6, serial)  # the database moves on; the catalog does not poll

        loads, exact = store.loads, []
        for name, ast in QUERIES.items():
            installed = live.catalog.install_ahead(aheads[name])
            assert installed.skipped == 0 and installed.installed > 0, name
            exact.append(installed.exact)  # registered as the walk built it: nothing moved
            shared[name] = live.catalog.register(ast)
        assert any(exact) == (mode == "behind")
        assert results(live, shared) == at_version
        reads_ahead = sum(a.scratch.loads for a in aheads.values())
        # Under the lock, at most what a view's rows at V need beyond those at V0.
        assert store.loads - loads - reads_ahead < reads_ahead

        publish_watermark()
        live.poll()
        assert results(live, shared) == fresh(live, shared)


def test_a_query_read_ahead_and_the_lock_read_the_same_when_nothing_moved(engine):
    """With no commit in between, installing a read ahead leaves nothing to read under the lock."""
    seed()
    publish_watermark()
    live = LiveQueries(engine).start()
    store = live.catalog.store
    for name, ast in QUERIES.items():
        ahead = live.catalog.read_ahead(ast)
        loads = store.loads
        live.catalog.install_ahead(ahead)
        assert store.loads == loads + ahead.scratch.loads
        shared = live.catalog.register(ast)
        assert store.loads == loads + ahead.scratch.loads, name
        assert shared.view.result() == fresh_result(engine, shared.query)


def test_a_read_ahead_that_cannot_be_brought_to_the_version_is_read_again(engine, monkeypatch):
    """
    The catalog moved past what a read ahead holds and the commits applied meanwhile
    were not all kept (more than the log holds), or the store was cleared: the read
    is left out, the locked build reads for itself, and the view is still exact.
    """
    monkeypatch.setattr(partitions, "_LOG_CHANGES", 1)
    rng, serial = random.Random(5), [0]
    seed()
    publish_watermark()
    live = LiveQueries(engine).start()
    ast = QUERIES["newest"]
    ahead = live.catalog.read_ahead(ast)
    for _commit in range(3):  # three commits: the log keeps only the last
        random_writes(rng, 1, serial)
        publish_watermark()
        live.poll()
    assert live.catalog.install_ahead(ahead).installed == 0
    shared = live.catalog.register(ast)
    assert shared.view.result() == fresh_result(engine, shared.query)

    live.catalog.destroy(shared.key)
    ahead = live.catalog.read_ahead(ast)
    live.catalog.store.clear()
    assert live.catalog.install_ahead(ahead).installed == 0
    shared = live.catalog.register(ast)
    assert shared.view.result() == fresh_result(engine, shared.query)
