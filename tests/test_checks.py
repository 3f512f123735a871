"""System checks catch each misconfiguration of rindle and pass the project's settings."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from rindle_app.checks import check_allowed_hosts, check_secret_key, check_settings

# The checks only read settings.DATABASES; no connection is opened through the
# overridden aliases, which is what Django's warning is about.
pytestmark = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES:UserWarning")

WAL = "PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL"


def sqlite(name="/var/lib/rindle/db.sqlite3", **options):
    return {"ENGINE": "django.db.backends.sqlite3", "NAME": name, "OPTIONS": options}


def check_ids(**overrides):
    """The ids rindle's checks report under ``overrides``."""
    with override_settings(**overrides):
        return [message.id for message in check_settings(None)]


def with_database(db, **rindle):
    """Overrides adding ``db`` as the alias rindle writes through."""
    return {
        "DATABASES": {**settings.DATABASES, "rindle": db},
        "RINDLE": {**settings.RINDLE, **rindle, "DATABASE": "rindle"},
    }


def test_the_project_settings_pass_every_check():
    """The host project's own settings raise no rindle error or warning."""
    assert check_settings(None) == []
    assert check_allowed_hosts(None) == []
    call_command("check", fail_level="WARNING")


def test_a_well_configured_sqlite_database_passes():
    """A file SQLite database in WAL mode with IMMEDIATE transactions passes."""
    assert check_ids(**with_database(sqlite(init_command=WAL, transaction_mode="IMMEDIATE"))) == []


def test_a_postgres_database_passes():
    """A PostgreSQL database needs no further options."""
    db = {"ENGINE": "django.db.backends.postgresql", "NAME": "rindle"}
    assert check_ids(**with_database(db)) == []


def test_an_unknown_database_alias_is_an_error():
    """RINDLE['DATABASE'] must name an alias of DATABASES (rindle.E001)."""
    assert check_ids(RINDLE={"DATABASE": "missing"}) == ["rindle.E001"]


def test_an_unsupported_database_engine_is_an_error():
    """Only SQLite and PostgreSQL are supported (rindle.E002)."""
    db = {"ENGINE": "django.db.backends.mysql", "NAME": "rindle"}
    assert check_ids(**with_database(db)) == ["rindle.E002"]


@pytest.mark.parametrize("name", [":memory:", "file:rindle?mode=memory&cache=shared"])
def test_an_in_memory_sqlite_database_is_an_error(name):
    """The engine's writer thread needs a file, not an in-memory database (rindle.E003)."""
    db = sqlite(name, init_command=WAL, transaction_mode="IMMEDIATE")
    assert check_ids(**with_database(db)) == ["rindle.E003"]


@pytest.mark.parametrize("init_command", [None, "PRAGMA synchronous=NORMAL"])
def test_sqlite_without_wal_is_an_error(init_command):
    """A SQLite database must switch to WAL in its init_command (rindle.E004)."""
    options = {"transaction_mode": "IMMEDIATE"}
    if init_command:
        options["init_command"] = init_command
    assert check_ids(**with_database(sqlite(**options))) == ["rindle.E004"]


def test_wal_is_recognised_in_any_case_and_spacing():
    """The WAL pragma is matched regardless of case and spaces."""
    db = sqlite(init_command="pragma JOURNAL_MODE = wal", transaction_mode="immediate")
    assert check_ids(**with_database(db)) == []


@pytest.mark.parametrize("layers", [None, {}, {"other": {}}])
def test_no_channel_layer_is_needed(layers):
    """Processes share changes through the outbox, not Channels: no layer, no check."""
    assert check_ids(CHANNEL_LAYERS=layers) == []


def test_an_unknown_synced_model_is_an_error():
    """Each SYNCED_MODELS label must name an installed model (rindle.E006)."""
    labels = ["demo.Issue", "demo.Nope", "nope.Issue", "no_dot"]
    assert check_ids(RINDLE={"SYNCED_MODELS": labels}) == ["rindle.E006"] * 3


@pytest.mark.parametrize("adapter", ["rindle_app.adapter.Nope", "no_such_module.Adapter", "x"])
def test_an_adapter_that_cannot_be_imported_is_an_error(adapter):
    """RINDLE['ADAPTER'] must be an importable dotted path (rindle.E007)."""
    assert check_ids(RINDLE={"ADAPTER": adapter}) == ["rindle.E007"]


@pytest.mark.parametrize("value", [["DATABASE"], "default", 1])
def test_rindle_settings_that_are_not_a_dict_are_an_error(value):
    """settings.RINDLE must be a dict, and nothing else is checked otherwise (rindle.E008)."""
    assert check_ids(RINDLE=value) == ["rindle.E008"]


@pytest.mark.parametrize(
    "rindle",
    [{"SQLITE_WAKE": "inotfy"}, {"SQLITE_WAKE": True}, {"WAKE_POLL_INTERVAL": -1}],
)
def test_a_bad_wake_up_setting_is_an_error(rindle):
    """SQLITE_WAKE is "inotify" or "poll", WAKE_POLL_INTERVAL positive (rindle.E031)."""
    assert check_ids(RINDLE={"DATABASE": "default", **rindle}) == ["rindle.E031"]
    assert check_ids(RINDLE={"DATABASE": "default", "SQLITE_WAKE": "poll"}) == []


def test_an_unknown_rindle_key_is_a_warning():
    """A misspelt key in settings.RINDLE is reported, one warning each (rindle.W001)."""
    ids = check_ids(RINDLE={"SYNCED_MODEL": [], "ADAPTR": "x", "DATABASE": "default"})
    assert ids == ["rindle.W001", "rindle.W001"]


def test_sqlite_with_deferred_transactions_is_a_warning():
    """SQLite should take the write lock at BEGIN (rindle.W002)."""
    assert check_ids(**with_database(sqlite(init_command=WAL))) == ["rindle.W002"]


def test_every_problem_is_reported_at_once():
    """Independent misconfigurations are all reported in one run."""
    ids = check_ids(
        CHANNEL_LAYERS={},
        **with_database(
            sqlite(":memory:"), SYNCED_MODELS=["demo.Nope"], ADAPTER="nope.A", COLOUR="blue"
        ),
    )
    assert sorted(ids) == sorted(
        ["rindle.W001", "rindle.E003", "rindle.E004", "rindle.W002"]
        + ["rindle.E006", "rindle.E007"]
    )


def test_a_bare_string_of_synced_models_is_one_error_not_one_per_character():
    """SYNCED_MODELS given as a string (or holding a non-string) is reported once per entry."""
    assert check_ids(RINDLE={"SYNCED_MODELS": "demo.User"}) == ["rindle.E006"]
    assert check_ids(RINDLE={"SYNCED_MODELS": [42]}) == ["rindle.E006"]


def test_an_adapter_that_is_not_a_rindle_adapter_is_refused():
    """An importable ADAPTER that is not a RindleAdapter subclass is rindle.E007."""
    assert check_ids(RINDLE={"ADAPTER": "builtins.dict"}) == ["rindle.E007"]
    assert check_ids(RINDLE={"ADAPTER": None}) == ["rindle.E007"]


def test_gis_engines_count_as_their_vendor():
    """PostGIS is PostgreSQL and SpatiaLite is SQLite for rindle's checks."""
    postgis = {"ENGINE": "django.contrib.gis.db.backends.postgis", "NAME": "x"}
    assert check_ids(**with_database(postgis)) == []
    spatialite = sqlite(init_command=WAL, transaction_mode="IMMEDIATE")
    spatialite["ENGINE"] = "django.contrib.gis.db.backends.spatialite"
    assert check_ids(**with_database(spatialite)) == []


def test_a_rindle_setting_that_is_not_a_dict_is_reported_not_crashing():
    """RINDLE = [...] yields rindle.E008, and settings fall back to their defaults."""
    from rindle_app.conf import rindle_settings

    with override_settings(RINDLE=["oops"]):
        assert [m.id for m in check_settings(None)] == ["rindle.E008"]
        assert rindle_settings.MUTATORS_MODULE == "mutators"


def test_a_wildcard_allowed_host_is_refused_outside_debug():
    """ALLOWED_HOSTS = ["*"] with DEBUG off is rindle.E009: websocket origins trust it."""

    def ids(**overrides):
        with override_settings(**overrides):
            return [m.id for m in check_allowed_hosts(None)]

    assert ids(DEBUG=False, ALLOWED_HOSTS=["example.com", "*"]) == ["rindle.E009"]
    assert ids(DEBUG=True, ALLOWED_HOSTS=["*"]) == []
    assert ids(DEBUG=False, ALLOWED_HOSTS=["example.com", ".example.org"]) == []
    with override_settings(DEBUG=False, ALLOWED_HOSTS=["*"]):
        with pytest.raises(SystemCheckError, match="rindle.E009"):
            call_command("check")


STRONG = "x7Qp9vR2mK4tW8zL1nB6cF3hJ5dG0sY-aE_uI9oP2qW4eR6tY8uI0oP2aS4dF6g"


def secret_key_ids(**overrides):
    with override_settings(**overrides):
        return [m.id for m in check_secret_key(None)]


@pytest.mark.parametrize(
    "key",
    [
        "insecure-development-key-change-me-in-production-0123456789",  # rindle's old key
        "django-insecure-rindle-development-key-public-never-use-it-0123456789",  # its new one
        "django-insecure-" + STRONG,  # what startproject generates
        "short-key",
        "a" * 80,  # long, but 1 distinct character
        "",
    ],
)
def test_a_public_or_weak_secret_key_is_an_error_outside_debug(key):
    """rindle.E010: a key anyone can know forges sessions and leases while DEBUG is off."""
    assert secret_key_ids(DEBUG=False, SECRET_KEY=key) == ["rindle.E010"]
    assert secret_key_ids(DEBUG=True, SECRET_KEY=key) == []


def test_a_strong_key_passes_and_a_weak_fallback_is_an_error():
    assert secret_key_ids(DEBUG=False, SECRET_KEY=STRONG) == []
    fallbacks = [STRONG[::-1], "django-insecure-" + STRONG]
    assert secret_key_ids(DEBUG=False, SECRET_KEY=STRONG, SECRET_KEY_FALLBACKS=fallbacks) == [
        "rindle.E010"
    ]
    with override_settings(DEBUG=False, SECRET_KEY="django-insecure-" + STRONG):
        with pytest.raises(SystemCheckError, match="rindle.E010"):
            call_command("check")


ROOT = Path(__file__).resolve().parent.parent


def manage_check(tmp_path, *args, **env):
    """``manage.py check`` of the host project with no key in the environment."""
    environment = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SECRET_KEY",)}
    environment.pop("DJANGO_DEBUG", None)
    environment.update(RINDLE_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="project.settings")
    environment.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", "check", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_project_refuses_its_development_key_unless_debug_or_a_key_file(tmp_path):
    """
    With no DJANGO_SECRET_KEY the host project falls back to its public development
    key, which check rindle.E010 refuses while DEBUG is off (the default); DEBUG on
    or the key file `make demo` writes (var/secret_key) passes.
    """
    refused = manage_check(tmp_path)
    assert refused.returncode != 0 and "rindle.E010" in refused.stderr, refused.stderr
    assert manage_check(tmp_path, DJANGO_DEBUG="1").returncode == 0
    (tmp_path / "secret_key").write_text(STRONG + "\n")
    passed = manage_check(tmp_path)
    assert passed.returncode == 0, passed.stderr


def test_the_production_settings_template_passes_check_deploy(tmp_path):
    """
    project.settings_production, with a strong key and a host name from the
    environment: ``check --deploy --fail-level WARNING`` finds no issue at all.
    Without the key it refuses to start.
    """
    import secrets

    env = {
        "DJANGO_SETTINGS_MODULE": "project.settings_production",
        "DJANGO_ALLOWED_HOSTS": "rindle.example.com",
    }
    deploy = ("--deploy", "--fail-level", "WARNING")
    passed = manage_check(tmp_path, *deploy, DJANGO_SECRET_KEY=secrets.token_urlsafe(50), **env)
    assert passed.returncode == 0, passed.stderr
    assert "System check identified no issues" in passed.stdout
    # The same checks flag the host project's own settings (DEBUG on, no HTTPS).
    dev = manage_check(tmp_path, *deploy, DJANGO_DEBUG="1")
    assert dev.returncode != 0 and "security.W018" in dev.stderr, dev.stderr
    refused = manage_check(tmp_path, *deploy, **env)
    assert refused.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in refused.stderr, refused.stderr


@pytest.mark.parametrize("value", [0, -5, "100", 1.5, None, True])
def test_a_store_bound_that_is_not_a_positive_integer_is_check_e032(settings, value):
    """STORE_MAX_ROWS bounds the live store's memory: anything but a positive int is refused."""
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "STORE_MAX_ROWS": value}
    assert "rindle.E032" in [e.id for e in check_settings(None)]
    settings.RINDLE = {**settings.RINDLE, "STORE_MAX_ROWS": 1000}
    assert "rindle.E032" not in [e.id for e in check_settings(None)]


@pytest.mark.parametrize("value", [0, -1, "10", 2.0, None, False])
def test_a_room_pending_bound_that_is_not_a_positive_integer_is_check_e037(settings, value):
    """ROOM_MAX_PENDING bounds a room host's buffer: anything but a positive int is refused."""
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "ROOM_MAX_PENDING": value}
    assert "rindle.E037" in [e.id for e in check_settings(None)]
    settings.RINDLE = {**settings.RINDLE, "ROOM_MAX_PENDING": 5}
    assert "rindle.E037" not in [e.id for e in check_settings(None)]


@pytest.mark.parametrize("value", ["externel", "Embedded", "", None, 1])
def test_a_watermarker_placement_other_than_embedded_or_external_is_check_e033(settings, value):
    """STREAM_WATERMARKER is "embedded" or "external"; a misspelling is refused, not ignored."""
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "STREAM_WATERMARKER": value}
    errors = [e for e in check_settings(None) if e.id == "rindle.E033"]
    assert len(errors) == 1 and repr(value) in errors[0].msg
    for good in ("embedded", "external"):
        settings.RINDLE = {**settings.RINDLE, "STREAM_WATERMARKER": good}
        assert "rindle.E033" not in [e.id for e in check_settings(None)]


@pytest.mark.parametrize("value", [0, -1, "4", 2.5, None, True])
def test_a_stream_waiter_cap_that_is_not_a_positive_integer_is_check_e034(settings, value):
    """STREAM_LONG_POLL_MAX_WAITERS bounds the waiting stream requests: a positive int only."""
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "STREAM_LONG_POLL_MAX_WAITERS": value}
    errors = [e for e in check_settings(None) if e.id == "rindle.E034"]
    assert len(errors) == 1 and repr(value) in errors[0].msg
    settings.RINDLE = {**settings.RINDLE, "STREAM_LONG_POLL_MAX_WAITERS": 16}
    assert "rindle.E034" not in [e.id for e in check_settings(None)]


@pytest.mark.parametrize(
    "value",
    [
        "rest_framework.permissions.IsAuthenticated",  # a string, not a list
        ["rest_framework.permissions.NoSuchClass"],
        ["rindle_app.conf.DEFAULTS"],  # imports, but is no permission class
        [object],
    ],
)
def test_a_bad_mutator_permission_classes_setting_is_e038(value):
    rindle = {**settings.RINDLE, "MUTATOR_PERMISSION_CLASSES": value}
    assert "rindle.E038" in check_ids(RINDLE=rindle)


def test_drf_permission_classes_pass_e038():
    from rest_framework.permissions import IsAdminUser

    value = ["rest_framework.permissions.IsAuthenticated", IsAdminUser]
    rindle = {**settings.RINDLE, "MUTATOR_PERMISSION_CLASSES": value}
    assert "rindle.E038" not in check_ids(RINDLE=rindle)


@pytest.mark.parametrize("value", [0, -1, "4096", True, 1.5])
def test_a_bad_result_cap_is_e039(value):
    rindle = {**settings.RINDLE, "MAX_MUTATION_RESULT_BYTES": value}
    assert "rindle.E039" in check_ids(RINDLE=rindle)
    assert "rindle.E039" not in check_ids(RINDLE={**rindle, "MAX_MUTATION_RESULT_BYTES": 1})


def test_a_mutator_with_a_non_permission_class_is_refused_at_registration():
    from django.core.exceptions import ImproperlyConfigured

    from rindle_app.mutators import mutator

    with pytest.raises(ImproperlyConfigured, match="not a permission class"):
        mutator("t_badPermissions", permission_classes=[object])


def test_a_synced_decimal_field_a_double_cannot_hold_is_a_warning(monkeypatch):
    """A synced DecimalField of more than 15 digits travels inexactly (rindle.W003)."""
    from django.db import models
    from django.test.utils import isolate_apps

    from rindle_app.engine import registry

    with isolate_apps("project.demo"):

        class Ledger(models.Model):
            exact = models.DecimalField(max_digits=15, decimal_places=2)
            wide = models.DecimalField(max_digits=20, decimal_places=2)

            class Meta:
                app_label = "demo"

    monkeypatch.setattr(registry, "synced_models", lambda: [Ledger])
    found = [m for m in check_settings(None) if m.id == "rindle.W003"]
    assert [m.obj.name for m in found] == ["wide"]
    assert "max_digits=20" in found[0].msg


def test_the_rooms_plane_without_the_ingest_plane_is_refused_at_start():
    """A room boot would name /apply-row-change-txn, which nothing serves (rindle.E041)."""
    assert "rindle.E041" in check_ids(ROOT_URLCONF="tests.api.rooms_only_urls")
    assert "rindle.E041" not in check_ids(ROOT_URLCONF="tests.api.prefixed_urls")
    assert "rindle.E041" not in check_ids()
