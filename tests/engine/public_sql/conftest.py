"""Fixtures of the public SQL tests: the views' engine, callers, and a state snapshot."""

import secrets
from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from rindle_app.testing import outbox_high_water
from tests.support import views
from tests.support.views import post, token_client  # noqa: F401  (re-exported for the tests)

# The views' engine and alice (tests/support/views.py), for this folder's tests.
engine, alice = views.engine, views.alice

ISSUE = (
    'INSERT INTO issue (id, title, status, priority, "ownerId", "createdAt", "updatedAt") '
    "VALUES (?, ?, 'todo', 'high', 'alice', 1.5, 1.5)"
)


@pytest.fixture
def sql(alice):
    """A token client of alice's with the sql scope, allowed to write ``issue`` only."""
    return token_client(alice, "sql", tables=["issue"])


def rows(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def state():
    """Everything a refused request must leave alone: rows, outcomes and the outbox."""
    return {
        "issues": rows("SELECT id, title, status FROM issue ORDER BY id"),
        "users": rows('SELECT id, name FROM "user" ORDER BY id'),
        "ledger": rows("SELECT * FROM _rindle_client_mutations ORDER BY client_id"),
        "outcomes": rows("SELECT outcome_key, result FROM _rindle_sql_outcomes ORDER BY 1"),
        "outbox": outbox_high_water(),
    }


def error(response, status, code):
    """Assert ``response`` is the error ``code`` with ``status``; return its envelope."""
    assert response.status_code == status, (response.status_code, response.content)
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["code"] == code, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["retry_scope"] in ("request", "transaction", "closure", "never"), err
    assert err["transaction_state"] in ("open", "closed", "unknown"), err
    assert "statement_index" in err and "partial_results" in err, err
    return err


def issue(issue_id, title="t"):
    return {"sql": ISSUE, "args": [issue_id, title]}


@dataclass(frozen=True)
class Planted:
    """A ``sql`` token with no table grants, and protected values no answer may show."""

    client: object
    secrets: tuple

    def leaked(self, response):
        """The planted values ``response`` shows (case-insensitively), if any."""
        text = response.content.decode(errors="replace").lower()
        return [s for s in self.secrets if s.lower() in text]


@pytest.fixture
def planted(alice):
    """A known session key, password hash, token digest and client id, and a bare token."""
    from django.contrib.sessions.models import Session

    from rindle_app.models import ClientMutation

    session_key = "plantedsession" + secrets.token_hex(9)
    Session.objects.create(
        session_key=session_key,
        session_data="x",
        expire_date=timezone.now() + timedelta(days=1),
    )
    client_id = "plantedclient" + secrets.token_hex(8)
    ClientMutation.objects.create(client_id=client_id, last_mutation_id=7)
    bare = token_client(alice, "sql")
    alice.refresh_from_db()
    return Planted(bare, (session_key, alice.password, bare.token.digest, client_id))


def refusal(response, context=None):
    """Assert ``response`` is a clean 4xx error envelope (never a 5xx); return its code."""
    assert 400 <= response.status_code < 500, (context, response.status_code, response.content)
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"]["code"], str), body
    return body["error"]["code"]


def create_issue_args(issue_id, created_at=1.5):
    """The args of the demo's ``createIssue`` mutator for a fresh issue ``issue_id``."""
    return {
        "id": issue_id,
        "title": "after",
        "status": "todo",
        "priority": "high",
        "owner": "alice",
        "description": "",
        "descriptionCommentId": f"{issue_id}-c0",
        "createdAt": created_at,
    }
