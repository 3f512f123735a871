"""
Named queries: the only queries a client can ask for.

A browser never sends an AST. It sends a name and arguments; the server validates
the arguments, builds the AST with the acting user in a context (never in the
arguments), asks the adapter whether the user may run it, and compiles the
adapter's per-table read rules into every level of the AST. So two users share a
live query only when they may see the same rows, and a row a user may not read
cannot reach them through a relationship, an EXISTS or a count::

    from rest_framework import serializers
    from rindle_app.queries import named_query, table

    class PageArgs(serializers.Serializer):
        limit = serializers.IntegerField(min_value=1, max_value=500)

    @named_query("latestIssues", args=PageArgs)
    def latest_issues(args, ctx):
        return table("issue").order_by("createdAt", "desc").limit(args["limit"])

``args`` is a DRF serializer class (the arguments are an object), a serializer
field instance (any other JSON value, such as a bare id), or None (the query takes
no arguments: null, {} or a missing value). Modules named ``RINDLE["QUERIES_MODULE"]``
("queries") in installed apps are imported at startup.
"""

import contextlib
import copy
import json
import logging
from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from rest_framework import serializers

from .adapter import get_adapter
from .conf import rindle_settings
from .engine.mutations import LEDGER, OWNER_COLUMN
from .exceptions import INTERNAL_ERROR, INVALID_ARGS, UNAUTHORIZED, UNKNOWN_QUERY, QueryRefused

LMID_QUERY_NAME = "_rindle/clientLmid"
LIFECYCLE_QUERY_NAME = "_rindle/lifecycle"  # a room doc's system streams (see ``rooms``)
ROOM_QUERY_NAME = "_rindle/room"  # a room host's upstream footprint (see ``rooms``)
AST_QUERY_NAME = "_rindle/ast"  # a raw AST from POST /materialize (see ``daemon``)

logger = logging.getLogger("rindle.named")

_registry = {}


@dataclass(frozen=True)
class Context:
    """What a query builder may know about who asks: never part of the arguments."""

    user: object = None
    client_id: str = None


@dataclass(frozen=True)
class NamedQuery:
    name: str
    build: object
    args: object = None
    realtime: object = None  # a rooms.RealtimeLabel: the query opts into a room profile

    def validate(self, args):
        spec = self.args
        if spec is None:
            if args not in (None, {}):
                raise QueryRefused(f"query {self.name!r} takes no arguments", INVALID_ARGS)
            return None
        if isinstance(spec, type) and issubclass(spec, serializers.BaseSerializer):
            if not isinstance(args, dict):
                raise QueryRefused(
                    f"query {self.name!r} takes an object of arguments", INVALID_ARGS
                )
            serializer = spec(data=args)
            if not serializer.is_valid():
                raise QueryRefused(
                    f"bad arguments for {self.name!r}: {_errors(serializer.errors)}",
                    INVALID_ARGS,
                )
            return serializer.validated_data
        try:
            return spec.run_validation(args)
        except serializers.ValidationError as exc:
            raise QueryRefused(
                f"bad arguments for {self.name!r}: {_errors(exc.detail)}", INVALID_ARGS
            ) from None


def named_query(name, *, args=None, realtime=None):
    """
    Register ``fn(args, ctx)`` (returning a builder query or a wire AST dict) as ``name``.
    ``realtime``: the room profile the query opts into (a name, or ``{room, args}`` with
    ``args`` mapping the query's validated args to the profile key's); see ``rooms``.
    """
    if not isinstance(name, str) or not name or name.startswith("_rindle/"):
        raise ValueError(f"invalid named query name {name!r}")
    from .rooms import RealtimeLabel

    label = RealtimeLabel.of(realtime)

    def register(fn):
        _registry[name] = NamedQuery(name, fn, args, label)
        return fn

    return register


def registered():
    """{name: NamedQuery} of every registered query."""
    return dict(_registry)


def lmid_ast(client_id, owner=None):
    """
    The system query every optimistic client subscribes: its own lmid row, only
    while ``owner`` (the caller's principal key) owns it or nobody does yet. A row
    another principal claims leaves the query; the owner column is never sent.
    """

    def owner_is(value):
        return {
            "type": "simple",
            "op": "IS" if value is None else "=",
            "left": {"type": "column", "name": OWNER_COLUMN},
            "right": {"type": "literal", "value": value},
        }

    mine = owner_is(None)
    if owner is not None:
        mine = {"type": "or", "conditions": [owner_is(owner), mine]}
    return {
        "table": LEDGER,
        "where": {
            "type": "and",
            "conditions": [
                {
                    "type": "simple",
                    "op": "=",
                    "left": {"type": "column", "name": "client_id"},
                    "right": {"type": "literal", "value": client_id},
                },
                mine,
            ],
        },
    }


def resolve(name, args, user=None, *, client_id=None, owner=None):
    """
    The wire AST of named query ``name`` for ``user``, permissions compiled in
    (``owner``: the caller's principal key, which scopes the lmid system query).
    Raises ``QueryRefused`` for an unknown name, bad arguments or a refused user.
    """
    if name == LMID_QUERY_NAME:
        if not client_id:
            raise QueryRefused(f"{LMID_QUERY_NAME} needs an init frame first", INVALID_ARGS)
        return lmid_ast(client_id, owner)
    if name == AST_QUERY_NAME:
        from .daemon import resolve_ast

        return resolve_ast(args)  # only an AST a daemon-scope token admitted (see daemon)
    if name in (LIFECYCLE_QUERY_NAME, ROOM_QUERY_NAME):
        from . import rooms

        if name == ROOM_QUERY_NAME:
            return rooms.resolve_room(args, user)
        return rooms.resolve_lifecycle(args, user, client_id)
    entry, clean = _validated(name, args)
    adapter = get_adapter()
    try:
        with _answered(name, "authorizing"):
            allowed = adapter.authorize_query(user, name, clean)
    except PermissionDenied as exc:
        raise QueryRefused(str(exc) or f"not allowed to read {name!r}", UNAUTHORIZED) from None
    if allowed is False:
        raise QueryRefused(f"not allowed to read {name!r}", UNAUTHORIZED)
    with _answered(name, "building"):
        built = entry.build(clean, Context(user=user, client_id=client_id))
        ast = built.build() if hasattr(built, "build") else copy.deepcopy(built)
    with _answered(name, "applying the read rules to"):
        rules = adapter.read_rules(user) or {}
    return compile_permissions(ast, rules)


def realtime_doc(name, args):
    """The room doc labelled query ``name`` derives from ``args`` (None: unlabelled)."""
    entry, clean = _validated(name, args)
    if entry.realtime is None:
        return None
    from .rooms import label_doc

    with _answered(name, "deriving the room key of"):
        return label_doc(entry.realtime, clean)


def _validated(name, args):
    if not isinstance(name, str) or name not in _registry:
        raise QueryRefused(f"unknown query {name!r}", UNKNOWN_QUERY)
    entry = _registry[name]
    try:
        encoded = json.dumps(args)
    except (TypeError, ValueError):
        raise QueryRefused("arguments must be JSON", INVALID_ARGS) from None
    if len(encoded.encode()) > int(rindle_settings.MAX_ARGS_BYTES):
        raise QueryRefused("arguments are too large", INVALID_ARGS)
    with _answered(name, "validating the arguments of"):
        return entry, entry.validate(args)


@contextlib.contextmanager
def _answered(name, doing):
    """
    Turn a server-side bug (in a query builder, a serializer, the adapter) into
    a ``QueryRefused`` with code ``INTERNAL_ERROR``, traceback logged: the caller is
    always answered, never left waiting.
    """
    try:
        yield
    except (QueryRefused, PermissionDenied):
        raise
    except Exception as exc:
        logger.exception("rindle: %s named query %r failed", doing, name)
        raise QueryRefused(
            f"the server failed {doing} query {name!r} ({type(exc).__name__})", INTERNAL_ERROR
        ) from exc


def compile_permissions(ast, rules):
    """
    AND each table's read rule ({table: condition}) into every query level over
    that table: the root, related subqueries (counts included) and EXISTS
    subqueries, so no path shows or counts a row the rule hides. Subqueries inside
    a rule are left as written.
    """
    if not rules:
        return ast
    ast = copy.deepcopy(ast)
    _gate(ast, rules)
    return ast


def _gate(query, rules):
    where = query.get("where")
    if where is not None:
        _gate_condition(where, rules)
    for related in query.get("related") or ():
        _gate(related["subquery"], rules)
    rule = rules.get(query.get("table"))
    if rule is not None:
        conditions = [copy.deepcopy(rule)] if where is None else [where, copy.deepcopy(rule)]
        query["where"] = {"type": "and", "system": "permissions", "conditions": conditions}


def _gate_condition(condition, rules):
    kind = condition.get("type")
    if kind in ("and", "or"):
        for c in condition.get("conditions") or ():
            _gate_condition(c, rules)
    elif kind == "correlatedSubquery":
        _gate(condition["related"]["subquery"], rules)


def _errors(detail):
    if isinstance(detail, dict):
        return "; ".join(f"{k}: {_errors(v)}" for k, v in detail.items())
    if isinstance(detail, list):
        return ", ".join(_errors(d) for d in detail)
    return str(detail)
