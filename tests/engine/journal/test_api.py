"""POST /v1/sql/migrate: the journal over HTTP, its permissions and its error shapes."""

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from rindle_app import tokens
from rindle_app.testing import outbox_since

from .conftest import rows, state

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/v1/sql/migrate"
NOTE = "CREATE TABLE jt_note (id TEXT PRIMARY KEY, body TEXT NOT NULL)"
S1, S2 = "a1" * 32, "b2" * 32


@pytest.fixture
def alice(engine, django_user_model):
    return django_user_model.objects.create_user("alice", password="pw")


def token_client(user, *scopes):
    raw, _token = tokens.create(user, list(scopes))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def deployer(alice):
    return token_client(alice, "migrate")


def post(client, body):
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(URL, data, content_type="application/json")


def error(response, status, code):
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]


def test_a_migration_is_applied_then_replayed_from_its_stored_report(engine, deployer):
    body = {"id": "0001_notes", "checksum": S1, "statements": [NOTE]}
    first = post(deployer, body)
    assert first.status_code == 200, first.content
    out = first.json()
    assert out["applied"] is True and out["kind"] == "ddl" and out["hashOverridden"] is False
    assert out["schemaVersion"] == "0001_notes" and out["report"]["created"] == ["jt_note"]
    assert isinstance(out["cv"], int) and out["destructive"] == []
    assert first["Rindle-Boot-Id"] == engine.boot_id
    assert "jt_note" in engine.tables
    before = state()
    again = post(deployer, body).json()
    assert again["applied"] is False and again["report"] == out["report"] and again["cv"] is None
    assert state() == before


def test_a_checksum_mismatch_is_409_and_writes_nothing(engine, deployer):
    post(deployer, {"id": "0001", "checksum": S1, "statements": [NOTE]})
    before = state()
    response = post(deployer, {"id": "0001", "checksum": S2, "statements": [NOTE]})
    detail = error(response, 409, "checksum_mismatch")
    assert detail["stored"] == S1
    response = post(
        deployer, {"id": "0001", "checksum": S2, "overrideHash": S1, "statements": [NOTE]}
    )
    assert response.status_code == 200 and response.json()["hashOverridden"] is True
    assert state()["outbox"] == before["outbox"] and state()["tables"] == before["tables"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ("not json", "parse_error"),
        ([], "invalid_request"),
        ({"statements": [NOTE]}, "invalid_request"),
        ({"id": "0001", "statements": []}, "invalid_request"),
        ({"id": "0001", "statements": "CREATE TABLE x (id TEXT PRIMARY KEY)"}, "invalid_request"),
        ({"id": "0001", "statements": [NOTE], "migrations": []}, "invalid_request"),
        ({"id": "../0001", "statements": [NOTE]}, "invalid_migration_id"),
        ({"id": "0001", "checksum": "nope", "statements": [NOTE]}, "invalid_checksum"),
        ({"id": "0001", "statements": ["ALTER TABLE jt_note RENAME TO jt_x"]}, "rename_refused"),
        ({"id": "0001", "statements": ["PRAGMA writable_schema = 1"]}, "pragma_refused"),
        ({"id": "0001", "statements": ["ATTACH 'x.db' AS x"]}, "attach_refused"),
        ({"id": "0001", "statements": ["COMMIT"]}, "transaction_control_refused"),
        ({"id": "0001", "statements": [NOTE, "DELETE FROM jt_note"]}, "mixed_migration"),
        ({"id": "0001", "statements": ["CREATE TABLE jt_l (a TEXT)"]}, "no_primary_key"),
        ({"id": "0001", "statements": [NOTE, NOTE]}, "statement_failed"),
    ],
)
def test_bad_input_is_a_4xx_with_a_code_and_writes_nothing(engine, deployer, body, code):
    before = state()
    error(post(deployer, body), 400, code)
    assert state() == before


def test_a_refusal_names_the_statement(engine, deployer):
    body = {"id": "0001", "statements": [NOTE, "ALTER TABLE jt_note ALTER COLUMN body TYPE INT"]}
    detail = error(post(deployer, body), 400, "type_change_refused")
    assert detail["statement"] == 1


def test_a_dml_migration_writes_captured_rows(engine, deployer):
    post(deployer, {"id": "0001", "statements": [NOTE]})
    high = state()["outbox"]
    body = {"id": "0002_seed", "statements": ["INSERT INTO jt_note VALUES ('a', 'x'), ('b', 'y')"]}
    out = post(deployer, body).json()
    assert out["applied"] and out["kind"] == "dml" and out["report"]["rowChanges"] == 2
    assert out["schemaVersion"] == "0001"
    assert [e["pk"] for e in outbox_since(high)] == [["a"], ["b"]]


def test_the_array_form_stops_at_the_first_failure_and_keeps_the_earlier_ones(engine, deployer):
    post(
        deployer,
        {"id": "0002", "checksum": S1, "statements": ["CREATE TABLE jt_b (id TEXT PRIMARY KEY)"]},
    )
    body = {
        "migrations": [
            {"id": "0001", "statements": [NOTE]},
            {
                "id": "0002",
                "checksum": S2,
                "statements": ["CREATE TABLE jt_b (id TEXT PRIMARY KEY)"],
            },
            {"id": "0003", "statements": ["INSERT INTO jt_note VALUES ('a', 'x')"]},
        ]
    }
    response = post(deployer, body)
    assert response.status_code == 200, response.content
    out = response.json()
    assert [r["id"] for r in out["results"]] == ["0001"] and out["results"][0]["applied"]
    assert out["failedId"] == "0002" and out["errorCode"] == "checksum_mismatch"
    assert out["error"] and out["schemaVersion"] == "0001"
    assert "jt_note" in engine.tables
    assert rows("SELECT COUNT(*) FROM jt_note") == [(0,)]


def test_a_refused_migration_anywhere_in_the_array_applies_nothing(engine, deployer):
    before = state()
    body = {
        "migrations": [
            {"id": "0001", "statements": [NOTE]},
            {"id": "0002", "statements": ["DROP TABLE jt_note CASCADE"]},
        ]
    }
    detail = error(post(deployer, body), 400, "cascade_refused")
    assert detail["failedId"] == "0002"
    assert state() == before


def test_the_migrate_scope_or_a_superuser_is_required(engine, alice, django_user_model):
    body = {"id": "0001", "statements": [NOTE]}
    before = state()
    error(post(APIClient(), body), 401, "not_authenticated")
    error(
        post(token_client(alice, "read", "mutate", "schema", "sql"), body),
        403,
        "insufficient_scope",
    )
    browser = Client()
    browser.force_login(alice)
    error(post(browser, body), 403, "not_superuser")
    assert state() == before
    admin = django_user_model.objects.create_superuser("root", password="pw")
    browser.force_login(admin)
    assert post(browser, body).status_code == 200
    assert post(token_client(alice, "admin"), body).json()["applied"] is False


def test_the_route_is_described_in_the_openapi_document(engine):
    schema = APIClient().get("/api/schema/openapi", HTTP_ACCEPT="application/json").json()
    operation = schema["paths"][URL]["post"]
    assert operation["operationId"] == "rindle_sql_migrate"
    for status in ("200", "400", "401", "403", "409", "413", "503"):
        assert status in operation["responses"], status
    assert "MigrateRequest" in json.dumps(operation["requestBody"])
