"""The public API: every public name is the object the internals use, and the demo uses only it."""

import ast
import gc
import importlib
import re
from pathlib import Path

import pytest
from channels.auth import AuthMiddleware
from channels.routing import ProtocolTypeRouter, URLRouter
from channels.security.websocket import OriginValidator
from channels.sessions import CookieMiddleware

import rindle_app
from rindle_app import asgi, mutators, queries
from rindle_app.engine import mutations, tx, writer
from rindle_app.ivm import builder, queryset
from rindle_app.realtime.auth import SocketSessionMiddleware
from rindle_app.realtime.consumer import RindleConsumer

ROOT = Path(__file__).resolve().parent.parent

# Public name -> the internal object it must be (not a copy, not a wrapper).
SURFACE = {
    mutators: {
        "mutator": mutations.mutator,
        "MutationRejected": mutations.MutationRejected,
        "Tx": writer.Tx,  # the class the writer thread hands to every request
        "room_mutator": importlib.import_module("rindle_app.rooms").room_mutator,
    },
    queries: {
        "named_query": importlib.import_module("rindle_app.named").named_query,
        "table": builder.table,
        "cond": builder.cond,
        "and_": builder.and_,
        "or_": builder.or_,
        "not_": builder.not_,
        "exists": builder.exists,
        "not_exists": builder.not_exists,
        "correlate": builder.correlate,
        "from_queryset": queryset.from_queryset,
        "room_profile": importlib.import_module("rindle_app.rooms").room_profile,
    },
}
PUBLIC_MODULES = (
    "rindle_app.mutators",
    "rindle_app.queries",
    "rindle_app.asgi",
    "rindle_app.testing",
)
# Public too, owned by other modules of the API (the runtime and the error vocabulary).
ALSO_PUBLIC = ("rindle_app.runtime", "rindle_app.exceptions")


@pytest.mark.parametrize("module", list(SURFACE), ids=lambda m: m.__name__)
def test_each_public_name_is_the_object_the_internals_use(module):
    """A public name re-exports the internal object itself, and __all__ lists exactly them."""
    expected = SURFACE[module]
    assert sorted(module.__all__) == sorted(expected)
    for name, internal in expected.items():
        assert getattr(module, name) is internal, name
    assert tx.Tx is writer.Tx


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_the_package_docstring_names_each_public_module(name):
    """rindle_app's docstring lists the public modules; each says it is public API."""
    assert f"``{name}``" in rindle_app.__doc__
    if name != "rindle_app.testing":  # its docstring is the testing helpers' own
        assert importlib.import_module(name).__doc__.lstrip().startswith("Public API")


def _chain(app):
    """The middleware classes from ``app`` down to its URLRouter."""
    seen = []
    while not isinstance(app, URLRouter):
        seen.append(type(app))
        app = getattr(app, "application", None) or app.inner
    return seen, app


def test_the_websocket_application_validates_origins_authenticates_and_routes():
    """websocket_application(): origin check, cookies, session, user, then the two sockets."""
    seen, router = _chain(asgi.websocket_application())
    validator, *rest = seen
    assert issubclass(validator, OriginValidator)  # Channels' own, admitting bearer clients
    assert rest == [CookieMiddleware, SocketSessionMiddleware, AuthMiddleware]
    assert [str(r.pattern) for r in router.routes] == ["ws/rindle/", "ws/rindle/room/"]
    assert router.routes[0].callback.consumer_class is RindleConsumer


def test_application_routes_http_to_the_given_app_and_websockets_to_rindle():
    """application(http_app) is a ProtocolTypeRouter of that app and the websocket app."""
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()

    async def http_app(scope, receive, send):
        pass

    try:
        router = asgi.application(http_app)
    finally:
        gc.set_threshold(*threshold)
        if not frozen:
            gc.unfreeze()
    assert isinstance(router, ProtocolTypeRouter)
    assert set(router.application_mapping) == {"http", "websocket"}
    assert router.application_mapping["http"] is http_app
    seen, _router = _chain(router.application_mapping["websocket"])
    assert issubclass(seen[0], OriginValidator)


def _rindle_imports(source):
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        yield from (n for n in names if n.split(".")[0] == "rindle_app")


def _python_blocks(markdown):
    """The ``python`` fenced code blocks of a Markdown text."""
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.M | re.S)


def test_the_demo_imports_only_the_public_api():
    """Every module of the demo project (its app, commands, settings) imports only public rindle."""
    files = sorted((ROOT / "project").rglob("*.py"))
    used = {(str(f.relative_to(ROOT)), m) for f in files for m in _rindle_imports(f.read_text())}
    assert ("project/demo/management/commands/rindle_seed_demo.py", "rindle_app.runtime") in used
    public = PUBLIC_MODULES + ALSO_PUBLIC
    assert {(f, m) for f, m in used if m not in public} == set()
    assert all(f"``{name}``" in rindle_app.__doc__ for name in ALSO_PUBLIC)


def test_the_adoption_examples_import_only_the_public_api():
    """
    The Python examples of the README and of the guide's Setup (the adoption guide a new
    project copies) parse, and import rindle only through public modules.
    """
    guide = (ROOT / "docs" / "guide.md").read_text()
    setup = guide[guide.index("\n## Setup\n") : guide.index("\n## The engine\n")]
    blocks = _python_blocks((ROOT / "README.md").read_text()) + _python_blocks(setup)
    used = {m for block in blocks for m in _rindle_imports(block)}
    assert {"rindle_app.mutators", "rindle_app.queries", "rindle_app.asgi"} <= used
    assert used - set(PUBLIC_MODULES + ALSO_PUBLIC) == set()
