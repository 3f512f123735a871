"""Lease tokens: signed, expiring, and useless once tampered with."""

import time
import uuid

import pytest
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core import signing
from django.test import override_settings

from rindle_app import leases
from rindle_app.leases import Lease, LeaseExpired, LeaseInvalid


class Member:
    is_authenticated = True

    def __init__(self, pk):
        self.pk = pk


def minted_ago(seconds, *args):
    """A lease minted ``seconds`` ago."""
    real = signing.TimestampSigner.timestamp
    signing.TimestampSigner.timestamp = lambda self: signing.b62_encode(int(time.time()) - seconds)
    try:
        return leases.mint(*args)
    finally:
        signing.TimestampSigner.timestamp = real


def test_a_lease_verifies_to_what_was_minted():
    """name, args as sent, the user's pk and the client id come back."""
    token, info = leases.mint("issuesPage", {"limit": 5, "filter": []}, Member(42), "tab-1")
    assert leases.verify(token) == Lease("issuesPage", {"limit": 5, "filter": []}, 42, "tab-1")
    assert info["expiresAt"] - info["issuedAt"] == 300_000


def test_an_anonymous_lease_has_no_user():
    for user in (None, AnonymousUser()):
        token, _info = leases.mint("users", None, user)
        assert leases.verify(token) == Lease("users", None, None, None)


def test_a_non_json_pk_is_carried_as_text():
    pk = uuid.UUID(int=7)
    token, _info = leases.mint("users", None, Member(pk))
    assert leases.verify(token).user_id == str(pk)


def test_a_lease_expires_after_the_ttl():
    """Older than LEASE_TTL: LeaseExpired (code lease_expired, retryable)."""
    token, _info = minted_ago(301, "users", None, None)
    with pytest.raises(LeaseExpired) as info:
        leases.verify(token)
    assert (info.value.code, info.value.retryable, info.value.status) == (
        "lease_expired",
        True,
        401,
    )
    fresh, _info = minted_ago(299, "users", None, None)
    assert leases.verify(fresh).name == "users"


def test_the_ttl_is_a_setting():
    token, _info = minted_ago(61, "users", None, None)
    with override_settings(RINDLE={**settings.RINDLE, "LEASE_TTL": 60}):
        with pytest.raises(LeaseExpired):
            leases.verify(token)
        _token, info = leases.mint("users", None, None)
        assert info["expiresAt"] - info["issuedAt"] == 60_000


def tampered(token):
    """``token`` with one character of its payload changed."""
    i = 3
    return token[:i] + ("A" if token[i] != "A" else "B") + token[i + 1 :]


def lease():
    return leases.mint("users", None, None)[0]


INVALID = {
    "empty": lambda: "",
    "none": lambda: None,
    "number": lambda: 42,
    "garbage": lambda: "not-a-lease",
    "tampered": lambda: tampered(lease()),
    "truncated": lambda: lease()[:-3],
    "other salt": lambda: signing.dumps({"name": "users", "args": None}, salt="another.salt"),
    "not an object": lambda: signing.dumps(["users"], salt=leases.SALT),
    "no name": lambda: signing.dumps({"args": None}, salt=leases.SALT),
}


@pytest.mark.parametrize("make", INVALID.values(), ids=INVALID.keys())
def test_an_invalid_token_is_refused_as_unauthorized(make):
    with pytest.raises(LeaseInvalid) as info:
        leases.verify(make())
    assert info.value.code == "unauthorized"


def test_another_secret_key_invalidates_leases():
    token, _info = leases.mint("users", None, None)
    with override_settings(SECRET_KEY="another-secret-key-of-enough-length-0123456789"):
        with pytest.raises(LeaseInvalid):
            leases.verify(token)


class Token:
    def __init__(self, prefix):
        self.prefix = prefix


def test_a_lease_is_redeemed_only_by_the_principal_it_was_minted_for():
    """Another user, nobody, another token, or a session for a token lease: refused."""
    alice, bob, t1, t2 = Member(1), Member(2), Token("a" * 12), Token("b" * 12)
    by_session, _info = leases.mint("users", None, alice)
    by_token, _info = leases.mint("users", None, alice, "tab-1", token=t1)
    anonymous, _info = leases.mint("users", None, None)
    assert leases.redeem(by_session, alice) == Lease("users", None, 1, None)
    assert leases.redeem(by_token, alice, t1) == Lease("users", None, 1, "tab-1", "a" * 12)
    assert leases.redeem(anonymous, AnonymousUser()).user_id is None
    mismatches = [
        (by_session, bob, None),
        (by_session, AnonymousUser(), None),
        (by_session, alice, t1),
        (by_token, alice, None),
        (by_token, alice, t2),
        (anonymous, alice, None),
    ]
    for token, user, auth in mismatches:
        with pytest.raises(leases.LeasePrincipalMismatch) as info:
            leases.redeem(token, user, auth)
        assert (info.value.code, info.value.status) == ("lease_principal_mismatch", 403)
