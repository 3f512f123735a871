"""
The parent's side of the suite's child processes: the environment that points one
at this test run's database, the command line that runs one, a free port, a clean
stop, and a line-protocol child whose stdout is read as it runs
(tests/support/children.py is the child's side).
"""

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60


def child_env(**extra):
    """Environment for a subprocess that must use this test run's database."""
    env = dict(os.environ)
    env["RINDLE_TEST_DATABASE_NAME"] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = "project.settings"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def free_port():
    """A TCP port of 127.0.0.1 that was free a moment ago, for a server child."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc, timeout):
    """SIGTERM ``proc``; SIGKILL it if it still runs after ``timeout`` seconds; reap it."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def command(module, *args):
    """
    The command line of child ``module`` of this package (``crash_child``,
    ``flow_child``) with ``args``; run it with ``cwd=ROOT`` and ``env=child_env()``.
    """
    return [sys.executable, "-m", f"tests.support.{module}", *map(str, args)]


class Child:
    """
    One run of a child of this package (the crash child, ``tests.support.crash_child``,
    unless ``module`` names another) with ``args``, the mode first, on this test run's
    database; its stdout lines are collected by a thread, and a ``STARTED`` line
    marks it ready. ``interactive``: its stdin is a pipe that ``send`` writes lines to.
    """

    def __init__(self, args, stderr_path, module="crash_child", interactive=False):
        self.stderr_path = stderr_path
        self.lines = []
        self.started = threading.Event()
        self._arrived = threading.Condition()
        self._stderr = open(stderr_path, "w")
        self.proc = subprocess.Popen(
            command(module, *args),
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.PIPE if interactive else None,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            with self._arrived:
                self.lines.append(line.rstrip("\n"))
                self._arrived.notify_all()
            if line.startswith("STARTED"):
                self.started.set()
        self.started.set()  # EOF: the child died before (or after) starting
        with self._arrived:
            self._arrived.notify_all()

    def send(self, line):
        """Write ``line`` to the child's stdin (an ``interactive`` child)."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def line(self, prefix, timeout):
        """The first stdout line starting with ``prefix``, waiting up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                found = next((x for x in self.lines if x.startswith(prefix)), None)
                left = deadline - time.monotonic()
                if found is not None or left <= 0 or not self._reader.is_alive():
                    break
                self._arrived.wait(left)
        if found is None:
            pytest.fail(f"the child printed no {prefix!r} in {timeout} s:\n{self.stderr()}")
        return found

    def wait_started(self):
        if not self.started.wait(START_TIMEOUT) or "STARTED" not in self.lines:
            self.kill()
            pytest.fail(f"the child did not start:\n{self.stderr()}")

    def kill(self):
        """SIGKILL the child (if still running) and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.finish()

    def wait(self, timeout):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the child did not finish in {timeout} s (hang?):\n{self.stderr()}")
        self.finish()

    def finish(self):
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self._reader.join(10)
        self.proc.stdout.close()
        self._stderr.close()

    @property
    def done(self):
        return "DONE" in self.lines

    @property
    def anomalies(self):
        return [line for line in self.lines if line.startswith("ANOMALY")]

    def stderr(self):
        return Path(self.stderr_path).read_text()[-4000:]


def wait_for_dead_sessions(timeout=20):
    """On Postgres, wait until the killed child's server sessions have ended."""
    if connection.vendor != "postgresql":
        return
    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            if cursor.fetchone()[0] == 0:
                return
        if time.monotonic() > deadline:
            pytest.fail("the killed child's database sessions did not end")
        time.sleep(0.05)
