"""POST /v1/sql/execute and /v1/sql/batch: reads, guarded writes, idempotency keys."""

import functools

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from rindle_app.engine.public_sql import protected
from rindle_app.testing import hold_writer, outbox_high_water, outbox_since
from tests.support.threads import run_at_once

from .conftest import ISSUE, error, issue, post, rows, state, token_client

EXECUTE = "/v1/sql/execute"
BATCH = "/v1/sql/batch"


def test_a_read_answers_columns_rows_and_tagged_values(engine, sql):
    """A read returns {columns, rows, counts}; a 64-bit integer beyond 2**53 stays exact."""
    big = {"$rindle": "i64", "value": "9007199254740993"}
    response = post(
        sql,
        EXECUTE,
        {"statement": {"sql": "SELECT ? AS big, :s AS s", "args": {"s": "x"}}},
    )
    assert response.status_code == 400  # ? and :name mixed
    response = post(
        sql, EXECUTE, {"statement": {"sql": "SELECT ? AS big, ? AS s", "args": [big, "x"]}}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert [c["name"] for c in body["result"]["columns"]] == ["big", "s"]
    assert body["result"]["rows"] == [[big, "x"]]
    assert body["result"]["rows_read"] == 1 and body["result"]["rows_affected"] == 0
    assert body["cv"] is None and body["commit_cursor"] is None


def test_a_read_never_waits_for_the_writer(engine, sql):
    """Reads run on a read-only connection: they answer while the writer is busy."""
    post(sql, EXECUTE, {"statement": issue("i1")})
    with hold_writer(engine):
        response = post(sql, EXECUTE, {"statement": "SELECT id FROM issue"})
        assert response.status_code == 200, response.content
        assert response.json()["result"]["rows"] == [["i1"]]


def test_a_write_commits_once_is_captured_and_answers_its_cursor(engine, sql):
    """A write applies on the writer; its change reaches the outbox; cv covers it."""
    before = outbox_high_water()
    response = post(sql, EXECUTE, {"statement": issue("i1", "First")})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["result"]["rows_affected"] == 1 == body["result"]["rows_written"]
    assert rows("SELECT id, title FROM issue") == [("i1", "First")]
    events = outbox_since(before)
    assert [(e["table"], e["op"], e["pk"]) for e in events] == [("issue", "add", ["i1"])]
    assert body["cv"] >= events[-1]["seq"]
    assert body["commit_cursor"] == f"w:{body['cv']:016x}"


def test_named_args_returning_and_want_rows(engine, sql):
    post(sql, EXECUTE, {"statement": issue("i1")})
    statement = {
        "sql": "UPDATE issue SET title = :title WHERE id = :id RETURNING id, title",
        "args": {"id": "i1", "title": "it's 100% done"},
    }
    body = post(sql, EXECUTE, {"statement": statement}).json()
    assert body["result"]["rows"] == [["i1", "it's 100% done"]]
    assert body["result"]["rows_affected"] == 1
    quiet = {**statement, "args": {"id": "i1", "title": "again"}, "want_rows": False}
    body = post(sql, EXECUTE, {"statement": quiet}).json()
    assert body["result"]["rows"] == [] and body["result"]["rows_affected"] == 1
    assert rows("SELECT title FROM issue") == [("again",)]


def test_a_batch_is_all_or_nothing(engine, sql):
    """A failing statement rolls back the whole batch and names its index."""
    before = state()
    response = post(sql, BATCH, {"statements": [issue("i1"), issue("i2"), issue("i1")]})
    err = error(response, 409, "CONSTRAINT_VIOLATION")
    assert err["statement_index"] == 2 and err["transaction_state"] == "closed"
    assert state() == before
    response = post(sql, BATCH, {"statements": [issue("i1"), "SELECT count(*) FROM issue"]})
    assert response.status_code == 200, response.content
    assert response.json()["results"][1]["rows"] == [[1]]  # reads see earlier writes


def _bad_requests(vendor):
    forbidden_cte = (
        'WITH gone AS (DELETE FROM "user" RETURNING id) SELECT id FROM gone',
        ("WRITE_FORBIDDEN", 403) if vendor == "postgresql" else ("SQL_ERROR", 400),
    )
    return [
        # (url, body, code, status)
        (EXECUTE, "[1, 2]", "PROTOCOL_ERROR", 400),
        (EXECUTE, "{not json", "PROTOCOL_ERROR", 400),
        (EXECUTE, {}, "PROTOCOL_ERROR", 400),
        (EXECUTE, {"statement": issue("i9"), "surprise": 1}, "PROTOCOL_ERROR", 400),
        (EXECUTE, {"statement": {"sql": "  "}}, "PROTOCOL_ERROR", 400),
        (EXECUTE, {"statement": {"sql": ISSUE, "params": ["i9", "t"]}}, "PROTOCOL_ERROR", 400),
        (EXECUTE, {"statement": {"sql": ISSUE, "args": ["i9"]}}, "PROTOCOL_ERROR", 400),
        (EXECUTE, {"statement": {"sql": ISSUE, "args": {"a": 1}}}, "PROTOCOL_ERROR", 400),
        (
            EXECUTE,
            {"statement": {"sql": ISSUE + "; DELETE FROM issue", "args": ["i9", "t"]}},
            "PROTOCOL_ERROR",
            400,
        ),
        (
            EXECUTE,
            {"statement": {"sql": ISSUE, "args": ["i9", {"x": 1}]}},
            "VALUE_UNSUPPORTED",
            400,
        ),
        (
            EXECUTE,
            {"statement": {"sql": ISSUE, "args": ["i9", {"$rindle": "i64", "value": "1e99"}]}},
            "VALUE_UNSUPPORTED",
            400,
        ),
        (EXECUTE, {"statement": issue("i9"), "idempotency_key": ""}, "PROTOCOL_ERROR", 400),
        (EXECUTE, {"statement": issue("i9"), "consistency": "psychic"}, "PROTOCOL_ERROR", 400),
        (EXECUTE, {"statement": "DROP TABLE issue"}, "DDL_FORBIDDEN", 400),
        (EXECUTE, {"statement": "CREATE TABLE x (a int)"}, "DDL_FORBIDDEN", 400),
        (EXECUTE, {"statement": "BEGIN"}, "STATEMENT_UNSUPPORTED", 400),
        (EXECUTE, {"statement": "PRAGMA foreign_keys = OFF"}, "STATEMENT_UNSUPPORTED", 400),
        (EXECUTE, {"statement": "EXPLAIN ANALYZE DELETE FROM issue"}, "STATEMENT_UNSUPPORTED", 400),
        (EXECUTE, {"statement": "INSERT INTO issue VALUES ("}, "SQL_ERROR", 400),
        (EXECUTE, {"statement": "SELECT * FROM no_such_table"}, "SQL_ERROR", 400),
        (EXECUTE, {"statement": 'DELETE FROM "user"'}, "WRITE_FORBIDDEN", 403),
        (
            EXECUTE,
            {"statement": "DELETE FROM _rindle_client_mutations"},
            "WRITE_FORBIDDEN",
            403,
        ),
        (EXECUTE, {"statement": "DELETE FROM _rindle_sql_outcomes"}, "WRITE_FORBIDDEN", 403),
        (EXECUTE, {"statement": "UPDATE auth_user SET first_name = 'x'"}, "WRITE_FORBIDDEN", 403),
        (EXECUTE, {"statement": "SELECT password FROM auth_user"}, "READ_FORBIDDEN", 403),
        (EXECUTE, {"statement": forbidden_cte[0]}, *forbidden_cte[1]),
        (BATCH, {"statements": []}, "PROTOCOL_ERROR", 400),
        (BATCH, {"statements": "SELECT 1"}, "PROTOCOL_ERROR", 400),
        (BATCH, {"statements": [issue("i9"), 'DELETE FROM "user"']}, "WRITE_FORBIDDEN", 403),
        (BATCH, {"statements": [issue("i9"), "DROP TABLE issue"]}, "DDL_FORBIDDEN", 400),
    ]


def test_postgres_system_catalogs_and_server_functions_are_out_of_reach(engine, sql, vendor):
    """Password hashes in pg_authid, server files, and SQL run from text are refused."""
    if vendor != "postgresql":
        pytest.skip("SQLite's authorizer sees every table a statement reads")
    cases = [
        ("SELECT rolpassword FROM pg_authid", "READ_FORBIDDEN"),
        ("SELECT pg_read_file('/etc/hostname')", "FUNCTION_FORBIDDEN"),
        ("SELECT * FROM pg_ls_dir('.')", "FUNCTION_FORBIDDEN"),
        # SQL run from text runs as the sandbox role: the database refuses the table.
        ("SELECT query_to_xml('select password from auth_user', true, true, '')", "READ_FORBIDDEN"),
        ("SELECT set_config('search_path', 'pg_catalog', false)", "FUNCTION_FORBIDDEN"),
        ("SELECT set_config('role', 'none', true)", "FUNCTION_FORBIDDEN"),
    ]
    before = state()
    for statement, code in cases:
        error(post(sql, EXECUTE, {"statement": statement}), 403, code)
    assert state() == before
    ok = post(sql, EXECUTE, {"statement": "SELECT count(*) FROM issue"})
    assert ok.status_code == 200, ok.content
    # The same function over a granted table answers: the boundary is the grants.
    xml = "SELECT query_to_xml('select id from issue', true, true, '')::text"
    assert post(sql, EXECUTE, {"statement": xml}).status_code == 200
    # The catalogs PostgreSQL shows to every role show no protected table to this one.
    names = post(sql, EXECUTE, {"statement": "SELECT table_name FROM information_schema.tables"})
    assert names.status_code == 200, names.content
    shown = {row[0] for row in names.json()["result"]["rows"]}
    assert "issue" in shown and not {t for t in shown if protected(t)}, shown


def test_bad_input_is_refused_with_a_code_and_writes_nothing(engine, sql, vendor):
    """Every malformed, forbidden or failing request gets its 4xx and changes nothing."""
    post(sql, EXECUTE, {"statement": issue("i1")})
    post(sql, EXECUTE, {"statement": issue("i2"), "idempotency_key": "seen"})
    before = state()
    for url, body, code, status in _bad_requests(vendor):
        response = post(sql, url, body)
        assert response.status_code == status, (body, response.content)
        error(response, status, code)
        assert state() == before, body
    with override_settings(RINDLE={"SQL_MAX_STATEMENTS": 2}):
        error(
            post(sql, BATCH, {"statements": [issue("a"), issue("b"), issue("c")]}),
            400,
            "PROTOCOL_ERROR",
        )
    assert state() == before


def test_a_write_reached_through_a_trigger_is_checked_too(engine, sql, vendor):
    """A trigger writing a table the caller may not write refuses the statement."""
    if vendor == "sqlite":
        create = [
            "CREATE TRIGGER sneaky AFTER INSERT ON issue BEGIN "
            "INSERT INTO \"user\" (id, name) VALUES (NEW.id, 'sneaky'); END"
        ]
        drop = ["DROP TRIGGER sneaky"]
    else:
        create = [
            "CREATE FUNCTION sneaky() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO \"user\" (id, name) VALUES (NEW.id, 'sneaky'); RETURN NULL; END $$",
            "CREATE TRIGGER sneaky AFTER INSERT ON issue FOR EACH ROW EXECUTE FUNCTION sneaky()",
        ]
        drop = ["DROP TRIGGER sneaky ON issue", "DROP FUNCTION sneaky()"]
    with connection.cursor() as cursor:
        for statement in create:
            cursor.execute(statement)
    try:
        before = state()
        error(post(sql, EXECUTE, {"statement": issue("i1")}), 403, "WRITE_FORBIDDEN")
        assert state() == before
        allowed = token_client(sql.token.user, "sql", tables=["issue", "user"])
        assert post(allowed, EXECUTE, {"statement": issue("i1")}).status_code == 200
        assert rows('SELECT id, name FROM "user"') == [("i1", "sneaky")]
    finally:
        with connection.cursor() as cursor:
            for statement in drop:
                cursor.execute(statement)


def test_only_sql_tokens_and_staff_get_in(engine, alice, client):
    """No token, a token without the sql scope, or a plain session: refused."""
    before = state()
    body = {"statement": issue("i1")}
    assert post(client, EXECUTE, body).status_code in (401, 403)
    read_token = token_client(alice, "read", "mutate", tables=["issue"])
    error(post(read_token, EXECUTE, body), 403, "insufficient_scope")
    client.force_login(alice)
    assert post(client, EXECUTE, body).status_code == 403
    assert state() == before
    alice.is_staff = True
    alice.save()
    # A staff session may read, but writes nothing unless the adapter says so.
    assert post(client, EXECUTE, {"statement": "SELECT 1"}).status_code == 200
    error(post(client, EXECUTE, body), 403, "WRITE_FORBIDDEN")
    assert state() == before


def test_an_idempotency_key_replays_the_stored_answer(engine, sql):
    """A retry with the same key and request gets the same answer; nothing runs twice."""
    body = {"statements": [issue("i1"), "SELECT id FROM issue"], "idempotency_key": "k-1"}
    first = post(sql, BATCH, body)
    assert first.status_code == 200, first.content
    assert "Rindle-Outcome" not in first
    after_first = state()
    retry = post(sql, BATCH, body)
    assert retry.status_code == 200 and retry["Rindle-Outcome"] == "replayed"
    assert retry.json() == first.json()
    assert state() == after_first  # no second insert, no new outbox row
    err = error(
        post(sql, BATCH, {**body, "statements": [issue("i2")]}), 409, "IDEMPOTENCY_KEY_REUSED"
    )
    assert err["retry_scope"] == "never"
    assert state() == after_first
    # Keys are per caller: another token's k-1 is its own.
    other = token_client(sql.token.user, "sql", tables=["issue"])
    assert post(other, BATCH, {**body, "statements": [issue("i2")]}).status_code == 200


def test_a_failed_request_stores_no_outcome(engine, sql):
    """A failure writes nothing, its outcome included: the retry runs for real."""
    post(sql, EXECUTE, {"statement": issue("i1")})
    body = {"statement": issue("i1"), "idempotency_key": "k-dup"}
    error(post(sql, EXECUTE, body), 409, "CONSTRAINT_VIOLATION")
    assert rows("SELECT count(*) FROM _rindle_sql_outcomes") == [(0,)]
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM issue")
    assert post(sql, EXECUTE, body).status_code == 200
    assert rows("SELECT id FROM issue") == [("i1",)]


@override_settings(RINDLE={"SQL_OUTCOME_MAX_BYTES": 1500})
def test_a_large_answer_is_kept_with_its_rows_elided(engine, sql):
    """The stored outcome is bounded: a replay keeps counts and cursor, drops rows."""
    statements = [issue(f"i{n}", "x" * 400) for n in range(5)]
    statements.append("SELECT id, title FROM issue ORDER BY id")
    body = {"statements": statements, "idempotency_key": "big"}
    first = post(sql, BATCH, body).json()
    assert len(first["results"][-1]["rows"]) == 5
    (stored,) = rows("SELECT result FROM _rindle_sql_outcomes")
    assert len(stored[0].encode()) <= 1500
    replay = post(sql, BATCH, body).json()
    assert replay["results_elided"] is True
    assert replay["cv"] == first["cv"]
    assert [r["rows_affected"] for r in replay["results"]] == [1] * 5 + [0]
    assert all(r["rows"] is None and r["rows_elided"] for r in replay["results"])
    assert rows("SELECT count(*) FROM issue") == [(5,)]


@pytest.mark.parametrize("value", ["Infinity", "-Infinity"])
def test_non_finite_floats_travel_tagged(engine, sql, value):
    """JSON has no infinities: they go in and come out as tagged floats."""
    tagged = {"$rindle": "float", "value": value}
    statement = {"sql": "SELECT ? AS f", "args": [tagged]}
    body = post(sql, EXECUTE, {"statement": statement}).json()
    assert body["result"]["rows"] == [[tagged]]


def test_the_token_command_grants_tables(engine, alice):
    """``rindle_token_create --table`` sets the tables the token may write."""
    import io

    from django.core.management import call_command

    from rindle_app.models import RindleToken

    out = io.StringIO()
    call_command(
        "rindle_token_create",
        "--user",
        "alice",
        "--scope",
        "sql",
        "--table",
        "issue",
        "--table",
        "tag",
        stdout=out,
        stderr=io.StringIO(),
    )
    token = RindleToken.objects.get()
    assert token.tables == ["issue", "tag"] and token.scopes == ["sql"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {out.getvalue().strip()}")
    assert post(client, EXECUTE, {"statement": issue("i1")}).status_code == 200
    error(post(client, EXECUTE, {"statement": 'DELETE FROM "user"'}), 403, "WRITE_FORBIDDEN")


def test_racing_retries_of_one_key_apply_once(engine, sql):
    """Two copies of a keyed request at once: the writer lets one run, the other replays."""
    import threading

    from django.db import connections

    body = {"statements": [issue("i1"), issue("i2")], "idempotency_key": "race"}
    clients = [APIClient() for _ in range(2)]
    for c in clients:  # the same caller, twice
        c.credentials(HTTP_AUTHORIZATION=f"Bearer {sql.raw_token}")
    barrier = threading.Barrier(2)
    answers = []

    def send(client):
        barrier.wait()
        try:
            answers.append(post(client, BATCH, body))
        finally:
            connections.close_all()

    run_at_once([functools.partial(send, c) for c in clients])
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json() == answers[1].json()
    assert rows("SELECT id FROM issue ORDER BY id") == [("i1",), ("i2",)]
    assert rows("SELECT count(*) FROM _rindle_sql_outcomes") == [(1,)]
