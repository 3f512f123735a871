"""
Lease tokens: a signed, short-lived permission to subscribe to one named query.

``POST /api/rindle/query`` resolves and authorizes a named query, then mints a lease
over its name, its arguments as sent, the user's id and the client id. The websocket
consumer verifies the lease, loads the user and resolves the query again, so the
arguments and the read rules are checked at subscribe time too; the lease only
proves that this server issued it, to whom, and when::

    token, info = leases.mint("issuesPage", {"limit": 50}, request.user)
    lease = leases.verify(token)  # Lease(name, args, user_id, client_id)

Tokens are signed with ``SECRET_KEY`` (``django.core.signing``, salt
``"rindle.lease"``) and expire ``RINDLE["LEASE_TTL"]`` seconds after they are minted.
They are bearer credentials: anyone holding one may subscribe as its user until it
expires, so they travel only over the connection that asked for them.
"""

import time
from dataclasses import dataclass

from django.core import signing

from .conf import rindle_settings
from .engine.errors import RindleError

SALT = "rindle.lease"


class LeaseError(RindleError):
    """A lease that cannot be used."""

    status = 403


class LeaseExpired(LeaseError):
    """The lease was valid once; ask ``POST /api/rindle/query`` for a new one."""

    code = "lease_expired"
    status = 401
    retryable = True


class LeaseInvalid(LeaseError):
    """The token is not a lease this server signed (tampered, truncated, another key)."""

    code = "unauthorized"


@dataclass(frozen=True)
class Lease:
    """What a verified lease grants: subscribing to ``name(args)`` as ``user_id``."""

    name: str
    args: object
    user_id: object  # the user's pk as JSON (None for an anonymous user)
    client_id: str = None


def mint(name, args, user, client_id=None):
    """
    ``(token, info)``: a lease on ``name(args)`` for ``user`` (and ``client_id``).
    ``info`` holds ``issuedAt`` and ``expiresAt`` in milliseconds since the epoch.
    Minting authorizes nothing: resolve the query for the user first.
    """
    issued = int(time.time())
    payload = {"name": name, "args": args, "uid": _user_id(user), "cid": client_id, "iat": issued}
    token = signing.dumps(payload, salt=SALT, compress=True)
    expires = issued + int(rindle_settings.LEASE_TTL)
    return token, {"issuedAt": issued * 1000, "expiresAt": expires * 1000}


def verify(token):
    """The ``Lease`` of ``token``; raises ``LeaseExpired`` or ``LeaseInvalid``."""
    if not isinstance(token, str) or not token:
        raise LeaseInvalid("a lease token must be a non-empty string")
    try:
        payload = signing.loads(token, salt=SALT, max_age=int(rindle_settings.LEASE_TTL))
    except signing.SignatureExpired:
        raise LeaseExpired("the lease has expired; request a new one") from None
    except signing.BadSignature:
        raise LeaseInvalid("the lease token is not valid") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        raise LeaseInvalid("the lease token is not valid")
    return Lease(payload["name"], payload.get("args"), payload.get("uid"), payload.get("cid"))


def _user_id(user):
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = user.pk
    return pk if isinstance(pk, (int, str)) else str(pk)
