"""The tables journaled migrations create, as GET /schema and rindle_schema_ts describe them."""

import io
import json

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from rindle_app import tokens
from tests.test_schema_ts import parse_ts

pytestmark = pytest.mark.django_db(transaction=True)

STATEMENTS = [
    "CREATE TABLE jt_counter (id INTEGER PRIMARY KEY, label TEXT)",
    "CREATE TABLE jt_cell (sheet TEXT, row_no INTEGER, col_no INTEGER, v TEXT, "
    "PRIMARY KEY (sheet, row_no, col_no))",
]
COUNTER = {
    "name": "jt_counter",
    "columns": [
        {"name": "id", "type": "number", "nullable": False},
        {"name": "label", "type": "string", "nullable": True},
    ],
    "primaryKey": ["id"],
}
CELL = {
    "name": "jt_cell",
    "columns": [
        {"name": "sheet", "type": "string", "nullable": False},
        {"name": "row_no", "type": "number", "nullable": False},
        {"name": "col_no", "type": "number", "nullable": False},
        {"name": "v", "type": "string", "nullable": True},
    ],
    "primaryKey": ["sheet", "row_no", "col_no"],
}


@pytest.fixture
def deployer(engine, django_user_model):
    """A client holding a token with the migrate and schema scopes."""
    raw, _ = tokens.create(django_user_model.objects.create_user("ops"), ["migrate", "schema"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = {"id": "0001_keys", "checksum": "c3" * 32, "statements": STATEMENTS}
    response = client.post("/v1/sql/migrate", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    return client


def test_schema_reports_journaled_key_columns_as_not_nullable(deployer):
    """An INTEGER PRIMARY KEY and each column of a composite key: nullable false."""
    tables = {t["name"]: t for t in deployer.get("/schema").json()["tables"]}
    assert tables["jt_counter"] == COUNTER
    assert tables["jt_cell"] == CELL


def test_rindle_schema_ts_defines_journaled_tables_without_nullable_keys(deployer):
    """The generated module has the journaled tables, keys without .nullable()."""
    out = io.StringIO()
    call_command("rindle_schema_ts", stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    tables = {t["name"]: t for t in parse_ts(text)}
    assert tables["jt_counter"] == COUNTER
    assert tables["jt_cell"] == CELL
    assert "    id: number()," in text and "    label: string().nullable()," in text
