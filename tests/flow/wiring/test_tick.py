"""
The flush tick: a serving process flushes its own ledger on a timer and at exit
(atexit, so Daphne's SIGTERM flushes too); a Celery beat flushes the worker's
ledger, drops aged rows and caches the fleet.
"""

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from django.test import override_settings

from rindle_app import flow, tokens
from rindle_app.flow import DAY_MS, FlowLedger, FlowStore, Transfer, now_ms, quota, tick
from rindle_app.models import FlowDayRecord
from rindle_app.tasks import flow_tick
from tests.conftest import celery_beat_worker, child_env
from tests.support.processes import ROOT, command, free_port
from tests.support.waiting import wait_for

from .conftest import stored

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def real_tick(monkeypatch, settings, rindle_runtime):
    """serving_ledger() as outside the test environment; yields the runtime."""
    settings.RINDLE = {**settings.RINDLE, "FLOW_FLUSH_SECONDS": 0.05}
    monkeypatch.setattr(tick, "_in_test_environment", lambda: False)
    yield rindle_runtime
    tick.shutdown()


def test_no_tick_runs_in_the_test_environment(rindle_runtime):
    """A background flush would race the tests' own use of the store."""
    quota.meter("acme").transfer(bytes_in=1)
    assert rindle_runtime.tick is None and not rindle_runtime.flushes_at_exit


def test_a_serving_process_flushes_on_its_tick_and_at_exit(real_tick):
    meter = quota.meter("acme", session="s1")
    assert real_tick.tick is not None and real_tick.tick.alive
    assert real_tick.flushes_at_exit  # the exit flush is armed
    meter.transfer(bytes_in=5, bytes_out=8)
    wait_for(lambda: stored("acme"), what="the tick's flush")
    [row] = stored("acme")
    assert (row["bytes_in"], row["bytes_out"], row["transfers"]) == (5, 8, 1)

    real_tick.tick.stop()  # no more ticks: only the exit flush can write what follows
    meter.transfer(bytes_in=100)
    time.sleep(0.15)
    assert stored("acme")[0]["bytes_in"] == 5
    tick.shutdown()
    assert stored("acme")[0]["bytes_in"] == 105
    assert flow.running_ledger() is None  # dropped after its last flush


def test_an_exit_flush_never_writes_into_another_database(real_tick):
    meter = quota.meter("acme")
    real_tick.tick.stop()
    meter.transfer(bytes_in=5)
    real_tick.ledger_database = "the database it started on"  # as after a test teardown
    tick.shutdown()
    assert stored("acme") == [] and flow.running_ledger() is None


def test_the_celery_task_flushes_this_process_and_caches_the_fleet(settings):
    quota.meter("acme").transfer(bytes_in=3, bytes_out=4)
    summary = flow_tick()
    assert summary["written"] == 1 and summary["namespaces"] == 1 and summary["active"] == 1
    [row] = stored("acme")
    assert (row["bytes_in"], row["bytes_out"]) == (3, 4)
    fleet, at = tick.cached_fleet()
    assert fleet.namespaces == 1 and fleet.moved == 7 and at <= now_ms()


@pytest.mark.parametrize("how, kept", [("exit", True), ("kill", False)])
def test_a_process_flushes_at_exit_and_a_sigkill_loses_the_unflushed_tick(how, kept):
    proc = subprocess.run(
        command("flow_child", "meter", "child-ns", how),
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "counted" in proc.stdout, proc.stderr
    rows = [(r["bytes_in"], r["bytes_out"], r["transfers"]) for r in stored("child-ns")]
    assert rows == ([(7, 11, 1)] if kept else [])


@pytest.mark.slow
def test_daphne_flushes_what_it_served_when_it_is_stopped(django_user_model, tmp_path):
    alice = django_user_model.objects.create_user("alice")
    raw, _ = tokens.create(alice, ["schema"])
    port = free_port()
    log = tmp_path / "daphne.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("daphne")),
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "project.asgi:application",
            ],
            cwd=ROOT,
            env=child_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/schema", headers={"Authorization": f"Bearer {raw}"}
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    body = response.read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"daphne did not answer:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
        assert json.loads(body)["tables"]
        assert stored(f"user:{alice.pk}") == []  # counted, not flushed (the tick is 60 s)
        server.terminate()  # SIGTERM: Daphne stops its reactor and exits normally
        assert server.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    [row] = stored(f"user:{alice.pk}")
    assert (row["bytes_out"], row["transfers"]) == (len(body), 1)


@pytest.mark.slow
def test_celery_beat_runs_the_flow_tick_every_interval(redis_url, tmp_path):
    """A real `celery worker -B`: aged rows go, the fleet figure lands in the cache."""
    now = now_ms()
    old = now - 100 * DAY_MS  # past the 90 kept days
    fresh = FlowLedger(FlowStore(), node="web-1").start(now)
    fresh.record("acme", now, Transfer(bytes_in=20, bytes_out=30))
    fresh.flush(now)
    aged = FlowLedger(FlowStore(), node="old-node").start(old)
    aged.record("acme", old, Transfer(bytes_in=1))
    aged.flush(old)
    assert len(stored("acme")) == 2

    cache_dir = tmp_path / "cache"
    cache = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(cache_dir),
        }
    }
    with celery_beat_worker(
        "rindle_app.tasks.flow_tick",
        redis_url,
        tmp_path,
        RINDLE_TEST_CACHE_DIR=cache_dir,
        RINDLE_FLOW_TICK_SECONDS="0.5",
    ) as (proc, log):
        with override_settings(CACHES=cache):
            wait_for(
                lambda: len(stored("acme")) == 1 and tick.cached_fleet() is not None,
                90,
                "the worker's tick",
                interval=0.25,
                process=proc,
                log=log,
            )
            fleet, at = tick.cached_fleet()
        first = log.read_text().count("flow tick wrote")
        wait_for(
            lambda: log.read_text().count("flow tick wrote") >= first + 2,
            timeout=30,
            what="two more ticks",
        )
    assert [r["node"] for r in stored("acme")] == ["web-1"]
    assert fleet.namespaces == 1 and fleet.active == 1 and fleet.moved == 50
    assert now <= at <= now_ms()
    assert FlowDayRecord.objects.filter(day__lt=now // DAY_MS - 89).count() == 0
