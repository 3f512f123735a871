"""POST /api/rindle/query: a lease on a named query, after the query is resolved and authorized."""

import pytest
from django.conf import settings
from django.test import Client, override_settings
from rest_framework.test import APIClient

from rindle_app import leases, named
from rindle_app.ivm.ast import parse, query_key

from .conftest import error, post, state, token_client

URL = "/api/rindle/query"
PAGE = {"name": "issuesPage", "args": {"limit": 20}}


def refusing():
    return override_settings(
        RINDLE={**settings.RINDLE, "ADAPTER": "tests.support.adapters.Refusing"}
    )


def test_a_session_user_gets_a_lease_for_the_query_it_asked(engine, session, alice):
    """The lease names the query, its args, the user and the client; queryKey is the query's."""
    response = post(session, URL, {**PAGE, "clientId": "tab-1"})
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"leaseToken", "queryKey", "expiresAt"}
    lease = leases.verify(body["leaseToken"])
    assert lease == leases.Lease("issuesPage", {"limit": 20}, alice.pk, "tab-1")
    ast = named.resolve("issuesPage", {"limit": 20}, alice)
    assert body["queryKey"] == query_key(parse(ast, engine.tables))
    assert response["Rindle-Boot-Id"] == engine.boot_id


def test_a_token_client_needs_no_csrf_token(engine, machine, alice):
    """A bearer-token request is authenticated by its header alone."""
    response = post(machine, URL, {"name": "users", "args": None})
    assert response.status_code == 200, response.content
    lease = leases.verify(response.json()["leaseToken"])
    assert (lease.name, lease.args, lease.user_id, lease.client_id) == (
        "users",
        None,
        alice.pk,
        None,
    )
    # Bound to the token that asked: only a socket with that token may redeem it.
    assert lease.token_prefix == machine.token.prefix


def test_an_anonymous_visitor_gets_a_lease_without_a_user(engine):
    """The adapter decides what anonymous visitors may read; the lease carries no user."""
    response = post(APIClient(), URL, PAGE)
    assert response.status_code == 200
    assert leases.verify(response.json()["leaseToken"]).user_id is None


def test_the_lease_expires_after_the_ttl(engine, machine):
    """expiresAt is LEASE_TTL seconds after minting, in milliseconds since the epoch."""
    with override_settings(RINDLE={**settings.RINDLE, "LEASE_TTL": 60}):
        response = post(machine, URL, PAGE)
    token = response.json()["leaseToken"]
    issued = leases.signing.loads(token, salt=leases.SALT)["iat"]
    assert response.json()["expiresAt"] == (issued + 60) * 1000


BAD_REQUESTS = [
    ("malformed JSON", '{"name": "issuesPage",', 400, "parse_error"),
    ("a list body", "[]", 400, "invalid_request"),
    ("no name", {"args": {"limit": 5}}, 400, "invalid_request"),
    ("a number name", {"name": 7, "args": None}, 400, "invalid_request"),
    ("a number clientId", {**PAGE, "clientId": 3}, 400, "invalid_request"),
    ("an overlong name", {"name": "q" * 201, "args": None}, 400, "invalid_request"),
    ("an unknown name", {"name": "noSuchQuery", "args": None}, 404, "unknown_query"),
    ("a system query", {"name": "_rindle/clientLmid", "clientId": "c"}, 404, "unknown_query"),
    ("args of the wrong shape", {"name": "issuesPage", "args": [1]}, 400, "invalid_args"),
    ("args out of range", {"name": "issuesPage", "args": {"limit": 0}}, 400, "invalid_args"),
    ("args for a query without any", {"name": "users", "args": {"x": 1}}, 400, "invalid_args"),
    ("a bad filter axis", {"name": "issuesPage", "args": {"limit": 1, "filter": [{}]}}, 400,
     "invalid_args"),
    # Valid but for their size: the serializer ignores the padding.
    ("oversized args", {"name": "issuesPage", "args": {"limit": 5, "pad": "x" * 64 * 1024}}, 400,
     "invalid_args"),
]  # fmt: skip


@pytest.mark.parametrize(
    "body,status,code", [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_a_bad_request_is_refused_and_changes_nothing(engine, machine, body, status, code):
    """Each malformed or unresolvable request gets its own error code and no lease."""
    before = state()
    response = post(machine, URL, body)
    error(response, status, code)
    assert response["Rindle-Boot-Id"] == engine.boot_id
    assert state() == before


def test_a_form_body_is_an_unsupported_media_type(engine, machine):
    """The routes take JSON only."""
    response = machine.post(URL, {"name": "users"})
    error(response, 415, "unsupported_media_type")


def test_a_query_the_adapter_refuses_is_forbidden(engine, machine):
    """authorize_query returning False, or raising PermissionDenied, is a 403."""
    with refusing():
        refused = post(machine, URL, {"name": "issueDetail", "args": "i1"})
        raised = post(machine, URL, {"name": "users", "args": None})
        allowed = post(machine, URL, PAGE)
    error(refused, 403, "unauthorized")
    assert "no user directory" in error(raised, 403, "unauthorized")["message"]
    assert allowed.status_code == 200


def test_a_session_post_without_the_csrf_token_is_refused(engine, session):
    """A browser session must send X-CSRFToken; DRF's session authentication checks it."""
    response = session.post(URL, PAGE, content_type="application/json")
    assert "CSRF" in error(response, 403, "permission_denied")["message"]


def test_a_plain_client_with_a_session_but_no_csrf_cookie_is_refused(engine, alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    error(post(client, URL, PAGE), 403, "permission_denied")


def test_a_token_without_the_read_scope_is_refused(engine, alice):
    """A token may use only the routes its scopes open."""
    client = token_client(alice, "mutate")
    error(post(client, URL, PAGE), 403, "insufficient_scope")
    assert post(token_client(alice, "admin"), URL, PAGE).status_code == 200


def test_a_revoked_expired_or_unknown_token_is_unauthenticated(engine, alice):
    """A token that does not authenticate is a 401 naming the Bearer scheme."""
    from django.utils import timezone

    revoked = token_client(alice, "read")
    revoked.token.revoked_at = timezone.now()
    revoked.token.save()
    expired = token_client(alice, "read", expires_at=timezone.now())
    forged = APIClient()
    raw = revoked.raw_token
    forged.credentials(HTTP_AUTHORIZATION="Bearer " + raw[:-1] + ("A" if raw[-1] != "A" else "B"))
    malformed = APIClient()
    malformed.credentials(HTTP_AUTHORIZATION="Bearer two parts")
    for client in (revoked, expired, forged, malformed):
        response = post(client, URL, PAGE)
        error(response, 401, "authentication_failed")
        assert response["WWW-Authenticate"].startswith("Bearer")
