"""
Shared fixtures.

The suite runs once per backend: SQLite by default, PostgreSQL when DATABASE_URL
points at one (the README's test command runs both). Services a test claims are
required under CI=true: a missing one fails the test instead of skipping it.
"""

import os
import socket
import subprocess
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import pytest
from django.db import connection

from rindle_app.pytest_plugin import rindle_runtime  # noqa: F401  (the plugin's fixture)
from rindle_app.testing import running
from tests.support.processes import child_env, stop  # noqa: F401  (child_env: for the tests)

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# pytest-django runs the suite with DEBUG off, where check rindle.E010 refuses the
# public development key: the run gets a strong random key of its own unless the
# caller set one, in the settings and in the environment its subprocesses (Daphne,
# manage.py) inherit, so a session or lease made here is valid there too.
if not os.environ.get("DJANGO_SECRET_KEY"):
    import secrets

    from django.conf import settings as _settings

    os.environ["DJANGO_SECRET_KEY"] = secrets.token_urlsafe(50)
    _settings.SECRET_KEY = os.environ["DJANGO_SECRET_KEY"]
REDIS_URL = os.environ.get("RINDLE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
POSTGRES_URL = os.environ.get("RINDLE_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")


def _reachable(url):
    parts = urlparse(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=2):
            return True
    except OSError:
        return False


def require_service(name, url):
    """Skip when ``url`` does not answer, except under CI=true where it fails."""
    if _reachable(url):
        return url
    message = f"{name} at {url} is unreachable"
    if CI:
        pytest.fail(message + " (CI=true: services are required)")
    pytest.skip(message)


@pytest.fixture(autouse=True)
def _fresh_runtime(rindle_runtime):  # noqa: F811  (the fixture, not the import)
    """
    Every test starts as a fresh process: no engine, hub, usage ledger, quota cache
    or flush tick of an earlier test (the ``rindle_runtime`` fixture, public API).
    """
    yield rindle_runtime


@pytest.fixture
def operator(client, django_user_model):
    """The test client signed in as a superuser: the admin's operator."""
    client.force_login(django_user_model.objects.create_superuser("operator", "op@example.com"))
    return client


@pytest.fixture
def staff(client, django_user_model):
    """The test client signed in as a staff user without permissions (``client.user``)."""
    user = django_user_model.objects.create_user("staff", is_staff=True)
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture(scope="session")
def installed_rindle(tmp_path_factory):
    """rindle's wheel ``pip install``-ed into a fresh venv, once per session (slow)."""
    from tests.support.installed import build_and_install

    return build_and_install(tmp_path_factory.mktemp("installed"))


@pytest.fixture
def redis_url():
    return require_service("Redis", REDIS_URL)


@pytest.fixture
def engine(transactional_db):
    """A fresh engine on the test database, drained and closed after the test."""
    with running() as e:
        yield e


@pytest.fixture
def vendor(db):
    return connection.vendor


METRICS_TOKEN = "metrics-scraper-token-for-the-test-run-0123456789"


def scrape_metrics():
    """GET /metrics as a scraper with the bearer token METRICS_AUTH admits."""
    from django.conf import settings
    from django.test import Client, override_settings

    auth = {**settings.RINDLE, "METRICS_AUTH": {"TOKEN": METRICS_TOKEN}}
    with override_settings(RINDLE=auth):
        response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    assert response.status_code == 200, response.content
    return response.content.decode()


# Property tests: a fixed budget in CI; RINDLE_SOAK=N multiplies every budget by N
# for a soak. A failure prints a blob that replays it (@reproduce_failure).
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

SOAK = max(1, int(os.environ.get("RINDLE_SOAK", "1")))
hypothesis_settings.register_profile(
    "rindle",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
hypothesis_settings.load_profile("rindle")


def examples(n):
    """The example budget of a property test: ``n`` in CI, ``n * RINDLE_SOAK`` in a soak."""
    return n * SOAK


@contextmanager
def celery_beat_worker(task, redis_url, workdir, **env):
    """
    A real ``celery -A project worker -B`` whose beat schedules only ``task``
    (tests/support/celery_settings.py), on a queue of its own (so concurrent runs on
    one broker never take each other's tasks); yields (process, log path), and stops
    it and drops its queue afterwards.
    """
    queue = f"rindle-test-{uuid.uuid4().hex[:12]}"
    log = workdir / "celery.log"
    command = [
        str(Path(sys.executable).with_name("celery")),
        *("-A", "project", "worker", "-B", "-P", "solo", "-Q", queue, "-n", f"{queue}@%h"),
        *("--schedule-filename", str(workdir / "beat-schedule"), "-l", "INFO"),
    ]
    root = Path(__file__).resolve().parent.parent
    environment = child_env(
        DJANGO_SETTINGS_MODULE="tests.support.celery_settings",
        REDIS_URL=redis_url,
        RINDLE_TEST_CELERY_QUEUE=queue,
        RINDLE_TEST_CELERY_TASK=task,
        PYTHONPATH=str(root),
        **env,
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(
            command, cwd=root, env=environment, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc, log
    finally:
        stop(proc, 30)
        import redis

        redis.Redis.from_url(redis_url).delete(queue)
