"""
Settings of the rindle host project.

Two environment variables choose the deployment mode:

- ``DATABASE_URL``: ``sqlite:///path/to/db.sqlite3`` (the embedded default, SQLite in
  WAL mode) or ``postgres://user@host:5432/name``.
- ``REDIS_URL``: when set, Redis carries the channel layer and the Celery broker;
  otherwise the in-memory channel layer is used and Celery runs without a broker.
"""

import os
import tempfile
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RINDLE_VAR_DIR", BASE_DIR / "var"))

# The key that signs sessions and lease tokens: DJANGO_SECRET_KEY, else the local
# key file `make demo` writes (var/secret_key, ignored by git), else a public
# development key that system check rindle.E010 refuses while DEBUG is off.
DEVELOPMENT_SECRET_KEY = "django-insecure-rindle-development-key-public-never-use-it-0123456789"


def _secret_key():
    key = os.environ.get("DJANGO_SECRET_KEY", "")
    if not key:
        try:
            key = (VAR_DIR / "secret_key").read_text().strip()
        except OSError:
            key = ""
    return key or DEVELOPMENT_SECRET_KEY


SECRET_KEY = _secret_key()
# Off unless asked for: `make demo` sets DJANGO_DEBUG=1. Demo mode follows it: the
# demo's open sign-in (project.demo.views) and its anonymous mutations (RINDLE below).
DEBUG = os.environ.get("DJANGO_DEBUG", "0") == "1"
ALLOWED_HOSTS = os.environ.get(
    "DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver"
).split(",")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's and Redoc's assets, served without a CDN
    "django_prometheus",
    "channels",
    "rindle_app",
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = None
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database(url):
    config = dj_database_url.parse(url, conn_max_age=0)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock
        # at BEGIN so a read-then-write transaction never fails on lock upgrade.
        config["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
        Path(config["NAME"]).parent.mkdir(parents=True, exist_ok=True)
        test_dir = Path(tempfile.gettempdir()) / "rindle-tests"
        test_dir.mkdir(exist_ok=True)
        config["TEST"] = {"NAME": str(test_dir / f"test-{os.getpid()}.sqlite3")}
    else:
        # One test database per test process, so parallel runs never collide.
        config["TEST"] = {"NAME": f"test_rindle_{os.getpid()}"}
    return config


DATABASE_URL = os.environ.get("DATABASE_URL") or f"sqlite:///{VAR_DIR / 'rindle.sqlite3'}"
DATABASES = {"default": _database(DATABASE_URL)}
if os.environ.get("RINDLE_TEST_DATABASE_NAME"):
    # Subprocesses started by tests point at the parent's test database.
    DATABASES["default"]["NAME"] = os.environ["RINDLE_TEST_DATABASE_NAME"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
# rindle needs no channel layer (its processes share changes through the database);
# this one is the project's, for Channels consumers of its own.
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = not REDIS_URL
CELERY_BEAT_SCHEDULE = {
    # Expired public SQL outcomes (past RINDLE["SQL_OUTCOME_RETENTION_SECONDS"]).
    "rindle-sweep-sql-outcomes": {
        "task": "rindle_app.tasks.sweep_sql_outcomes",
        "schedule": float(os.environ.get("RINDLE_SQL_OUTCOME_SWEEP_SECONDS", 600)),
    },
    # The usage ledger: the worker's flush, aged rows dropped, the fleet figure cached.
    "rindle-flow-tick": {
        "task": "rindle_app.tasks.flow_tick",
        "schedule": float(os.environ.get("RINDLE_FLOW_TICK_SECONDS", 60)),
    },
}

AUTH_PASSWORD_VALIDATORS = []
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
LOGIN_URL = "/admin/login/"

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Tokens first: a request with no credentials is then told to authenticate (401).
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rindle_app.api.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "rindle",
    "VERSION": "0.1.0",
    # /api/rindle/docs/ and /api/rindle/redoc/ load their assets from this site.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

RINDLE = {
    "SYNCED_MODELS": ["demo.User", "demo.Issue", "demo.Tag", "demo.Comment"],
    # Seconds between this process's flushes of its usage ledger (tests shorten it).
    "FLOW_FLUSH_SECONDS": float(os.environ.get("RINDLE_FLOW_FLUSH_SECONDS", 60)),
    # The demo opts in to anonymous mutations in demo mode (DEBUG on): anonymous
    # visitors may edit issues there (its mutators that need an author still reject
    # them: "sign in to do this"). Outside demo mode rindle refuses them first.
    "ALLOW_ANONYMOUS_MUTATIONS": DEBUG,
    # Rooms (two or more people on one issue exchange edits through this process):
    # on in demo mode, where one process serves everyone; RINDLE_ROOMS_ENABLED=1
    # turns them on elsewhere.
    "ROOMS_ENABLED": os.environ.get("RINDLE_ROOMS_ENABLED", "1" if DEBUG else "0") == "1",
    # Seconds between outbox retention runs (the beat entry below uses the same).
    "STREAM_RETENTION_PERIOD_SECONDS": float(
        os.environ.get("RINDLE_STREAM_RETENTION_PERIOD_SECONDS", 3600)
    ),
}
# The outbox's retention: the prefix older than RINDLE["STREAM_RETENTION_SECONDS"].
CELERY_BEAT_SCHEDULE["rindle-stream-retention"] = {
    "task": "rindle_app.tasks.stream_retention",
    "schedule": RINDLE["STREAM_RETENTION_PERIOD_SECONDS"],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    # propagate=False: Daphne configures the root logger too, which would print twice.
    "loggers": {"rindle": {"handlers": ["console"], "level": "INFO", "propagate": False}},
}
