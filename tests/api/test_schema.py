"""GET /schema, the OpenAPI document, and the boot id every route answers."""

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from .conftest import error, post, token_client


def test_the_schema_lists_the_client_tables_sorted(engine, machine):
    """{tables: [{name, columns: [{name, type, nullable}], primaryKey}]}, no bookkeeping."""
    response = machine.get("/schema")
    assert response.status_code == 200
    tables = response.json()["tables"]
    assert tables == engine.base_table_schemas()
    assert [t["name"] for t in tables] == ["comment", "issue", "tag", "user"]
    issue = tables[1]
    assert issue["primaryKey"] == ["id"]
    assert issue["columns"][0] == {"name": "id", "type": "string", "nullable": False}
    assert {"name": "createdAt", "type": "number", "nullable": False} in issue["columns"]
    assert response["Rindle-Boot-Id"] == engine.boot_id


def test_the_schema_needs_a_signed_in_user_or_the_schema_scope(engine, alice, session):
    """Anonymous: 401; a token without the scope: 403; admin tokens and sessions: 200."""
    anonymous = APIClient().get("/schema")
    error(anonymous, 401, "not_authenticated")
    assert anonymous["Rindle-Boot-Id"] == engine.boot_id
    error(token_client(alice, "read", "mutate").get("/schema"), 403, "insufficient_scope")
    assert token_client(alice, "admin").get("/schema").status_code == 200
    assert session.get("/schema").status_code == 200


def test_the_routes_refuse_other_methods(engine, machine):
    error(machine.get("/api/rindle/query"), 405, "method_not_allowed")
    error(post(machine, "/schema", {}), 405, "method_not_allowed")


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_the_openapi_document_describes_every_route(engine, fmt):
    """/api/schema/openapi documents the four routes with their bodies."""
    response = APIClient().get("/api/schema/openapi", {"format": fmt})
    assert response.status_code == 200
    text = response.content.decode()
    for route in ("/api/rindle/query", "/api/rindle/read", "/api/rindle/mutate", "/schema"):
        assert route in text
    if fmt == "json":
        doc = response.json()
        paths = doc["paths"]
        body = paths["/api/rindle/mutate"]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["$ref"] == "#/components/schemas/MutateRequest"
        lease = doc["components"]["schemas"]["LeaseResponse"]["properties"]
        assert set(lease) == {
            "leaseToken",
            "queryKey",
            "expiresAt",
            "lifecycle",
            "realtime",
            "realtimeFence",
        }
        assert "/api/rindle/room-boot" in paths
        assert doc["components"]["securitySchemes"]["rindleToken"]["scheme"] == "bearer"
        assert "409" in paths["/api/rindle/mutate"]["post"]["responses"]


def test_requires_scope_guards_a_host_projects_own_view(engine, alice, session):
    """requires_scope(scope) limits token requests to that scope and lets sessions through."""
    from django.urls import path
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from rindle_app.api.permissions import requires_scope

    class Report(APIView):
        permission_classes = [requires_scope("mutate")]

        def get(self, request):
            return Response({"user": request.user.username})

    urlconf = type("urls", (), {"urlpatterns": [path("report", Report.as_view())]})
    with override_settings(ROOT_URLCONF=urlconf):
        assert token_client(alice, "mutate").get("/report").json() == {"user": "alice"}
        denied = token_client(alice, "read").get("/report")
        assert denied.status_code == 403
        assert denied.json()["detail"].startswith("This token lacks")
        assert session.get("/report").status_code == 200
    with pytest.raises(ValueError):
        requires_scope("write")
