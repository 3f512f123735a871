"""
Client mutations, applied exactly once per (client_id, mid).

The lmid rule: ``mid <= lmid`` is absorbed (success, no effects); ``mid > lmid + 1``
is refused with the stored lmid; ``mid == lmid + 1`` runs the mutator in the
writer transaction with the lmid upsert in the SAME transaction. A business
rejection (the mutator raises, its args are invalid, the name is unknown, the user
is not authorized, a deterministic integrity error) rolls the effects back and
STILL advances the lmid, so the client's queue never wedges. A database failure
advances nothing and is retryable.

The owner rule: a client id belongs to the first principal that writes under it
(``principal_key``: a token, a user, or an anonymous client's session). The owner
is stored with the lmid row and checked where the lmid is read, inside the writer
transaction (on Postgres under the per-client advisory lock), so two principals
racing on a fresh id leave exactly one owner. Any other principal is refused with
``client_id_taken`` before the lmid is looked at: nothing is read back or written.
A row without an owner (written before owners existed, or by trusted server code
that passes none) is claimed by the next principal that writes under it.
"""

import hashlib
import json
import logging
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DatabaseError, DataError, IntegrityError, connections
from django.utils.module_loading import import_string

from ..adapter import get_adapter
from ..conf import rindle_settings
from ..exceptions import (
    ARGS_TOO_LARGE,
    DATA_ERROR,
    INTEGRITY_ERROR,
    INVALID_ARGS,
    INVALID_CLIENT_ID,
    INVALID_MID,
    INVALID_NAME,
    MUTATION_RESULT_INVALID,
    MUTATOR_ERROR,
    PERMISSION_DENIED,
    UNAUTHORIZED,
    UNKNOWN_MUTATOR,
    MutationRejected,
    QueryError,
    QueryRefused,
)
from . import capture
from .errors import ClientIdTaken, InvalidInput, MutationGap, RindleError, Unavailable
from .writer import is_infrastructure_error

logger = logging.getLogger("rindle.engine")

LEDGER = "_rindle_client_mutations"
# The ledger column naming a client id's owner: filtered on, never sent to a client.
OWNER_COLUMN = "owner"
MAX_CLIENT_ID_LENGTH = 255
# What ``_rindle_lock_lmid`` answers for a client id another principal owns.
_TAKEN = -1


@dataclass(frozen=True)
class Mutator:
    name: str
    fn: object
    args: object = None  # a DRF Serializer class, a callable, or None
    # DRF-style permission classes; None: RINDLE["MUTATOR_PERMISSION_CLASSES"].
    permission_classes: tuple = None

    def validate(self, args):
        spec = self.args
        if spec is None:
            return args
        if hasattr(spec, "is_valid") or _is_serializer_class(spec):
            serializer = spec(data=args)
            if not serializer.is_valid():
                raise invalid_args(serializer.errors)
            return serializer.validated_data
        try:
            return spec(args)
        except DjangoValidationError as exc:
            raise invalid_args(django_field_errors(exc)) from exc
        except (ValueError, TypeError) as exc:
            raise MutationRejected(str(exc), INVALID_ARGS) from exc

    def get_permissions(self):
        classes = self.permission_classes
        if classes is None:
            classes = rindle_settings.MUTATOR_PERMISSION_CLASSES
        return [(import_string(c) if isinstance(c, str) else c)() for c in dict.fromkeys(classes)]


def permission_problem(entry):
    """Why ``entry`` is not a permission class (or its dotted path); None if it is one."""
    if isinstance(entry, str):
        try:
            entry = import_string(entry)
        except ImportError as exc:
            return f"{entry!r} cannot be imported: {exc}"
    if not (isinstance(entry, type) and callable(getattr(entry, "has_permission", None))):
        return f"{entry!r} is not a permission class with has_permission(request, view)"
    return None


def invalid_args(field_errors):
    """The ``invalid_args`` rejection of DRF-shaped ``field_errors`` (``{field: [msg]}``)."""
    details = _plain(field_errors)
    return MutationRejected(
        f"invalid arguments: {flatten_errors(details)}", INVALID_ARGS, details=details
    )


def django_field_errors(exc):
    """A Django ``ValidationError`` as DRF's field errors (non-field ones under DRF's key)."""
    if hasattr(exc, "error_dict"):
        return {field: list(messages) for field, messages in exc.message_dict.items()}
    return {_non_field_key(): list(exc.messages)}


def _non_field_key():
    try:
        from rest_framework.settings import api_settings
    except ImportError:  # pragma: no cover
        return "non_field_errors"
    return api_settings.NON_FIELD_ERRORS_KEY


def _plain(detail):
    """DRF's ``ErrorDetail`` tree as plain JSON: dicts, lists and strings."""
    if isinstance(detail, dict):
        return {str(k): _plain(v) for k, v in detail.items()}
    if isinstance(detail, (list, tuple)):
        return [_plain(v) for v in detail]
    return str(detail)


def flatten_errors(detail, path=""):
    """DRF-shaped field errors in one line: ``envelope.mid: A valid integer is required.``"""
    if isinstance(detail, dict):
        return "; ".join(
            flatten_errors(v, f"{path}.{k}" if path else str(k)) for k, v in detail.items()
        )
    if isinstance(detail, list):
        if all(not isinstance(d, (dict, list)) for d in detail):
            text = " ".join(str(d) for d in detail)
            return f"{path}: {text}" if path else text
        return "; ".join(flatten_errors(d, f"{path}[{i}]") for i, d in enumerate(detail) if d)
    return f"{path}: {detail}" if path else str(detail)


def _is_serializer_class(spec):
    try:
        from rest_framework.serializers import BaseSerializer
    except ImportError:  # pragma: no cover
        return False
    return isinstance(spec, type) and issubclass(spec, BaseSerializer)


_registry = {}


def mutator(name=None, *, args=None, permission_classes=None):
    """
    Register ``fn(tx, args, user)`` as the mutator ``name`` (default: its __name__).

    ``args`` validates the client's arguments: a DRF ``Serializer`` class (its
    ``validated_data`` is passed on) or a callable returning the validated value;
    invalid arguments are an ``invalid_args`` rejection whose ``details`` are the
    field errors.

    ``permission_classes``: DRF permission classes (or dotted paths), each asked
    ``has_permission(request, view)`` before the arguments are validated, on every
    transport; a refusal is a ``permission_denied`` rejection (the mid is consumed,
    nothing is written). ``request`` has ``.user``, ``.auth`` (the bearer token, or
    None) and ``.method`` ("POST"): over HTTP it is DRF's request itself; ``view``
    is a ``MutationView`` (``.mutator``, the name; ``.args``, the raw arguments;
    ``.required_scope``, "mutate"). None (the default) takes
    ``RINDLE["MUTATOR_PERMISSION_CLASSES"]`` (none by default: everyone may).

    The mutator's return value, if not None, travels back in the HTTP mutate
    outcome as ``result``: JSON of at most ``MAX_MUTATION_RESULT_BYTES``, or the
    mutation is rejected with ``mutation_result_invalid``.
    """
    if permission_classes is not None:
        permission_classes = tuple(permission_classes)
        for entry in permission_classes:
            problem = None if isinstance(entry, str) else permission_problem(entry)
            if problem is not None:
                raise ImproperlyConfigured(f"mutator {name!r}: permission_classes: {problem}")

    def register(fn):
        key = name or fn.__name__
        existing = _registry.get(key)
        if existing is not None and existing.fn is not fn:
            raise ImproperlyConfigured(f"mutator {key!r} is registered twice")
        _registry[key] = Mutator(key, fn, args, permission_classes)
        return fn

    return register


def get_mutator(name):
    return _registry.get(name)


def registered_mutators():
    return dict(_registry)


@dataclass(frozen=True)
class MutationResult:
    """
    The outcome of one envelope. ``status``: applied | absorbed | rejected;
    ``details``: a rejection's JSON-able dict (``MutationRejected.details``);
    ``result``: an applied mutator's return value (None when it returned nothing).
    """

    status: str
    lmid: int
    cv: int
    code: str = None
    reason: str = None
    details: dict = None
    result: object = None

    @property
    def accepted(self):
        return self.status != "rejected"


@dataclass(frozen=True)
class _Plan:
    mutator: Mutator = None
    args: object = None
    code: str = None
    reason: str = None
    details: dict = None


@dataclass(frozen=True)
class MutationRequest:
    """
    What a mutator's permission classes get as ``request`` off HTTP (the websocket,
    server code): ``user``, ``auth`` (the bearer token, or None), ``method`` "POST".
    """

    user: object = None
    auth: object = None
    method: str = "POST"


@dataclass(frozen=True)
class MutationView:
    """What a mutator's permission classes get as ``view``."""

    mutator: str
    args: object
    required_scope: str = "mutate"


def principal_key(user=None, token=None, session_key=None):
    """
    The owner a client id is bound to, revealing nothing: ``t:<pk>`` for a bearer
    token, ``u:<pk>`` for a signed-in user, ``s:<sha256 of the session key>`` for an
    anonymous client with a Django session, and ``anonymous`` for one without (every
    such client shares it: give anonymous browsers a session to bind their ids).
    """
    if token is not None:
        return f"t:{token.pk}"
    if user is not None and getattr(user, "is_authenticated", False):
        return f"u:{user.pk}"
    if session_key:
        return "s:" + hashlib.sha256(session_key.encode()).hexdigest()
    return "anonymous"


def validate_envelope(client_id, mid, name, args):
    """Refuse a malformed envelope before anything is written."""
    if not isinstance(client_id, str) or not client_id or len(client_id) > MAX_CLIENT_ID_LENGTH:
        raise InvalidInput(
            f"clientID must be a non-empty string of at most {MAX_CLIENT_ID_LENGTH} characters",
            code=INVALID_CLIENT_ID,
        )
    if isinstance(mid, bool) or not isinstance(mid, int) or mid < 1:
        raise InvalidInput(f"mid must be a positive integer, got {mid!r}", code=INVALID_MID)
    if not isinstance(name, str) or not name:
        raise InvalidInput("name must be a non-empty string", code=INVALID_NAME)
    try:
        size = len(json.dumps(args, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"args are not JSON: {exc}", code=INVALID_ARGS) from None
    limit = int(rindle_settings.MAX_ARGS_BYTES)
    if size > limit:
        raise InvalidInput(f"args take {size} bytes; the limit is {limit}", code=ARGS_TOO_LARGE)


def _plan(name, args, user, request=None):
    m = get_mutator(name)
    if m is None:
        return _Plan(code=UNKNOWN_MUTATOR, reason=f"no mutator is registered as {name!r}")
    try:
        allowed = get_adapter().authorize_mutation(user, name, args)
    except PermissionDenied as exc:
        return _Plan(code=UNAUTHORIZED, reason=str(exc) or "not authorized")
    if allowed is False:
        return _Plan(code=UNAUTHORIZED, reason=f"not authorized to run {name!r}")
    refusal = _permission_refusal(m, args, user, request)
    if refusal is not None:
        return refusal
    try:
        return _Plan(mutator=m, args=m.validate(args))
    except MutationRejected as exc:
        return _Plan(code=exc.code, reason=exc.reason, details=exc.details)


def _permission_refusal(m, args, user, request):
    """The ``permission_denied`` plan if a permission class of ``m`` refuses, else None."""
    permissions = m.get_permissions()
    if not permissions:
        return None
    request = request if request is not None else MutationRequest(user=user)
    view = MutationView(m.name, args)
    for permission in permissions:
        try:
            allowed = permission.has_permission(request, view)
        except PermissionDenied as exc:  # DRF's PermissionDenied is an APIException
            allowed, message = False, str(exc)
        except Exception as exc:
            if _is_drf_permission_denied(exc):
                allowed, message = False, str(getattr(exc, "detail", exc))
            else:
                raise
        else:
            message = getattr(permission, "message", None)
        if not allowed:
            reason = str(message) if message else f"not permitted to run {m.name!r}"
            return _Plan(code=PERMISSION_DENIED, reason=reason)
    return None


def _is_drf_permission_denied(exc):
    try:
        from rest_framework.exceptions import NotAuthenticated
        from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (DRFPermissionDenied, NotAuthenticated))


def _drf_validation_error(exc):
    try:
        from rest_framework.exceptions import ValidationError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, ValidationError)


def validation_rejection(exc):
    """
    The ``invalid_args`` rejection (DRF's field errors as its details) of a Django or
    DRF ``ValidationError`` raised inside a mutator (say
    ``serializer.is_valid(raise_exception=True)``), or None for any other exception.
    """
    if isinstance(exc, DjangoValidationError):
        return invalid_args(django_field_errors(exc))
    if _drf_validation_error(exc):
        detail = exc.detail if isinstance(exc.detail, dict) else {_non_field_key(): exc.detail}
        return invalid_args(detail)
    return None


def classify(exc):
    """(code, reason, details) of a business rejection raised inside a mutator."""
    if isinstance(exc, MutationRejected):
        return exc.code, exc.reason, exc.details
    if isinstance(exc, PermissionDenied):
        return UNAUTHORIZED, str(exc) or "not authorized", None
    if isinstance(exc, RindleError) and not isinstance(exc, (QueryError, QueryRefused)):
        return exc.code, exc.message, None  # (a query a mutator built wrong is its bug, below)
    if isinstance(exc, IntegrityError):
        return INTEGRITY_ERROR, str(exc), None
    if isinstance(exc, DataError):
        return DATA_ERROR, str(exc), None
    rejection = validation_rejection(exc)
    if rejection is not None:
        return rejection.code, rejection.reason, rejection.details
    # Not a business rule: a bug in the mutator. The client gets a rejection; the
    # operator gets the traceback.
    logger.error("rindle: a mutator raised %s", type(exc).__name__, exc_info=exc)
    return MUTATOR_ERROR, f"{type(exc).__name__}: {exc}", None


def _checked_result(value):
    """A mutator's return value as JSON-able, within ``MAX_MUTATION_RESULT_BYTES``."""
    if value is None:
        return None
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise MutationRejected(
            f"the mutator returned a value that is not JSON: {exc}", MUTATION_RESULT_INVALID
        ) from None
    limit = int(rindle_settings.MAX_MUTATION_RESULT_BYTES)
    size = len(text.encode())
    if size > limit:
        raise MutationRejected(
            f"the mutator's result takes {size} bytes; MAX_MUTATION_RESULT_BYTES is {limit}",
            MUTATION_RESULT_INVALID,
        )
    return json.loads(text)


# On Postgres, engines of several processes may share the ledger: the read takes a
# per-client advisory lock first, and both helpers save a round trip each. A
# VOLATILE function's statements each take a fresh snapshot, so the read after the
# lock sees the latest committed lmid (and owner) even under READ COMMITTED. The
# owner check rides in the same call: a NULL ``principal`` is trusted server code.
# The one-argument helpers of earlier versions are left for processes still running
# them during a rolling upgrade (their rows have no owner: claimable).
PG_LEDGER_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION _rindle_lock_lmid(client text, principal text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    stored_lmid bigint;
    stored_owner text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(client, 0));
    SELECT last_mutation_id, {OWNER_COLUMN} INTO stored_lmid, stored_owner
      FROM {LEDGER} WHERE client_id = client;
    IF principal IS NOT NULL AND stored_owner IS NOT NULL AND stored_owner <> principal THEN
        RETURN {_TAKEN};
    END IF;
    RETURN COALESCE(stored_lmid, 0);
END $$;
CREATE OR REPLACE FUNCTION _rindle_store_lmid(client text, mid bigint, principal text)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {LEDGER} AS l (client_id, last_mutation_id, {OWNER_COLUMN})
    VALUES (client, mid, principal)
    ON CONFLICT (client_id) DO UPDATE SET last_mutation_id = excluded.last_mutation_id,
        {OWNER_COLUMN} = COALESCE(l.{OWNER_COLUMN}, excluded.{OWNER_COLUMN});
    -- The ledger is captured: its outbox row is this transaction's last.
    RETURN currval(pg_get_serial_sequence('_rindle_change_events', 'seq'));
END $$;
"""

# The lmid upsert; an owner, once set, is never replaced (the read checked it).
_STORE_SQL = (
    f"INSERT INTO {LEDGER} AS l (client_id, last_mutation_id, {OWNER_COLUMN}) "
    "VALUES (%s, %s, %s) ON CONFLICT (client_id) DO UPDATE SET "
    f"last_mutation_id = excluded.last_mutation_id, "
    f"{OWNER_COLUMN} = COALESCE(l.{OWNER_COLUMN}, excluded.{OWNER_COLUMN})"
)


def install_ledger_functions(tx):
    """Create (or refresh) the Postgres helpers of the ledger; nothing on SQLite."""
    if tx.vendor == "postgresql":
        # Processes starting together would replace the functions concurrently.
        tx.scalar("SELECT pg_advisory_xact_lock(%s)", [capture.INSTALL_KEY])
        tx.execute(PG_LEDGER_FUNCTIONS)


def _read_lmid(tx, client_id, owner):
    """The stored lmid (0 if new); raises ``ClientIdTaken`` if another principal owns it."""
    if tx.vendor == "postgresql":
        lmid = tx.scalar("SELECT _rindle_lock_lmid(%s, %s)", [client_id, owner])
    else:
        row = tx.fetchone(
            f"SELECT last_mutation_id, {OWNER_COLUMN} FROM {LEDGER} WHERE client_id = %s",
            [client_id],
        )
        lmid = 0
        if row is not None:
            lmid = _TAKEN if owner is not None and row[1] not in (None, owner) else row[0]
    if lmid == _TAKEN:
        raise ClientIdTaken(client_id)
    return lmid


def _store_lmid(tx, client_id, mid, owner):
    if tx.vendor == "postgresql":
        tx.cv = tx.scalar("SELECT _rindle_store_lmid(%s, %s, %s)", [client_id, mid, owner])
        return
    tx.run(_STORE_SQL, [client_id, mid, owner])


def _apply(tx, client_id, mid, plan, user, owner):
    lmid = _read_lmid(tx, client_id, owner)
    if mid <= lmid:
        return "absorbed", lmid, None, None, None, None
    if mid > lmid + 1:
        raise MutationGap(client_id, mid, lmid)
    code, reason, details, result = plan.code, plan.reason, plan.details, None
    if code is None and tx.solo:
        # Alone in its transaction, a failing mutator sinks the transaction and the
        # engine's fallback records the rejection in an lmid-only commit instead:
        # the common, successful path pays for no savepoint.
        result = _checked_result(plan.mutator.fn(tx, plan.args, user))
    elif code is None:
        try:
            with tx.savepoint():
                result = _checked_result(plan.mutator.fn(tx, plan.args, user))
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise
            code, reason, details = classify(exc)
    _store_lmid(tx, client_id, mid, owner)
    return ("applied" if code is None else "rejected"), mid, code, reason, details, result


def mutate(engine, client_id, mid, name, args, user=None, *, owner=None, request=None):
    """
    Apply one client mutation through ``engine``; return a ``MutationResult``.
    ``owner`` is the caller's ``principal_key`` (``None``: trusted server code, which
    neither checks nor claims the id). ``request`` is what the mutator's permission
    classes are asked about (``MutationRequest(user)`` when None).
    """
    validate_envelope(client_id, mid, name, args)
    plan = _plan(name, args, user, request)

    def record_rejection(exc):
        # The mutator raised, or its effects broke the commit (a deferred
        # constraint): its transaction is gone, so record the rejection alone.
        if isinstance(exc, (MutationGap, ClientIdTaken)) or is_infrastructure_error(exc):
            return None
        code, reason, details = classify(exc)
        rejected = _Plan(code=code, reason=reason, details=details)
        return lambda tx: _apply(tx, client_id, mid, rejected, user, owner)

    commit = engine.write(
        lambda tx: _apply(tx, client_id, mid, plan, user, owner), record_rejection
    )
    status, lmid, code, reason, details, result = commit.value
    return MutationResult(status, lmid, commit.cv, code, reason, details, result)


def client_lmid(using, client_id):
    """The stored lmid of ``client_id`` (0 if new), read from committed data."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT last_mutation_id FROM {LEDGER} WHERE client_id = %s", [client_id])
        row = cursor.fetchone()
    return row[0] if row else 0


def check_owner(using, client_id, owner):
    """
    Raise ``ClientIdTaken`` if another principal than ``owner`` owns ``client_id``,
    from committed data; an unowned or new id passes (and is claimed by its first
    write). Only the owner is read.
    """
    try:
        with connections[using].cursor() as cursor:
            cursor.execute(f"SELECT {OWNER_COLUMN} FROM {LEDGER} WHERE client_id = %s", [client_id])
            row = cursor.fetchone()
    except DatabaseError as exc:
        raise Unavailable(f"the database is unavailable: {exc}") from exc
    if row is not None and row[0] is not None and row[0] != owner:
        raise ClientIdTaken(client_id)


def reject(engine, client_id, mid, reason=None, *, owner=None):
    """
    Record a business rejection decided outside the engine (the original's
    ``/reject-mutation``: its api-server ran the mutator and refused it): an
    lmid-only commit under the lmid rule, absorbed at or below the lmid, a gap
    above lmid + 1. Returns a ``MutationResult``.
    """
    validate_envelope(client_id, mid, "reject", None)
    plan = _Plan(code=MUTATOR_ERROR, reason=reason or "rejected")
    commit = engine.write(lambda tx: _apply(tx, client_id, mid, plan, None, owner))
    status, lmid, code, reason, details, _result = commit.value
    return MutationResult(status, lmid, commit.cv, code, reason, details)
