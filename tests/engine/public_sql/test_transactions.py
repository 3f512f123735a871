"""Interactive transactions: buffered on the server, validated and applied at commit."""

import time

from django.db import connection
from django.test import override_settings

from rindle_app.engine import shutdown
from rindle_app.testing import outbox_high_water, outbox_since
from tests.support.threads import run_at_once

from .conftest import error, issue, post, rows, state, token_client

BEGIN = "/v1/sql/transactions"


def url(tid, op):
    return f"/v1/sql/transactions/{tid}/{op}"


def begin(client, **body):
    response = post(client, BEGIN, body)
    assert response.status_code == 200, response.content
    return response.json()["transaction_id"]


def run(client, tid, op, *statements):
    return post(client, url(tid, "execute"), {"operation_id": op, "statements": list(statements)})


def test_writes_apply_at_commit_and_reads_see_them_before(engine, sql):
    """Inside the transaction a read sees its writes; others see nothing until commit."""
    tid = begin(sql)
    assert run(sql, tid, "1", issue("i1")).status_code == 200
    seen = run(sql, tid, "2", "SELECT id FROM issue").json()["results"][0]["rows"]
    assert seen == [["i1"]]
    assert rows("SELECT id FROM issue") == []  # nothing applied, the writer is free
    before = outbox_high_water()
    response = post(sql, url(tid, "commit"), {"operation_id": "3"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["committed"] is True and body["results"][1]["rows"] == [["i1"]]
    assert rows("SELECT id FROM issue") == [("i1",)]
    events = outbox_since(before)
    assert [(e["table"], e["op"]) for e in events] == [("issue", "add")]  # live subscribers
    assert body["cv"] >= events[-1]["seq"]


def test_a_retried_commit_whose_answer_was_lost_replays_it(engine, sql):
    """Commit, lose the answer, commit again with the same operation id: same outcome, once."""
    tid = begin(sql)
    run(sql, tid, "1", issue("i1"), issue("i2"))
    first = post(sql, url(tid, "commit"), {"operation_id": "2"})  # the answer is "lost"
    assert first.status_code == 200
    after = state()
    retry = post(sql, url(tid, "commit"), {"operation_id": "2"})
    assert retry.status_code == 200 and retry["Rindle-Outcome"] == "replayed"
    assert retry.json() == first.json()
    assert state() == after
    assert rows("SELECT count(*) FROM issue") == [(2,)]
    # Another operation on a committed transaction: closed, never re-run.
    err = error(post(sql, url(tid, "commit"), {"operation_id": "3"}), 409, "TRANSACTION_CLOSED")
    assert err["transaction_state"] == "closed" and err["retry_scope"] == "never"
    error(run(sql, tid, "4", issue("i3")), 409, "TRANSACTION_CLOSED")
    error(post(sql, url(tid, "rollback"), {"operation_id": "5"}), 409, "TRANSACTION_CLOSED")
    assert state() == after


def test_the_outcome_outlives_the_process_that_committed(engine, sql):
    """A retry reaching a restarted server still replays the commit from the database."""
    tid = begin(sql)
    run(sql, tid, "1", issue("i1"))
    first = post(sql, url(tid, "commit"), {"operation_id": "c"}).json()
    shutdown()  # the open-transaction registry is gone with the engine
    after = state()
    retry = post(sql, url(tid, "commit"), {"operation_id": "c"})
    assert retry.status_code == 200, retry.content
    assert retry.json() == first and retry["Rindle-Outcome"] == "replayed"
    error(post(sql, url(tid, "commit"), {"operation_id": "other"}), 409, "TRANSACTION_CLOSED")
    # The outcome is the caller's: another token learns nothing about it.
    stranger = token_client(sql.token.user, "sql", tables=["issue"])
    error(post(stranger, url(tid, "commit"), {"operation_id": "c"}), 404, "TRANSACTION_EXPIRED")
    assert state() == after


def test_a_commit_whose_reads_changed_conflicts_and_applies_nothing(engine, sql):
    """The commit re-runs every statement; a different answer aborts it all."""
    post(sql, "/v1/sql/execute", {"statement": issue("i1", "old")})
    tid = begin(sql)
    assert run(sql, tid, "1", "SELECT title FROM issue").json()["results"][0]["rows"] == [["old"]]
    run(sql, tid, "2", issue("i2"))
    with connection.cursor() as cursor:  # someone else writes meanwhile
        cursor.execute("UPDATE issue SET title = 'new' WHERE id = 'i1'")
    before = state()
    err = error(post(sql, url(tid, "commit"), {"operation_id": "3"}), 409, "TRANSACTION_CONFLICT")
    assert err["retry_scope"] == "closure" and err["transaction_state"] == "closed"
    assert err["statement_index"] == 0
    assert state() == before
    # The same failed outcome again for the same operation; the transaction is over.
    error(post(sql, url(tid, "commit"), {"operation_id": "3"}), 409, "TRANSACTION_CONFLICT")
    error(run(sql, tid, "4", "SELECT 1"), 409, "TRANSACTION_CLOSED")


def test_a_write_whose_effect_changed_conflicts_at_the_next_statement(engine, sql):
    """An update that now matches other rows no longer holds: TRANSACTION_CONFLICT."""
    tid = begin(sql)
    run(sql, tid, "1", issue("i1"))
    assert (
        run(sql, tid, "2", "UPDATE issue SET status = 'done'").json()["results"][0]["rows_affected"]
        == 1
    )
    with connection.cursor() as cursor:
        cursor.execute(
            'INSERT INTO issue (id, title, status, priority, "ownerId", "createdAt", '
            "\"updatedAt\") VALUES ('x', 'x', 'todo', 'low', 'bob', 1, 1)"
        )
    before = state()
    error(run(sql, tid, "3", "SELECT 1"), 409, "TRANSACTION_CONFLICT")
    assert state() == before


def test_an_executed_operation_is_replayed_not_run_again(engine, sql):
    """A retried execute (same operation id) answers again without buffering twice."""
    tid = begin(sql)
    first = run(sql, tid, "1", issue("i1"))
    retry = run(sql, tid, "1", issue("i1"))
    assert retry.json() == first.json() and retry["Rindle-Outcome"] == "replayed"
    error(run(sql, tid, "1", issue("i2")), 409, "OPERATION_ID_REUSED")
    assert post(sql, url(tid, "commit"), {"operation_id": "2"}).status_code == 200
    assert rows("SELECT id FROM issue") == [("i1",)]


def test_rollback_applies_nothing_and_closes(engine, sql):
    tid = begin(sql)
    run(sql, tid, "1", issue("i1"))
    before = state()
    response = post(sql, url(tid, "rollback"), {"operation_id": "2"})
    assert response.json() == {"rolled_back": True}
    assert post(sql, url(tid, "rollback"), {"operation_id": "2"}).json() == {"rolled_back": True}
    error(post(sql, url(tid, "commit"), {"operation_id": "3"}), 409, "TRANSACTION_CLOSED")
    assert state() == before


def test_an_idle_transaction_expires(engine, sql):
    with override_settings(RINDLE={"SQL_TRANSACTION_IDLE_SECONDS": 0.2}):
        tid = begin(sql)
        run(sql, tid, "1", issue("i1"))
        time.sleep(0.4)
        before = state()
        err = error(
            post(sql, url(tid, "commit"), {"operation_id": "2"}), 404, "TRANSACTION_EXPIRED"
        )
        assert err["retry_scope"] == "closure"
        assert state() == before


def test_a_read_only_transaction_refuses_writes_and_stays_open(engine, sql):
    tid = begin(sql, read_only=True)
    before = state()
    err = error(run(sql, tid, "1", "SELECT 1", issue("i1")), 400, "TRANSACTION_READ_ONLY")
    assert err["statement_index"] == 1 and err["transaction_state"] == "open"
    assert run(sql, tid, "2", "SELECT count(*) FROM issue").json()["results"][0]["rows"] == [[0]]
    assert post(sql, url(tid, "commit"), {"operation_id": "3"}).json()["committed"] is True
    assert state() == before


def test_open_transactions_are_bounded(engine, sql):
    """Too many open transactions, or too many buffered bytes: clear errors, nothing kept."""
    with override_settings(
        RINDLE={"SQL_TRANSACTIONS_MAX_OPEN": 2, "SQL_TRANSACTION_MAX_BYTES": 2000}
    ):
        tid = begin(sql)
        begin(sql)
        err = error(post(sql, BEGIN, {}), 503, "TOO_MANY_TRANSACTIONS")
        assert err["retry_scope"] == "request"
        big = issue("i1", "x" * 3000)
        err = error(run(sql, tid, "1", big), 400, "TRANSACTION_TOO_LARGE")
        assert err["transaction_state"] == "open"
        assert run(sql, tid, "2", issue("i2")).status_code == 200
        assert post(sql, url(tid, "commit"), {"operation_id": "3"}).status_code == 200
        assert rows("SELECT id FROM issue") == [("i2",)]


def test_bad_transaction_requests_are_refused_and_write_nothing(engine, sql):
    tid = begin(sql)
    run(sql, tid, "1", issue("i1"))
    before = state()
    cases = [
        (BEGIN, {"isolation": "chaos"}, 400, "PROTOCOL_ERROR"),
        (BEGIN, {"read_only": "yes"}, 400, "PROTOCOL_ERROR"),
        (url(tid, "execute"), {"statements": ["SELECT 1"]}, 400, "PROTOCOL_ERROR"),
        (url(tid, "execute"), {"operation_id": "9"}, 400, "PROTOCOL_ERROR"),
        (url(tid, "execute"), {"operation_id": "", "statement": "SELECT 1"}, 400, "PROTOCOL_ERROR"),
        (
            url(tid, "execute"),
            {"operation_id": "9", "statement": "DROP TABLE issue"},
            400,
            "DDL_FORBIDDEN",
        ),
        (
            url(tid, "execute"),
            {"operation_id": "10", "statement": 'DELETE FROM "user"'},
            403,
            "WRITE_FORBIDDEN",
        ),
        (
            url("tx_" + "0" * 32, "execute"),
            {"operation_id": "1", "statement": "SELECT 1"},
            404,
            "TRANSACTION_EXPIRED",
        ),
        (url("nope", "commit"), {"operation_id": "1"}, 400, "PROTOCOL_ERROR"),
        (url("tx_" + "0" * 32, "commit"), {"operation_id": "1"}, 404, "TRANSACTION_EXPIRED"),
        (url(tid, "commit"), {"operation_id": ["x"]}, 400, "PROTOCOL_ERROR"),
    ]
    for path, body, status, code in cases:
        err = error(post(sql, path, body), status, code)
        assert state() == before, (path, body)
    # A statement error inside leaves the transaction open, unchanged.
    err = error(run(sql, tid, "11", issue("i1")), 409, "CONSTRAINT_VIOLATION")
    assert err["transaction_state"] == "open" and err["statement_index"] == 0
    # Another caller cannot see or touch the transaction.
    stranger = token_client(sql.token.user, "sql", tables=["issue"])
    error(run(stranger, tid, "12", "SELECT 1"), 404, "TRANSACTION_EXPIRED")
    error(post(stranger, url(tid, "commit"), {"operation_id": "12"}), 404, "TRANSACTION_EXPIRED")
    assert state() == before
    assert post(sql, url(tid, "commit"), {"operation_id": "13"}).status_code == 200
    assert rows("SELECT id FROM issue") == [("i1",)]


def test_racing_commits_of_one_transaction_apply_once(engine, sql):
    """The commit and its impatient retry at the same moment: one outcome, applied once."""
    import threading

    from django.db import connections
    from rest_framework.test import APIClient

    tid = begin(sql)
    run(sql, tid, "1", issue("i1"))
    barrier = threading.Barrier(2)
    answers = []

    def commit():
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {sql.raw_token}")
        barrier.wait()
        try:
            answers.append(post(client, url(tid, "commit"), {"operation_id": "2"}))
        finally:
            connections.close_all()

    run_at_once([commit, commit])
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json()
    assert rows("SELECT id FROM issue") == [("i1",)]
