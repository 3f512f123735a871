"""
Two browsers on the live demo: what one changes, the other shows without a reload.

A real server (Daphne through ``manage.py runserver``, which also serves
``rindle.js``) runs in a subprocess on a free loopback port against this test's
database. Debian's Chromium, driven by Playwright, signs in as two demo users in
two browser contexts and edits through the demo pages; every edit is expected in
the other user's pages within ``LIVE_MS``. Screenshots and the server's log go to
``tests/e2e/browser/artifacts/``.
"""

import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest

from project.demo.management.commands.rindle_seed_demo import seed_rows
from rindle_app.testing import running
from tests.conftest import child_env
from tests.support.processes import free_port, stop

from .chromium import CHROMIUM, CHROMIUM_ARGS, sync_playwright_or_skip

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = Path(__file__).parent / "artifacts"
LIVE_MS = 5000
ISSUES = 40
ISSUE = f"s1-i{ISSUES - 1:06d}"  # the newest seeded issue: first in the list

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


_sync_playwright = sync_playwright_or_skip  # the name the other browser tests import


def _wait_until_up(url, proc, log_path, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = log_path.read_text()[-3000:]
            pytest.fail(f"the server exited with {proc.returncode}:\n{log}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail(f"the server did not answer in {timeout}s:\n{log_path.read_text()[-3000:]}")


@contextmanager
def live_server(log_name, ready_path, **env):
    """
    ``manage.py runserver`` (Daphne) on a free loopback port over this test run's
    database, DEBUG on, extra environment ``env``; yields its base URL once
    ``ready_path`` answers 200, and stops it on exit. Its log goes to artifacts.
    """
    ARTIFACTS.mkdir(exist_ok=True)
    log_path = ARTIFACTS / log_name
    base = f"http://127.0.0.1:{free_port()}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "runserver", "--noreload", base.split("//")[1]],
            cwd=ROOT,
            env=child_env(DJANGO_DEBUG="1", **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_until_up(base + ready_path, proc, log_path)
            yield base
        finally:
            stop(proc, 10)


@pytest.fixture
def demo_server(transactional_db):
    """The demo, seeded with ``ISSUES`` issues, served by Daphne in a subprocess."""
    with running() as engine:
        engine.write(lambda tx: [tx.insert_ignore(t, row) for t, row in seed_rows(ISSUES, 1)])
    with live_server("server.log", "/signin/") as base:
        yield base


class Browser:
    """One Chromium; a context per demo user; every page's script errors collected."""

    def __init__(self, playwright, base):
        self.base = base
        self.browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        self.errors = []
        self.pages = {}

    def user(self, name):
        context = self.browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(f"{self.base}/signin/")
        page.fill("#signin [name=username]", name)
        page.click("#signin button[type=submit]")
        page.wait_for_url(f"{self.base}/")
        page.close()
        return context

    def open(self, context, label, path, ready):
        page = context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(f"{label}: {exc}"))
        page.goto(self.base + path)
        page.wait_for_selector(ready, state="attached")
        self.pages[label] = page
        return page

    def protocol_report(self):
        """Each page's connection: counters that must stay zero, and what is pending."""
        script = "() => ({...window.rindle.stats, pending: window.rindle.pending})"
        return {label: page.evaluate(script) for label, page in self.pages.items()}

    def screenshots(self):
        ARTIFACTS.mkdir(exist_ok=True)
        for label, page in self.pages.items():
            page.screenshot(path=str(ARTIFACTS / f"{label}.png"), full_page=True)


def test_edits_in_one_browser_appear_live_in_the_other(demo_server):
    """Title, comment, status, tags, a new issue, a board move, a refused edit, a
    mutation across a reconnect and a delete, made by one user, reach the other's
    pages without a reload."""
    from playwright.sync_api import expect

    sync_playwright = _sync_playwright()
    token = uuid.uuid4().hex[:6]
    with sync_playwright() as p:
        b = Browser(p, demo_server)
        try:
            ada, alan = b.user("ada"), b.user("alan")
            alan_list = b.open(alan, "alan-list", "/", "body[data-list-ready='1']")
            ada_issue = b.open(ada, "ada-issue", f"/issues/{ISSUE}/", "body[data-issue-ready='1']")
            alan_issue = b.open(alan, "alan-issue", f"/issues/{ISSUE}/", "#detail:not([hidden])")

            # A new title, seen in the other user's list.
            title = f"Renamed by ada {token}"
            ada_issue.click("#edit-title")
            ada_issue.fill("#title-form [name=title]", title)
            started = time.monotonic()
            ada_issue.click("#title-form button[type=submit]")
            expect(alan_list.locator("#rows tr").first).to_contain_text(title, timeout=LIVE_MS)
            latency_ms = (time.monotonic() - started) * 1000

            # A comment, seen under the issue in the other browser.
            comment = f"Hello from alan {token}"
            alan_issue.fill("#comment-form [name=body]", comment)
            alan_issue.click("#comment-form button[type=submit]")
            expect(ada_issue.locator("#comments .comment").last).to_contain_text(comment)
            expect(ada_issue.locator("#comments .comment").last).to_contain_text("Alan Turing")

            # Status and tags.
            ada_issue.select_option("#status", "review")
            expect(alan_issue.locator("#status")).to_have_value("review", timeout=LIVE_MS)
            ada_issue.fill("#tag-form [name=tag]", f"Live-{token}")
            ada_issue.click("#tag-form button[type=submit]")
            tag = alan_issue.locator("#tags .tag", has_text=f"live-{token}")
            expect(tag).to_be_visible(timeout=LIVE_MS)
            expect(alan_list.locator("#rows tr").first).to_contain_text(f"live-{token}")
            tag.locator("button").click()
            expect(ada_issue.locator("#tags .tag", has_text=f"live-{token}")).to_have_count(0)

            # A refused edit: the author hears why, nobody sees it.
            ada_issue.click("#edit-title")
            ada_issue.fill("#title-form [name=title]", "cheap spam here")
            ada_issue.click("#title-form button[type=submit]")
            expect(ada_issue.locator(".toast.bad")).to_contain_text("spam", timeout=LIVE_MS)
            expect(alan_list.locator("#rows tr").first).to_contain_text(title)

            # A mutation made as the socket drops is re-sent on the new socket (setOwner:
            # the room carries setPriority, setStatus and editTitle, not this one).
            mid = ada_issue.evaluate(
                """(id) => {
                    window.rindle._ws.close();
                    return window.rindle
                        .mutate("setOwner", {id, owner: "ada", updatedAt: Date.now()})
                        .then((result) => result.mid);
                }""",
                ISSUE,
            )
            assert mid >= 1
            expect(alan_issue.locator("#owner")).to_have_value("ada", timeout=LIVE_MS)
            assert ada_issue.evaluate("window.rindle.stats.reconnects") >= 1

            # A new issue enters the top of the other user's list and the board.
            board_ready = ".column[data-status='done'][data-ready='1']"
            alan_board = b.open(alan, "alan-board", "/board/", board_ready)
            ada_new = b.open(ada, "ada-new", "/issues/new/", "#new-issue")
            created = f"Created by ada {token}"
            ada_new.fill("#new-issue [name=title]", created)
            ada_new.fill("#new-issue [name=description]", "Made in a browser test.")
            ada_new.fill("#new-issue [name=tags]", "e2e, Browser")
            ada_new.click("#new-issue button[type=submit]")
            ada_new.wait_for_url("**/issues/i*/")
            ada_new.wait_for_selector("#detail:not([hidden])")
            expect(alan_list.locator("#rows tr").first).to_contain_text(created, timeout=LIVE_MS)
            expect(alan_list.locator("#rows tr").first).to_contain_text("browser")
            todo = alan_board.locator(".column[data-status='todo'] .card", has_text=created)
            expect(todo).to_have_count(1, timeout=LIVE_MS)

            # Moved on the board by one user, moved in the other's board.
            ada_new.select_option("#status", "done")
            done = alan_board.locator(".column[data-status='done'] .card", has_text=created)
            expect(done).to_have_count(1, timeout=LIVE_MS)
            expect(todo).to_have_count(0)

            # Deleted by its owner: gone from the other user's list and board.
            ada_new.once("dialog", lambda dialog: dialog.accept())
            ada_new.click("#delete")
            expect(ada_new.locator("#missing")).to_be_visible(timeout=LIVE_MS)
            expect(alan_list.locator("#rows tr", has_text=created)).to_have_count(0)
            expect(done).to_have_count(0)
            expect(alan_list.locator("#rows tr").first).to_contain_text(title)

            b.screenshots()
            report = b.protocol_report()
        finally:
            b.browser.close()

    assert not b.errors, b.errors
    for label, stats in report.items():
        for counter in ("gaps", "lateFrames", "fpMismatches", "foldErrors", "pending"):
            assert stats[counter] == 0, (label, counter, stats)
    print(f"edit -> other browser: {latency_ms:.0f} ms; protocol: {report}")
