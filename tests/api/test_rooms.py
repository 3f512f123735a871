"""
The room write authority over HTTP, in the shapes the published daemon client and
room hosts use: /claim-room-epoch, /room-lmids and /apply-row-change-txn with
doc/epoch/cas. Verdicts are 409 {error: "fenced"|"conflict"}; every refusal
changes nothing; only tokens with scope "rooms" get in.
"""

import pytest

from rindle_app.testing import outbox_high_water
from tests.engine.conftest import scratch_table

from .conftest import post, token_client

TABLE = "room_http_rows"
DOC = "notes/7"


@pytest.fixture
def table(engine):
    yield from scratch_table(engine, TABLE)


@pytest.fixture
def host(alice, table):
    return token_client(alice, "rooms")


def add(i, label="x"):
    return {"table": TABLE, "op": "add", "row": {"id": f"r{i}", "label": label}}


def flush(client, offset, changes, epoch, **extra):
    body = {"source": f"room:{DOC}", "offset": str(offset), "changes": changes}
    return post(client, "/apply-row-change-txn", {**body, "doc": DOC, "epoch": epoch, **extra})


def labels():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id, label FROM "{TABLE}" ORDER BY id')
        return cursor.fetchall()


def test_claim_flush_fence_and_lmids_round_trip(host):
    first = post(host, "/claim-room-epoch", {"doc": DOC})
    assert first.status_code == 200 and first.json() == {"epoch": 1}
    lmid = {"table": "_rindle_client_mutations", "op": "add"}
    lmid["row"] = {"client_id": "c1", "last_mutation_id": 4}
    ok = flush(host, 1, [add(1), lmid], 1, batchHash="b1")
    assert ok.status_code == 200, ok.content
    assert ok.json()["applied"] is True and ok.json()["cv"] >= 1
    replay = flush(host, 1, [add(1), lmid], 1, batchHash="b1")
    assert replay.status_code == 200 and replay.json()["applied"] is False
    lmids = post(host, "/room-lmids", {"doc": DOC, "clients": ["c1", "c2"]})
    assert lmids.status_code == 200 and lmids.json() == {"lmids": {"c1": 4}}
    assert post(host, "/claim-room-epoch", {"doc": DOC}).json() == {"epoch": 2}
    before = outbox_high_water()
    stale = flush(host, 2, [add(2)], 1)
    assert stale.status_code == 409
    assert stale.json()["error"] == "fenced" and stale.json()["epoch"] == 2
    assert outbox_high_water() == before and labels() == [("r1", "x")]


def test_a_cas_miss_is_a_conflict_with_the_current_images_and_nothing_applied(host):
    post(host, "/claim-room-epoch", {"doc": DOC})
    assert flush(host, 1, [add(1, "a")], 1).status_code == 200
    before = outbox_high_water()
    miss = {"table": TABLE, "op": "edit", "old": {"id": "r1", "label": "b"}, "row": {"label": "c"}}
    r = flush(host, 2, [add(2), miss], 1, cas=True)
    assert r.status_code == 409, r.content
    body = r.json()
    assert body["error"] == "conflict"
    assert [(c["index"], c["key"], c["current"]["label"]) for c in body["conflicts"]] == [
        (1, {"id": "r1"}, "a")
    ]
    assert outbox_high_water() == before and labels() == [("r1", "a")]


def test_room_routes_need_the_rooms_scope(alice, table):
    ingest_only = token_client(alice, "ingest")
    before = outbox_high_water()
    for path, body in (
        ("/claim-room-epoch", {"doc": DOC}),
        ("/room-lmids", {"doc": DOC, "clients": []}),
        ("/apply-row-change-txn", {"source": "s", "offset": "1", "changes": [add(1)], "doc": DOC}),
        ("/apply-row-change-txn", {"source": "s", "offset": "1", "changes": [add(1)], "cas": True}),
    ):
        r = post(ingest_only, path, body)
        assert r.status_code == 403, (path, r.content)
        assert r.json()["error"]["code"] == "insufficient_scope"
    assert outbox_high_water() == before and labels() == []
    # and a rooms token is no change-source token
    plain = {"source": "s", "offset": "1", "changes": [add(1)]}
    r = post(token_client(alice, "rooms"), "/apply-row-change-txn", plain)
    assert r.status_code == 403 and r.json()["error"]["code"] == "insufficient_scope"
    assert labels() == []


@pytest.mark.parametrize(
    "path, body, code",
    [
        ("/claim-room-epoch", {}, "invalid_request"),
        ("/claim-room-epoch", {"doc": ""}, "invalid_request"),
        ("/claim-room-epoch", {"doc": 5}, "invalid_request"),
        ("/claim-room-epoch", {"doc": DOC, "extra": 1}, "invalid_request"),
        ("/room-lmids", {"doc": DOC}, "invalid_request"),
        ("/room-lmids", {"doc": DOC, "clients": "c1"}, "invalid_request"),
        ("/room-lmids", {"doc": DOC, "clients": ["c"] * 1001}, "invalid_clients"),
        ("/room-lmids", {"doc": DOC, "clients": [""]}, "invalid_request"),
        (
            "/apply-row-change-txn",
            {"source": "s", "offset": "1", "changes": [], "doc": DOC},
            "invalid_epoch",
        ),
        (
            "/apply-row-change-txn",
            {"source": "s", "offset": "1", "changes": [], "epoch": 1},
            "invalid_epoch",
        ),
        (
            "/apply-row-change-txn",
            {"source": "s", "offset": "1", "changes": [], "doc": DOC, "epoch": 0},
            "invalid_request",
        ),
        (
            "/apply-row-change-txn",
            {"source": "s", "offset": "1", "changes": [], "doc": DOC, "epoch": 1, "cas": "yes"},
            "invalid_request",
        ),
        (
            "/apply-row-change-txn",
            {"source": "s", "offset": "1", "changes": [], "doc": DOC, "epoch": 1, "run_id": "r"},
            "invalid_request",
        ),
    ],
)
def test_bad_room_bodies_are_refused_with_a_code_and_change_nothing(host, path, body, code):
    before = outbox_high_water()
    r = post(host, path, body)
    assert r.status_code == 400, r.content
    assert r.json()["error"]["code"] == code
    assert outbox_high_water() == before
