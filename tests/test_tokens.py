"""API tokens: shown once, stored hashed, scoped, revocable and expiring."""

import hashlib
import io
import re
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse
from django.utils import timezone

from rindle_app import tokens
from rindle_app.models import RindleToken

pytestmark = pytest.mark.django_db

TOKEN = re.compile(r"^rdl_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def test_a_token_is_stored_as_its_prefix_and_hash_only(alice):
    """The raw token is rdl_<prefix>_<secret>; the row keeps the prefix and a SHA-256."""
    raw, token = tokens.create(alice, ["read", "mutate", "read"], name="ci")
    prefix, secret = TOKEN.match(raw).groups()
    row = RindleToken.objects.get()
    assert (row.prefix, row.name, row.scopes, row.user) == (prefix, "ci", ["read", "mutate"], alice)
    assert row.digest == hashlib.sha256(raw.encode()).hexdigest()
    stored = [str(getattr(row, f.attname)) for f in RindleToken._meta.concrete_fields]
    assert not any(secret in value for value in stored)
    assert secret not in str(row) and token.pk == row.pk


def test_authenticate_accepts_only_the_exact_active_token(alice):
    raw, token = tokens.create(alice, ["read"])
    assert token.last_used_at is None
    user, found = tokens.authenticate(raw)
    assert (user, found) == (alice, token)
    assert RindleToken.objects.get().last_used_at is not None
    other = raw[:-1] + ("A" if raw[-1] != "A" else "B")
    for wrong in (other, raw + "x", raw.replace("rdl_", "rdx_"), "", None, "rdl__x", "Bearer"):
        assert tokens.authenticate(wrong) is None


def test_revoked_expired_and_inactive_user_tokens_do_not_authenticate(alice, django_user_model):
    revoked, _ = tokens.create(alice, ["read"])
    tokens.revoke(tokens.split(revoked))
    past = timezone.now() - timedelta(seconds=1)
    expired, _ = tokens.create(alice, ["read"], expires_at=past)
    future, _ = tokens.create(alice, ["read"], expires_at=timezone.now() + timedelta(days=1))
    bob = django_user_model.objects.create_user("bob", is_active=False)
    inactive, _ = tokens.create(bob, ["read"])
    assert tokens.authenticate(revoked) is None
    assert tokens.authenticate(expired) is None
    assert tokens.authenticate(inactive) is None
    assert tokens.authenticate(future)[0] == alice


def test_last_used_is_written_at_most_once_a_minute(alice):
    raw, token = tokens.create(alice, ["read"])
    tokens.authenticate(raw)
    first = RindleToken.objects.get().last_used_at
    tokens.authenticate(raw)
    assert RindleToken.objects.get().last_used_at == first
    RindleToken.objects.update(last_used_at=first - tokens.TOUCH_INTERVAL)
    tokens.authenticate(raw)
    assert RindleToken.objects.get().last_used_at > first


def test_scopes_come_from_the_fixed_set_and_admin_holds_them_all(alice):
    with pytest.raises(ValueError):
        tokens.create(alice, ["read", "write"])
    with pytest.raises(ValueError):
        tokens.create(alice, [])
    _raw, reader = tokens.create(alice, ["read"])
    _raw, admin = tokens.create(alice, ["admin"])
    assert reader.has_scope("read") and not reader.has_scope("mutate")
    assert all(admin.has_scope(s) for s in tokens.SCOPES)


def test_is_active():
    now = timezone.now()
    assert RindleToken().is_active()
    assert not RindleToken(revoked_at=now).is_active()
    assert not RindleToken(expires_at=now).is_active(now)
    assert RindleToken(expires_at=now + timedelta(seconds=1)).is_active(now)


# --- management commands ----------------------------------------------------------------


def test_rindle_token_create_prints_the_token_once(alice):
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "rindle_token_create",
        "--user=alice",
        "--scope=read",
        "--scope=schema",
        "--name=nightly",
        "--expires-days=7",
        stdout=out,
        stderr=err,
    )
    raw = out.getvalue().strip()
    assert TOKEN.match(raw)
    token = RindleToken.objects.get()
    assert token.scopes == ["read", "schema"] and token.name == "nightly"
    assert timedelta(days=6, hours=23) < token.expires_at - timezone.now() <= timedelta(days=7)
    assert tokens.authenticate(raw)[0] == alice
    assert token.prefix in err.getvalue() and raw not in err.getvalue()


@pytest.mark.parametrize(
    "args",
    [
        ["--user=nobody", "--scope=read"],
        ["--user=alice", "--scope=write"],
        ["--user=alice"],
        ["--user=alice", "--scope=read", "--expires-days=0"],
    ],
    ids=["unknown user", "unknown scope", "no scope", "no days"],
)
def test_rindle_token_create_refuses_bad_arguments(alice, args):
    with pytest.raises(CommandError):
        call_command("rindle_token_create", *args, stdout=io.StringIO())
    assert not RindleToken.objects.exists()


def test_rindle_token_revoke(alice):
    raw, token = tokens.create(alice, ["read"])
    out = io.StringIO()
    call_command("rindle_token_revoke", token.prefix, stdout=out)
    assert token.prefix in out.getvalue()
    assert tokens.authenticate(raw) is None
    revoked_at = RindleToken.objects.get().revoked_at
    call_command("rindle_token_revoke", raw, stdout=io.StringIO())  # the whole token works too
    assert RindleToken.objects.get().revoked_at == revoked_at
    with pytest.raises(CommandError):
        call_command("rindle_token_revoke", "000000000000", stdout=io.StringIO())


# --- the admin --------------------------------------------------------------------------


def test_the_admin_lists_tokens_by_prefix_never_their_hash(operator, alice):
    raw, token = tokens.create(alice, ["read"], name="ci job")
    listing = operator.get(reverse("admin:rindle_app_rindletoken_changelist"))
    change = operator.get(reverse("admin:rindle_app_rindletoken_change", args=[token.pk]))
    for page in (listing, change):
        assert page.status_code == 200
        assert token.prefix in page.text
        assert token.digest not in page.text and raw not in page.text
    assert "ci job" in listing.text
    add = reverse("admin:rindle_app_rindletoken_add")
    assert operator.get(add).status_code == 403


def test_the_admin_revoke_action(operator, alice, client, django_user_model):
    raw, token = tokens.create(alice, ["read"])
    _raw2, kept = tokens.create(alice, ["read"])
    url = reverse("admin:rindle_app_rindletoken_changelist")
    operator.post(url, {"action": "revoke", "_selected_action": [token.pk]})
    assert tokens.authenticate(raw) is None
    assert RindleToken.objects.get(pk=kept.pk).revoked_at is None


def test_viewing_tokens_does_not_allow_revoking_them(client, django_user_model, alice):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_rindletoken"))
    client.force_login(viewer)
    raw, token = tokens.create(alice, ["read"])
    url = reverse("admin:rindle_app_rindletoken_changelist")
    assert client.get(url).status_code == 200
    client.post(url, {"action": "revoke", "_selected_action": [token.pk]})
    assert tokens.authenticate(raw) is not None
