"""Under CI=true a missing PostgreSQL or Redis fails the run; elsewhere it is skipped."""

import subprocess
import sys
from pathlib import Path

import pytest

from . import conftest

ROOT = Path(__file__).resolve().parent.parent
DEAD = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def require(*urls, ci):
    env = {"PATH": "/usr/bin:/bin", "CI": "true" if ci else ""}
    return subprocess.run(
        [sys.executable, "scripts/require_services.py", *urls],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_test_command_fails_on_a_missing_service_under_ci():
    """With CI=true, an unreachable service makes the service gate exit non-zero (1)."""
    result = require(conftest.POSTGRES_URL, DEAD, ci=True)
    assert result.returncode == 1
    assert DEAD in result.stderr and "CI=true" in result.stderr


def test_the_test_command_skips_a_missing_service_outside_ci():
    """Outside CI the gate reports the missing service and asks the caller to skip (2)."""
    assert require(DEAD, ci=False).returncode == 2


def test_the_gate_passes_when_the_services_answer():
    """When PostgreSQL and Redis answer, the second pass runs."""
    conftest.require_service("PostgreSQL", conftest.POSTGRES_URL)
    conftest.require_service("Redis", conftest.REDIS_URL)
    assert require(conftest.POSTGRES_URL, conftest.REDIS_URL, ci=True).returncode == 0


def test_a_test_claiming_a_missing_service_fails_under_ci(monkeypatch):
    """A test that needs a service fails, never skips, when CI=true and it is gone."""
    monkeypatch.setattr(conftest, "CI", True)
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        conftest.require_service("Redis", DEAD)
    monkeypatch.setattr(conftest, "CI", False)
    with pytest.raises(pytest.skip.Exception):
        conftest.require_service("Redis", DEAD)
