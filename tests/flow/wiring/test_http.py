"""
HTTP traffic in the usage ledger: every rindle route counts its body bytes in and
rendered bytes out under the caller's namespace, refusals by reason, 401s as auth
failures; a namespace over its quota gets 429 quota_exceeded with nothing written,
and its quota is read from the store once per process.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from rindle_app.flow import DAY_MS, FlowLedger, FlowStore, Transfer, quota
from rindle_app.testing import outbox_high_water
from tests.engine.conftest import scratch_table

from .conftest import post, today, token_client

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "flow_http"


@pytest.fixture
def engine(transactional_db):
    from rindle_app.engine import get_engine, shutdown

    shutdown()
    engine = get_engine()
    yield from scratch_table(engine, TABLE)
    shutdown()


@pytest.fixture
def alice(engine, django_user_model):
    return django_user_model.objects.create_user("alice", password="pw")


@pytest.fixture
def namespace(alice):
    return f"user:{alice.pk}"


def add(i, label="x"):
    return {"table": TABLE, "op": "add", "row": {"id": f"r{i}", "label": label}}


def rows():
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT COUNT(*) FROM "{TABLE}"')
        return cursor.fetchone()[0]


def test_a_producer_write_and_a_source_batch_count_their_bytes(alice, namespace):
    producer = token_client(alice, "produce")
    ingest = token_client(alice, "ingest")
    write, write_in = post(
        producer, "/v1/producers/write", {"producer": "etl", "seq": 1, "changes": [add(1, "é")]}
    )
    assert write.status_code == 200, write.content
    batch, batch_in = post(ingest, "/v1/sources/cdc/batches", {"offset": "1", "changes": [add(2)]})
    assert batch.status_code == 200, batch.content
    day = today(namespace)
    assert day.bytes_in == write_in + batch_in
    assert day.bytes_out == len(write.content) + len(batch.content)
    # One transfer per request; each token is its own session.
    assert day.transfers == 2 and day.sessions == 2 and day.refused == 0


def test_a_signed_in_browser_counts_under_its_user(alice, namespace, client):
    client.force_login(alice)
    response = client.get("/schema")
    assert response.status_code == 200
    day = today(namespace)
    assert (day.bytes_in, day.bytes_out, day.transfers, day.sessions) == (
        0,
        len(response.content),
        1,
        1,
    )


def test_refusals_count_by_reason_and_move_no_bytes(alice, namespace):
    producer = token_client(alice, "produce")
    ingest = token_client(alice, "ingest")
    assert (
        post(producer, "/v1/producers/write", {"producer": "p", "seq": 1, "changes": []})[
            0
        ].status_code
        == 200
    )
    refused = [
        (post(producer, "/v1/producers/write", {"producer": "p", "seq": 1}), 400),  # no changes
        (post(producer, "/v1/producers/write", {"producer": "p", "seq": 9, "changes": []}), 409),
        (post(producer, "/v1/sources/s/batches", {"offset": "1", "changes": []}), 403),  # scope
    ]
    assert (
        post(ingest, "/v1/sources/s/batches", {"offset": "1", "run_id": "a", "changes": []})[
            0
        ].status_code
        == 200
    )
    stale = {"offset": "2", "run_id": "b", "changes": []}
    refused.append((post(ingest, "/v1/sources/s/batches", stale), 409))  # fenced
    for (response, _n), status in refused:
        assert response.status_code == status, response.content
    day = today(namespace)
    assert {k: v for k, v in day.refusals.items() if v} == {
        "bad_request": 1,
        "other": 1,  # a seq gap: the producer's conflict, not a door
        "permission": 1,
        "fenced": 1,
    }
    assert day.transfers == 2 and day.auth_failures == 0

    anonymous = APIClient()
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer rdl_nope_nope")
    assert anonymous.get("/v1/producers/p").status_code == 401
    assert APIClient().get("/v1/producers/p").status_code == 401  # no credentials at all
    nobody = today("anonymous")
    assert nobody.auth_failures == 2 and nobody.transfers == 0 and nobody.last_seen_ms is None


def test_over_quota_a_request_gets_429_before_the_view_runs(alice, namespace, settings):
    settings.RINDLE = {**settings.RINDLE, "FLOW_QUOTAS": {namespace: 100}}
    producer = token_client(alice, "produce")
    ok, _ = post(producer, "/v1/producers/write", {"producer": "p", "seq": 1, "changes": [add(1)]})
    assert ok.status_code == 200  # admitted at 0 bytes; it crossed the quota
    assert today(namespace).moved >= 100
    before = outbox_high_water()
    body = {"producer": "p", "seq": 2, "changes": [add(2)]}
    refused, _ = post(producer, "/v1/producers/write", body)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded" and error["retryable"] is True
    assert error["limit"] == 100 and error["used"] >= 100 and error["window_days"] == 30
    assert 1 <= int(refused["Retry-After"]) <= 30 * 86_400
    assert int(refused["Retry-After"]) == -(-error["retry_after_ms"] // 1000)
    assert outbox_high_water() == before and rows() == 1
    assert producer.get("/v1/producers/p").status_code == 429
    day = today(namespace)
    assert day.refusals["quota"] == 2 and day.transfers == 1

    # Another namespace has its own quota (unlimited here).
    bob = token_client(type(alice).objects.create_user("bob"), "produce")  # noqa: E501
    assert (
        post(bob, "/v1/producers/write", {"producer": "q", "seq": 1, "changes": []})[0].status_code
        == 200
    )


def test_a_zero_quota_refuses_public_sql_in_its_own_envelope(alice, namespace, settings):
    settings.RINDLE = {**settings.RINDLE, "FLOW_QUOTAS": {namespace: 0}}
    sql = token_client(alice, "sql", tables=[TABLE])
    statement = {"sql": f'INSERT INTO "{TABLE}" (id, label) VALUES (?, ?)', "args": ["r1", "x"]}
    refused, _ = post(sql, "/v1/sql/execute", {"statement": statement})
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded" and error["retry_scope"] == "request"
    assert error["transaction_state"] == "unknown" and error["partial_results"] is None
    assert rows() == 0


def test_every_rindle_route_documents_its_429(engine, client):
    document = client.get("/api/schema/openapi?format=json").json()
    operations = {
        (method, path): op
        for path, item in document["paths"].items()
        for method, op in item.items()
        if path != "/api/schema/openapi"
    }
    assert len(operations) >= 17
    for key, op in operations.items():
        assert "429" in op["responses"], key
        assert "Retry-After" in op["responses"]["429"]["headers"], key


def test_the_store_is_read_once_per_namespace_per_process(alice, namespace, settings):
    settings.RINDLE = {**settings.RINDLE, "FLOW_QUOTA_BYTES": 10_000_000}
    producer = token_client(alice, "produce")

    def flow_reads(context):
        """The namespace's window read (the ledger's own start reads its node's rows)."""
        return [
            q["sql"]
            for q in context.captured_queries
            if "_rindle_flow_days" in q["sql"] and "namespace =" in q["sql"]
        ]

    with CaptureQueriesContext(connection) as first:
        assert producer.get("/v1/producers/p").status_code == 200
    assert len(flow_reads(first)) == 1
    with CaptureQueriesContext(connection) as later:
        for seq in (1, 2, 3):
            body = {"producer": "p", "seq": seq, "changes": [add(seq)]}
            assert post(producer, "/v1/producers/write", body)[0].status_code == 200
        assert producer.get("/v1/producers/p").status_code == 200
    assert [q["sql"] for q in later.captured_queries if "_rindle_flow" in q["sql"]] == []
    # The cache advanced by what this process counted, without reading the store.
    quotas = quota.get_quotas()
    assert quotas.seeds == 1
    assert quotas.used(namespace, quota.now_ms()) == today(namespace).moved


def test_the_window_rolls_days_out_of_the_cache_without_reading_again(db):
    """A day that leaves the window stops counting at the midnight that ends it."""
    day = 20_000
    noon = day * DAY_MS + DAY_MS // 2
    ledger = FlowLedger(FlowStore(), node="n", retention_days=90).start(noon)
    quotas = quota.Quotas(ledger, default=1000, window_days=3)
    ledger.record("acme", noon - 2 * DAY_MS, Transfer(bytes_in=900))  # the oldest day
    ledger.flush(noon)
    quotas.check("acme", noon)  # seeds: 900 < 1000
    at = noon + 60_000
    ledger.record("acme", at, Transfer(bytes_out=200))
    quotas.count("acme", at, 200)
    with pytest.raises(quota.QuotaExceeded) as refused:
        quotas.check("acme", at)
    # 1,100 bytes; at midnight the 900-byte day leaves the window.
    assert refused.value.details["used"] == 1100
    assert refused.value.retry_after_ms == (day + 1) * DAY_MS - at
    quotas.check("acme", (day + 1) * DAY_MS)  # admitted: 200 left in the window
    assert quotas.used("acme", (day + 1) * DAY_MS) == 200
    assert quotas.seeds == 1
    # Another namespace over quota from today alone waits for today to leave.
    quotas.check("big", at)
    quotas.count("big", at, 5000)
    with pytest.raises(quota.QuotaExceeded) as refused:
        quotas.check("big", at)
    assert refused.value.retry_after_ms == (day + 3) * DAY_MS - at


@pytest.mark.parametrize(
    "rindle, message",
    [
        ({"FLOW_QUOTA_BYTES": -1}, "FLOW_QUOTA_BYTES"),
        ({"FLOW_QUOTA_BYTES": 1.5}, "FLOW_QUOTA_BYTES"),
        ({"FLOW_QUOTAS": {"acme": "lots"}}, "FLOW_QUOTAS"),
        ({"FLOW_QUOTA_WINDOW_DAYS": 0}, "FLOW_QUOTA_WINDOW_DAYS"),
        ({"FLOW_QUOTA_WINDOW_DAYS": 91}, "FLOW_QUOTA_WINDOW_DAYS"),  # past the retention
    ],
)
def test_misconfigured_quotas_are_refused_by_name(db, settings, rindle, message):
    from django.core.exceptions import ImproperlyConfigured

    settings.RINDLE = {**settings.RINDLE, **rindle}
    with pytest.raises(ImproperlyConfigured, match=message):
        quota.get_quotas()
