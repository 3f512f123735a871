"""
Waiting for something another thread or process does, written once: poll a
predicate until it holds, and fail the test naming what did not happen.
"""

import time

import pytest


def wait_for(predicate, timeout=10, what="condition", *, interval=0.02, process=None, log=None):
    """
    Call ``predicate`` every ``interval`` seconds until it is true. Fail the test,
    naming ``what``, once ``timeout`` seconds have passed, or as soon as ``process`` (a
    ``Popen``, the one expected to act) has exited; with the tail of ``log`` (a path,
    that process's output) when given.
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        exited = process is not None and process.poll() is not None
        if exited or time.monotonic() > deadline:
            why = f"its process exited with {process.returncode}" if exited else f"{timeout} s"
            tail = f":\n{log.read_text()[-4000:]}" if log is not None else ""
            pytest.fail(f"{what} not reached ({why}){tail}")
        time.sleep(interval)
