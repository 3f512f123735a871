"""DATABASE_URL and REDIS_URL choose the backends; the services they name answer."""

import json
import subprocess
import sys
from pathlib import Path

import psycopg
from asgiref.sync import async_to_sync
from channels_redis.core import RedisChannelLayer

from rindle_app.conf import rindle_settings

from .conftest import POSTGRES_URL, require_service

ROOT = Path(__file__).resolve().parent.parent

PROBE = (
    "import json, django; django.setup(); from django.conf import settings;"
    "db = settings.DATABASES['default'];"
    "print(json.dumps({'engine': db['ENGINE'], 'name': str(db['NAME']),"
    " 'options': db.get('OPTIONS', {}),"
    " 'layer': settings.CHANNEL_LAYERS['default']['BACKEND'],"
    " 'broker': settings.CELERY_BROKER_URL, 'debug': settings.DEBUG,"
    " 'anonymous_mutations': settings.RINDLE.get('ALLOW_ANONYMOUS_MUTATIONS'),"
    " 'key': settings.SECRET_KEY}))"
)


def probe_settings(tmp_path, **env):
    base = {"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "project.settings"}
    base["RINDLE_VAR_DIR"] = str(tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**base, **env},
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def test_the_default_is_embedded_sqlite_wal_and_in_memory_layer(tmp_path):
    """With no environment, the project runs on SQLite in WAL and an in-memory layer."""
    s = probe_settings(tmp_path)
    assert s["engine"] == "django.db.backends.sqlite3"
    assert s["name"] == str(tmp_path / "rindle.sqlite3")
    assert "journal_mode=WAL" in s["options"]["init_command"]
    assert s["options"]["transaction_mode"] == "IMMEDIATE"
    assert s["layer"] == "channels.layers.InMemoryChannelLayer"
    assert s["broker"] == "memory://"


def test_debug_and_the_demo_mode_are_off_unless_asked_for(tmp_path):
    """
    No environment: DEBUG off, no anonymous mutations, the public development key
    (which check rindle.E010 refuses). DJANGO_DEBUG=1 (``make demo``) turns demo
    mode on; the key file ``make demo`` writes is read when DJANGO_SECRET_KEY is unset.
    """
    s = probe_settings(tmp_path)
    assert (s["debug"], s["anonymous_mutations"]) == (False, False)
    assert s["key"].startswith("django-insecure-")
    s = probe_settings(tmp_path, DJANGO_DEBUG="1")
    assert (s["debug"], s["anonymous_mutations"]) == (True, True)
    (tmp_path / "secret_key").write_text("k3y-from-the-file-" * 4 + "\n")
    assert probe_settings(tmp_path)["key"] == "k3y-from-the-file-" * 4
    assert probe_settings(tmp_path, DJANGO_SECRET_KEY="from-env" * 8)["key"] == "from-env" * 8


def test_database_url_and_redis_url_select_postgres_and_redis(tmp_path):
    """DATABASE_URL=postgres://... and REDIS_URL switch to the scale-out backends."""
    s = probe_settings(
        tmp_path,
        DATABASE_URL="postgres://app@db.example:5432/prod",
        REDIS_URL="redis://cache.example:6379/0",
    )
    assert s["engine"] == "django.db.backends.postgresql"
    assert s["name"] == "prod"
    assert s["layer"] == "channels_redis.core.RedisChannelLayer"
    assert s["broker"] == "redis://cache.example:6379/0"


def test_rindle_settings_have_defaults_and_refuse_unknown_names(settings):
    """RINDLE is read lazily with defaults; a typo is an AttributeError, not a None."""
    settings.RINDLE = {"MAX_ARGS_BYTES": 10}
    assert rindle_settings.MAX_ARGS_BYTES == 10
    assert rindle_settings.GROUP_COMMIT_MAX == 64
    try:
        rindle_settings.MAX_ARG_BYTES  # noqa: B018
    except AttributeError as exc:
        assert "MAX_ARG_BYTES" in str(exc)
    else:
        raise AssertionError("an unknown setting must raise")


def test_redis_channel_layer_round_trip(redis_url):
    """The Redis channel layer delivers a message between channels."""
    layer = RedisChannelLayer(hosts=[redis_url])

    async def round_trip():
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "rindle.ping", "n": 1})
        message = await layer.receive(channel)
        await layer.flush()
        return message

    assert async_to_sync(round_trip)() == {"type": "rindle.ping", "n": 1}


def test_postgres_answers():
    """The local PostgreSQL the scale-out tests use accepts connections."""
    require_service("PostgreSQL", POSTGRES_URL)
    with psycopg.connect(POSTGRES_URL, connect_timeout=5) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
