"""Long transactions made visible: /metrics gauges, /healthz degraded, the admin's stream page."""

import re
import time

import pytest
from django.test import Client
from django.urls import reverse

from project.demo import models as demo

from ..conftest import scrape_metrics
from .api_support import *  # noqa: F403  (the fixtures)
from .api_support import HeldTransaction, postgres, publish, publish_to

pytestmark = pytest.mark.django_db(transaction=True)

HOLD = "INSERT INTO \"user\" (id, name) VALUES ('idle', 'idle')"


def gauge(text, name):
    match = re.search(rf'^{name}{{database="default"}} ([0-9.e+-]+)$', text, re.M)
    return None if match is None else float(match.group(1))


@pytest.fixture
def pg_only(engine):
    if not postgres():
        pytest.skip("SQLite has no fence to hold open: its write lock orders commits")


def test_metrics_show_the_oldest_fenced_transaction_while_a_session_idles_in_one(pg_only):
    """
    A session idle in a transaction that captured a row shows on /metrics as the age of
    the oldest fenced transaction, and the watermark lag it causes; both clear after it ends.
    """
    published = publish()
    held = HeldTransaction(HOLD)
    try:
        demo.User.objects.create(id="after", name="after")  # commits above the held seq
        publish_to(published)
        time.sleep(1.1)
        text = scrape_metrics()
        assert gauge(text, "rindle_stream_status_up") == 1
        assert gauge(text, "rindle_stream_oldest_fenced_transaction_seconds") >= 1.0
        assert gauge(text, "rindle_stream_fenced_transactions") == 1
        lag = gauge(text, "rindle_stream_lag")  # seqs: the held one and the one above it
        assert lag >= 2 and lag == gauge(text, "rindle_stream_max_seq") - published
        assert gauge(text, "rindle_stream_lag_seconds") > 0
        assert gauge(text, "rindle_stream_safe_seq") == published
    finally:
        held.release()
    publish()
    text = scrape_metrics()
    assert gauge(text, "rindle_stream_oldest_fenced_transaction_seconds") == 0
    assert gauge(text, "rindle_stream_lag") == 0
    assert gauge(text, "rindle_stream_lag_seconds") == 0


def test_healthz_is_ok_when_the_watermark_keeps_up(engine):
    """A published watermark with no long transaction: ok, 200, on both backends."""
    demo.User.objects.create(id="a", name="a")
    publish()
    response = Client().get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["reasons"] == []
    assert body["stream"]["lag"] == 0 and body["stream"]["safe_seq"] == body["stream"]["max_seq"]


def test_healthz_reports_degraded_past_the_threshold_and_names_the_pid(pg_only, settings):
    """
    Past STREAM_HEALTH_LAG_SECONDS of lag /healthz says degraded, with the lag, its age
    and the pid holding the fence, and stays 200 so balancers keep the server in rotation.
    """
    settings.RINDLE = {**settings.RINDLE, "STREAM_HEALTH_LAG_SECONDS": 0.5}
    published = publish()
    held = HeldTransaction(HOLD)
    try:
        demo.User.objects.create(id="after", name="after")
        publish_to(published)
        assert Client().get("/healthz").json()["status"] == "ok"  # not yet past the threshold
        time.sleep(1.0)
        response = Client().get("/healthz")
        body = response.json()
    finally:
        held.release()
    assert response.status_code == 200
    assert body["status"] == "degraded"
    assert set(body["reasons"]) == {"watermark_lag", "long_fenced_transaction"}
    stream = body["stream"]
    assert stream["lag"] == stream["max_seq"] - published >= 2
    assert stream["lag_seconds"] > 0.5
    assert stream["oldest_fenced_transaction"]["pid"] == held.pid
    assert stream["oldest_fenced_transaction"]["age_seconds"] >= 1.0
    publish()
    assert Client().get("/healthz").json()["status"] == "ok"


def test_the_admin_stream_page_lists_an_open_fenced_transaction_for_staff(
    pg_only, django_user_model
):
    """
    The admin's change-stream page shows safe_seq, max_seq, lag, horizon and epoch, and the
    open fenced transaction with its pid and query, so the operator can find it.
    """
    operator = django_user_model.objects.create_superuser("operator", "op@example.com")
    client = Client()
    client.force_login(operator)
    url = reverse("admin:rindle_app_streamstate_changelist")
    published = publish()
    held = HeldTransaction(HOLD)
    try:
        response = client.get(url)
    finally:
        held.release()
    assert response.status_code == 200
    text = response.text
    assert f'<td id="stream-safe-seq">{published}</td>' in text
    assert 'id="stream-epoch"' in text and 'id="stream-horizon"' in text
    assert "stream-fenced-row" in text and f"<td>{held.pid}</td>" in text
    assert "INSERT INTO &quot;user&quot;" in text and "holds (shared)" in text


def test_the_admin_stream_page_renders_on_both_backends_and_is_closed_to_others(
    engine, django_user_model
):
    """Staff with view rights see the state (no fenced transaction); a non-staff user does not."""
    demo.User.objects.create(id="a", name="a")
    publish()
    url = reverse("admin:rindle_app_streamstate_changelist")
    operator = Client()
    operator.force_login(django_user_model.objects.create_superuser("op", "op@example.com"))
    response = operator.get(url)
    assert response.status_code == 200
    assert 'id="stream-max-seq"' in response.text and "Change stream" in response.text
    if postgres():
        assert 'id="stream-fenced-none"' in response.text
    member = Client()
    member.force_login(django_user_model.objects.create_user("member"))
    assert member.get(url).status_code == 302  # to the admin login
    plain_staff = Client()
    plain_staff.force_login(django_user_model.objects.create_user("ops", is_staff=True))
    assert plain_staff.get(url).status_code == 403
