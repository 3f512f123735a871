"""Retained outcomes: bounded retention, the sweep, and the Celery beat that runs it."""

from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from rindle_app.engine import outcomes
from rindle_app.tasks import sweep_sql_outcomes
from tests.conftest import celery_beat_worker
from tests.support.waiting import wait_for

from .conftest import issue, post, rows

ROOT = Path(__file__).resolve().parents[3]
NOW = 1_800_000_000_000


def put(key, expires_at):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO _rindle_sql_outcomes (outcome_key, result, expires_at) "
            "VALUES (%s, %s, %s)",
            [key, '{"status": 200, "body": {}}', expires_at],
        )


def keys():
    return [k for (k,) in rows("SELECT outcome_key FROM _rindle_sql_outcomes ORDER BY 1")]


def test_the_sweep_removes_only_expired_outcomes(engine):
    """Expired (expires_at <= now) go; live ones stay, however close to expiry."""
    put("gone-long-ago", NOW - 86_400_000)
    put("gone-just-now", NOW)
    put("live-1ms", NOW + 1)
    put("live-tomorrow", NOW + 86_400_000)
    assert sweep_sql_outcomes(NOW) == 2
    assert keys() == ["live-1ms", "live-tomorrow"]
    assert sweep_sql_outcomes(NOW) == 0  # idempotent
    assert keys() == ["live-1ms", "live-tomorrow"]


def test_an_outcome_is_kept_for_the_retention_period(engine, sql):
    with override_settings(RINDLE={"SQL_OUTCOME_RETENTION_SECONDS": 3600}):
        before = outcomes.now_ms()
        post(sql, "/v1/sql/execute", {"statement": issue("i1"), "idempotency_key": "k"})
        after = outcomes.now_ms()
        ((expires_at,),) = rows("SELECT expires_at FROM _rindle_sql_outcomes")
        assert before + 3_600_000 <= expires_at <= after + 3_600_000
        assert outcomes.operation_floor_ms(after) == after - 3_600_000


def test_an_expired_outcome_is_not_replayed_even_before_the_sweep(engine, sql):
    """Past its retention a key is forgotten at once: replay never depends on sweep timing."""
    post(sql, "/v1/sql/execute", {"statement": issue("i1", "a")})
    body = {
        "statement": {"sql": "UPDATE issue SET title = title || 'b' WHERE id = 'i1'"},
        "idempotency_key": "append",
    }
    post(sql, "/v1/sql/execute", body)
    assert post(sql, "/v1/sql/execute", body)["Rindle-Outcome"] == "replayed"
    assert rows("SELECT title FROM issue") == [("ab",)]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE _rindle_sql_outcomes SET expires_at = %s", [outcomes.now_ms() - 1])
    response = post(sql, "/v1/sql/execute", body)
    assert response.status_code == 200 and "Rindle-Outcome" not in response
    assert rows("SELECT title FROM issue") == [("abb",)]


@pytest.mark.slow
def test_celery_beat_and_a_worker_sweep_expired_outcomes(engine, redis_url, tmp_path):
    """A real `celery worker -B` runs the scheduled sweep against this test's database."""
    now = outcomes.now_ms()
    put("expired-a", now - 1)
    put("expired-b", now - 60_000)
    put("live", now + 3_600_000)
    with celery_beat_worker(
        "rindle_app.tasks.sweep_sql_outcomes",
        redis_url,
        tmp_path,
        RINDLE_SQL_OUTCOME_SWEEP_SECONDS="0.5",
    ) as (proc, log):
        wait_for(
            lambda: keys() == ["live"],
            90,
            "the worker's sweep",
            interval=0.25,
            process=proc,
            log=log,
        )
    assert keys() == ["live"]
    assert "rindle_app.tasks.sweep_sql_outcomes" in log.read_text()
