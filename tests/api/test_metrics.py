"""/metrics: the ProducerCensus gauge, read from memory (a scrape runs no query)."""

import re

import pytest
from django.conf import settings
from django.test import Client, override_settings

from rindle_app.checks import check_settings
from tests.engine.conftest import scratch_table

from ..conftest import METRICS_TOKEN, scrape_metrics


def gauge(text, name):
    match = re.search(rf'^{name}{{database="default"}} ([0-9.e+]+)$', text, re.M)
    return None if match is None else float(match.group(1))


@pytest.fixture
def table(engine):
    yield from scratch_table(engine, "metrics_item")


def test_the_census_is_on_metrics_and_a_scrape_runs_no_query(table, django_assert_num_queries):
    engine = table
    for n in range(3):
        engine.producer_write(f"p{n}", 1, [])
    engine.producer_write("p0", 2, [])  # a later write of a known producer
    engine.producer_write("p1", 1, [])  # a replay
    with django_assert_num_queries(0):
        text = scrape_metrics()
    assert gauge(text, "rindle_producers") == 3
    assert gauge(text, "rindle_writer_queue_depth") == 0


def metrics_status(auth=None, user=None, **extra):
    """The status of GET /metrics under ``RINDLE["METRICS_AUTH"] = auth``."""
    client = Client()
    if user is not None:
        client.force_login(user)
    with override_settings(RINDLE={**settings.RINDLE, "METRICS_AUTH": auth}):
        response = client.get("/metrics", **extra)
    if response.status_code == 403:
        assert response.json()["error"]["code"] == "metrics_forbidden"
    else:
        assert b"# TYPE rindle_producers gauge" in response.content
    return response.status_code


@pytest.fixture
def people(engine, django_user_model):
    staff = django_user_model.objects.create_user("ops", is_staff=True)
    return staff, django_user_model.objects.create_user("member")


def test_by_default_metrics_are_closed_outside_debug_but_to_staff(people):
    """METRICS_AUTH None: open while DEBUG is on; otherwise staff sessions only (403)."""
    staff, member = people
    assert metrics_status() == 403
    assert metrics_status(user=member) == 403
    assert metrics_status(user=staff) == 200
    with override_settings(DEBUG=True):
        assert metrics_status() == 200


def test_a_scraper_token_or_address_opens_metrics(people, django_assert_num_queries):
    staff, _member = people
    token = {"TOKEN": METRICS_TOKEN}
    with django_assert_num_queries(0):  # a token or an address reads no database
        assert metrics_status(token, HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}") == 200
        addresses = {"ADDRESSES": ["10.0.0.0/8", "::1"]}
        assert metrics_status(addresses, REMOTE_ADDR="10.1.2.3") == 200
        assert metrics_status(addresses, REMOTE_ADDR="::1") == 200
    assert metrics_status(token, HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}x") == 403
    assert metrics_status(token, HTTP_AUTHORIZATION=f"Basic {METRICS_TOKEN}") == 403
    assert metrics_status(token) == 403
    assert metrics_status(addresses, REMOTE_ADDR="127.0.0.1") == 403
    assert metrics_status(token, user=staff) == 200  # STAFF defaults to True
    assert metrics_status({**token, "STAFF": False}, user=staff) == 403
    assert metrics_status({"OPEN": True}) == 200


@pytest.mark.parametrize(
    "auth", ["open", {"TOKEN": "short"}, {"ADDRESSES": ["not-an-ip"]}, {"PASSWORD": "x"}]
)
def test_a_malformed_metrics_auth_is_check_e011_and_admits_nobody(people, auth):
    staff, _member = people
    with override_settings(RINDLE={**settings.RINDLE, "METRICS_AUTH": auth}):
        assert [m.id for m in check_settings(None)] == ["rindle.E011"]
    assert metrics_status(auth, user=staff, REMOTE_ADDR="127.0.0.1") == 403
