"""Fixtures of the HTTP API tests: the process's engine, users, and clients of each kind."""

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from project.demo import models as demo
from rindle_app.testing import outbox_high_water
from tests.support import views
from tests.support.views import post, token_client  # noqa: F401  (re-exported for the tests)

# The views' engine and alice (tests/support/views.py), for this folder's tests.
engine, alice = views.engine, views.alice


@pytest.fixture
def session(alice):
    """A browser signed in as alice, whose POSTs must carry the CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    client.csrf = "k" * 32  # an unmasked secret: Django compares the header to the cookie
    client.cookies[settings.CSRF_COOKIE_NAME] = client.csrf
    return client


@pytest.fixture
def machine(alice):
    """A client authenticated by a token of alice's holding every route's scope."""
    return token_client(alice, "read", "mutate", "schema")


def state():
    """Everything a refused request must leave alone: rows, ledger and outbox."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT client_id, last_mutation_id FROM _rindle_client_mutations")
        ledger = sorted(cursor.fetchall())
    return {
        "issues": sorted(demo.Issue.objects.values_list("id", "title", "status")),
        "users": sorted(demo.User.objects.values_list("id", "name")),
        "tags": sorted(demo.Tag.objects.values_list("id", flat=True)),
        "comments": sorted(demo.Comment.objects.values_list("id", "body")),
        "ledger": ledger,
        "outbox": outbox_high_water(),
    }


def error(response, status, code):
    """Assert ``response`` is the error ``code`` with ``status``; returns its detail."""
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]
