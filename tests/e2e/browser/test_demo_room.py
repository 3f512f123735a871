"""
The collaborative issue page: two people on one issue share a room.

Daphne serves the demo in demo mode (rooms on) as in ``test_demo_live``; two
Chromium contexts sign in as two demo users and open the same issue. Both see
presence 2 and are room-served; the title one of them types reaches the other
through the room socket, lands in the database after the room's flush, and moves
the writer's room ledger (``_rindle_room_client_mutations``), never its slow-path
ledger. One person alone gets no room: the same edits go the main path.
"""

import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from .test_demo_live import ISSUE, Browser, _sync_playwright, demo_server  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PEER_MS = 2000  # a peer sees a typed title within this (debounce included)
FLUSH_S = 5
ROUNDS = 7
TITLE = "#title-form [name=title]"
SEES_TITLE = "t => document.getElementById('title').textContent === t"


def _one(sql, params):
    """One cell, read in a thread of its own: Playwright's loop runs in this one."""

    def read():
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql, params)
                row = cursor.fetchone()
            return row[0] if row else None
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(read).result()


def _title():
    return _one('SELECT "title" FROM "issue" WHERE "id" = %s', [ISSUE])


def _slow_lmid(client_id):
    sql = "SELECT last_mutation_id FROM _rindle_client_mutations WHERE client_id = %s"
    return _one(sql, [client_id])


def _room_lmid(client_id):
    sql = (
        "SELECT last_mutation_id FROM _rindle_room_client_mutations "
        "WHERE doc = %s AND client_id = %s"
    )
    return _one(sql, [f"issue/{ISSUE}", client_id])


def _eventually(what, probe, want, seconds=FLUSH_S):
    deadline = time.monotonic() + seconds
    while True:
        got = probe()
        if got == want:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: {got!r}, expected {want!r}")
        time.sleep(0.05)


def test_two_people_on_an_issue_see_each_others_title_as_it_is_typed(demo_server):  # noqa: F811
    """Presence 2 on both pages, each typed title seen by the peer through the room
    within PEER_MS, then durable, on the writer's room ledger only."""
    from playwright.sync_api import expect

    sync_playwright = _sync_playwright()
    token = uuid.uuid4().hex[:6]
    with sync_playwright() as p:
        b = Browser(p, demo_server)
        try:
            ada, alan = b.user("ada"), b.user("alan")
            path = f"/issues/{ISSUE}/"
            a = b.open(ada, "room-ada", path, "#detail:not([hidden])")
            c = b.open(alan, "room-alan", path, "#detail:not([hidden])")
            for page in (a, c):
                presence = page.locator("#presence")
                expect(presence).to_have_attribute("data-count", "2", timeout=10_000)
                expect(presence).to_have_attribute("data-room", "1", timeout=10_000)
            expect(a.locator("#presence")).to_contain_text("you, alan")
            expect(c.locator("#presence")).to_contain_text("ada, you")
            ada_id = a.evaluate("window.rindle.clientID")
            slow_before = _slow_lmid(ada_id)

            a.click("#edit-title")
            receipts = []
            for i in range(ROUNDS):
                title = f"Typed by ada {token} {i}"
                started = time.monotonic()
                a.fill(TITLE, title)
                c.wait_for_function(SEES_TITLE, arg=title, timeout=PEER_MS)
                receipts.append((time.monotonic() - started) * 1000)
            # Key by key, as a person types: the peer ends on the whole title.
            final = f"Keyed by ada {token}"
            a.fill(TITLE, "")
            a.locator(TITLE).press_sequentially(final, delay=40)
            c.wait_for_function(SEES_TITLE, arg=final, timeout=PEER_MS)
            a.click("#title-form button[type=submit]")

            _eventually("the issue's title in the database", _title, final)
            expect(a.locator("#pending")).to_be_hidden(timeout=FLUSH_S * 1000)
            room_lmid = a.evaluate("[...window.rindle._rooms.values()][0].lmid")
            b.screenshots()
            report = b.protocol_report()
        finally:
            b.browser.close()

    assert not b.errors, b.errors
    assert room_lmid >= 2, room_lmid
    _eventually("ada's room ledger", lambda: _room_lmid(ada_id), room_lmid)
    assert _slow_lmid(ada_id) == slow_before, "a room edit touched the slow-path ledger"
    for label, stats in report.items():
        for counter in ("gaps", "lateFrames", "fpMismatches", "foldErrors", "pending"):
            assert stats[counter] == 0, (label, counter, stats)
    print(
        f"room peer receipt over {ROUNDS} typed titles (150 ms debounce included): "
        f"median {statistics.median(receipts):.0f} ms, max {max(receipts):.0f} ms"
    )


def test_one_person_alone_gets_no_room_and_edits_on_the_main_path(demo_server):  # noqa: F811
    """Alone on an issue: presence 1, no room socket, and the title edit is applied
    through the main socket's ledger."""
    from playwright.sync_api import expect

    sync_playwright = _sync_playwright()
    title = f"Alone {uuid.uuid4().hex[:6]}"
    with sync_playwright() as p:
        b = Browser(p, demo_server)
        try:
            ada = b.user("ada")
            a = b.open(ada, "alone-ada", f"/issues/{ISSUE}/", "#detail:not([hidden])")
            presence = a.locator("#presence")
            expect(presence).to_have_attribute("data-count", "1", timeout=10_000)
            expect(presence).to_contain_text("1 person here: you")
            a.click("#edit-title")
            a.fill(TITLE, title)
            a.click("#title-form button[type=submit]")
            expect(a.locator("#title")).to_have_text(title, timeout=FLUSH_S * 1000)
            expect(a.locator("#pending")).to_be_hidden(timeout=FLUSH_S * 1000)
            ada_id = a.evaluate("window.rindle.clientID")
            rooms = a.evaluate("window.rindle._rooms.size")
            room_attr = presence.get_attribute("data-room")
        finally:
            b.browser.close()

    assert not b.errors, b.errors
    assert rooms == 0 and room_attr == "0"
    assert _title() == title
    assert _slow_lmid(ada_id) >= 1
    assert _room_lmid(ada_id) is None
