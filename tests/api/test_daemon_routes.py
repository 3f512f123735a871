"""
The original daemon's control plane (``@rindle/daemon-client`` routes): the same
engine functions as the Django-native routes, behind a ``daemon``-scope token.
"""

import pytest
from django.db import connection

from project.demo import models as demo
from rindle_app import leases, named
from rindle_app.exceptions import QueryRefused

from .conftest import error, post, state, token_client
from .test_read import seed

pytestmark = pytest.mark.django_db(transaction=True)

INSERT_USER = 'INSERT INTO "user" (id, name) VALUES (?, ?)'


@pytest.fixture
def daemon(alice):
    return token_client(alice, "daemon")


def lmid(client_id):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT last_mutation_id FROM _rindle_client_mutations WHERE client_id = %s",
            [client_id],
        )
        row = cursor.fetchone()
    return row[0] if row else 0


def users():
    return sorted(demo.User.objects.values_list("id", "name"))


def txn(client, mid, *statements, client_id="c1", **extra):
    body = {"statements": [{"sql": s, "params": p} for s, p in statements], **extra}
    if mid is not None:
        body.update(clientID=client_id, mid=mid)
    return post(client, "/execute-sql-txn", body)


# --- who may call ------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/execute-sql-txn", "/materialize", "/execute-sql-read"])
def test_a_browser_session_is_refused_even_a_superusers(engine, django_user_model, path):
    """A session never reaches the daemon plane, a superuser's included: nothing changes."""
    from django.test import Client

    root = django_user_model.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(root)
    before = state()
    response = post(client, path, {"statements": [], "sql": "SELECT 1", "ast": {}})
    assert response.status_code == 403, response.content
    assert state() == before


def test_a_token_without_the_daemon_scope_is_refused(engine, alice):
    """Another scope (sql, mutate) does not open the daemon plane."""
    client = token_client(alice, "sql", "mutate", "read")
    before = state()
    error(txn(client, 1, (INSERT_USER, ["u1", "U"])), 403, "insufficient_scope")
    assert state() == before


def test_no_credentials_is_401(engine):
    from rest_framework.test import APIClient

    assert post(APIClient(), "/execute-sql-read", {"sql": "SELECT 1"}).status_code == 401


# --- /execute-sql-txn ----------------------------------------------------------------------


def test_a_client_transaction_applies_once_and_its_replay_is_absorbed(daemon):
    """mid 1 applies with its lmid; the same mid again is absorbed, nothing re-runs."""
    first = txn(daemon, 1, (INSERT_USER, ["u1", "One"]))
    assert first.status_code == 200, first.content
    body = first.json()
    assert body["applied"] is True and body["lmid"] == 1
    assert body["lmidAdvances"] == [{"clientID": "c1", "lmid": 1}]
    assert isinstance(body["cv"], int) and body["cursor"].startswith("w:")
    again = txn(daemon, 1, (INSERT_USER, ["u1", "One"])).json()
    assert again["applied"] is False and again["lmid"] == 1
    assert users() == [("u1", "One")] and lmid("c1") == 1


def test_a_mid_gap_is_409_and_writes_nothing(daemon):
    before = state()
    detail = error(txn(daemon, 3, (INSERT_USER, ["u1", "One"])), 409, "mid_gap")
    assert detail["lmid"] == 0
    assert state() == before


def test_an_sql_failure_advances_no_lmid_and_a_corrected_retry_applies(daemon):
    """Unlike our mutators' rule, a failing statement leaves the mid's slot open."""
    broken = ('INSERT INTO "user" (nope) VALUES (?)', [1])
    bad = txn(daemon, 1, (INSERT_USER, ["u1", "One"]), broken)
    assert bad.status_code == 400, bad.content
    assert users() == [] and lmid("c1") == 0
    dup = txn(daemon, 1, (INSERT_USER, ["u1", "One"]), (INSERT_USER, ["u1", "Again"]))
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "CONSTRAINT_VIOLATION"
    assert users() == [] and lmid("c1") == 0
    fixed = txn(daemon, 1, (INSERT_USER, ["u1", "One"]))
    assert fixed.status_code == 200 and fixed.json()["applied"] is True
    assert users() == [("u1", "One")] and lmid("c1") == 1


def test_an_idempotency_key_dedupes_a_foreign_write(daemon):
    """A retried key answers applied: false; another request under the key is 409."""
    first = txn(daemon, None, (INSERT_USER, ["u1", "One"]), idempotencyKey="k1").json()
    assert first["applied"] is True and "lmid" not in first
    again = txn(daemon, None, (INSERT_USER, ["u1", "One"]), idempotencyKey="k1").json()
    assert again == {**first, "applied": False}
    other = txn(daemon, None, (INSERT_USER, ["u2", "Two"]), idempotencyKey="k1")
    assert other.status_code == 409 and other.json()["error"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert users() == [("u1", "One")]


def test_bookkeeping_tables_are_out_of_reach(daemon):
    before = state()
    response = txn(daemon, 1, ("DELETE FROM _rindle_client_mutations", []))
    assert response.status_code == 403, response.content
    assert state() == before


# --- /reject-mutation ----------------------------------------------------------------------


def test_reject_mutation_advances_the_lmid_alone(daemon):
    """A business rejection: an lmid-only commit; a replay is absorbed; a gap is 409."""
    body = post(daemon, "/reject-mutation", {"clientID": "c1", "mid": 1, "reason": "no"}).json()
    assert body["lmid"] == 1 and isinstance(body["cv"], int)
    assert lmid("c1") == 1
    again = post(daemon, "/reject-mutation", {"clientID": "c1", "mid": 1}).json()
    assert again["lmid"] == 1
    error(post(daemon, "/reject-mutation", {"clientID": "c1", "mid": 5}), 409, "mid_gap")
    assert txn(daemon, 2, (INSERT_USER, ["u1", "One"])).json()["lmid"] == 2


# --- /execute-sql-read ---------------------------------------------------------------------


def test_sql_read_answers_bare_cell_arrays(daemon, engine):
    seed(engine)
    body = post(
        daemon,
        "/execute-sql-read",
        {"sql": 'SELECT id, name FROM "user" WHERE id <> ? ORDER BY id', "params": ["x"]},
    ).json()
    assert body == {"cols": ["id", "name"], "rows": [["alice", "Alice"], ["bob", "Bob"]]}


@pytest.mark.parametrize(
    "sql, code",
    [
        ("INSERT INTO \"user\" (id, name) VALUES ('z', 'Z')", "READ_ONLY"),
        ('DELETE FROM "user"', "READ_ONLY"),
        ("CREATE TABLE t (x int)", "DDL_FORBIDDEN"),
        ("SELEC nonsense", "STATEMENT_UNSUPPORTED"),
        ('SELECT nope FROM "user"', "SQL_ERROR"),
    ],
)
def test_sql_read_refuses_writes_whatever_the_token(engine, alice, sql, code):
    """Even an admin token: a statement that writes is a 400 and writes nothing."""
    seed(engine)
    client = token_client(alice, "admin")
    before = state()
    response = post(client, "/execute-sql-read", {"sql": sql})
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == code
    assert state() == before


# --- /materialize, /query, /dematerialize ---------------------------------------------------

AST = {"table": "issue", "orderBy": [["id", "asc"]], "limit": 2}


def test_materialize_leases_a_validated_ast(daemon, engine):
    first = post(daemon, "/materialize", {"ast": AST, "mode": "normalized"}).json()
    assert set(first) == {"materializationId", "queryKey", "leaseToken", "reused"}
    assert first["reused"] is False
    lease = leases.verify(first["leaseToken"])
    assert lease.name == named.AST_QUERY_NAME and lease.user_id is None
    assert named.resolve(lease.name, lease.args) == AST
    again = post(daemon, "/materialize", {"ast": AST}).json()
    assert again["reused"] is True and again["queryKey"] == first["queryKey"]
    gone = post(daemon, "/dematerialize", {"queryKey": first["queryKey"]}).json()
    assert gone == {"removed": True}
    assert post(daemon, "/dematerialize", {"queryKey": first["queryKey"]}).json() == {
        "removed": False
    }


def test_an_ast_of_ones_own_cannot_be_subscribed_by_name(engine):
    """Without the grant /materialize signs, _rindle/ast resolves nothing."""
    with pytest.raises(QueryRefused):
        named.resolve(named.AST_QUERY_NAME, {"ast": AST})
    with pytest.raises(QueryRefused):
        named.resolve(named.AST_QUERY_NAME, {"ast": AST, "grant": "forged"})
    other = named.resolve  # a grant for another AST does not carry over
    from rindle_app.daemon import grant

    with pytest.raises(QueryRefused):
        other(named.AST_QUERY_NAME, {"ast": {**AST, "limit": 3}, "grant": grant(AST)["grant"]})


@pytest.mark.parametrize(
    "ast, code",
    [
        ({"table": "nope"}, "unknown_table"),
        ({"table": "issue", "where": {"type": "simple", "op": "=", "left": {}}}, None),
        ({"table": "issue", "orderBy": [["missing", "asc"]]}, "unknown_column"),
        ("issue", None),
    ],
)
def test_a_bad_ast_is_refused_with_its_code(daemon, ast, code):
    for path in ("/materialize", "/query"):
        response = post(daemon, path, {"ast": ast})
        assert response.status_code == 400, response.content
        if code is not None:
            assert response.json()["error"]["code"] == code


def test_query_reads_an_ast_once_in_the_ssr_shape(daemon, engine):
    seed(engine)
    ast = {
        **AST,
        "related": [
            {
                "correlation": {"parentField": ["id"], "childField": ["issueId"]},
                "subquery": {"table": "tag", "alias": "tags", "orderBy": [["id", "asc"]]},
            }
        ],
    }
    body = post(daemon, "/query", {"ast": ast}).json()
    assert [r["cols"]["id"] for r in body["rows"]] == ["i0", "i1"]
    assert [t["cols"]["name"] for t in body["rows"][1]["tags"]] == ["bug", "api"]
    assert isinstance(body["cvMin"], int) and body["queryKey"] and body["bootId"]


# --- /migrate -----------------------------------------------------------------------------


def test_migrate_runs_the_same_journal_as_v1_sql_migrate(daemon, alice):
    ddl = {"id": "0001_note", "statements": ["CREATE TABLE note (id TEXT PRIMARY KEY, body TEXT)"]}
    first = post(daemon, "/migrate", ddl).json()
    assert first == {"applied": True, "hashOverridden": False, "schemaVersion": "0001_note"}
    native = post(token_client(alice, "migrate"), "/v1/sql/migrate", ddl).json()
    assert native["applied"] is False  # one journal
    batch = post(
        daemon,
        "/migrate",
        [ddl, {"id": "0002_bad", "statements": ["ALTER TABLE note RENAME TO x"]}],
    )
    assert batch.status_code == 200
    body = batch.json()
    assert body["applied"] == 0 and body["failedId"] == "0002_bad" and body["errorCode"]
    assert body["results"] == [
        {"id": "0001_note", "applied": False, "hashOverridden": False, "schemaVersion": "0001_note"}
    ]


# --- /mutate-session/* ----------------------------------------------------------------------


def test_a_mutation_session_reads_its_writes_and_commits_with_its_lmid(daemon):
    begin = post(
        daemon,
        "/mutate-session/begin",
        {
            "clientID": "c1",
            "mid": 1,
            "statements": [{"sql": INSERT_USER, "params": ["u1", "One"]}],
            "query": {"sql": 'SELECT id, name FROM "user" ORDER BY id'},
        },
    ).json()
    session = begin["sessionId"]
    assert begin["read"] == {"cols": ["id", "name"], "rows": [["u1", "One"]]}
    assert users() == []  # nothing applies before the commit
    ok = post(
        daemon,
        "/mutate-session/exec",
        {"sessionId": session, "statements": [{"sql": INSERT_USER, "params": ["u2", "Two"]}]},
    )
    assert ok.status_code == 200, ok.content
    read = post(
        daemon,
        "/mutate-session/query",
        {"sessionId": session, "sql": 'SELECT count(*) AS n FROM "user"'},
    ).json()
    assert read == {"cols": ["n"], "rows": [[2]]}
    commit = post(daemon, "/mutate-session/commit", {"sessionId": session}).json()
    assert commit["applied"] is True and commit["lmid"] == 1
    assert users() == [("u1", "One"), ("u2", "Two")] and lmid("c1") == 1
    error(post(daemon, "/mutate-session/commit", {"sessionId": session}), 410, "session_gone")
    absorbed = post(daemon, "/mutate-session/begin", {"clientID": "c1", "mid": 1}).json()
    assert absorbed["absorbed"] is True and "sessionId" not in absorbed
    assert absorbed["lmid"] == 1


def test_a_rolled_back_or_unknown_session_applies_nothing(daemon):
    session = post(daemon, "/mutate-session/begin", {"clientID": "c1", "mid": 1}).json()[
        "sessionId"
    ]
    post(
        daemon,
        "/mutate-session/exec",
        {"sessionId": session, "statements": [{"sql": INSERT_USER, "params": ["u1", "One"]}]},
    )
    assert post(daemon, "/mutate-session/rollback", {"sessionId": session}).status_code == 200
    assert users() == [] and lmid("c1") == 0
    unknown = "tx_" + "0" * 32
    error(post(daemon, "/mutate-session/commit", {"sessionId": unknown}), 410, "session_gone")
    error(post(daemon, "/mutate-session/begin", {"clientID": "c1", "mid": 4}), 409, "mid_gap")


# --- /schema, /stats, /version -------------------------------------------------------------


def test_schema_stats_and_version_answer_a_daemon_token(daemon):
    schema = daemon.get("/schema").json()
    assert "issue" in [t["name"] for t in schema["tables"]]
    stats = post(daemon, "/stats", {}).json()
    assert set(stats) == {"subscriptions", "materializations", "leases", "connections"}
    version = daemon.get("/version")
    assert version.json()["bootId"] == version["Rindle-Boot-Id"]


# --- bad input ------------------------------------------------------------------------------

BAD = [
    ("/execute-sql-txn", {"statements": "x"}),
    ("/execute-sql-txn", {"statements": [], "clientID": "c1"}),
    ("/execute-sql-txn", {"statements": [{"sql": "SELECT 1", "bogus": 1}], "mid": 1}),
    ("/execute-sql-txn", {"statements": [{"sql": INSERT_USER, "params": ["u1"]}]}),
    ("/execute-sql-txn", {"statements": [], "clientID": "c1", "mid": 0}),
    ("/execute-sql-txn", {"statements": [], "extra": True}),
    ("/reject-mutation", {"clientID": "", "mid": 1}),
    ("/reject-mutation", {"clientID": "c1", "mid": True}),
    ("/execute-sql-read", {"sql": ""}),
    ("/execute-sql-read", {"sql": "SELECT ?", "params": "x"}),
    ("/materialize", {}),
    ("/materialize", {"ast": AST, "policy": {"kind": "forever"}}),
    ("/dematerialize", {}),
    ("/query", {"ast": AST, "ttlMs": -1}),
    ("/migrate", {"id": "x"}),
    ("/migrate", []),
    ("/migrate", [{"id": "x"}]),
    ("/mutate-session/begin", {"mid": 1}),
    ("/mutate-session/exec", {"sessionId": "tx_1", "statements": []}),
    ("/mutate-session/query", {"sessionId": 5, "sql": "SELECT 1"}),
    ("/mutate-session/commit", {}),
    ("/mutate-session/rollback", {"sessionId": "nope"}),
]


@pytest.mark.parametrize("path, body", BAD)
def test_bad_input_is_a_4xx_with_a_code_and_changes_nothing(daemon, path, body):
    before = state()
    response = post(daemon, path, body)
    assert 400 <= response.status_code < 500, (response.status_code, response.content)
    assert response.status_code != 410 or path.startswith("/mutate-session/")
    assert isinstance(response.json()["error"]["code"], str)
    assert state() == before


def test_malformed_json_is_a_400(daemon):
    response = post(daemon, "/execute-sql-txn", "{not json")
    assert response.status_code == 400


def test_a_sessions_idempotency_key_is_absorbed_once_committed(daemon):
    """A foreign write through a session: its key, once committed, absorbs the retry."""
    session = post(daemon, "/mutate-session/begin", {"idempotencyKey": "k9"}).json()["sessionId"]
    statement = {"sql": INSERT_USER, "params": ["u1", "One"]}
    post(daemon, "/mutate-session/exec", {"sessionId": session, "statements": [statement]})
    commit = post(daemon, "/mutate-session/commit", {"sessionId": session}).json()
    assert commit["applied"] is True and "lmid" not in commit
    again = post(daemon, "/mutate-session/begin", {"idempotencyKey": "k9"}).json()
    assert again["absorbed"] is True and again["applied"] is False
    assert again["cv"] == commit["cv"] and "sessionId" not in again
    assert users() == [("u1", "One")]
