"""
Room profiles and the realtime lifecycle plane: which rows a room doc owns, and
the four system streams the published optimistic client folds.

A **room profile** names what stands up a room. ``key(args)`` derives the
profile-local key from a labelled query's (validated) arguments; the wire doc is
``"<profile>/<key>"``, minted here and never by the client. ``footprint(key, ctx)``
builds the room's canonical footprint, which must be **unwindowed** (no ``limit``,
``start`` or ``one`` anywhere): a window computed over an unwindowed superset equals
the window over the whole table, a windowed footprint would silently break that.
``context`` names the footprint tables the room loads but never writes::

    from rindle_app.queries import correlate, named_query, table
    from rindle_app.rooms import room_profile

    @room_profile("issue", key=lambda args: str(args["id"]), context=("user",), example_key="1")
    def issue_room(key, ctx):
        return (
            table("issue").where("id", "=", int(key))
            .related("comments", correlate("id", "issueId"), table("comment"))
        )

    @named_query("issueDetail", args=IssueArgs, realtime="issue")
    def issue_detail(args, ctx): ...

Profiles are checked loudly: a label naming a missing profile, a context table
outside the footprint and (with ``example_key``) a windowed footprint are system
check errors (``rindle.E035``), and every ``/room-boot`` checks its footprint again.

**The lifecycle plane.** With ``RINDLE["REALTIME_LIFECYCLE"]`` on, a lease for a
labelled query carries ``lifecycle: {doorbell, fence?}``. Each entry is a lease on
the reserved system query ``_rindle/lifecycle`` over one of the four system tables
(``_rindle_scope_sessions`` for the doorbell, ``_rindle_room_watermark``,
``_rindle_room_client_mutations`` and ``_rindle_room_mutation_outcomes`` for the
fence), subscribed like any lease. Its arguments name the parent labelled query, so
every subscribe re-authorizes the parent for the subscriber and checks that the
stream's scope or doc is the one the parent's label derives: the same rule the
client uses to re-lease it. The ledger and outcome streams are always scoped to the
socket's own client id. The lease route writes the caller's occupancy row (the
doorbell's row delta, captured like any write) in the same step.
"""

import time
from dataclasses import dataclass

from .adapter import get_adapter
from .conf import rindle_settings
from .engine.rooms import (
    LIFECYCLE_TABLES,
    ROOM_LEDGER,
    ROOM_OUTCOMES,
    ROOM_WATERMARK,
    SCOPE_SESSIONS,
)
from .exceptions import (
    INTERNAL_ERROR,
    INVALID_ARGS,
    UNKNOWN_QUERY,
    UNKNOWN_ROOM,
    QueryRefused,
    RindleError,
)
from .named import (
    LIFECYCLE_QUERY_NAME,
    ROOM_QUERY_NAME,
    Context,
    compile_permissions,
    realtime_doc,
    registered,
)
from .named import resolve as resolve_named

DOC_SEPARATOR = "/"

FENCE_TABLES = (ROOM_WATERMARK, ROOM_LEDGER, ROOM_OUTCOMES)
ROOM_SERVE_QUERY_NAME = "_rindle/roomQuery"  # a room token: {doc, parent}, never by name

MAX_KEY_CHARS = 200

_profiles = {}


class UnknownRoom(RindleError):
    """The doc names no registered room profile."""

    code = UNKNOWN_ROOM
    status = 404


@dataclass(frozen=True)
class RealtimeLabel:
    """A named query's opt-in to a room: the profile, and how its args map to the key's."""

    room: str
    args: object = None  # fn(validated args) -> the profile key's args (None: the same)

    @classmethod
    def of(cls, value):
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, dict) and isinstance(value.get("room"), str):
            return cls(value["room"], value.get("args"))
        raise ValueError(f"realtime must be a room profile name or {{room, args}}, not {value!r}")


@dataclass(frozen=True)
class RoomProfile:
    name: str
    key: object  # fn(validated args) -> str
    footprint: object  # fn(key, ctx) -> builder query or wire AST dict
    context: tuple = ()
    example_key: str = None

    def doc(self, args):
        """The wire doc of the labelled query's (validated) ``args``."""
        key = self.key(args)
        if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
            raise QueryRefused(
                f"room profile {self.name!r} derived an unusable key {key!r}", INVALID_ARGS
            )
        return f"{self.name}{DOC_SEPARATOR}{key}"

    def footprint_ast(self, key, ctx):
        """The footprint's wire AST for ``key``; raises ``ValueError`` when windowed."""
        built = self.footprint(key, ctx)
        ast = built.build() if hasattr(built, "build") else built
        hit = find_window(ast)
        if hit is not None:
            raise ValueError(
                f"room profile {self.name!r}: the footprint must be unwindowed, found {hit}; "
                "windows belong on the labelled queries a room serves"
            )
        return ast


def room_profile(name, *, key, context=(), example_key=None):
    """Register ``fn(key, ctx)`` as the footprint of room profile ``name``."""
    if not isinstance(name, str) or not name or DOC_SEPARATOR in name:
        raise ValueError(f"invalid room profile name {name!r} (non-empty, no '/')")
    if not callable(key):
        raise ValueError(f"room profile {name!r}: key must be a function of the query's args")

    def register(fn):
        _profiles[name] = RoomProfile(name, key, fn, tuple(context), example_key)
        return fn

    return register


def profiles():
    return dict(_profiles)


_mutators = {}  # profile name -> {mutator name: fn(tx, args)}


def room_mutator(profile, name=None):
    """
    Register ``fn(tx, args)`` as room mutator ``name`` (default: the function's name)
    of room profile ``profile``: the room host runs it against the room's rows in
    memory (``tx.get/add/edit/remove``); raising ``RoomReject`` rejects it.
    """

    def register(fn):
        _mutators.setdefault(profile, {})[name or fn.__name__] = fn
        return fn

    return register


def mutators_of(profile):
    """{name: fn} of the room mutators of ``profile`` (a name)."""
    return dict(_mutators.get(profile, {}))


def split_doc(doc):
    """``(profile, key)`` of a wire doc; raises ``UnknownRoom``."""
    if isinstance(doc, str):
        name, sep, key = doc.partition(DOC_SEPARATOR)
        if sep and key and name in _profiles:
            return _profiles[name], key
    raise UnknownRoom(f"no room profile serves doc {doc!r} (expected '<profile>/<key>')")


def profile_problems():
    """What is wrong with the registered profiles and labels (the system check E035)."""
    problems = []
    for name, entry in sorted(registered().items()):
        if entry.realtime is not None and entry.realtime.room not in _profiles:
            problems.append(
                f"named query {name!r} is labelled for room profile {entry.realtime.room!r}, "
                "which is not registered"
            )
    for name, profile in sorted(_profiles.items()):
        if profile.example_key is None:
            continue
        try:
            ast = profile.footprint_ast(profile.example_key, Context())
        except Exception as exc:  # the profile's own code: report it, whatever it is
            problems.append(f"room profile {name!r}: {exc}")
            continue
        nodes = {}
        _collect(ast, True, nodes, {})
        for table in profile.context:
            if table not in nodes:
                problems.append(
                    f"room profile {name!r}: context table {table!r} is not in its footprint"
                )
    return problems


# --- the unwindowed rule and the room's table scopes ------------------------------------


def find_window(ast, path="footprint"):
    """Where ``limit``, ``start`` or ``one`` appears in ``ast`` (None: nowhere)."""
    if not isinstance(ast, dict):
        return None
    for field, label in (("limit", "limit"), ("start", "start (cursor paging)"), ("one", "one()")):
        if ast.get(field) not in (None, False):
            return f"{label} at {path}.{field}"
    for i, rel in enumerate(ast.get("related") or ()):
        sub = rel.get("subquery") if isinstance(rel, dict) else None
        hit = find_window(sub, f"{path}.related[{(sub or {}).get('alias', i)}]")
        if hit:
            return hit
    for field in ("where", "having"):
        hit = _window_in_condition(ast.get(field), f"{path}.{field}")
        if hit:
            return hit
    return None


def _window_in_condition(cond, path):
    if not isinstance(cond, dict):
        return None
    kind = cond.get("type")
    if kind in ("and", "or"):
        for i, c in enumerate(cond.get("conditions") or ()):
            hit = _window_in_condition(c, f"{path}.{kind}[{i}]")
            if hit:
                return hit
    elif kind == "correlatedSubquery":
        sub = (cond.get("related") or {}).get("subquery")
        return find_window(sub, f"{path}.exists")
    return None


TRUE = {"type": "and", "conditions": []}


def compile_scopes(ast, context=()):
    """
    Per footprint table, what a room may write and which rows it holds, in the
    original's boot-wire shape: ``{table, footprintWhere?, writable}``, sorted by
    table. ``writable`` is ``{kind: "none"}`` for a context table, otherwise
    ``{kind: "predicate", where?, joinKeyCols}`` where ``where`` keeps only the
    row-local part of the table's predicates (dropping a part only widens it; the
    rows the room holds are the real bound). ``footprintWhere`` is the EXACT
    membership predicate, given only for the root table and only when its
    ``where`` is wholly row-local: an absent read is provable from it alone.
    """
    nodes, join_keys = {}, {}
    _collect(ast, True, nodes, join_keys)
    specs = []
    for table in sorted(nodes):
        spec = {"table": table, "writable": {"kind": "none"}}
        occurrences = nodes[table]
        if len(occurrences) == 1 and occurrences[0][1]:
            cond, exact = _row_local(occurrences[0][0].get("where"))
            if exact:
                spec["footprintWhere"] = cond if cond is not None else TRUE
        if table not in context:
            parts = []
            for node, _root in occurrences:
                cond, _exact = _row_local(node.get("where"))
                if cond is None:
                    parts = None
                    break
                parts.append(cond)
            writable = {"kind": "predicate", "joinKeyCols": sorted(join_keys.get(table, ()))}
            if parts:
                either = {"type": "or", "conditions": parts}
                writable["where"] = parts[0] if len(parts) == 1 else either
            spec["writable"] = writable
        specs.append(spec)
    return specs


def _collect(node, is_root, nodes, join_keys):
    if not isinstance(node, dict) or not isinstance(node.get("table"), str):
        return
    nodes.setdefault(node["table"], []).append((node, is_root))

    def child(entry):
        sub = entry.get("subquery") or {}
        corr = entry.get("correlation") or {}
        if isinstance(sub.get("table"), str):
            join_keys.setdefault(node["table"], set()).update(corr.get("parentField") or ())
            join_keys.setdefault(sub["table"], set()).update(corr.get("childField") or ())
        _collect(sub, False, nodes, join_keys)

    for rel in node.get("related") or ():
        child(rel)
    for field in ("where", "having"):
        _exists_children(node.get(field), child)


def _exists_children(cond, child):
    if not isinstance(cond, dict):
        return
    if cond.get("type") in ("and", "or"):
        for c in cond.get("conditions") or ():
            _exists_children(c, child)
    elif cond.get("type") == "correlatedSubquery":
        child(cond.get("related") or {})


def _row_local(cond):
    """``(row-local condition or None for unconstrained, exact?)`` of a where."""
    if cond is None:
        return None, True
    kind = cond.get("type")
    if kind == "simple":
        left, right = cond.get("left") or {}, cond.get("right") or {}
        if left.get("type") == "column" and right.get("type") == "literal":
            return cond, True
        return None, False
    if kind == "and":
        kept, exact = [], True
        for c in cond.get("conditions") or ():
            local, ok = _row_local(c)
            exact = exact and ok
            if local is not None:
                kept.append(local)
        if not kept:
            return None, exact
        return (kept[0] if len(kept) == 1 else {"type": "and", "conditions": kept}), exact
    if kind == "or":
        kept = []
        for c in cond.get("conditions") or ():
            local, ok = _row_local(c)
            if local is None or not ok:
                return None, False  # an OR is kept whole or dropped whole
            kept.append(local)
        return {"type": "or", "conditions": kept}, True
    return None, False


# --- the lifecycle system streams -----------------------------------------------------


def _eq(column, value):
    return {
        "type": "simple",
        "op": "=",
        "left": {"type": "column", "name": column},
        "right": {"type": "literal", "value": value},
    }


def lifecycle_ast(table, scope_or_doc, client_id=None):
    """The system stream's AST: a scope's sessions, a doc's fence, a client's ledger."""
    column = "scope" if table == SCOPE_SESSIONS else "doc"
    where = _eq(column, scope_or_doc)
    if table in (ROOM_LEDGER, ROOM_OUTCOMES):
        where = {"type": "and", "conditions": [where, _eq("client_id", client_id)]}
    return {"table": table, "where": where}


def label_doc(label, clean_args):
    """The wire doc a realtime label maps a query's validated args to."""
    profile = _profiles.get(label.room)
    if profile is None:
        raise QueryRefused(f"room profile {label.room!r} is not registered", INTERNAL_ERROR)
    room_args = label.args(clean_args) if label.args is not None else clean_args
    return profile.doc(room_args)


def resolve_lifecycle(args, user, client_id):
    """The AST of a ``_rindle/lifecycle`` subscription, its parent re-authorized."""
    if not rindle_settings.REALTIME_LIFECYCLE:
        raise QueryRefused("the realtime lifecycle is off (REALTIME_LIFECYCLE)", UNKNOWN_QUERY)
    if not isinstance(args, dict) or args.get("table") not in LIFECYCLE_TABLES:
        raise QueryRefused(
            f"{LIFECYCLE_QUERY_NAME} takes {{table, scope | doc, parent: {{name, args}}}} with "
            f"table one of {', '.join(LIFECYCLE_TABLES)}",
            INVALID_ARGS,
        )
    parent = args.get("parent")
    if not isinstance(parent, dict) or not isinstance(parent.get("name"), str):
        raise QueryRefused(f"{LIFECYCLE_QUERY_NAME} needs parent {{name, args}}", INVALID_ARGS)
    table = args["table"]
    field = "scope" if table == SCOPE_SESSIONS else "doc"
    want = args.get(field)
    resolve_named(parent["name"], parent.get("args"), user, client_id=client_id)  # authorizes
    doc = realtime_doc(parent["name"], parent.get("args"))
    if doc is None:
        raise QueryRefused(f"query {parent['name']!r} has no realtime label", INVALID_ARGS)
    if want != doc:
        raise QueryRefused(
            f"the {field} of this {table} stream is not the one {parent['name']!r} derives",
            INVALID_ARGS,
        )
    if table in (ROOM_LEDGER, ROOM_OUTCOMES) and not client_id:
        raise QueryRefused(f"the {table} stream needs an init frame first", INVALID_ARGS)
    return lifecycle_ast(table, doc, client_id)


def resolve_room(args, user):
    """The AST of a room host's upstream footprint subscription (``_rindle/room``)."""
    if not isinstance(args, dict) or set(args) != {"doc"}:
        raise QueryRefused(f"{ROOM_QUERY_NAME} takes {{doc}}", INVALID_ARGS)
    try:
        profile, key = split_doc(args["doc"])
    except UnknownRoom as exc:
        raise QueryRefused(exc.message, UNKNOWN_QUERY) from None
    ast = footprint_for(profile, key, user)
    return compile_permissions(ast, get_adapter().read_rules(user) or {})


def footprint_for(profile, key, user):
    """The profile's footprint AST for ``key`` as ``user``; a windowed one is refused."""
    try:
        return profile.footprint_ast(key, Context(user=user))
    except ValueError as exc:
        raise QueryRefused(str(exc), INTERNAL_ERROR) from None


def load_footprint(engine, profile, key):
    """
    ``{table: [row, ...]}``: the rows of the footprint of ``profile`` for ``key``,
    read from the database now (unwindowed, so bounded by what the doc owns; past
    ``WS_MAX_FOOTPRINT_ROWS`` rows it is refused, ``footprint_too_large``). The room
    host loads it at boot; no read rule applies (each room-served query is
    resolved with its subscriber's rules compiled in, and evaluated over these rows).
    """
    from django.db import connections

    from .ivm.ast import parse
    from .ivm.sql import run_query

    query = parse(footprint_for(profile, key, None), engine.tables)
    view = run_query(query, connections[engine.using], engine.tables)
    nodes = [] if view is None else (view if isinstance(view, list) else [view])
    out = {}
    _footprint_rows(engine.tables, query, nodes, out)
    total, cap = sum(len(rows) for rows in out.values()), int(rindle_settings.WS_MAX_FOOTPRINT_ROWS)
    if total > cap:
        from .exceptions import FOOTPRINT_TOO_LARGE, LimitExceeded

        raise LimitExceeded(
            f"room {profile.name}/{key} holds {total} rows, more than WS_MAX_FOOTPRINT_ROWS "
            f"({cap}) a room may keep in memory",
            FOOTPRINT_TOO_LARGE,
        )
    return {table: list(rows.values()) for table, rows in out.items()}


def _footprint_rows(schema, query, nodes, out):
    table = schema.get(query.table)
    names = [c.name for c in table.wire_columns]
    found = out.setdefault(query.table, {})
    for node in nodes:
        row = {n: node.get(n) for n in names}
        found[tuple(row[c] for c in table.primary_key)] = row
        for rel in query.related:
            sub = rel.subquery
            if sub.aggregate is not None:
                continue
            children = node.get(sub.alias)
            if isinstance(children, dict):
                children = [children]
            _footprint_rows(schema, sub, children or [], out)


def footprint_tables(profile, key):
    """The tables the footprint of ``profile`` for ``key`` reads."""
    nodes = {}
    _collect(footprint_for(profile, key, None), True, nodes, {})
    return frozenset(nodes)


def query_tables(query):
    """Every table a parsed query reads: its own, its relationships' and its EXISTS'."""
    from .ivm.ast import subqueries

    found = {query.table}
    for related in subqueries(query):
        found |= query_tables(related.subquery)
    return found


def has_aggregate(query):
    from .ivm.ast import subqueries

    below = [*query.related, *subqueries(query)]
    return query.aggregate is not None or any(has_aggregate(r.subquery) for r in below)


def realtime_block(request, name, args, doc, user, client_id, auth):
    """
    The ``realtime`` block of a room-served lease: the room socket's endpoint, the
    room token (a lease on ``_rindle/roomQuery`` naming the doc and this query), its
    expiry and the footprint's table scopes.
    """
    from . import leases

    profile, key = split_doc(doc)
    token, info = leases.mint(
        ROOM_SERVE_QUERY_NAME,
        {"doc": doc, "parent": {"name": name, "args": args}},
        user,
        client_id,
        token=auth,
    )
    from urllib.parse import quote

    from .mount import prefix_of, ws_url

    # The room socket is mounted beside the lease route (rindle_app.mount).
    prefix = prefix_of("rindle-query", "api/rindle/query")
    return {
        "sourceKey": f"room:{doc}",
        "wsEndpoint": ws_url(request, prefix, f"ws/rindle/room/?doc={quote(doc, safe='')}"),
        "roomToken": token,
        "exp": info["expiresAt"],
        "doc": doc,
        "tables": compile_scopes(footprint_for(profile, key, user), set(profile.context)),
    }


# --- occupancy (the doorbell's rows) --------------------------------------------------


def settings_problem(settings):
    """Why the ROOM_* timings or ROOMS_ENABLED are refused (None: they are fine)."""
    for name in ("ROOM_SESSION_TTL", "ROOM_SESSION_GRACE", "ROOM_FLUSH_INTERVAL"):
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return f"{name} must be a positive number of seconds, not {value!r}"
    value = settings.ROOM_MIN_SESSIONS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"ROOM_MIN_SESSIONS must be a positive integer, not {value!r}"
    if not isinstance(settings.ROOMS_ENABLED, bool):
        return f"ROOMS_ENABLED must be True or False, not {settings.ROOMS_ENABLED!r}"
    return None


SWEEP_SLACK_MS = 60_000


def touch_session(engine, scope, client_id, now_ms=None):
    """
    Sweep the scope's long-expired sessions and upsert the caller's, in one write
    (the row delta is the doorbell). ``(live others, others expired within the
    grace, other rows at all)``: the last says a room plausibly served the scope.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    ttl = int(float(rindle_settings.ROOM_SESSION_TTL) * 1000)
    grace = int(float(rindle_settings.ROOM_SESSION_GRACE) * 1000)

    def write(tx):
        tx.run(
            f"DELETE FROM {SCOPE_SESSIONS} WHERE scope = %s AND expires_at < %s",
            [scope, now - grace - SWEEP_SLACK_MS],
        )
        if client_id:
            tx.run(
                f"INSERT INTO {SCOPE_SESSIONS} (scope, client_id, expires_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (scope, client_id) DO UPDATE SET expires_at = excluded.expires_at",
                [scope, client_id, now + ttl],
            )
        return tx.fetchone(
            f"SELECT SUM(CASE WHEN expires_at > %s THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN expires_at <= %s AND expires_at > %s THEN 1 ELSE 0 END), COUNT(*) "
            f"FROM {SCOPE_SESSIONS} WHERE scope = %s AND client_id <> %s",
            [now, now, now - grace, scope, client_id or ""],
        )

    live, lingering, rows = engine.write(write).value or (0, 0, 0)
    return int(live or 0), int(lingering or 0), int(rows or 0)
