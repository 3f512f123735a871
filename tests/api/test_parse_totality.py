"""
Every POST route of rindle answers a hostile JSON body with a 400 envelope, never a
500; a named query's own bug is a 500 envelope with ``internal_error``, logged.
"""

import logging

import pytest
from django.urls import URLPattern, reverse

from rindle_app import tokens
from rindle_app import urls as rindle_urls
from rindle_app.named import named_query

from .conftest import error, post, state, token_client

pytestmark = pytest.mark.django_db(transaction=True)

DEEP = "[" * 1000 + "]" * 1000
HOSTILE = {
    "deep nesting": DEEP,
    "deep nesting in an object": '{"args": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}",
    "lone surrogate value": '{"clientID": "\\ud800", "name": "x"}',
    "lone surrogate key": '{"args": {"\\udfff": 1}}',
    "NaN": '{"args": NaN}',
    "Infinity": '{"args": -Infinity}',
    "overflowing float": '{"args": 1e999}',
    "huge int": '{"mid": ' + "9" * 40 + "}",
    "int past the digit limit": '{"mid": ' + "9" * 5000 + "}",
    "not UTF-8": b'{"name": "\xff\xfe"}',
}


def post_routes():
    """(name, url) of every rindle route whose view answers POST."""
    routes = []
    for pattern in rindle_urls.urlpatterns:
        if not isinstance(pattern, URLPattern):
            continue
        view = getattr(pattern.callback, "view_class", None)
        if view is None or not hasattr(view, "post"):
            continue
        kwargs = {name: "x" for name in pattern.pattern.converters}
        routes.append((pattern.name, reverse(pattern.name, kwargs=kwargs)))
    return routes


def test_every_post_route_is_covered():
    """The route list is read from the URLconf: the ones known today are all in it."""
    names = {name for name, _ in post_routes()}
    assert {"rindle-mutate", "rindle-sql-execute", "rindle-sql-migrate", "rindle-source"} <= names
    assert len(names) >= 14


@pytest.mark.parametrize("body", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_bodies_get_a_400_envelope_on_every_post_route(engine, alice, body, settings):
    settings.DEBUG = True  # a traceback page would show here if anything raised
    client = token_client(alice, *tokens.SCOPES)
    before = state()
    for name, url in post_routes():
        response = post(client, url, body)
        assert response.status_code == 400, (name, response.status_code, response.content[:300])
        assert response["Content-Type"].startswith("application/json"), name
        error = response.json()["error"]
        # public SQL answers in its own plane's vocabulary (SqlError)
        assert error["code"] in ("parse_error", "PROTOCOL_ERROR"), (name, error)
        assert "JSON parse error" in error["message"], (name, error)
    assert state() == before


@named_query("apiTestExploding")
def exploding(args, ctx):
    raise ZeroDivisionError("a bug in the query builder")


@pytest.mark.parametrize("url", ["/api/rindle/read", "/api/rindle/query"])
def test_a_failing_named_query_is_a_json_internal_error_and_logged(
    engine, machine, url, caplog, monkeypatch, settings
):
    """A bug in a named query is answered with the envelope (not a traceback page) and logged."""
    settings.DEBUG = True
    monkeypatch.setattr(logging.getLogger("rindle"), "propagate", True)
    before = state()
    response = post(machine, url, {"name": "apiTestExploding", "args": None, "clientId": "c1"})
    error(response, 500, "internal_error")
    assert "apiTestExploding" in response.json()["error"]["message"]
    assert "ZeroDivisionError: a bug in the query builder" in caplog.text
    assert state() == before
