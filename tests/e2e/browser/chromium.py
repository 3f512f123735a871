"""Debian's chromium and the flags the browser tests launch it with."""

CHROMIUM = "/usr/bin/chromium"
# The flags keep Chromium off the network it would otherwise call home on.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def sync_playwright_or_skip():
    """
    Playwright's ``sync_playwright`` once Debian's chromium and the playwright package
    are both there; otherwise the test skips, or under CI=true fails (a browser test
    must run there).
    """
    import os

    import pytest

    from tests.conftest import CI

    problem = None
    if not os.path.exists(CHROMIUM):
        problem = f"{CHROMIUM} is missing (`make install-test` installs Debian's chromium)"
    else:
        try:
            from playwright.sync_api import sync_playwright
        except ImportError:
            problem = "the playwright package is not installed (`make install-test`)"
    if problem:
        if CI:
            pytest.fail(problem + " (CI=true: the browser tests must run)")
        pytest.skip(problem)
    return sync_playwright
