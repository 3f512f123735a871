"""
The watermarker in a fleet: one exclusive fence acquisition per refresh interval
whatever the number of processes, a watermarker beside every PostgreSQL hub
(STREAM_WATERMARKER "embedded") that the runtime stops and whose lease it
releases, and ``manage.py rindle_watermark``.
"""

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from rindle_app import runtime as runtimes
from rindle_app.stream.lease import read as read_lease
from rindle_app.stream.watermark import Watermarker
from tests.support.waiting import wait_for

from ..conftest import child_env
from .watermark_support import max_seq, pg, raw, safe_seq, write_user

__all__ = ["pg"]

ROOT = Path(__file__).resolve().parents[2]


def test_three_processes_take_the_fence_once_per_interval_between_them(pg):
    """
    Three watermarker processes on one database, under a steady stream of commits:
    the fence is taken (a fenced step, granted or timed out) at most once per
    refresh interval for the whole fleet, plus slack; the others stay standbys.
    """
    interval, window = 0.05, 3.0
    env = child_env(WM_INTERVAL=str(interval), WM_TTL="5", PYTHONPATH=str(ROOT))
    children, outputs = [], []
    for n in range(3):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.stream.wm_child", f"fleet{n}", "0"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        lines = []
        threading.Thread(
            target=lambda c=child, out=lines: out.extend(c.stdout), daemon=True
        ).start()
        children.append(child)
        outputs.append(lines)
    stop = threading.Event()

    def write():
        conn = raw()
        while not stop.is_set():
            write_user(conn)
            time.sleep(0.005)
        conn.close()

    writer = threading.Thread(target=write)
    try:
        deadline = time.monotonic() + 90
        while not all(any('"ready"' in x for x in lines) for lines in outputs):
            assert time.monotonic() < deadline, outputs
            time.sleep(0.1)
        writer.start()
        time.sleep(0.5)
        start = time.monotonic()
        time.sleep(window)
        end = time.monotonic()
        stop.set()
        writer.join(10)
        time.sleep(0.5)  # the leader publishes the last commits
    finally:
        stop.set()
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            child.wait(30)
    steps = [(n, json.loads(x)) for n, lines in enumerate(outputs) for x in lines if '"step"' in x]
    inside = [(n, s) for n, s in steps if start <= s["at"] <= end]
    print(f"fenced steps in {window}s at interval {interval}: {len(inside)}")
    assert len(inside) <= window / interval * 1.2 + 5, len(inside)
    assert len(inside) >= window / interval / 4  # the fleet did keep stepping
    assert len({s["epoch"] for _n, s in inside}) <= 2
    assert safe_seq() == max_seq()


def test_the_runtime_runs_a_watermarker_beside_the_hub_and_releases_its_lease(pg):
    """
    On PostgreSQL the hub's start starts a watermarker that publishes commits;
    shutdown stops it and releases the lease, leaving safe_seq as published.
    """
    runtime = runtimes.get_runtime()
    runtime.hub  # noqa: B018  (starts the engine, the hub and the watermarker)
    watermarker = runtime.watermarker
    assert watermarker is not None and watermarker.running
    writer = raw()
    write_user(writer)
    target = max_seq()
    wait_for(lambda: safe_seq() >= target, 5, "safe_seq past the write")
    runtime.shutdown()
    assert not watermarker.running and runtime.watermarker is None
    with connection.cursor() as cursor:
        lease = read_lease(cursor, "watermark")
    assert lease["holder"] == "" and safe_seq() >= target
    writer.close()


def test_an_external_watermarker_setting_starts_none_in_the_runtime(pg, settings):
    """STREAM_WATERMARKER "external" leaves the watermark to the management command."""
    settings.RINDLE = {**settings.RINDLE, "STREAM_WATERMARKER": "external"}
    runtime = runtimes.get_runtime()
    runtime.hub  # noqa: B018
    assert runtime.watermarker is None


def test_the_command_once_prints_one_step(pg, capsys):
    """``rindle_watermark --once`` publishes and prints the step's progress as JSON."""
    writer = raw()
    write_user(writer)
    call_command("rindle_watermark", "--once")
    report = json.loads(capsys.readouterr().out)
    assert report["safe_seq"] == max_seq() == safe_seq()
    assert report["advanced"] is True and report["fence_timed_out"] is False
    writer.close()


def test_the_command_once_exits_1_while_another_process_leads(pg):
    """With the lease held elsewhere, ``--once`` fails with status 1 and publishes nothing."""
    leader = Watermarker()
    leader.step()
    writer = raw()
    write_user(writer)
    with pytest.raises(CommandError, match="held by") as caught:
        call_command("rindle_watermark", "--once")
    assert caught.value.returncode == 1
    assert safe_seq() < max_seq()
    leader.close()
    writer.close()


def test_the_command_runs_until_sigterm_and_releases_its_lease(pg):
    """The standalone command publishes commits and, on SIGTERM, releases its lease."""
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "rindle_watermark"],
        cwd=ROOT,
        env=child_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        writer = raw()
        write_user(writer)
        target = max_seq()
        wait_for(lambda: safe_seq() >= target, 60, "safe_seq past the write", process=proc)
        writer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    with connection.cursor() as cursor:
        assert read_lease(cursor, "watermark")["holder"] == ""


@override_settings()
def test_metrics_report_the_watermarker_steps(pg):
    """/metrics shows the running watermarker's steps by outcome, safe_seq and epoch."""
    from ..conftest import scrape_metrics

    runtime = runtimes.get_runtime()
    runtime.hub  # noqa: B018
    writer = raw()
    write_user(writer)
    target = max_seq()
    wait_for(lambda: safe_seq() >= target, 5, "safe_seq past the write")
    text = scrape_metrics()
    assert 'rindle_watermark_steps_total{database="default",outcome="advanced"}' in text
    assert f'rindle_watermark_safe_seq{{database="default"}} {float(target)}' in text
    assert 'rindle_watermark_leader{database="default"} 1.0' in text
    writer.close()
