"""
The producer and change-source routes: verdicts as documented, every refusal a
code with nothing written, bearer tokens with the right scope only, producer ids
bound to the token's user.
"""

import pytest

from rindle_app.testing import outbox_high_water
from tests.engine.conftest import scratch_table

from .conftest import post, token_client

TABLE = "ingest_http"


@pytest.fixture
def table(engine):
    yield from scratch_table(engine, TABLE)


@pytest.fixture
def producer(alice, table):
    return token_client(alice, "produce")


@pytest.fixture
def ingest(alice, table):
    return token_client(alice, "ingest")


def add(i):
    return {"table": TABLE, "op": "add", "row": {"id": f"r{i}", "label": "x"}}


def count():
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f'SELECT COUNT(*) FROM "{TABLE}"')
        return cursor.fetchone()[0]


def write(client, producer, seq, changes):
    return post(
        client, "/v1/producers/write", {"producer": producer, "seq": seq, "changes": changes}
    )


def test_producer_writes_replays_gaps_and_conflicts(producer):
    r = write(producer, "etl", 1, [add(1)])
    assert r.status_code == 200, r.content
    assert r.json()["applied"] is True and r.json()["seq"] == 1 and r["Rindle-Boot-Id"]
    replay = write(producer, "etl", 1, [add(1)])
    assert replay.status_code == 200 and replay.json()["applied"] is False
    before = outbox_high_water()
    gap = write(producer, "etl", 5, [add(5)])
    assert gap.status_code == 409
    assert gap.json()["error"]["code"] == "seq_gap" and gap.json()["error"]["stored"] == 1
    conflict = write(producer, "etl", 1, [add(2)])
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "digest_conflict"
    assert outbox_high_water() == before and count() == 1
    seq = producer.get("/v1/producers/etl")
    assert seq.status_code == 200 and seq.json() == {"producer": "etl", "seq": 1}
    assert producer.get("/v1/producers/never").json()["seq"] == 0


def test_a_producer_id_belongs_to_the_user_whose_token_claimed_it(
    producer, django_user_model, table
):
    assert write(producer, "shared", 1, [add(1)]).status_code == 200
    bob = token_client(django_user_model.objects.create_user("bob"), "produce")
    before = outbox_high_water()
    r = write(bob, "shared", 2, [add(2)])
    assert r.status_code == 403 and r.json()["error"]["code"] == "producer_not_owned"
    assert bob.get("/v1/producers/shared").status_code == 403
    assert outbox_high_water() == before and count() == 1


def test_the_routes_take_tokens_with_their_scope_only(alice, session, table):
    reader = token_client(alice, "read", "mutate", "ingest")
    before = outbox_high_water()
    assert write(reader, "p", 1, [add(1)]).status_code == 403
    assert write(session, "p", 1, [add(1)]).status_code == 403
    from rest_framework.test import APIClient

    anonymous = write(APIClient(), "p", 1, [add(1)])
    assert anonymous.status_code == 401
    producer_only = token_client(alice, "produce")
    body = {"source": "s", "offset": "1", "changes": [add(1)]}
    assert post(producer_only, "/apply-row-change-txn", body).status_code == 403
    assert outbox_high_water() == before and count() == 0


@pytest.mark.parametrize(
    "body, code",
    [
        ([], "invalid_request"),
        ({"producer": "p", "seq": 1}, "invalid_request"),
        ({"producer": "p", "seq": "1", "changes": []}, "invalid_request"),
        ({"producer": "p", "seq": 0, "changes": []}, "invalid_request"),
        ({"producer": 7, "seq": 1, "changes": []}, "invalid_request"),
        ({"producer": "p", "seq": 1, "changes": [], "extra": 1}, "invalid_request"),
        ({"producer": "p", "seq": 1, "changes": [{"table": "nope", "op": "add"}]}, "unknown_table"),
        ({"producer": "p", "seq": 1, "changes": [{"table": TABLE, "op": "add"}]}, "invalid_row"),
    ],
)
def test_bad_producer_bodies_are_refused_with_a_code(producer, body, code):
    before = outbox_high_water()
    r = post(producer, "/v1/producers/write", body)
    assert r.status_code == 400, r.content
    assert r.json()["error"]["code"] == code
    assert outbox_high_water() == before


def test_source_batches_over_http(ingest):
    body = {"source": "wiki", "offset": "3", "batchHash": "h3", "changes": [add(1), add(2)]}
    r = post(ingest, "/apply-row-change-txn", body)
    assert r.status_code == 200, r.content
    assert r.json()["applied"] is True and r.json()["checkpoint"]["offset"] == "3"
    again = post(ingest, "/apply-row-change-txn", body)
    assert again.status_code == 200 and again.json()["applied"] is False
    before = outbox_high_water()
    other = post(ingest, "/apply-row-change-txn", {**body, "batchHash": "zz"})
    assert other.status_code == 409 and other.json()["error"]["code"] == "hash_mismatch"
    assert outbox_high_water() == before and count() == 2
    # The path form, and the checkpoint a restarted source resumes from.
    nxt = post(ingest, "/v1/sources/wiki/batches", {"offset": "4", "changes": [add(3)]})
    assert nxt.status_code == 200 and nxt.json()["applied"] is True
    cp = ingest.get("/v1/sources/wiki/checkpoint")
    assert cp.status_code == 200 and cp.json()["offset"] == "4"
    assert cp.json()["head"] == {"rows": 3, "batches": 2}
    missing = ingest.get("/v1/sources/unknown/checkpoint")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_the_run_fence_over_http(ingest):
    first = {"offset": "1", "run_id": "a", "changes": [add(1)]}
    assert post(ingest, "/v1/sources/cdc/batches", first).status_code == 200
    before = outbox_high_water()
    stale = post(ingest, "/v1/sources/cdc/batches", {"offset": "2", "run_id": "b", "changes": []})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "fenced"
    bad_swap = post(ingest, "/v1/sources/cdc/run-id", {"offset": "1", "previous": "x", "next": "b"})
    assert bad_swap.status_code == 409 and bad_swap.json()["error"]["code"] == "fenced"
    swap = post(ingest, "/v1/sources/cdc/run-id", {"offset": "1", "previous": "a", "next": "b"})
    assert swap.status_code == 200 and swap.json()["runId"] == "b"
    assert outbox_high_water() == before
    ok = post(ingest, "/v1/sources/cdc/batches", {"offset": "2", "run_id": "b", "changes": []})
    assert ok.status_code == 200 and ok.json()["applied"] is True


@pytest.mark.parametrize(
    "body, code",
    [
        ({"offset": "1", "changes": [add(1)]}, "invalid_request"),  # no source
        ({"source": "s", "offset": "1", "chunk_seq": -2, "changes": []}, "invalid_request"),
        ({"source": "s", "offset": 1, "changes": []}, "invalid_request"),
        ({"source": "s", "offset": "1", "changes": [add(1), add(1)]}, "row_conflict"),
        ({"source": "s", "offset": "1", "changes": [{"table": TABLE}]}, "invalid_op"),
    ],
)
def test_bad_source_bodies_are_refused_with_a_code(ingest, body, code):
    before = outbox_high_water()
    r = post(ingest, "/apply-row-change-txn", body)
    assert r.status_code in (400, 409), r.content
    assert r.json()["error"]["code"] == code
    assert outbox_high_water() == before and count() == 0
    assert ingest.get("/v1/sources/s/checkpoint").status_code == 404


def test_the_daemon_clients_positional_rows_are_accepted(ingest):
    """`@rindle/daemon-client` sends RowChangeTxn rows as arrays in /schema's column order."""
    from rindle_app.engine import get_engine

    schema = {t["name"]: t for t in get_engine().base_table_schemas()}[TABLE]
    columns = [c["name"] for c in schema["columns"]]
    row = {"id": "r1", "label": "x", "n": 3, "meta": None}
    body = {
        "source": "d",
        "offset": "1",
        "changes": [{"table": TABLE, "op": "add", "row": [row[c] for c in columns]}],
    }
    r = post(ingest, "/apply-row-change-txn", body)
    assert r.status_code == 200 and r.json()["applied"] is True, r.content
    assert count() == 1
