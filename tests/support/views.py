"""
What the tests of the HTTP views share (tests/api, tests/engine/public_sql): the
engine the views use, a user, token clients and a JSON POST. A conftest imports
the fixtures it wants, so they apply to its folder only.
"""

import json

import pytest
from rest_framework.test import APIClient

from rindle_app import tokens
from rindle_app.engine import get_engine, shutdown


@pytest.fixture
def engine(transactional_db):
    """The engine the views use (``get_engine()``), stopped after the test."""
    shutdown()
    yield get_engine()
    shutdown()


@pytest.fixture
def alice(engine, django_user_model):
    return django_user_model.objects.create_user("alice", password="pw")


def token_client(user, *scopes, **kwargs):
    """An API client holding a new token of ``user`` (``client.token``, ``client.raw_token``)."""
    raw, token = tokens.create(user, list(scopes), **kwargs)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    client.raw_token, client.token = raw, token
    return client


def post(client, url, body, **extra):
    """POST ``body`` as JSON (a str is sent as is); a session client sends its CSRF token."""
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    csrf = getattr(client, "csrf", None)
    if csrf is not None:
        extra.setdefault("HTTP_X_CSRFTOKEN", csrf)
    return client.post(url, data, content_type="application/json", **extra)
