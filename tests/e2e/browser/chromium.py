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
