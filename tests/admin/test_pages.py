"""
The usage ledger's admin pages: the fleet, one namespace, forget.

Flow is recorded through the process ledger the pages read (``flow.get_ledger()``)
with the clock stopped at ``NOW``; the pages must show what the ledger holds,
flushed or not, every node summed, and forget only on a confirmed POST.
"""

import re
from html import unescape

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse

from rindle_app import flow
from rindle_app.admin import humanize_bytes, nice_scale
from rindle_app.flow import FlowLedger, FlowStore, Refusal, Transfer
from rindle_app.models import FlowDayRecord, FlowTombstone

from .conftest import NOW, day_at

FLEET = reverse("admin:rindle_app_flow_fleet")
NAMESPACE = reverse("admin:rindle_app_flow_namespace")
FORGET = reverse("admin:rindle_app_flow_forget")
KIB = 1024
MIB = 1024 * KIB


def value(html, element_id):
    """The ``data-value`` of the element with ``element_id``, as an int."""
    match = re.search(rf'id="{re.escape(element_id)}"[^>]*data-value="(\d*)"', html)
    assert match, f"no #{element_id} with a data-value"
    return int(match.group(1)) if match.group(1) else None


def error_code(response):
    match = re.search(r'id="flow-error" data-code="([a-z_]+)"', response.text)
    return match and match.group(1)


def bars(html, chart_id, namespace=None):
    """``{day: bytes}`` of the bars of one chart (of one row, in the fleet chart)."""
    svg = re.search(rf'<svg id="{chart_id}".*?</svg>', html, re.S).group(0)
    if namespace is not None:
        row = re.search(
            rf'<g class="fleet-row" data-namespace="{re.escape(namespace)}">.*?</g>\s*<text',
            svg,
            re.S,
        )
        svg = row.group(0) if row else ""
    return {
        day: int(n)
        for day, n in re.findall(r'<g class="bar" data-day="([\d-]+)" data-bytes="(\d+)"', svg)
    }


def assert_bars_inside(html, chart_id):
    """Every bar of the chart lies inside its viewBox and is drawn (a positive size)."""
    svg = re.search(rf'<svg id="{chart_id}".*?</svg>', html, re.S).group(0)
    width, height = map(float, re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg).groups())
    rects = re.findall(
        r'<rect class="(?:in|out)" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" height="([\d.]+)"',
        svg,
    )
    assert rects
    for x, y, w, h in (map(float, r) for r in rects):
        assert 0 <= x and x + w <= width and 0 <= y and y + h <= height
    stacks = re.findall(r'<g class="bar"[^>]*>.*?</g>', svg, re.S)
    for stack in stacks:
        heights = [float(h) for h in re.findall(r' height="([\d.]+)"', stack)]
        assert sum(heights) >= 2


def quiet_names(html):
    return [
        unescape(n) for n in re.findall(r'class="quiet-namespace" data-namespace="([^"]*)"', html)
    ]


def busy_fleet(ledger):
    """
    acme moves bytes on three days (today too), globex only today and is refused,
    initech was last seen 20 days ago, and umbrella only ever failed to authenticate.
    Recorded in time order, as transfers happen, then flushed.
    """
    ledger.record("initech", day_at(20), Transfer(5 * KIB, 0, session="i1"))
    ledger.record("acme", day_at(3), Transfer(1 * MIB, 2 * MIB, session="a1"))
    ledger.record("acme", day_at(1), Transfer(0, 512 * KIB, session="a1"))
    ledger.auth_failure("umbrella", day_at(1))
    ledger.record("acme", day_at(0), Transfer(100 * KIB, 3 * MIB, bulk_bytes_out=MIB, session="a1"))
    ledger.record("acme", day_at(0, 11), Transfer(10 * KIB, 20 * KIB, session="a2"))
    ledger.refuse("acme", day_at(0, 11), Refusal.RATE_LIMIT)
    ledger.record("globex", day_at(0), Transfer(2 * KIB, 4 * KIB, session="g1"))
    ledger.refuse("globex", day_at(0), Refusal.QUOTA)
    ledger.refuse("globex", day_at(0), Refusal.QUOTA)
    ledger.auth_failure("globex", day_at(0))
    assert ledger.flush(NOW) > 0


@pytest.fixture
def staff(client, django_user_model):
    def make(*codenames):
        user = django_user_model.objects.create_user("staff", is_staff=True)
        user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
        client.force_login(user)
        return client

    return make


# --- the fleet page -------------------------------------------------------------------


def test_the_fleet_page_shows_todays_totals_after_a_flush(ledger, operator):
    """Today's totals on the page are the ledger's fleet figures, exactly."""
    busy_fleet(ledger)
    response = operator.get(FLEET)
    assert response.status_code == 200
    html = response.text
    expected = {
        "fleet-bytes-in": 100 * KIB + 10 * KIB + 2 * KIB,
        "fleet-bytes-out": 3 * MIB + 20 * KIB + 4 * KIB,
        "fleet-bulk-out": MIB,
        "fleet-transfers": 3,
        "fleet-refusals": 3,
        "fleet-auth-failures": 1,
        "fleet-active": 2,  # acme and globex; umbrella's auth failure is not a sighting
        "fleet-namespaces": 4,
        "fleet-sessions": 3,  # a1, a2 in acme; g1 in globex
        "fleet-refused-rate_limit": 1,
        "fleet-refused-quota": 2,
        "fleet-refused-permission": 0,
    }
    assert {key: value(html, key) for key in expected} == expected
    fleet = ledger.fleet(NOW, 14)
    assert value(html, "fleet-bytes-in") == fleet.bytes_in
    assert value(html, "fleet-transfers") == fleet.transfers
    # Humanized beside the exact figure.
    assert f">{humanize_bytes(3 * MIB + 24 * KIB)}<" in html
    assert "2024-10-04" in html


def test_unflushed_live_figures_count_once_beside_the_stored_copies(ledger, operator):
    """This process's live slot replaces its own stored copy (never added to it), and
    another process's flushed rows are summed in."""
    busy_fleet(ledger)
    ledger.record("acme", day_at(0, 11), Transfer(KIB, KIB))  # not flushed
    other = FlowLedger(FlowStore(), node="node-b").start(NOW)
    other.record("acme", day_at(0, 9), Transfer(3 * KIB, 0))
    other.record("hooli", day_at(0, 9), Transfer(7 * KIB, 0))
    other.flush(NOW)
    html = operator.get(FLEET).text
    acme_today = 100 * KIB + 3 * MIB + 30 * KIB + 2 * KIB + 3 * KIB
    assert bars(html, "fleet-chart", "acme")["2024-10-04"] == acme_today
    assert bars(html, "fleet-chart", "hooli") == {"2024-10-04": 7 * KIB}
    assert value(html, "fleet-bytes-in") == 112 * KIB + KIB + 3 * KIB + 7 * KIB
    assert value(html, "fleet-transfers") == 3 + 1 + 2
    assert value(html, "fleet-active") == 3


def test_the_fleet_chart_draws_each_namespaces_days_on_one_scale(ledger, operator):
    """One chart row per namespace that moved bytes in the window, a bar per day that
    moved any, the largest mover first; the table holds the same figures."""
    busy_fleet(ledger)
    html = operator.get(FLEET).text
    assert bars(html, "fleet-chart", "acme") == {
        "2024-10-01": 3 * MIB,
        "2024-10-03": 512 * KIB,
        "2024-10-04": 100 * KIB + 3 * MIB + 30 * KIB,
    }
    assert bars(html, "fleet-chart", "globex") == {"2024-10-04": 6 * KIB}
    rows = re.findall(r'<g class="fleet-row" data-namespace="([^"]*)"', html)
    assert rows == [
        "acme",
        "globex",
    ]  # initech's bytes are outside the 14 days; umbrella moved none
    assert 'data-days="14"' in html
    assert_bars_inside(html, "fleet-chart")
    assert f"full row height = {humanize_bytes(4 * MIB)} per day" in html
    detail = f'{NAMESPACE}?namespace=acme&amp;days=14"'
    assert f'<a href="{detail}' in html
    table = re.search(r'<tr data-namespace="acme">.*?</tr>', html, re.S).group(0)
    cells = [int(n) for n in re.findall(r'data-value="(\d+)"', table)]
    assert cells[0] == 3 * MIB + 512 * KIB + 3 * MIB + 130 * KIB  # the window's total
    assert [n for n in cells[1:] if n] == [3 * MIB, 512 * KIB, 3 * MIB + 130 * KIB]
    assert len(cells) == 1 + 14
    # A 30-day window reaches initech's day.
    html = operator.get(FLEET, {"days": 30}).text
    assert bars(html, "fleet-chart", "initech") == {"2024-09-14": 5 * KIB}


def test_the_fleet_chart_shows_the_largest_movers_and_counts_the_rest(ledger, operator):
    for n in range(23):
        ledger.record(f"tenant-{n:02d}", day_at(0), Transfer((n + 1) * KIB, 0))
    ledger.flush(NOW)
    html = operator.get(FLEET).text
    rows = re.findall(r'<g class="fleet-row" data-namespace="([^"]*)"', html)
    assert rows == [f"tenant-{n:02d}" for n in range(22, 2, -1)]
    assert "and 3 more namespaces, 6 KiB together." in html


def test_the_quiet_namespaces_follow_the_days_asked_for(ledger, operator, settings):
    """Quiet: not seen (a transfer or a refusal) for N UTC days; N from ?silent=,
    else RINDLE["FLOW_SILENT_AFTER_DAYS"]."""
    busy_fleet(ledger)
    html = operator.get(FLEET).text
    assert quiet_names(html) == ["umbrella", "initech"]  # never seen first, then oldest
    assert "never (auth failures only)" in html
    assert "20 days ago" in html
    assert quiet_names(operator.get(FLEET, {"silent": 30}).text) == ["umbrella"]
    # initech was seen on the 20th UTC day back (today is the 0th): quiet after 20, not 21.
    assert quiet_names(operator.get(FLEET, {"silent": 20}).text) == ["umbrella", "initech"]
    assert quiet_names(operator.get(FLEET, {"silent": 21}).text) == ["umbrella"]
    # acme and globex were seen today: never quiet, whatever the days asked for.
    assert quiet_names(operator.get(FLEET, {"silent": 1}).text) == ["umbrella", "initech"]
    settings.RINDLE = {**settings.RINDLE, "FLOW_SILENT_AFTER_DAYS": 30}
    assert quiet_names(operator.get(FLEET).text) == ["umbrella"]


@pytest.mark.parametrize(
    "query",
    [
        {"days": "0"},
        {"days": "abc"},
        {"days": "91"},
        {"silent": "-1"},
        {"silent": "9" * 5000},
        {"days": "1.5"},
    ],
)
def test_a_bad_window_is_refused_with_a_code(ledger, operator, query):
    busy_fleet(ledger)
    response = operator.get(FLEET, query)
    assert response.status_code == 400
    assert error_code(response) == "flow_invalid_window"
    assert 'id="fleet-chart"' not in response.text


def test_an_empty_fleet_has_a_page(ledger, operator):
    response = operator.get(FLEET)
    assert response.status_code == 200
    assert value(response.text, "fleet-bytes-in") == 0
    assert 'id="fleet-chart-empty"' in response.text


def test_the_fleet_page_costs_the_same_queries_for_3_or_40_namespaces(ledger, operator):
    """O(namespaces) work in a fixed number of grouped queries: never one per namespace."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def queries():
        with CaptureQueriesContext(connection) as captured:
            assert operator.get(FLEET).status_code == 200
        return len(captured)

    for n in range(3):
        ledger.record(f"few-{n}", day_at(n), Transfer(KIB, KIB))
    ledger.flush(NOW)
    few = queries()
    for n in range(37):
        ledger.record(f"many-{n}", day_at(n % 10), Transfer(KIB, KIB))
    ledger.flush(NOW)
    assert queries() == few
    assert few <= 8  # session and user, then fleet (2) and the chart's two grouped reads


# --- access ---------------------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_the_login(ledger, client):
    for url in (FLEET, f"{NAMESPACE}?namespace=acme", f"{FORGET}?namespace=acme"):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]
    response = client.post(FORGET, {"namespace": "acme", "confirm": "yes"})
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_staff_without_the_permission_are_refused(ledger, staff):
    busy_fleet(ledger)
    client = staff()
    assert client.get(FLEET).status_code == 403
    assert client.get(NAMESPACE, {"namespace": "acme"}).status_code == 403
    assert client.post(FORGET, {"namespace": "acme", "confirm": "yes"}).status_code == 403
    assert FlowDayRecord.objects.filter(namespace="acme").exists()


def test_staff_who_may_view_read_the_pages_but_cannot_forget(ledger, staff):
    busy_fleet(ledger)
    client = staff("view_flowdayrecord")
    assert client.get(FLEET).status_code == 200
    response = client.get(NAMESPACE, {"namespace": "acme"})
    assert response.status_code == 200
    assert 'id="forget-link"' not in response.text
    assert client.get(FORGET, {"namespace": "acme"}).status_code == 403
    assert client.post(FORGET, {"namespace": "acme", "confirm": "yes"}).status_code == 403
    assert FlowDayRecord.objects.filter(namespace="acme").count() == 3
    assert not FlowTombstone.objects.exists()


def test_the_app_index_links_the_fleet_page(ledger, operator):
    response = operator.get(reverse("admin:app_list", args=["rindle_app"]))
    assert f'href="{FLEET}"' in response.text


USAGE = "/admin/rindle_app/usage/"


def test_the_admin_index_has_a_usage_entry_that_opens_the_fleet_page(ledger, operator):
    """The admin index lists "Usage" in rindle's section; it opens the fleet page."""
    busy_fleet(ledger)
    assert reverse("admin:rindle_app_usage_changelist") == USAGE
    index = operator.get(reverse("admin:index"))
    assert index.status_code == 200
    assert f'<a href="{USAGE}">Usage</a>' in index.text
    response = operator.get(USAGE, follow=True)
    assert response.status_code == 200
    assert response.redirect_chain == [(FLEET, 302)]
    assert "acme" in response.text


def test_the_usage_entry_follows_the_flow_view_permission(ledger, staff, django_user_model):
    """Staff who may view the flow see and open "Usage"; staff without it get neither."""
    client = staff()
    assert USAGE not in client.get(reverse("admin:index")).text
    assert client.get(USAGE).status_code == 403
    user = django_user_model.objects.get(username="staff")
    user.user_permissions.add(Permission.objects.get(codename="view_flowdayrecord"))
    assert f'<a href="{USAGE}">Usage</a>' in client.get(reverse("admin:index")).text
    assert client.get(USAGE, follow=True).status_code == 200


def test_a_signed_in_user_who_is_not_staff_is_sent_to_the_login(ledger, client, django_user_model):
    """A non-staff user, even one holding the flow permission, never reaches the pages."""
    user = django_user_model.objects.create_user("visitor")
    user.user_permissions.add(Permission.objects.get(codename="view_flowdayrecord"))
    client.force_login(user)
    for url in (USAGE, FLEET):
        response = client.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


# --- a namespace's page ---------------------------------------------------------------


def test_a_namespace_page_shows_today_and_the_last_sighting_apart(ledger, operator):
    """An idle tenant has a today of zeroes AND a last sighting 20 days ago."""
    busy_fleet(ledger)
    response = operator.get(NAMESPACE, {"namespace": "initech", "days": 30})
    assert response.status_code == 200
    html = response.text
    assert value(html, "today-bytes-in") == 0 and value(html, "today-transfers") == 0
    assert value(html, "last-seen") == day_at(20)
    assert "20 days ago" in html
    assert bars(html, "namespace-chart") == {"2024-09-14": 5 * KIB}


def test_a_namespace_page_shows_its_days_refusals_and_sessions(ledger, operator):
    busy_fleet(ledger)
    html = operator.get(NAMESPACE, {"namespace": "acme"}).text
    glance = ledger.glance("acme", NOW)
    assert value(html, "today-bytes-in") == glance.today.bytes_in == 110 * KIB
    assert value(html, "today-bytes-out") == glance.today.bytes_out
    assert value(html, "today-bulk-out") == MIB
    assert value(html, "today-transfers") == 2
    assert value(html, "today-sessions") == 2
    assert value(html, "today-refusals") == 1
    assert value(html, "last-seen") == glance.last_seen_ms == day_at(0, 11)
    assert value(html, "refused-today-rate_limit") == 1
    assert value(html, "refused-window-rate_limit") == 1
    assert value(html, "refused-today-quota") == 0
    assert bars(html, "namespace-chart") == dict(
        (flow.day_date(d).isoformat(), n) for d, n in ledger.moved("acme", NOW, 14)
    )
    assert len(bars(html, "namespace-chart")) == 3
    assert_bars_inside(html, "namespace-chart")
    day_rows = re.findall(r'<tr data-day="([\d-]+)">', html)
    assert len(day_rows) == 14 and day_rows[0] == "2024-10-04"  # every day, newest first
    assert 'id="forget-link"' in html
    # The y axis is labelled in round binary units up to the top of the scale.
    top, step = nice_scale(3 * MIB + 130 * KIB)
    assert f">{humanize_bytes(top)}</text>" in html and f">{humanize_bytes(step)}</text>" in html


def test_a_namespace_with_nothing_kept_is_not_found(ledger, operator):
    busy_fleet(ledger)
    response = operator.get(NAMESPACE, {"namespace": "nobody"})
    assert response.status_code == 404
    assert error_code(response) == "flow_unknown_namespace"


@pytest.mark.parametrize("namespace", ["", "x" * 201, "bad\x00name", "tab\there"])
def test_a_malformed_namespace_is_refused(ledger, operator, namespace):
    response = operator.get(NAMESPACE, {"namespace": namespace})
    assert response.status_code == 400
    assert error_code(response) == "flow_invalid_namespace"


# --- forget -----------------------------------------------------------------------------


def test_a_get_of_forget_asks_and_forgets_nothing(ledger, operator):
    busy_fleet(ledger)
    response = operator.get(FORGET, {"namespace": "acme"})
    assert response.status_code == 200
    assert 'method="post"' in response.text and "csrfmiddlewaretoken" in response.text
    assert 'name="confirm" value="yes"' in response.text
    assert FlowDayRecord.objects.filter(namespace="acme").count() == 3
    assert not FlowTombstone.objects.exists()
    assert ledger.today("acme", NOW).transfers == 2


def test_a_confirmed_post_forgets_the_namespace(ledger, operator):
    busy_fleet(ledger)
    response = operator.post(FORGET, {"namespace": "acme", "confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == FLEET
    assert not FlowDayRecord.objects.filter(namespace="acme").exists()
    assert FlowDayRecord.objects.filter(namespace="globex").exists()
    assert FlowTombstone.objects.get(namespace="acme").generation == 1
    assert ledger.today("acme", NOW) is None
    html = operator.get(FLEET).text
    assert "Forgot the flow of &#x27;acme&#x27;" in html
    assert bars(html, "fleet-chart", "acme") == {}
    assert value(html, "fleet-transfers") == 1  # globex's
    assert operator.get(NAMESPACE, {"namespace": "acme"}).status_code == 404
    # A flush after the forget does not bring the figures back.
    ledger.flush(NOW)
    assert not FlowDayRecord.objects.filter(namespace="acme").exists()


def test_a_post_without_the_confirmation_or_with_a_bad_namespace_changes_nothing(ledger, operator):
    busy_fleet(ledger)
    before = list(FlowDayRecord.objects.order_by("namespace", "day").values())
    response = operator.post(FORGET, {"namespace": "acme"})
    assert response.status_code == 400 and error_code(response) == "flow_forget_unconfirmed"
    response = operator.post(FORGET, {"namespace": "x" * 300, "confirm": "yes"})
    assert response.status_code == 400 and error_code(response) == "flow_invalid_namespace"
    response = operator.post(FORGET, {"confirm": "yes"})
    assert response.status_code == 400 and error_code(response) == "flow_invalid_namespace"
    assert list(FlowDayRecord.objects.order_by("namespace", "day").values()) == before
    assert not FlowTombstone.objects.exists()
    assert ledger.today("acme", NOW).transfers == 2


def test_forget_needs_the_csrf_token(ledger, django_user_model):
    from django.test import Client

    busy_fleet(ledger)
    client = Client(enforce_csrf_checks=True)
    client.force_login(django_user_model.objects.create_superuser("op2", "op2@example.com"))
    response = client.post(FORGET, {"namespace": "acme", "confirm": "yes"})
    assert response.status_code == 403
    assert FlowDayRecord.objects.filter(namespace="acme").count() == 3


# --- the helpers ------------------------------------------------------------------------


def test_bytes_are_shown_in_binary_units():
    assert [humanize_bytes(n) for n in (0, 1023, 1024, 1536, 10 * MIB, 250 * MIB, 3 * 1024**3)] == [
        "0 B",
        "1023 B",
        "1 KiB",
        "1.5 KiB",
        "10 MiB",
        "250 MiB",
        "3 GiB",
    ]


@pytest.mark.parametrize("peak", [1, 999, 1024, 5000, 3 * MIB + 1, 7 * 1024**3, 2**53])
def test_the_axis_holds_the_peak_in_round_steps(peak):
    top, step = nice_scale(peak)
    assert top >= peak and top % step == 0 and top // step <= 8
    unit = 1
    while unit * 1024 <= step:
        unit *= 1024
    assert step % unit == 0 and step // unit in (1, 2, 5, 10, 20, 50, 100, 200, 500)


def test_an_unreachable_store_is_a_503_with_a_code(ledger, operator, monkeypatch):
    from rindle_app.engine import Unavailable

    busy_fleet(ledger)

    def down(*args, **kwargs):
        raise Unavailable("the flow store is unavailable: test", code="flow_store_unavailable")

    monkeypatch.setattr(FlowStore, "daily_bytes", down)
    monkeypatch.setattr(FlowStore, "forget", down)
    response = operator.get(FLEET)
    assert response.status_code == 503 and error_code(response) == "flow_store_unavailable"
    response = operator.post(FORGET, {"namespace": "acme", "confirm": "yes"})
    assert response.status_code == 503 and error_code(response) == "flow_store_unavailable"
    assert FlowDayRecord.objects.filter(namespace="acme").count() == 3
    assert ledger.today("acme", NOW).transfers == 2
