"""
Failover of the watermarker: two watermarker processes with a 1 s lease, the
leader killed with SIGKILL mid-stream (it releases nothing). The standby takes
the lease once it expires, within about the TTL plus one refresh interval, under
a greater epoch, and goes on publishing: safe_seq never goes back and reaches
the writes made after the kill.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.db import connection

from rindle_app.stream.lease import read as read_lease
from tests.support.waiting import wait_for

from ..conftest import child_env
from .watermark_support import pg, raw, write_user

__all__ = ["pg"]

ROOT = Path(__file__).resolve().parents[2]
TTL = 1.0
INTERVAL = 0.05
# Scheduling on a loaded 2-core machine: a child's step may start this much late.
SLACK = 0.6


class Child:
    """A ``wm_child`` watermarker process and the JSON lines it printed."""

    def __init__(self, owner):
        env = child_env(WM_TTL=str(TTL), WM_INTERVAL=str(INTERVAL), PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.stream.wm_child", owner, "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def of(self, kind):
        return [x for x in list(self.lines) if x["t"] == kind]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


class Sampler:
    """Reads the published safe_seq every 10 ms on a connection of its own."""

    def __init__(self):
        self.seen = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        conn = raw()
        try:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT safe_seq FROM _rindle_stream WHERE name = 'outbox'"
                ).fetchone()
                self.seen.append(row[0] if row else 0)
                time.sleep(0.01)
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(10)
        return self.seen


class Writer:
    """Commits a captured row every 10 ms; ``newest()`` is the greatest seq it committed."""

    def __init__(self):
        self.stop = threading.Event()
        self.conn = raw()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            write_user(self.conn)
            time.sleep(0.01)

    def close(self):
        self.stop.set()
        self.thread.join(10)
        newest = self.conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM _rindle_change_events"
        ).fetchone()[0]
        self.conn.close()
        return newest


def lease_row():
    with connection.cursor() as cursor:
        return read_lease(cursor, "watermark")


def current_safe_seq():
    with connection.cursor() as cursor:
        cursor.execute("SELECT safe_seq FROM _rindle_stream WHERE name = 'outbox'")
        row = cursor.fetchone()
    return row[0] if row else 0


def test_a_killed_leader_is_replaced_within_the_ttl_and_safe_seq_never_goes_back(pg):
    leader = Child("leader")
    standby = None
    sampler = writer = None
    try:
        wait_for(lambda: leader.of("step"), timeout=60, what="the leader's first step")
        standby = Child("standby")
        wait_for(lambda: standby.of("ready"), timeout=60, what="the standby to start")
        sampler, writer = Sampler(), Writer()
        wait_for(
            lambda: any(s["advanced"] for s in leader.of("step")),
            timeout=10,
            what="the leader to publish the writes",
        )
        time.sleep(0.5)  # both run: the standby only retries the lease
        assert standby.of("step") == []
        before = lease_row()
        assert before["holder"] == "leader"
        published_by_leader = max(s["safe_seq"] for s in leader.of("step"))

        os.kill(leader.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        leader.proc.wait(10)

        wait_for(lambda: standby.of("step"), timeout=10, what="the standby to take over")
        took_over = standby.of("step")[0]["at"] - killed
        # It waited for the lease to expire (the leader renewed it on every step,
        # so at most an interval before the kill), and took it within TTL + interval.
        assert TTL - INTERVAL - 0.3 <= took_over <= TTL + INTERVAL + SLACK, took_over
        after = lease_row()
        assert after["holder"] == "standby"
        assert after["epoch"] > before["epoch"]
        assert all(s["epoch"] == after["epoch"] for s in standby.of("step"))

        time.sleep(0.5)  # writes after the takeover, published by the new leader
        newest = writer.close()
        writer = None
        wait_for(
            lambda: current_safe_seq() >= newest,
            timeout=5,
            what="safe_seq to reach the writes made after the kill",
        )
        assert newest > published_by_leader
        steps = [s["safe_seq"] for s in leader.of("step") + standby.of("step")]
        assert steps == sorted(steps), "a published safe_seq went back"
        seen = sampler.close()
        sampler = None
        assert seen == sorted(seen), "a reader saw safe_seq go back"
        assert seen[-1] >= published_by_leader
    finally:
        if writer is not None:
            writer.close()
        if sampler is not None:
            sampler.close()
        leader.stop()
        if standby is not None:
            standby.stop()
