"""
The room flush credential: what ``/room-boot`` hands a room host to present on the
flush routes, instead of the boot request's own bearer token.

A boot is made with a ``rooms`` token, often a deployment's broad one (``admin``
holds every scope), and the room host that flushes may be another process. So the
boot answers ``flush.headers = {"X-Rindle-Room-Credential": "rfc1.<signed>"}``
(the original api-server's header name): a value signed with ``SECRET_KEY`` (salt
``"rindle.room-flush"``) that names the doc, the placement epoch the boot claimed
and the issuing token. On the flush routes it authenticates as that token narrowed
to:

- scope ``rooms`` only (a change-source batch, any other route, and ``/room-boot``
  itself refuse it: a credential never mints another);
- its doc: a claim, an lmid probe or a flush for another doc is 403;
- its placement and the ones after it: a flush or a claim carries an epoch at or
  above the credential's (the original's room shell claims again at its own boot
  and flushes under that epoch, so a later epoch is its own);
- the issuing token's life: revoke the token (or let it expire, or deactivate its
  user, or take ``rooms`` from it) and every credential it issued is refused.

It carries no expiry of its own, as the original's does not: a room host flushes
for as long as it holds its placement, and revoking the token is the kill switch.
"""

from dataclasses import dataclass

from django.core import signing
from django.utils import timezone

HEADER = "X-Rindle-Room-Credential"
PREFIX = "rfc1."
SALT = "rindle.room-flush"
SCOPE = "rooms"


class Refused(ValueError):
    """The credential is malformed, forged, or its token can no longer issue it."""


@dataclass(frozen=True)
class RoomCredential:
    """``request.auth`` of a request authenticated by a flush credential."""

    token: object  # the issuing RindleToken
    doc: str
    epoch: int

    def has_scope(self, scope):
        return scope == SCOPE

    def allows(self, doc, epoch=None):
        """Whether a room request on ``doc`` (carrying ``epoch``, if any) is this one's."""
        return doc == self.doc and (epoch is None or epoch >= self.epoch)


def mint(token, doc, epoch):
    """The credential value for ``token``'s boot of ``doc`` at placement ``epoch``."""
    return PREFIX + signing.dumps({"v": 1, "tok": token.pk, "doc": doc, "epoch": epoch}, salt=SALT)


def verify(value):
    """The ``RoomCredential`` of a header value; ``Refused`` when it does not hold."""
    from .models import RindleToken

    if not isinstance(value, str) or not value.startswith(PREFIX):
        raise Refused("not a room flush credential")
    try:
        claims = signing.loads(value[len(PREFIX) :], salt=SALT)
    except signing.BadSignature:
        raise Refused("the room flush credential's signature does not hold") from None
    if (
        not isinstance(claims, dict)
        or claims.get("v") != 1
        or not isinstance(claims.get("tok"), int)
        or not isinstance(claims.get("doc"), str)
        or not isinstance(claims.get("epoch"), int)
    ):
        raise Refused("the room flush credential is malformed")
    token = RindleToken.objects.select_related("user").filter(pk=claims["tok"]).first()
    if (
        token is None
        or not token.is_active(timezone.now())
        or not getattr(token.user, "is_active", True)
        or not token.has_scope(SCOPE)
    ):
        raise Refused("the token that issued this room flush credential is no longer valid")
    return RoomCredential(token, claims["doc"], claims["epoch"])
