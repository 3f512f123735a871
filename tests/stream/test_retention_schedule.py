"""
Where retention runs: the Celery beat task every STREAM_RETENTION_PERIOD_SECONDS,
and, in the embedded mode, the same run on the runtime's in-process timer, started
with the hub and stopped with the runtime.
"""

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from rindle_app.tasks import stream_retention
from tests.support.waiting import wait_for

from ..conftest import celery_beat_worker
from .retention_support import DAY, add_events, outbox_seqs, publish, read_state

pytestmark = pytest.mark.django_db(transaction=True)


def rindle(**values):
    return override_settings(RINDLE={**settings.RINDLE, **values})


def old_rows(n):
    """``n`` rows stamped a month ago by the real clock, then published."""
    seqs = add_events([timezone.now() - 30 * DAY] * n)
    publish()
    return seqs


def test_the_beat_schedule_runs_the_retention_task_every_period():
    """The host project's beat entry names the registered task, at the period setting."""
    from project.celery import app

    entry = settings.CELERY_BEAT_SCHEDULE["rindle-stream-retention"]
    assert entry["task"] == stream_retention.name == "rindle_app.tasks.stream_retention"
    assert entry["schedule"] == settings.RINDLE["STREAM_RETENTION_PERIOD_SECONDS"]
    app.loader.import_default_modules()
    assert stream_retention.name in app.tasks


def test_the_task_prunes_the_prefix_past_the_configured_age():
    """The task prunes every row older than STREAM_RETENTION_SECONDS but the newest."""
    seqs = old_rows(4)
    summary = stream_retention()
    assert summary["pruned"] == 3 and summary["horizon"] == seqs[-1]
    assert outbox_seqs() == seqs[-1:]


def test_the_embedded_timer_prunes_every_period_until_the_runtime_stops(rindle_runtime):
    """
    With a tiny period the runtime's timer prunes rows that aged, run after run;
    ``shutdown()`` stops it.
    """
    with rindle(STREAM_RETENTION_PERIOD_SECONDS=0.05):
        seqs = old_rows(3)
        timer = rindle_runtime.start_retention()
        assert timer is not None and timer.alive
        assert rindle_runtime.start_retention() is timer
        wait_for(lambda: outbox_seqs() == seqs[-1:], 10, "the first run")
        more = old_rows(3)
        wait_for(lambda: outbox_seqs() == more[-1:], 10, "a later run")
        wait_for(lambda: timer.runs >= 3, 10, "three runs")
        assert read_state().horizon == more[-1]
        assert rindle_runtime.retention_stats.pruned == 5
        rindle_runtime.shutdown()
    assert not timer.alive and rindle_runtime.retention_timer is None


def test_no_timer_runs_when_the_watermarker_is_external():
    """STREAM_WATERMARKER "external": the embedded timer stays off (beat prunes)."""
    from rindle_app.runtime import get_runtime

    with rindle(STREAM_WATERMARKER="external"):
        assert get_runtime("default").start_retention() is None


def test_the_serving_path_starts_the_timer_with_the_hub(rindle_runtime, monkeypatch):
    """
    Outside Django's test environment, starting the hub starts the retention timer
    (inside it, it does not: a background delete would race the tests).
    """
    from rindle_app.flow import tick

    rindle_runtime.hub  # noqa: B018  (starts the engine and the hub)
    assert rindle_runtime.retention_timer is None
    rindle_runtime.stop_hub()
    rindle_runtime.stop_retention()
    monkeypatch.setattr(tick, "_in_test_environment", lambda: False)
    rindle_runtime.hub  # noqa: B018
    timer = rindle_runtime.retention_timer
    assert timer is not None and timer.alive
    rindle_runtime.shutdown()
    assert not timer.alive


@pytest.mark.slow
def test_celery_beat_runs_retention_every_period(redis_url, tmp_path):
    """A real `celery worker -B` prunes the aged prefix on its schedule."""
    seqs = old_rows(5)
    with celery_beat_worker(
        "rindle_app.tasks.stream_retention",
        redis_url,
        tmp_path,
        RINDLE_STREAM_RETENTION_PERIOD_SECONDS="0.5",
    ) as (proc, log):
        wait_for(
            lambda: outbox_seqs() == seqs[-1:],
            90,
            "the worker's prune",
            interval=0.25,
            process=proc,
            log=log,
        )
        wait_for(
            lambda: log.read_text().count("stream retention pruned") >= 2,
            30,
            "a second run",
        )
    assert read_state().horizon == seqs[-1]
