"""
What every child process of the suite shares: Django set up on the parent test
run's database, a line protocol on stdout, and a self-kill at a named step.

A child is a module of this package, run as ``python -m tests.support.<module>``
from the repository root with ``child_env()`` (tests/support/processes.py builds the
command line), so the database it writes is the parent test's.
"""

import os
import signal
import sys
import threading

_out_lock = threading.Lock()


def boot():
    """Set Django up with the host project's settings (``child_env()`` names the database)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()


def say(line):
    """Write one protocol line to stdout at once, whichever thread says it."""
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class KillAt:
    """
    A step marker that SIGKILLs this process the ``at``-th time ``step`` is reached
    while armed (``step`` ``none`` never kills), so the parent sees a crash exactly there.
    """

    def __init__(self, step, at, *, armed=True):
        self.step, self.at, self.armed, self.reached = step, at, armed, 0

    def __call__(self, here):
        if here == self.step and self.armed:
            self.reached += 1
            if self.reached == self.at:
                os.kill(os.getpid(), signal.SIGKILL)
