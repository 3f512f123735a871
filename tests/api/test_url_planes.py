"""
rindle's URLconfs per plane, mounted under a prefix: the planes included answer
there (and reverse() finds them), the planes left out answer 404, and the
websocket URLs rindle hands out sit under the same prefix, where
``websocket_application(prefix)`` serves them.
"""

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.urls import reverse
from rest_framework.test import APIClient

from project.demo import models as demo
from rindle_app import tokens
from rindle_app.asgi import websocket_application
from rindle_app.urls import PLANES

from .conftest import post, state, token_client
from .test_mutate import create

URLS = "tests.api.prefixed_urls"
ORIGIN = (b"origin", b"http://localhost")


def test_every_plane_is_an_includable_urlconf_and_the_whole_keeps_every_route(engine):
    """``rindle_app.urls`` is the union of the planes, no route in two; paths are unchanged."""
    import importlib

    names = set()
    for plane in PLANES:
        module = importlib.import_module(f"rindle_app.urls.{plane}")
        names |= {p.name for p in module.urlpatterns}
    assert len(names) == sum(
        len(importlib.import_module(f"rindle_app.urls.{p}").urlpatterns) for p in PLANES
    )  # no route in two planes
    from rindle_app import urls

    assert [p.name for p in urls.urlpatterns] == [
        p.name
        for plane in PLANES
        for p in importlib.import_module(f"rindle_app.urls.{plane}").urlpatterns
    ]
    assert reverse("rindle-mutate") == "/api/rindle/mutate"
    assert reverse("rindle-sql-execute") == "/v1/sql/execute"
    assert reverse("rindle-daemon-materialize") == "/materialize"
    assert reverse("rindle-docs") == "/api/rindle/docs/"


@pytest.mark.urls(URLS)
def test_a_prefixed_mount_serves_its_planes_and_404s_the_others(engine, alice):
    client = token_client(alice, "mutate", "read", "schema")
    assert reverse("rindle-mutate") == "/sync/api/rindle/mutate"
    assert reverse("rindle-openapi") == "/sync/api/schema/openapi"
    outcome = post(client, "/sync/api/rindle/mutate", {"envelope": create("i1", 1)}).json()
    assert outcome["accepted"] is True and outcome["lmid"] == 1
    assert demo.Issue.objects.filter(id="i1").exists()
    read = post(client, "/sync/api/rindle/read", {"name": "users"}).json()
    assert [r["cols"]["id"] for r in read["rows"]] == ["alice"]
    assert client.get("/sync/schema").status_code == 200
    before = state()
    # Not at the root any more, and the planes left out are not mounted anywhere.
    assert post(client, "/api/rindle/mutate", {"envelope": create("i2", 2)}).status_code == 404
    sql = token_client(alice, "admin")
    assert post(sql, "/sync/v1/sql/execute", {"sql": "SELECT 1"}).status_code == 404
    assert post(sql, "/v1/sql/execute", {"sql": "SELECT 1"}).status_code == 404
    assert post(sql, "/sync/materialize", {}).status_code == 404
    assert sql.get("/sync/v1/stream").status_code == 404
    assert state() == before
    # The ops plane: the document and its viewer point at the prefixed route.
    assert APIClient().get("/sync/api/schema/openapi").status_code == 200
    docs = APIClient().get("/sync/api/rindle/docs/")
    assert docs.status_code == 200 and b"/sync/api/schema/openapi" in docs.content


@pytest.mark.urls(URLS)
def test_room_boot_under_a_prefix_points_at_the_prefixed_socket_and_routes(engine, settings):
    settings.RINDLE = {**settings.RINDLE, "ROOMS_ENABLED": True}
    demo.User.objects.create(id="u1", name="Ursula")
    demo.Issue.objects.create(
        id="i1", title="t", status="todo", priority="low", owner_id="u1", created_at=1,
        updated_at=1,
    )  # fmt: skip
    host = get_user_model().objects.create_user("host")
    raw, _token = tokens.create(host, ["rooms"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    boot = post(client, "/sync/api/rindle/room-boot", {"doc": "issue/i1"})
    assert boot.status_code == 200, boot.content
    body = boot.json()
    assert body["upstreamWsEndpoint"] == "ws://testserver/sync/ws/rindle/"
    assert body["flush"]["urls"] == {
        "apply": "/sync/apply-row-change-txn",
        "claim": "/sync/claim-room-epoch",
        "lmids": "/sync/room-lmids",
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_websocket_serves_under_the_prefix_and_not_at_the_root(live):
    await database_sync_to_async(demo.User.objects.create)(id="u1", name="Ada")
    app = websocket_application("sync/")
    root = WebsocketCommunicator(app, "/ws/rindle/", headers=[ORIGIN])
    with pytest.raises(ValueError, match="No route found"):
        await root.connect(timeout=5)
    socket = WebsocketCommunicator(app, "/sync/ws/rindle/", headers=[ORIGIN])
    assert (await socket.connect(timeout=5))[0]
    frame = {"t": "subscribe", "queryId": 1, "name": "users", "mode": "normalized"}
    await socket.send_to(text_data=json.dumps(frame))
    frames = []
    while not frames or frames[-1]["t"] != "progress":
        frames.append(json.loads(await socket.receive_from(timeout=10)))
    assert frames[1]["batch"]["ops"] == [{"table": "user", "op": "add", "row": ["u1", "Ada"]}]
    await socket.disconnect()


@pytest.fixture
def live(transactional_db):
    from rindle_app.testing import fresh_runtime

    with fresh_runtime() as runtime:
        yield runtime.engine


def test_the_openapi_viewers_load_no_asset_from_a_cdn(engine):
    """Swagger UI and Redoc at their documented URLs, their assets served by this site."""
    for url in ("/api/rindle/docs/", "/api/rindle/redoc/"):
        page = APIClient().get(url, HTTP_ACCEPT="text/html")
        assert page.status_code == 200 and page["Content-Type"].startswith("text/html")
        html = page.content.decode()
        assert "/api/schema/openapi" in html
        assert "/static/drf_spectacular_sidecar/" in html and "cdn.jsdelivr" not in html


def test_the_openapi_document_opened_in_a_browser_is_shown_not_downloaded(engine):
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    page = APIClient().get("/api/schema/openapi", HTTP_ACCEPT=browser)
    assert page.status_code == 200
    assert page["Content-Type"] == "text/plain; charset=utf-8"
    assert page["Content-Disposition"].startswith("inline")
    assert page.content.startswith(b"openapi: ")
    as_json = APIClient().get("/api/schema/openapi?format=json", HTTP_ACCEPT=browser)
    assert as_json["Content-Type"] == "application/json; charset=utf-8"
    assert "paths" in as_json.json()
    # Tools keep the OpenAPI media types.
    tool = APIClient().get("/api/schema/openapi")
    assert tool["Content-Type"].startswith("application/vnd.oai.openapi")
    tool = APIClient().get("/api/schema/openapi", HTTP_ACCEPT="application/json")
    assert tool["Content-Type"] == "application/json" and "paths" in tool.json()


@pytest.mark.urls("tests.api.rooms_only_urls")
def test_room_boot_without_the_ingest_plane_is_a_clear_501_that_claims_nothing(engine):
    from django.db import connection

    host = get_user_model().objects.create_user("host")
    client = token_client(host, "rooms")
    demo.User.objects.create(id="u1", name="Ursula")
    demo.Issue.objects.create(
        id="i1", title="t", status="todo", priority="low", owner_id="u1", created_at=1,
        updated_at=1,
    )  # fmt: skip
    reply = post(client, "/api/rindle/room-boot", {"doc": "issue/i1"})
    assert reply.status_code == 501, reply.content
    assert reply.json()["error"]["code"] == "plane_not_mounted"
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM _rindle_room_placement")
        assert cursor.fetchone()[0] == 0
