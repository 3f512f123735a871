"""
A fleet on PostgreSQL: two Daphne processes with the Redis channel layer, each
tailing the outbox up to the published watermark, judged by the published clients
(``tests/judges``: every view must equal the SQL oracle). Clients on each server see
the others' writes; a server killed with SIGKILL mid-stream loses no committed write
for the survivor's clients.
"""

import signal

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from project.demo.models import Comment, Issue
from tests.e2e.judges.test_published_clients import (
    FLAT,
    Judge,
    Run,
    Server,
    free_port,
    node_or_skip,
    seed,
    session_cookie,
)

from .reader_support import postgres_only

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = ("page", "detail", "recent", "users", "tags")


@pytest.fixture
def fleet(engine, tmp_path, redis_url):
    """Two Daphne servers on this test's database and Redis, a judge on each."""
    postgres_only()
    node = node_or_skip()
    seed()
    ada = get_user_model().objects.create_user("ada")
    started, runs = [], []
    try:
        for name in ("a", "b"):
            server = Server(free_port(), tmp_path / f"daphne-{name}.log", REDIS_URL=redis_url)
            started.append(server)
            server.start()
            judge = Judge(
                node,
                server.port,
                tmp_path / f"judge-{name}.stderr",
                user="ada",
                cookie=session_cookie(ada),
                flat=FLAT,
                client=f"fleet-{name}",
            )
            started.append(judge)
            run = Run(judge, server, engine, ada)
            for key in KEYS:
                run.subscribe(key)
            runs.append(run)
        yield runs
    finally:
        for process in reversed(started):
            if isinstance(process, Judge):
                process.close()
            else:
                process.stop()


def test_clients_on_each_server_see_the_others_writes_and_a_killed_server_loses_none(fleet):
    """
    A mutation through either server and an ORM write from a third process reach the
    clients of both; then server A is killed (SIGKILL) while its client pushes a burst
    and ORM writes go on: every committed write reaches B's clients, whose views
    equal SQL, and B keeps serving new writes.
    """
    a, b = fleet
    for run in fleet:
        run.settle("hydrate")
    mid = a.judge.call("mutate", name="setStatus", args={"id": "i1", "status": "done"})["mid"]
    a.settle("a's mutation on a", until=a.confirmed(mid))
    b.settle("a's mutation on b")
    args = {"id": "c-b", "issueId": "i1", "body": "from b", "createdAt": 50}
    mid = b.judge.call("mutate", name="addComment", args=args)["mid"]
    b.settle("b's mutation on b", until=b.confirmed(mid))
    a.settle("b's mutation on a")
    Issue.objects.filter(id="i2").update(title="renamed by the ORM", updated_at=60.0)
    for run in fleet:
        run.settle("an ORM write on both")

    # A burst through A, and A dies in the middle of it.
    for n in range(8):
        body = {"id": f"c-a{n}", "issueId": "i3", "body": f"burst {n}", "createdAt": 70 + n}
        a.judge.call("mutate", name="addComment", args=body)
        if n == 4:
            a.server.stop(signal.SIGKILL)
        Comment.objects.create(
            id=f"c-orm{n}", issue_id="i2", author_id="bob", body=f"orm {n}", created_at=80 + n
        )
    b.settle("after A was killed: every committed write on b", timeout=15)
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM comment WHERE id LIKE 'c-orm%%'")
        assert cursor.fetchone()[0] == 8
    Issue.objects.filter(id="i4").update(title="after the kill", updated_at=90.0)
    b.settle("b serves writes after the kill")
    log = b.server.log(tail=None)
    assert "Traceback" not in log, log[-4000:]
