"""
Client mutations, applied exactly once per (client_id, mid).

The lmid rule: ``mid <= lmid`` is absorbed (success, no effects); ``mid > lmid + 1``
is refused with the stored lmid; ``mid == lmid + 1`` runs the mutator in the
writer transaction with the lmid upsert in the SAME transaction. A business
rejection (the mutator raises, its args are invalid, the name is unknown, the user
is not authorized, a deterministic integrity error) rolls the effects back and
STILL advances the lmid, so the client's queue never wedges. A database failure
advances nothing and is retryable.
"""

import json
import logging
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError, connections

from ..adapter import get_adapter
from ..conf import rindle_settings
from . import capture
from .errors import InvalidInput, MutationGap, RindleError
from .writer import is_infrastructure_error

logger = logging.getLogger("rindle.engine")

LEDGER = "_rindle_client_mutations"
MAX_CLIENT_ID_LENGTH = 255


class MutationRejected(Exception):
    """Raise from a mutator to reject the mutation with a reason (a business rejection)."""

    def __init__(self, reason, code="rejected"):
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True)
class Mutator:
    name: str
    fn: object
    args: object = None  # a DRF Serializer class, a callable, or None

    def validate(self, args):
        spec = self.args
        if spec is None:
            return args
        if hasattr(spec, "is_valid") or _is_serializer_class(spec):
            serializer = spec(data=args)
            if not serializer.is_valid():
                raise MutationRejected(json.dumps(serializer.errors, default=str), "invalid_args")
            return serializer.validated_data
        try:
            return spec(args)
        except (ValueError, TypeError, DjangoValidationError) as exc:
            raise MutationRejected(str(exc), "invalid_args") from exc


def _is_serializer_class(spec):
    try:
        from rest_framework.serializers import BaseSerializer
    except ImportError:  # pragma: no cover
        return False
    return isinstance(spec, type) and issubclass(spec, BaseSerializer)


_registry = {}


def mutator(name=None, *, args=None):
    """
    Register ``fn(tx, args, user)`` as the mutator ``name`` (default: its __name__).

    ``args`` validates the client's arguments: a DRF ``Serializer`` class (its
    ``validated_data`` is passed on) or a callable returning the validated value.
    """

    def register(fn):
        key = name or fn.__name__
        existing = _registry.get(key)
        if existing is not None and existing.fn is not fn:
            raise ImproperlyConfigured(f"mutator {key!r} is registered twice")
        _registry[key] = Mutator(key, fn, args)
        return fn

    return register


def get_mutator(name):
    return _registry.get(name)


def registered_mutators():
    return dict(_registry)


@dataclass(frozen=True)
class MutationResult:
    """The outcome of one envelope. ``status``: applied | absorbed | rejected."""

    status: str
    lmid: int
    cv: int
    code: str = None
    reason: str = None

    @property
    def accepted(self):
        return self.status != "rejected"


@dataclass(frozen=True)
class _Plan:
    mutator: Mutator = None
    args: object = None
    code: str = None
    reason: str = None


def validate_envelope(client_id, mid, name, args):
    """Refuse a malformed envelope before anything is written."""
    if not isinstance(client_id, str) or not client_id or len(client_id) > MAX_CLIENT_ID_LENGTH:
        raise InvalidInput(
            f"clientID must be a non-empty string of at most {MAX_CLIENT_ID_LENGTH} characters",
            code="invalid_client_id",
        )
    if isinstance(mid, bool) or not isinstance(mid, int) or mid < 1:
        raise InvalidInput(f"mid must be a positive integer, got {mid!r}", code="invalid_mid")
    if not isinstance(name, str) or not name:
        raise InvalidInput("name must be a non-empty string", code="invalid_name")
    try:
        size = len(json.dumps(args, separators=(",", ":"), allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"args are not JSON: {exc}", code="invalid_args") from None
    limit = int(rindle_settings.MAX_ARGS_BYTES)
    if size > limit:
        raise InvalidInput(f"args take {size} bytes; the limit is {limit}", code="args_too_large")


def _plan(name, args, user):
    m = get_mutator(name)
    if m is None:
        return _Plan(code="unknown_mutator", reason=f"no mutator is registered as {name!r}")
    try:
        allowed = get_adapter().authorize_mutation(user, name, args)
    except PermissionDenied as exc:
        return _Plan(code="unauthorized", reason=str(exc) or "not authorized")
    if allowed is False:
        return _Plan(code="unauthorized", reason=f"not authorized to run {name!r}")
    try:
        return _Plan(mutator=m, args=m.validate(args))
    except MutationRejected as exc:
        return _Plan(code=exc.code, reason=exc.reason)


def classify(exc):
    """(code, reason) of a business rejection raised inside a mutator."""
    if isinstance(exc, MutationRejected):
        return exc.code, exc.reason
    if isinstance(exc, PermissionDenied):
        return "unauthorized", str(exc) or "not authorized"
    if isinstance(exc, RindleError):
        return exc.code, exc.message
    if isinstance(exc, IntegrityError):
        return "integrity_error", str(exc)
    if isinstance(exc, DataError):
        return "data_error", str(exc)
    if isinstance(exc, DjangoValidationError):
        return "invalid_args", "; ".join(exc.messages)
    # Not a business rule: a bug in the mutator. The client gets a rejection; the
    # operator gets the traceback.
    logger.error("rindle: a mutator raised %s", type(exc).__name__, exc_info=exc)
    return "mutator_error", f"{type(exc).__name__}: {exc}"


# On Postgres, engines of several processes may share the ledger: the read takes a
# per-client advisory lock first, and both helpers save a round trip each. A
# VOLATILE function's statements each take a fresh snapshot, so the read after the
# lock sees the latest committed lmid even under READ COMMITTED.
PG_LEDGER_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION _rindle_lock_lmid(client text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(client, 0));
    RETURN COALESCE(
        (SELECT last_mutation_id FROM {LEDGER} WHERE client_id = client), 0);
END $$;
CREATE OR REPLACE FUNCTION _rindle_store_lmid(client text, mid bigint) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    INSERT INTO {LEDGER} (client_id, last_mutation_id) VALUES (client, mid)
    ON CONFLICT (client_id) DO UPDATE SET last_mutation_id = excluded.last_mutation_id;
    -- The ledger is captured: its outbox row is this transaction's last.
    RETURN currval(pg_get_serial_sequence('_rindle_change_events', 'seq'));
END $$;
"""


def install_ledger_functions(tx):
    """Create (or refresh) the Postgres helpers of the ledger; nothing on SQLite."""
    if tx.vendor == "postgresql":
        # Processes starting together would replace the functions concurrently.
        tx.scalar("SELECT pg_advisory_xact_lock({ph})", [capture.INSTALL_KEY])
        tx.execute(PG_LEDGER_FUNCTIONS)


def _read_lmid(tx, client_id):
    if tx.vendor == "postgresql":
        return tx.scalar("SELECT _rindle_lock_lmid({ph})", [client_id])
    lmid = tx.scalar(f"SELECT last_mutation_id FROM {LEDGER} WHERE client_id = {{ph}}", [client_id])
    return lmid or 0


def _store_lmid(tx, client_id, mid):
    if tx.vendor == "postgresql":
        tx.cv = tx.scalar("SELECT _rindle_store_lmid({ph}, {ph})", [client_id, mid])
        return
    tx.run(
        f"INSERT INTO {LEDGER} (client_id, last_mutation_id) VALUES ({{ph}}, {{ph}}) "
        "ON CONFLICT (client_id) DO UPDATE SET last_mutation_id = excluded.last_mutation_id",
        [client_id, mid],
    )


def _apply(tx, client_id, mid, plan, user):
    lmid = _read_lmid(tx, client_id)
    if mid <= lmid:
        return "absorbed", lmid, None, None
    if mid > lmid + 1:
        raise MutationGap(client_id, mid, lmid)
    code, reason = plan.code, plan.reason
    if code is None and tx.solo:
        # Alone in its transaction, a failing mutator sinks the transaction and the
        # engine's fallback records the rejection in an lmid-only commit instead:
        # the common, successful path pays for no savepoint.
        plan.mutator.fn(tx, plan.args, user)
    elif code is None:
        try:
            with tx.savepoint():
                plan.mutator.fn(tx, plan.args, user)
        except Exception as exc:
            if is_infrastructure_error(exc):
                raise
            code, reason = classify(exc)
    _store_lmid(tx, client_id, mid)
    return ("applied" if code is None else "rejected"), mid, code, reason


def mutate(engine, client_id, mid, name, args, user=None):
    """Apply one client mutation through ``engine``; return a ``MutationResult``."""
    validate_envelope(client_id, mid, name, args)
    plan = _plan(name, args, user)

    def record_rejection(exc):
        # The mutator raised, or its effects broke the commit (a deferred
        # constraint): its transaction is gone, so record the rejection alone.
        if isinstance(exc, MutationGap) or is_infrastructure_error(exc):
            return None
        code, reason = classify(exc)
        return lambda tx: _apply(tx, client_id, mid, _Plan(code=code, reason=reason), user)

    commit = engine.write(lambda tx: _apply(tx, client_id, mid, plan, user), record_rejection)
    status, lmid, code, reason = commit.value
    return MutationResult(status, lmid, commit.cv, code, reason)


def client_lmid(using, client_id):
    """The stored lmid of ``client_id`` (0 if new), read from committed data."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT last_mutation_id FROM {LEDGER} WHERE client_id = %s", [client_id])
        row = cursor.fetchone()
    return row[0] if row else 0
