"""
Lease tokens: a signed, short-lived permission to subscribe to one named query.

``POST /api/rindle/query`` resolves and authorizes a named query, then mints a lease
over its name, its arguments as sent, the principal that asked (the user's id, and
the bearer token's prefix for a token request) and the client id. The websocket
consumer redeems the lease only for that same principal, and resolves the query
again as that principal, so the arguments and the read rules are checked at
subscribe time too; the lease only proves that this server issued it, to whom, and
when. A socket that authenticated (a session user or a bearer token) redeems only
leases minted for itself (``redeem``: another user or token is refused with
``lease_principal_mismatch``). A socket with no credentials of its own may present a
session user's lease as its credential (``redeem_as_credential``): the original's
daemon deployment, where the browser holds only leases. Its first lease binds it:
every later lease on that socket must name the same user, and a lease minted for a
bearer token is redeemed only with that token::

    token, info = leases.mint("issuesPage", {"limit": 50}, request.user, token=request.auth)
    lease = leases.redeem(token, socket_user, socket_token)  # Lease(name, args, user_id, ...)

Tokens are signed with ``SECRET_KEY`` (``django.core.signing``, salt
``"rindle.lease"``) and expire ``RINDLE["LEASE_TTL"]`` seconds after they are minted.
A leaked lease grants at most one named query, as its user, until it expires
(``LEASE_TTL``), and never on a socket authenticated as someone else.
"""

import time
from dataclasses import dataclass

from django.core import signing

from .conf import rindle_settings
from .exceptions import (
    LeaseError,  # noqa: F401  (re-exported: leases.LeaseError)
    LeaseExpired,
    LeaseInvalid,
    LeasePrincipalMismatch,
)

SALT = "rindle.lease"


@dataclass(frozen=True)
class Lease:
    """What a verified lease grants: subscribing to ``name(args)`` as ``user_id``."""

    name: str
    args: object
    user_id: object  # the user's pk as JSON (None for an anonymous user)
    client_id: str = None
    token_prefix: str = None  # the bearer token it was minted for (None: a session)


def mint(name, args, user, client_id=None, token=None):
    """
    ``(token, info)``: a lease on ``name(args)`` for ``user`` (and ``client_id``);
    ``token``: the ``RindleToken`` the request authenticated with, if any.
    ``info`` holds ``issuedAt`` and ``expiresAt`` in milliseconds since the epoch.
    Minting authorizes nothing: resolve the query for the user first.
    """
    issued = int(time.time())
    payload = {"name": name, "args": args, "uid": _user_id(user), "cid": client_id, "iat": issued}
    if _token_prefix(token) is not None:
        payload["tid"] = _token_prefix(token)
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
    fields = ("args", "uid", "cid", "tid")
    return Lease(payload["name"], *(payload.get(field) for field in fields))


def redeem(token, user, auth_token=None):
    """
    The ``Lease`` of ``token`` for the caller: ``user`` and the ``RindleToken`` it
    authenticated with (None for a session or nobody). A lease minted for another
    principal raises ``LeasePrincipalMismatch``; see ``verify`` for the rest.
    """
    lease = verify(token)
    if (lease.user_id, lease.token_prefix) != (_user_id(user), _token_prefix(auth_token)):
        raise LeasePrincipalMismatch(
            "this lease was minted for another user or token; ask POST /api/rindle/query "
            "for a lease of your own"
        )
    return lease


UNBOUND = object()


def redeem_as_credential(token, bound=UNBOUND):
    """
    The ``Lease`` of ``token`` for a caller with no credentials of its own, whose
    earlier leases named ``bound`` (a user id, None for anonymous; ``UNBOUND`` for
    its first lease). A lease of another user than ``bound``, or one minted for a
    bearer token, raises ``LeasePrincipalMismatch``.
    """
    lease = verify(token)
    if lease.token_prefix is not None or (bound is not UNBOUND and lease.user_id != bound):
        raise LeasePrincipalMismatch(
            "this lease was minted for a bearer token or for another user than this "
            "socket's earlier leases; present it with its own credentials"
        )
    return lease


def lease_user(lease):
    """The active user a lease acts as (``AnonymousUser`` for an anonymous lease)."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import AnonymousUser

    if lease.user_id is None:
        return AnonymousUser()
    user = get_user_model().objects.filter(pk=lease.user_id).first()
    if user is None or not user.is_active:
        raise LeaseInvalid("the lease's user no longer exists")
    return user


def _token_prefix(token):
    prefix = getattr(token, "prefix", None)
    return prefix if isinstance(prefix, str) else None


def _user_id(user):
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = user.pk
    return pk if isinstance(pk, (int, str)) else str(pk)
