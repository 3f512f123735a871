"""
Scoped bearer tokens for machine clients (scripts, CI jobs, other services).

A token reads ``rdl_<prefix>_<secret>``. It is shown once, when it is created; the
database keeps its prefix (to find it) and the SHA-256 of the whole token (to check
it). Each token carries scopes from a fixed set, and a request authenticated by a
token may only use the routes its scopes open; ``"admin"`` opens every route::

    raw, token = tokens.create(user, ["read", "mutate"], name="nightly import")
    user, token = tokens.authenticate(raw)  # or None

Browsers use the Django session instead, and are not scope-limited.
"""

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from .models import RindleToken

SCOPES = (
    "read",
    "mutate",
    "schema",
    "produce",
    "ingest",
    "sql",
    "migrate",
    "stream",
    "rooms",
    "daemon",
    "admin",
)
# read: named queries and leases; mutate: client mutations; schema: GET /schema;
# produce: foreign producer writes; ingest: change-source batches; sql: public SQL
# (writes limited to the token's ``tables``); migrate: the migrations journal;
# stream: GET /v1/stream, the public change stream (every table's changes); rooms:
# the room write authority (/claim-room-epoch, /room-lmids, and room flushes: a
# /apply-row-change-txn carrying a doc); daemon: the original daemon's control plane
# (/materialize, /execute-sql-txn, ... see docs/daemon.md), which also opens read,
# schema, ingest and rooms (``RindleToken.IMPLIED_SCOPES``); admin: every scope.
PREFIX_BYTES = 6  # 12 hex characters: looked up, never secret
SECRET_BYTES = 32  # 256 random bits
# last_used_at is advisory: write it at most this often, not on every request.
TOUCH_INTERVAL = timedelta(minutes=1)


def digest(raw):
    """
    The stored form of a token: its SHA-256, hex.

    A password needs a slow hash because it is guessable; a token is 256 random
    bits, so no dictionary helps and a brute force cannot finish whatever the hash
    costs. A fast hash is as safe here and keeps authentication off the CPU.
    """
    return hashlib.sha256(raw.encode()).hexdigest()


def split(raw):
    """The prefix of a well-formed token, else None."""
    if not isinstance(raw, str) or len(raw) > 200:
        return None
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != "rdl" or not parts[1] or not parts[2]:
        return None
    prefix = parts[1]
    if len(prefix) != PREFIX_BYTES * 2 or not all(c in "0123456789abcdef" for c in prefix):
        return None
    return prefix


def create(user, scopes, *, name="", expires_at=None, tables=()):
    """
    ``(raw, token)``: a new token of ``user`` with ``scopes``. ``raw`` is the only
    copy of the secret; hand it over and forget it. ``tables`` are the tables public
    SQL with the token may write (the ``sql`` scope).
    """
    scopes = list(dict.fromkeys(scopes))
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise ValueError(f"scopes must be a non-empty subset of {SCOPES}, got {scopes!r}")
    tables = list(dict.fromkeys(tables))
    if not all(isinstance(t, str) and t for t in tables):
        raise ValueError(f"tables must be non-empty names, got {tables!r}")
    for _attempt in range(5):
        prefix = secrets.token_hex(PREFIX_BYTES)
        raw = f"rdl_{prefix}_{secrets.token_urlsafe(SECRET_BYTES)}"
        try:
            with transaction.atomic():
                token = RindleToken.objects.create(
                    user=user,
                    name=name,
                    prefix=prefix,
                    digest=digest(raw),
                    scopes=scopes,
                    tables=tables,
                    expires_at=expires_at,
                )
        except IntegrityError:  # a prefix collision: 48 random bits make it rare
            continue
        return raw, token
    raise RuntimeError("could not allocate a unique token prefix")


def authenticate(raw):
    """
    ``(user, token)`` for an active token of an active user, else None: unknown,
    malformed, revoked and expired tokens are all simply refused.
    """
    prefix = split(raw)
    if prefix is None:
        return None
    token = RindleToken.objects.select_related("user").filter(prefix=prefix).first()
    if token is None or not hmac.compare_digest(token.digest, digest(raw)):
        return None
    now = timezone.now()
    if not token.is_active(now) or not getattr(token.user, "is_active", True):
        return None
    if token.last_used_at is None or now - token.last_used_at >= TOUCH_INTERVAL:
        try:
            with transaction.atomic():  # a savepoint when the request runs in a transaction
                RindleToken.objects.filter(pk=token.pk).update(last_used_at=now)
            token.last_used_at = now
        except DatabaseError:
            pass  # a busy database must not refuse a valid token over a timestamp
    return token.user, token


def revoke(prefix):
    """Revoke the token with ``prefix`` (idempotent); returns it. Raises DoesNotExist."""
    token = RindleToken.objects.get(prefix=prefix)
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        RindleToken.objects.filter(pk=token.pk, revoked_at=None).update(revoked_at=token.revoked_at)
    return token
