"""The PostgreSQL sandbox of public SQL: its role's grants, its budgets, its setup."""

import time

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.core.management import call_command
from django.db import connection
from django.test import override_settings

from rindle_app.checks import check_sql_sandbox
from rindle_app.engine.public_sql import sandbox

from .conftest import create_issue_args, error, issue, post, rows, state, token_client

EXECUTE = "/v1/sql/execute"
BATCH = "/v1/sql/batch"
BEGIN = "/v1/sql/transactions"
MUTATE = "/api/rindle/mutate"

# SQL run from text by the function itself, where a plan check cannot see it.
TS_STAT = (
    "SELECT word FROM ts_stat('SELECT to_tsvector(''simple'', session_key) FROM django_session')"
)
TS_REWRITE = (
    "SELECT ts_rewrite(to_tsquery('simple', 'x'), "
    "'SELECT to_tsquery(''simple'', ''x''), to_tsquery(''simple'', username) FROM auth_user')::text"
)
# Three ways round a billion-row cross product: far past any budget.
CROSS = (
    "SELECT count(*) FROM generate_series(1, 2000) a, generate_series(1, 2000) b, "
    "generate_series(1, 2000) c"
)
CROSS_INSERT = (
    'INSERT INTO issue (id, title, status, priority, "ownerId", "createdAt", "updatedAt") '
    "SELECT a || '-' || b || '-' || c, 't', 'todo', 'high', 'alice', 1.5, 1.5 "
    "FROM generate_series(1, 2000) a, generate_series(1, 2000) b, generate_series(1, 2000) c "
    "WHERE a + b + c < 0"
)


@pytest.fixture
def pg(vendor):
    if vendor != "postgresql":
        pytest.skip("the database role sandbox is PostgreSQL's (SQLite has its authorizer)")


@pytest.fixture
def secrets(alice):
    """A session in django_session: what the SQL-text functions used to hand out."""
    store = SessionStore()
    store["uid"] = alice.pk
    store.create()
    return store.session_key


def begin(client):
    response = post(client, BEGIN, {})
    assert response.status_code == 200, response.content
    return response.json()["transaction_id"]


def in_txn(client, txn, op, statement):
    body = {"operation_id": op, "statement": statement}
    return post(client, f"{BEGIN}/{txn}/execute", body)


def test_sql_text_functions_read_with_the_sandbox_role(engine, sql, pg, secrets):
    """ts_stat and ts_rewrite over django_session and auth_user are refused, everywhere."""
    before = state()
    for statement in (TS_STAT, TS_REWRITE):
        response = post(sql, EXECUTE, {"statement": statement})
        assert secrets.encode() not in response.content and b"alice" not in response.content
        error(response, 403, "READ_FORBIDDEN")
        error(post(sql, BATCH, {"statements": [issue("i1"), statement]}), 403, "READ_FORBIDDEN")
    # In an interactive transaction: before any write (read-only connection) and after
    # one (the writer's speculative run).
    txn = begin(sql)
    error(in_txn(sql, txn, "1", TS_STAT), 403, "READ_FORBIDDEN")
    txn = begin(sql)
    assert in_txn(sql, txn, "1", issue("i2")).status_code == 200
    response = in_txn(sql, txn, "2", TS_REWRITE)
    assert b"alice" not in response.content
    error(response, 403, "READ_FORBIDDEN")
    assert state() == before


def test_a_token_writes_only_its_tables_and_reads_no_protected_one(engine, sql, pg, secrets):
    """Write grant on issue: user is not writable, auth/django/_rindle tables not readable."""
    post(sql, EXECUTE, {"statement": issue("i1")})
    before = state()
    writes = [
        "INSERT INTO \"user\" (id, name) VALUES ('u9', 'x')",
        "UPDATE \"user\" SET name = 'x'",
        'WITH w AS (DELETE FROM "user" RETURNING id) SELECT id FROM w',
        "DELETE FROM _rindle_change_events",
    ]
    reads = [
        "SELECT session_key FROM django_session",
        "SELECT password FROM auth_user",
        "WITH s AS (SELECT * FROM django_session) SELECT session_key FROM s",
        "SELECT * FROM _rindle_tokens",
        "SELECT id FROM issue WHERE EXISTS (SELECT 1 FROM auth_user)",
    ]
    for statement in writes:
        error(post(sql, EXECUTE, {"statement": statement}), 403, "WRITE_FORBIDDEN")
    for statement in reads:
        error(post(sql, EXECUTE, {"statement": statement}), 403, "READ_FORBIDDEN")
    for statement, code in [(w, "WRITE_FORBIDDEN") for w in writes] + [
        (r, "READ_FORBIDDEN") for r in reads
    ]:
        txn = begin(sql)
        assert in_txn(sql, txn, "1", issue("i2")).status_code == 200
        error(in_txn(sql, txn, "2", statement), 403, code)
    assert state() == before
    # The grants follow the token: one listing user may write it.
    both = token_client(sql.token.user, "sql", tables=["issue", "user"])
    ok = post(both, EXECUTE, {"statement": writes[0]})
    assert ok.status_code == 200, ok.content
    assert rows('SELECT id FROM "user"') == [("u9",)]


def _mutation(client_id, issue_id):
    args = create_issue_args(issue_id, created_at=1_704_067_200_000.0)
    envelope = {"clientID": client_id, "mid": 1, "name": "createIssue", "args": args}
    return {"envelope": envelope}


def _running(fragment):
    return rows(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
        "AND pid <> pg_backend_pid() AND query LIKE %s",
        [f"%{fragment}%"],
    )[0][0]


@pytest.mark.parametrize("statement", [CROSS, CROSS_INSERT], ids=["select", "insert-select"])
def test_a_runaway_statement_is_cancelled_within_its_budget(engine, sql, pg, alice, statement):
    """A cross join answers STATEMENT_TIMEOUT (408) in budget + epsilon, and stops there."""
    budget = 0.5
    mutator = token_client(alice, "read", "mutate")
    before = state()
    with override_settings(RINDLE={"SQL_STATEMENT_TIMEOUT_SECONDS": budget}):
        started = time.monotonic()
        response = post(sql, EXECUTE, {"statement": statement})
        elapsed = time.monotonic() - started
    print(f"runaway statement answered in {elapsed:.3f} s (budget {budget} s)")
    err = error(response, 408, "STATEMENT_TIMEOUT")
    assert err["retryable"] is False
    assert elapsed < budget + 1.0, elapsed
    assert _running("generate_series(1, 2000)") == 0  # not left running on the server
    assert state() == before  # nothing of it applied
    # The writer is free at once: a client mutation goes through.
    started = time.monotonic()
    response = post(mutator, MUTATE, _mutation("c-after", "i-after"))
    assert response.status_code == 200, response.content
    assert response.json()["accepted"] is True
    assert time.monotonic() - started < 1.0
    assert rows("SELECT title FROM issue WHERE id = 'i-after'") == [("after",)]


def test_a_runaway_statement_in_a_transaction_times_out_too(engine, sql, pg):
    """Inside an interactive transaction, on either connection, the budget holds."""
    with override_settings(RINDLE={"SQL_STATEMENT_TIMEOUT_SECONDS": 0.5}):
        txn = begin(sql)
        error(in_txn(sql, txn, "1", CROSS), 408, "STATEMENT_TIMEOUT")
        txn = begin(sql)
        assert in_txn(sql, txn, "1", issue("i1")).status_code == 200
        error(in_txn(sql, txn, "2", CROSS), 408, "STATEMENT_TIMEOUT")
    assert rows("SELECT count(*) FROM issue") == [(0,)]


def test_a_result_over_the_byte_cap_is_refused(engine, sql):
    """SQL_MAX_RESULT_BYTES bounds an answer: RESULT_TOO_LARGE, not a truncated result."""
    with override_settings(RINDLE={"SQL_MAX_RESULT_BYTES": 10_000}):
        big = post(sql, EXECUTE, {"statement": {"sql": "SELECT ? AS x", "args": ["y" * 20_000]}})
        error(big, 400, "RESULT_TOO_LARGE")
        small = post(sql, EXECUTE, {"statement": {"sql": "SELECT ? AS x", "args": ["y" * 100]}})
        assert small.status_code == 200, small.content
        # Many small rows: refused once the bytes pass the cap, long before the end.
        many = (
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5000000) "
            "SELECT i, 'padding' FROM n"
        )
        started = time.monotonic()
        error(post(sql, EXECUTE, {"statement": many}), 400, "RESULT_TOO_LARGE")
        assert time.monotonic() - started < 2.0
        # On the writer (a read after a write) the answer is fetched, then counted.
        batch = [issue("i1"), many.replace("5000000", "100000")]
        error(post(sql, BATCH, {"statements": batch}), 400, "RESULT_TOO_LARGE")
    empty = post(sql, EXECUTE, {"statement": "SELECT id FROM issue WHERE id = 'none'"})
    assert empty.status_code == 200, empty.content
    assert empty.json()["result"]["columns"][0]["name"] == "id"
    assert rows("SELECT count(*) FROM issue") == [(0,)]


def _privileges(role, table):
    return rows(
        "SELECT has_table_privilege(%s, %s, 'SELECT'), has_table_privilege(%s, %s, 'INSERT')",
        [role, table, role, table],
    )[0]


def test_the_role_command_is_idempotent_and_grants_only_the_allowed_tables(engine, sql, pg):
    """rindle_sql_role twice: the same roles and grants, none on protected tables."""
    for _ in range(2):
        call_command("rindle_sql_role")
        base = sandbox.base_role()
        writer = sandbox.role_for(["issue"])
        assert _privileges(base, "issue") == (True, False)
        assert _privileges(writer, "issue") == (True, True)
        assert _privileges(writer, '"user"') == (True, False)
        for table in ("auth_user", "django_session", "_rindle_change_events", "_rindle_tokens"):
            assert _privileges(writer, table) == (False, False), table
        assert (
            rows(
                "SELECT rolcanlogin, rolsuper FROM pg_roles WHERE rolname = ANY(%s)",
                [[base, writer]],
            )
            == [(False, False)] * 2
        )
        assert sandbox.status(connection.alias) is None
        # Files, large objects and the GUC setter are out of the roles' reach.
        for function in (
            "pg_catalog.set_config(text,text,boolean)",
            "pg_catalog.lo_create(oid)",
            "pg_catalog.lo_from_bytea(oid,bytea)",
            "pg_catalog.lo_get(oid)",
            "pg_catalog.pg_read_file(text)",
        ):
            assert rows("SELECT has_function_privilege(%s, %s, 'EXECUTE')", [writer, function]) == [
                (False,)
            ], function
    assert check_sql_sandbox(None, databases=[connection.alias]) == []
    before = state()
    for statement in ("SELECT lo_from_bytea(0, 'x')", "SELECT lo_get(1)"):
        error(post(sql, EXECUTE, {"statement": statement}), 403, "FUNCTION_FORBIDDEN")
        error(post(sql, BATCH, {"statements": [issue("i1"), statement]}), 403, "FUNCTION_FORBIDDEN")
    assert state() == before


def test_the_system_check_and_requests_refuse_a_missing_or_unusable_role(engine, sql, pg):
    """rindle.E020 when the role is missing or can log in; requests answer SANDBOX_MISSING."""
    missing = f"rindle_sql_missing_{time.monotonic_ns()}"
    with override_settings(RINDLE={"SQL_SANDBOX_ROLE": missing}):
        errors = check_sql_sandbox(None, databases=[connection.alias])
        assert [e.id for e in errors] == ["rindle.E020"], errors
        assert "does not exist" in errors[0].msg
        with override_settings(RINDLE={"SQL_SANDBOX_ROLE": missing, "SQL_ENABLED": False}):
            assert check_sql_sandbox(None, databases=[connection.alias]) == []
    unusable = f"rindle_sql_login_{time.monotonic_ns()}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE ROLE "{unusable}" LOGIN')
    try:
        with override_settings(RINDLE={"SQL_SANDBOX_ROLE": unusable}):
            errors = check_sql_sandbox(None, databases=[connection.alias])
            assert [e.id for e in errors] == ["rindle.E020"], errors
            sandbox.forget()
            before = state()
            error(post(sql, EXECUTE, {"statement": "SELECT 1"}), 503, "SANDBOX_MISSING")
            error(post(sql, EXECUTE, {"statement": issue("i1")}), 503, "SANDBOX_MISSING")
            assert state() == before
    finally:
        sandbox.forget()
        with connection.cursor() as cursor:
            cursor.execute(f'DROP ROLE "{unusable}"')


def test_a_statement_waits_for_a_lock_only_so_long(engine, sql, pg):
    """A row locked elsewhere: LOCK_TIMEOUT (408, retryable) after the lock budget."""
    post(sql, EXECUTE, {"statement": issue("i1")})
    holder = connection.copy()
    try:
        with holder.cursor() as cursor:
            holder.set_autocommit(False)
            cursor.execute("SELECT id FROM issue WHERE id = 'i1' FOR UPDATE")
            with override_settings(RINDLE={"SQL_LOCK_TIMEOUT_SECONDS": 0.3}):
                started = time.monotonic()
                response = post(sql, EXECUTE, {"statement": "UPDATE issue SET title = 'x'"})
                elapsed = time.monotonic() - started
            err = error(response, 408, "LOCK_TIMEOUT")
            assert err["retryable"] is True and elapsed < 2.0, elapsed
            holder.rollback()
    finally:
        holder.close()
    assert post(sql, EXECUTE, {"statement": "UPDATE issue SET title = 'x'"}).status_code == 200


def test_public_sql_can_be_turned_off(engine, sql):
    """SQL_ENABLED False: /v1/sql/* answers 404 SQL_DISABLED and runs nothing."""
    before = state()
    with override_settings(RINDLE={"SQL_ENABLED": False}):
        error(post(sql, EXECUTE, {"statement": issue("i1")}), 404, "SQL_DISABLED")
        error(post(sql, BEGIN, {}), 404, "SQL_DISABLED")
    assert state() == before


def test_a_session_lock_taken_by_a_statement_does_not_outlive_it(engine, sql, pg):
    """pg_advisory_lock on the reader or the writer is released with the statement."""
    statements = [
        ("SELECT pg_advisory_lock(7101)::text", 7101, 200),
        ("SELECT pg_advisory_lock(7102)::text, 1 / 0", 7102, 400),
        ("SELECT pg_advisory_lock(7103)", 7103, 400),
    ]
    for statement, key, status in statements:
        for body, url in (
            ({"statement": statement}, EXECUTE),
            ({"statements": [issue(f"i{key}"), statement]}, BATCH),
        ):
            response = post(sql, url, body)
            assert response.status_code == status, response.content
            assert rows("SELECT pg_try_advisory_lock(%s), pg_advisory_unlock(%s)", [key, key]) == [
                (True, True)
            ], (statement, url)


def test_a_security_definer_function_of_the_schema_is_not_the_sandboxs(engine, sql, pg, secrets):
    """A SECURITY DEFINER function runs as its owner: the sandbox may not call it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION leak() RETURNS text LANGUAGE sql SECURITY DEFINER AS "
            "$$ SELECT string_agg(session_key, ',') FROM django_session $$"
        )
    try:
        for body, url in (
            ({"statement": "SELECT leak()"}, EXECUTE),
            ({"statements": [issue("i1"), "SELECT leak()"]}, BATCH),
        ):
            response = post(sql, url, body)
            assert secrets.encode() not in response.content
            error(response, 403, "FUNCTION_FORBIDDEN")
        # The capture trigger's function is one too, and still fires.
        assert post(sql, EXECUTE, {"statement": issue("i1")}).status_code == 200
        assert rows("SELECT count(*) FROM _rindle_change_events WHERE pk = '[\"i1\"]'") == [(1,)]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP FUNCTION leak()")


def test_statements_run_as_the_callers_role_with_their_budgets(engine, sql, pg):
    """current_user is the caller's sandbox role, with the budgets; the app's after."""
    app = rows("SELECT current_user, current_setting('statement_timeout')")
    probe = (
        "SELECT current_user::text, current_setting('statement_timeout'), "
        "current_setting('lock_timeout'), current_setting('idle_in_transaction_session_timeout')"
    )
    writer = sandbox.role_for(["issue"])
    settings = {"SQL_STATEMENT_TIMEOUT_SECONDS": 3, "SQL_LOCK_TIMEOUT_SECONDS": 1}
    with override_settings(RINDLE={**settings, "SQL_TRANSACTION_IDLE_SECONDS": 7}):
        read = post(sql, EXECUTE, {"statement": probe}).json()["result"]["rows"]
        assert read == [[writer, "3s", "1s", "7s"]]
        batch = post(sql, BATCH, {"statements": [issue("i1"), probe]}).json()
        assert batch["results"][1]["rows"][0][:3] == [writer, "3s", "1s"]
    reader = token_client(sql.token.user, "sql")  # no tables: the base role
    read = post(reader, EXECUTE, {"statement": probe}).json()["result"]["rows"]
    assert read[0][0] == sandbox.base_role()
    with override_settings(RINDLE={"SQL_STATEMENT_TIMEOUT_SECONDS": 0}):  # 0: no budget
        read = post(reader, EXECUTE, {"statement": probe}).json()["result"]["rows"]
        assert read[0][1] == "0"
    assert rows("SELECT current_user, current_setting('statement_timeout')") == app
