"""
The usage pages in a real browser: Debian's Chromium, driven by Playwright, signs
in to the admin of a live server (``manage.py runserver`` in a subprocess on this
test's database) and reads the fleet page and a namespace's page after a flush,
then forgets a namespace through the confirmation step. Screenshots go to
``tests/e2e/browser/artifacts/flow-*.png``.
"""

import time

import pytest

from rindle_app import flow
from rindle_app.admin import humanize_bytes
from rindle_app.flow import DAY_MS, Refusal, Transfer
from rindle_app.models import FlowDayRecord, FlowTombstone
from tests.e2e.browser.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.browser.test_demo_live import ARTIFACTS, _sync_playwright, live_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

KIB = 1024
MIB = 1024 * KIB
PASSWORD = "operator-password-1"
# Bytes (in, out) per namespace per day back from today, recorded oldest first.
TRAFFIC = {
    "acme": {9: (2 * MIB, 6 * MIB), 6: (MIB, 3 * MIB), 3: (512 * KIB, 9 * MIB), 0: (MIB, 5 * MIB)},
    "globex": {8: (200 * KIB, 900 * KIB), 4: (300 * KIB, 1200 * KIB), 0: (100 * KIB, 2 * MIB)},
    "initech": {12: (50 * KIB, 400 * KIB), 2: (80 * KIB, 700 * KIB)},
    "hooli": {13: (1 * MIB, 1 * MIB)},
}


def fleet_page(browser, base, errors):
    """A new page of ``browser``, signed in to the admin as the operator and on the
    fleet's usage page (its chart drawn); the page's script errors go to ``errors``."""
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{base}/admin/login/?next=/admin/rindle_app/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/rindle_app/")
    page.click("#flow-usage-module a.viewlink")
    page.wait_for_selector("#fleet-chart")
    return page


@pytest.fixture
def flow_server(transactional_db, django_user_model, monkeypatch):
    """A live server over this test's database, an operator, and flushed flow."""
    now = flow.now_ms()
    if now % DAY_MS > DAY_MS - 120_000:  # the pages' "today" must be the test's
        time.sleep((DAY_MS - now % DAY_MS) / 1000 + 1)
        now = flow.now_ms()
    ledger = flow.get_ledger()  # a fresh one: the suite's runtime fixture (conftest)
    today = now // DAY_MS
    events = sorted(
        (today - back, namespace, figures)
        for namespace, days in TRAFFIC.items()
        for back, figures in days.items()
    )
    for day, namespace, (bytes_in, bytes_out) in events:
        at = min(now, day * DAY_MS + 9 * 3_600_000)
        ledger.record(namespace, at, Transfer(bytes_in, bytes_out, session=f"{namespace}-{day}"))
    ledger.refuse("globex", now, Refusal.QUOTA)
    ledger.auth_failure("umbrella", now)
    ledger.flush(now)
    django_user_model.objects.create_superuser("operator", "op@example.com", PASSWORD)

    with live_server("flow-server.log", "/admin/login/") as base:
        yield base, ledger, now


def test_the_fleet_and_a_namespace_in_a_browser(flow_server):
    """After a flush the fleet page shows today's totals and a bar per namespace-day;
    the namespace page shows its days; forget asks, then removes it from the fleet."""
    from playwright.sync_api import expect

    sync_playwright = _sync_playwright()
    base, ledger, now = flow_server
    fleet = ledger.fleet(now, 14)
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = fleet_page(browser, base, errors)

            # Today's totals, as the ledger folds them.
            expect(page.locator("#fleet-bytes-in")).to_have_text(humanize_bytes(fleet.bytes_in))
            expect(page.locator("#fleet-bytes-out")).to_have_text(humanize_bytes(fleet.bytes_out))
            expect(page.locator("#fleet-transfers")).to_have_text("2")
            expect(page.locator("#fleet-refused-quota")).to_have_text("1")
            expect(page.locator("#fleet-auth-failures")).to_have_text("1")
            expect(page.locator("#fleet-active")).to_have_text("2")
            expect(page.locator("tr.quiet-namespace")).to_have_count(1)  # umbrella
            # One chart row per mover, largest first, and one drawn bar per day moved.
            rows = page.locator("#fleet-chart g.fleet-row")
            expect(rows).to_have_count(4)
            assert rows.evaluate_all("rs => rs.map(r => r.dataset.namespace)") == [
                "acme",
                "globex",
                "hooli",
                "initech",
            ]
            for namespace, days in TRAFFIC.items():
                bars = page.locator(f'#fleet-chart g.fleet-row[data-namespace="{namespace}"] g.bar')
                expect(bars).to_have_count(len(days))
                for box in bars.evaluate_all(
                    "bs => bs.map(b => b.getBoundingClientRect().toJSON())"
                ):
                    assert box["height"] > 1 and box["width"] > 1  # visible, however small
            acme_peak = page.locator('#fleet-chart g.fleet-row[data-namespace="acme"] g.bar')
            heights = acme_peak.evaluate_all("bs => bs.map(b => b.getBoundingClientRect().height)")
            assert max(heights) == heights[2]  # 9.5 MiB, the tallest day of the window
            expect(page.locator("#fleet-table tbody tr")).to_have_count(4)
            page.screenshot(path=str(ARTIFACTS / "flow-fleet.png"), full_page=True)

            # A namespace's page: today and the last sighting apart, and its days.
            page.click('#fleet-chart g.fleet-row[data-namespace="acme"] a')
            page.wait_for_selector("#namespace-chart")
            expect(page.locator("#flow-namespace")).to_have_text("acme")
            expect(page.locator("#today-bytes-out")).to_have_text("5 MiB")
            expect(page.locator("#today-transfers")).to_have_text("1")
            expect(page.locator("#last-seen-ago")).to_have_text("today")
            expect(page.locator("#namespace-chart g.bar")).to_have_count(4)
            expect(page.locator("#namespace-chart text.axis", has_text="MiB").first).to_be_visible()
            page.screenshot(path=str(ARTIFACTS / "flow-namespace.png"), full_page=True)

            # Forget: a confirmation page first, then the POST.
            page.click("#forget-link")
            page.wait_for_selector("#flow-forget-form")
            page.screenshot(path=str(ARTIFACTS / "flow-forget-confirm.png"), full_page=True)
            page.click("#flow-forget-form input[type=submit]")
            page.wait_for_selector("#fleet-chart")
            expect(page.locator(".messagelist .success")).to_contain_text("Forgot the flow")
            expect(page.locator("#fleet-chart g.fleet-row")).to_have_count(3)
            page.screenshot(path=str(ARTIFACTS / "flow-fleet-after-forget.png"), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
    assert not FlowDayRecord.objects.filter(namespace="acme").exists()
    assert FlowTombstone.objects.filter(namespace="acme").exists()
