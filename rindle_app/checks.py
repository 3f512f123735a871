"""System checks for rindle's configuration (ids ``rindle.E001``...)."""

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.utils.module_loading import import_string

from .conf import DEFAULTS


@register()
def check_settings(app_configs, **kwargs):
    errors = []
    user = getattr(settings, "RINDLE", {})
    if not isinstance(user, dict):
        return [Error("settings.RINDLE must be a dict.", id="rindle.E008")]
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            Warning(
                f"Unknown key {key!r} in settings.RINDLE.",
                hint=f"Known keys: {', '.join(sorted(DEFAULTS))}.",
                id="rindle.W001",
            )
        )
    alias = user.get("DATABASE", DEFAULTS["DATABASE"])
    db = settings.DATABASES.get(alias) if isinstance(alias, str) else None
    if db is None:
        errors.append(
            Error(
                f"RINDLE['DATABASE'] names {alias!r}, which is not in DATABASES.", id="rindle.E001"
            )
        )
    else:
        errors.extend(_check_database(alias, db))
    # No channel layer is required (there was a check rindle.E005 that said so): the
    # hub hands frames to its own process's sockets, and processes share every change
    # through the database's outbox, never through Channels.
    synced_errors = _check_synced_models(user.get("SYNCED_MODELS", []))
    errors.extend(synced_errors or _check_decimal_precision())
    errors.extend(_check_adapter(user.get("ADAPTER", DEFAULTS["ADAPTER"])))
    errors.extend(_check_metrics_auth(user.get("METRICS_AUTH")))
    errors.extend(_check_retention())
    errors.extend(_check_store_rows(user.get("STORE_MAX_ROWS", DEFAULTS["STORE_MAX_ROWS"])))
    errors.extend(_check_wake())
    errors.extend(_check_watermarker())
    errors.extend(_check_stream_waiters())
    errors.extend(_check_daemon_pins())
    errors.extend(_check_url_planes())
    errors.extend(_check_room_profiles())
    errors.extend(_check_room_pending(user.get("ROOM_MAX_PENDING", DEFAULTS["ROOM_MAX_PENDING"])))
    errors.extend(_check_mutator_permissions(user.get("MUTATOR_PERMISSION_CLASSES", [])))
    errors.extend(
        _check_result_cap(
            user.get("MAX_MUTATION_RESULT_BYTES", DEFAULTS["MAX_MUTATION_RESULT_BYTES"])
        )
    )
    return errors


def _check_mutator_permissions(value):
    from .engine.mutations import permission_problem

    if not isinstance(value, (list, tuple)):
        problem = f"it is a {type(value).__name__}, not a list"
    else:
        problem = next(filter(None, (permission_problem(entry) for entry in value)), None)
    if problem is None:
        return []
    return [
        Error(
            f"RINDLE['MUTATOR_PERMISSION_CLASSES'] is refused: {problem}.",
            hint="A list of DRF permission classes (or their dotted paths), each with "
            "has_permission(request, view); empty lets every mutator run.",
            id="rindle.E038",
        )
    ]


def _check_result_cap(value):
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return []
    return [
        Error(
            f"RINDLE['MAX_MUTATION_RESULT_BYTES'] must be a positive integer, not {value!r}.",
            hint="It caps the JSON of a mutator's return value sent back as `result`.",
            id="rindle.E039",
        )
    ]


def _check_room_profiles():
    from .conf import rindle_settings
    from .rooms import profile_problems, settings_problem

    problem = settings_problem(rindle_settings)
    refused = (
        []
        if problem is None
        else [
            Error(
                f"RINDLE['ROOM*'] is refused: {problem}.",
                hint="ROOM_SESSION_TTL and ROOM_SESSION_GRACE time the doorbell's occupancy "
                "rows (300 and 120 s), ROOM_FLUSH_INTERVAL a room's flushes (0.05 s), "
                "ROOM_MIN_SESSIONS the sessions that make a room (2).",
                id="rindle.E036",
            )
        ]
    )
    return refused + [
        Error(
            problem,
            hint="A labelled query names a registered room_profile; a footprint is unwindowed "
            "(no limit, start or one anywhere) and its context tables are among its tables.",
            id="rindle.E035",
        )
        for problem in profile_problems()
    ]


def _check_room_pending(value):
    if type(value) is int and value >= 1:
        return []
    return [
        Error(
            f"RINDLE['ROOM_MAX_PENDING'] must be a positive integer, not {value!r}.",
            hint="It bounds the mutations a room host holds unflushed (1000 by default); at "
            "the cap the host flushes first and refuses with room_busy if it cannot.",
            id="rindle.E037",
        )
    ]


def _check_url_planes():
    from django.urls import NoReverseMatch, reverse

    def mounted(name):
        try:
            reverse(name)
        except NoReverseMatch:
            return False
        return True

    try:
        rooms, ingest = mounted("rindle-room-boot"), mounted("rindle-apply-txn")
    except Exception:  # no URLconf to read: Django's own URL checks report it
        return []
    if not rooms or ingest:
        return []
    return [
        Error(
            "The rooms URLconf plane is mounted without the ingest plane.",
            hint="A room's flushes go through /apply-row-change-txn, which "
            "rindle_app.urls.ingest serves: include it beside rindle_app.urls.rooms "
            "(/api/rindle/room-boot answers 501 plane_not_mounted without it).",
            id="rindle.E041",
        )
    ]


def _check_daemon_pins():
    from .conf import rindle_settings
    from .daemon import settings_problem

    problem = settings_problem(rindle_settings)
    if problem is None:
        return []
    return [
        Error(
            f"RINDLE['DAEMON_MAX_PINS'] is refused: {problem}.",
            hint="It bounds the pinned materializations (POST /materialize with policy "
            "{kind: pinned}) one process keeps warm (64 by default); past it a new pin is "
            "409 too_many_pins.",
            id="rindle.E040",
        )
    ]


def _check_stream_waiters():
    from .conf import rindle_settings
    from .stream.bell import settings_problem

    problem = settings_problem(rindle_settings)
    if problem is None:
        return []
    return [
        Error(
            f"RINDLE['STREAM_LONG_POLL_MAX_WAITERS'] is refused: {problem}.",
            hint="It bounds the GET /v1/stream long-polls and event streams waiting at once "
            "in one process (4 by default); past it they are 503 stream_busy.",
            id="rindle.E034",
        )
    ]


def _check_watermarker():
    from .conf import rindle_settings
    from .stream.watermark import settings_problem

    problem = settings_problem(rindle_settings)
    if problem is None:
        return []
    return [
        Error(
            f"RINDLE['STREAM_WATERMARKER'] is refused: {problem}.",
            hint='"embedded" (the default: the serving process holding the lease runs it) or '
            '"external" (only `manage.py rindle_watermark` runs it); the runtime refuses to '
            "start with anything else.",
            id="rindle.E033",
        )
    ]


def _check_store_rows(value):
    if type(value) is int and value >= 1:
        return []
    return [
        Error(
            f"RINDLE['STORE_MAX_ROWS'] must be a positive integer, not {value!r}.",
            hint="It bounds the rows the live queries' store keeps per process (200000 by "
            "default); past it the partitions read least recently are read again on demand.",
            id="rindle.E032",
        )
    ]


def _check_wake():
    from .conf import rindle_settings
    from .stream.wake import settings_problem

    problem = settings_problem(rindle_settings)
    if problem is None:
        return []
    return [
        Error(
            f"RINDLE['SQLITE_WAKE'] or RINDLE['WAKE_POLL_INTERVAL'] is refused: {problem}.",
            hint='SQLITE_WAKE is "inotify" (the default) or "poll"; WAKE_POLL_INTERVAL is a '
            "positive number of seconds.",
            id="rindle.E031",
        )
    ]


def _check_retention():
    from .conf import rindle_settings
    from .stream.retention import settings_problem

    problem = settings_problem(rindle_settings)
    if problem is None:
        return []
    return [
        Error(
            f"RINDLE['STREAM_RETENTION_*'] is refused: {problem}.",
            hint="STREAM_RETENTION_SECONDS is at least 604800 (7 days); the period and the "
            "batch size are positive.",
            id="rindle.E030",
        )
    ]


def _check_metrics_auth(auth):
    from .metrics import metrics_auth_problem

    problem = metrics_auth_problem(auth)
    if problem is None:
        return []
    return [
        Error(
            f"RINDLE['METRICS_AUTH'] is malformed: {problem}; /metrics admits nobody.",
            hint='e.g. {"TOKEN": os.environ["METRICS_TOKEN"], "ADDRESSES": ["10.0.0.0/8"]}.',
            id="rindle.E011",
        )
    ]


def _check_synced_models(labels):
    if not isinstance(labels, (list, tuple)):
        return [
            Error(
                f"RINDLE['SYNCED_MODELS'] must be a list of 'app_label.ModelName', not {labels!r}.",
                id="rindle.E006",
            )
        ]
    errors = []
    for label in labels:
        try:
            if not isinstance(label, str):
                raise TypeError(label)
            apps.get_model(label)
        except (LookupError, ValueError, TypeError):
            errors.append(
                Error(
                    f"RINDLE['SYNCED_MODELS'] names an unknown model {label!r}.",
                    hint="Use 'app_label.ModelName' of an installed app.",
                    id="rindle.E006",
                )
            )
    return errors


def _check_decimal_precision():
    """
    A synced DecimalField travels as a JSON number: a double holds 15 digits exactly.
    Run only once the synced models' labels passed rindle.E006.
    """
    from .engine.registry import synced_models

    return [
        Warning(
            f"{model._meta.label}.{field.name} is a synced DecimalField with max_digits="
            f"{field.max_digits}; the wire carries it as a JSON number, exact to 15 digits.",
            hint="Lower max_digits to 15 or less, or store the value as text or an integer "
            "of the smallest unit (cents).",
            obj=field,
            id="rindle.W003",
        )
        for model in synced_models()
        for field in model._meta.concrete_fields
        if field.get_internal_type() == "DecimalField" and (field.max_digits or 0) > 15
    ]


def _check_adapter(adapter):
    from .adapter import RindleAdapter

    if isinstance(adapter, str):
        try:
            adapter = import_string(adapter)
        except ImportError as exc:
            return [Error(f"RINDLE['ADAPTER'] cannot be imported: {exc}", id="rindle.E007")]
    if not (isinstance(adapter, type) and issubclass(adapter, RindleAdapter)):
        return [
            Error(
                f"RINDLE['ADAPTER'] must be a RindleAdapter subclass, not {adapter!r}.",
                id="rindle.E007",
            )
        ]
    return []


def _check_database(alias, db):
    engine = db.get("ENGINE", "")
    if engine.endswith(("postgresql", "postgis")):
        return []
    if not engine.endswith(("sqlite3", "spatialite")):
        return [
            Error(
                f"Database {alias!r} uses {engine}; rindle supports SQLite and PostgreSQL.",
                id="rindle.E002",
            )
        ]
    errors = []
    name = str(db.get("NAME", ""))
    if name == ":memory:" or "mode=memory" in name or name.startswith("file::memory:"):
        errors.append(
            Error(
                f"Database {alias!r} is an in-memory SQLite database.",
                hint="The engine writes from its own thread; use a file.",
                id="rindle.E003",
            )
        )
    options = db.get("OPTIONS") or {}
    init = str(options.get("init_command", "")).replace(" ", "").lower()
    if "journal_mode=wal" not in init:
        errors.append(
            Error(
                f"SQLite database {alias!r} is not configured for WAL.",
                hint="Add 'init_command': 'PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL' "
                "to its OPTIONS.",
                id="rindle.E004",
            )
        )
    if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
        errors.append(
            Warning(
                f"SQLite database {alias!r} starts transactions DEFERRED.",
                hint="Set 'transaction_mode': 'IMMEDIATE' in its OPTIONS so concurrent "
                "writers wait for the lock instead of failing with 'database is locked'.",
                id="rindle.W002",
            )
        )
    return errors


@register()
def check_allowed_hosts(app_configs, **kwargs):
    # The websocket origin check trusts the hosts ALLOWED_HOSTS names: "*" would let
    # any site's page open a websocket with its visitors' session cookies.
    if settings.DEBUG or "*" not in (getattr(settings, "ALLOWED_HOSTS", None) or ()):
        return []
    return [
        Error(
            'ALLOWED_HOSTS contains "*" while DEBUG is False.',
            hint="rindle validates websocket origins against ALLOWED_HOSTS; list the "
            "site's host names instead.",
            id="rindle.E009",
        )
    ]


# Keys published in rindle's own sources at some point: public, so never secret.
PUBLIC_SECRET_KEYS = frozenset({"insecure-development-key-change-me-in-production-0123456789"})


def weak_secret_key(key):
    """Why ``key`` cannot sign anything outside DEBUG, or None for a usable key."""
    if not isinstance(key, (str, bytes)) or not key:
        return "it is empty"
    text = key.decode("latin-1") if isinstance(key, bytes) else key
    if text in PUBLIC_SECRET_KEYS or text.startswith("django-insecure-"):
        return "it is a published development key"
    # Django's own bar for a deployment key (security.W009).
    if len(text) < 50 or len(set(text)) < 5:
        return "it is shorter than 50 characters or has fewer than 5 distinct ones"
    return None


@register()
def check_secret_key(app_configs, **kwargs):
    # Anyone who knows the key forges sessions and lease tokens for any user, so a
    # public or weak key is an error whenever DEBUG is off, not only under --deploy.
    if settings.DEBUG:
        return []
    try:
        keys = [("SECRET_KEY", settings.SECRET_KEY)]
    except ImproperlyConfigured:  # Django refuses to hand out an empty key
        keys = [("SECRET_KEY", "")]
    keys += [("SECRET_KEY_FALLBACKS", k) for k in getattr(settings, "SECRET_KEY_FALLBACKS", ())]
    errors = []
    for name, key in keys:
        problem = weak_secret_key(key)
        if problem is not None:
            errors.append(
                Error(
                    f"{name} cannot be used while DEBUG is False: {problem}, so anyone can "
                    "forge sessions and lease tokens.",
                    hint="Set DJANGO_SECRET_KEY to at least 50 random characters, e.g. "
                    "python -c 'import secrets; print(secrets.token_urlsafe(50))'.",
                    id="rindle.E010",
                )
            )
    return errors


@register(Tags.database)
def check_sql_sandbox(app_configs, databases=None, **kwargs):
    # Public SQL on PostgreSQL is only as safe as the role it runs as. A database
    # check: it runs with migrate and `check --database`, once rindle is migrated.
    from .conf import rindle_settings
    from .engine.capture import OUTBOX
    from .engine.public_sql import sandbox

    alias = rindle_settings.DATABASE
    if not databases or alias not in databases or not rindle_settings.SQL_ENABLED:
        return []
    if alias not in settings.DATABASES or connections[alias].vendor != "postgresql":
        return []
    try:
        if OUTBOX not in connections[alias].introspection.table_names():
            return []  # not migrated yet: migrate creates the role after
        problem = sandbox.status(alias)
    except DatabaseError:
        return []
    if problem is None:
        return []
    return [
        Error(
            f"Public SQL is enabled but its sandbox role is not usable: {problem}.",
            hint="Run `manage.py rindle_sql_role` (it prints the SQL a superuser must run), "
            "or set RINDLE['SQL_ENABLED'] = False.",
            id="rindle.E020",
        )
    ]
