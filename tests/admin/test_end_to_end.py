"""
End to end: a browser's websocket traffic and a machine's HTTP ingest, served by a
live Daphne process, are counted under their namespace, flushed by that process's
own tick, and read back: in ``today()`` here and on the operator's fleet and
namespace pages in a real browser (screenshots in tests/e2e/browser/artifacts/).
"""

import json
import time
import urllib.request

import pytest
from django.contrib.auth import get_user_model

from rindle_app import flow, tokens
from tests.e2e.browser.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.e2e.browser.test_demo_live import ARTIFACTS, _sync_playwright, live_server

from .test_browser import PASSWORD, fleet_page

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def live_flow_server(transactional_db, django_user_model):
    """Daphne (``runserver``) on this test's database, flushing its ledger every 0.5 s."""
    django_user_model.objects.create_superuser("operator", "op@example.com", PASSWORD)
    with live_server("flow-e2e-server.log", "/signin/", RINDLE_FLOW_FLUSH_SECONDS="0.5") as base:
        yield base


def off_loop(fn, *args):
    """Run ``fn`` in a thread of its own: Playwright's sync API keeps an event loop here."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def run():
        try:
            return fn(*args)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def ada_token():
    user = get_user_model().objects.get(username="ada")
    raw, _token = tokens.create(user, ["produce"])
    return f"user:{user.pk}", raw


def producer_write(base, raw_token, body):
    request = urllib.request.Request(
        base + "/v1/producers/write",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {raw_token}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return len(request.data), json.loads(response.read())


def test_websocket_and_ingest_traffic_reach_today_and_the_fleet_page(live_flow_server):
    from playwright.sync_api import expect

    base = live_flow_server
    sync_playwright = _sync_playwright()
    errors = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # A demo user's list page: its websocket subscribes and receives batches.
            ada = browser.new_context(viewport={"width": 1280, "height": 900})
            page = ada.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{base}/signin/")
            page.fill("#signin [name=username]", "ada")
            page.click("#signin button[type=submit]")
            page.wait_for_url(f"{base}/")
            page.wait_for_selector("body[data-list-ready='1']", state="attached")

            namespace, raw = off_loop(ada_token)
            change = {"table": "user", "op": "add", "row": {"id": "u-e2e", "name": "E2E"}}
            sent, answer = producer_write(
                base, raw, {"producer": "e2e", "seq": 1, "changes": [change]}
            )
            assert answer["applied"] is True

            # The server flushes its ledger on its own tick (0.5 s here).
            deadline = time.monotonic() + 20
            ledger = off_loop(
                lambda: flow.FlowLedger(flow.FlowStore("default")).start(flow.now_ms())
            )
            day = None
            while time.monotonic() < deadline:
                day = off_loop(ledger.today, namespace, flow.now_ms())
                if day is not None and day.transfers >= 3 and day.bytes_in >= sent:
                    break
                time.sleep(0.25)
            assert day is not None and day.transfers >= 3, day  # ws frames in and out, + HTTP
            assert day.bytes_in >= sent and day.bytes_out > 0

            # The operator reads it on the fleet page and the namespace's page.
            operator = fleet_page(browser, base, errors)
            row = operator.locator(f'#fleet-chart g.fleet-row[data-namespace="{namespace}"]')
            expect(row).to_have_count(1)
            expect(row.locator("g.bar")).to_have_count(1)  # today
            operator.screenshot(path=str(ARTIFACTS / "flow-e2e-fleet.png"), full_page=True)
            row.locator("a").first.click()
            operator.wait_for_selector("#namespace-chart")
            expect(operator.locator("#flow-namespace")).to_have_text(namespace)
            shown = int(operator.locator("#today-transfers").inner_text())
            assert shown >= 3
            operator.screenshot(path=str(ARTIFACTS / "flow-e2e-namespace.png"), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
