"""
The original daemon's private control plane (``@rindle/daemon-client`` 0.9.0): a
second front door to the engine functions the Django-native routes call, with the
original's paths, bodies and status codes (docs/daemon.md has the route table).

Every route takes a bearer token with the ``daemon`` scope (``admin`` holds it);
a browser session is refused, a superuser's included: the daemon token is the
database's, server-only. The token is trusted server code, as the original's
api-server is: its client ids are not bound to it (``owner`` None), so a browser
socket of the same client id still sees its lmid row.
"""

import secrets

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response

import rindle_app

from .. import daemon, leases
from ..conf import rindle_settings
from ..engine import InvalidInput, RindleError, Unavailable, get_engine, journal
from ..engine.errors import MutationGap
from ..engine.mutations import reject, validate_envelope
from ..engine.public_sql import SqlError, parse_statement, protocol_error, transactions
from ..engine.public_sql.attributed import (
    DaemonPrincipal,
    client_receipt,
    read_only,
    run_txn,
    session_ledger,
    stored_key,
    stored_lmid,
)
from ..exceptions import INVALID_REQUEST, SessionGone
from ..ivm.ast import QueryError, parse, query_key
from ..realtime.hub import get_hub
from .ingest_views import StrictBodyView
from .migrate_views import MigrationSerializer, _parse
from .serializers import ErrorResponse, StrictCharField, StrictIntegerField
from .sql_views import CONSISTENCY
from .views import FollowsSchema, read_once

MAX_MID = 2**53 - 1  # the original's mids are JS numbers


def _errors(*statuses):
    return {status: OpenApiResponse(ErrorResponse) for status in statuses}


# --- bodies ------------------------------------------------------------------------------


class StatementSerializer(serializers.Serializer):
    sql = StrictCharField(trim_whitespace=False)
    params = serializers.ListField(child=serializers.JSONField(), required=False)


class MaterializeRequest(serializers.Serializer):
    ast = serializers.JSONField(help_text="A query AST, validated against the schema.")
    mode = serializers.ChoiceField(["flat", "normalized"], required=False)
    policy = serializers.DictField(
        required=False, help_text="{kind: pinned, name?} or {kind: whileSubscribed, idleTtlMs?}"
    )
    subject = StrictCharField(required=False, max_length=255, trim_whitespace=False)
    leaseTtlMs = StrictIntegerField(required=False, min_value=1)
    maxSubscribers = StrictIntegerField(required=False, min_value=1)
    metadata = serializers.DictField(required=False)

    def validate_policy(self, policy):
        kind = policy.get("kind")
        if kind not in ("pinned", "whileSubscribed"):
            raise serializers.ValidationError("kind must be 'pinned' or 'whileSubscribed'")
        name = policy.get("name")
        if name is not None and (not isinstance(name, str) or not name or len(name) > 255):
            raise serializers.ValidationError("name must be a non-empty string")
        idle = policy.get("idleTtlMs")
        most = int(rindle_settings.LEASE_TTL) * 1000
        if idle is not None and (
            isinstance(idle, bool) or not isinstance(idle, int) or not 0 <= idle <= most
        ):
            raise serializers.ValidationError(
                f"idleTtlMs must be an integer from 0 to {most} (LEASE_TTL)"
            )
        return policy


class MaterializeResponse(serializers.Serializer):
    materializationId = serializers.CharField()
    queryKey = serializers.CharField()
    leaseToken = serializers.CharField(help_text="Subscribe it on /ws/rindle/ (no credentials).")
    reused = serializers.BooleanField()


class DematerializeRequest(serializers.Serializer):
    materializationId = StrictCharField(required=False, max_length=300, trim_whitespace=False)
    queryKey = StrictCharField(required=False, max_length=300, trim_whitespace=False)
    name = StrictCharField(required=False, max_length=255, trim_whitespace=False)


class RemovedResponse(serializers.Serializer):
    removed = serializers.BooleanField()


class QueryOnceRequest(serializers.Serializer):
    ast = serializers.JSONField()
    visibilityKey = StrictCharField(required=False, max_length=255, trim_whitespace=False)
    ttlMs = StrictIntegerField(required=False, min_value=0)


class QueryOnceResponse(serializers.Serializer):
    rows = serializers.ListField(child=serializers.DictField(), help_text="{cols, <rel>...}")
    cvMin = serializers.IntegerField()
    queryKey = serializers.CharField()
    bootId = serializers.CharField()


class SqlReadRequest(serializers.Serializer):
    sql = StrictCharField(trim_whitespace=False)
    params = serializers.ListField(child=serializers.JSONField(), required=False)
    # Accepted and ignored (one database is always consistent); the public SQL routes'
    # choices, so the OpenAPI document has one ``consistency`` enum.
    consistency = serializers.ChoiceField(CONSISTENCY, required=False)
    routingKey = StrictCharField(required=False, max_length=255, trim_whitespace=False)


class SqlReadResponse(serializers.Serializer):
    cols = serializers.ListField(child=serializers.CharField())
    rows = serializers.ListField(child=serializers.ListField(), help_text="Bare cell arrays.")


class SqlTxnRequest(serializers.Serializer):
    idempotencyKey = StrictCharField(required=False, max_length=255, trim_whitespace=False)
    clientID = StrictCharField(required=False, max_length=255, trim_whitespace=False)
    mid = StrictIntegerField(required=False, min_value=1, max_value=MAX_MID)
    statements = StatementSerializer(many=True)

    def validate(self, data):
        if ("clientID" in data) != ("mid" in data):
            raise serializers.ValidationError("send clientID and mid together, or neither")
        return data


class LmidAdvance(serializers.Serializer):
    clientID = serializers.CharField()
    lmid = serializers.IntegerField()


class SqlTxnResponse(serializers.Serializer):
    applied = serializers.BooleanField(help_text="False: a replay (mid or key), absorbed.")
    cv = serializers.IntegerField(allow_null=True)
    txId = serializers.IntegerField(allow_null=True)
    cursor = serializers.CharField(allow_null=True)
    lmid = serializers.IntegerField(required=False)
    lmidAdvances = LmidAdvance(many=True, required=False)


class RejectRequest(serializers.Serializer):
    clientID = StrictCharField(max_length=255, trim_whitespace=False)
    mid = StrictIntegerField(min_value=1, max_value=MAX_MID)
    reason = StrictCharField(required=False, max_length=2000, trim_whitespace=False)


class RejectResponse(serializers.Serializer):
    cv = serializers.IntegerField(allow_null=True)
    lmid = serializers.IntegerField()


class SessionBeginRequest(serializers.Serializer):
    clientID = StrictCharField(required=False, max_length=255, trim_whitespace=False)
    mid = StrictIntegerField(required=False, min_value=1, max_value=MAX_MID)
    idempotencyKey = StrictCharField(required=False, max_length=255, trim_whitespace=False)
    statements = StatementSerializer(many=True, required=False)
    query = StatementSerializer(required=False)

    validate = SqlTxnRequest.validate


class SessionBeginResponse(serializers.Serializer):
    sessionId = serializers.CharField(required=False)
    read = SqlReadResponse(required=False)
    absorbed = serializers.BooleanField(required=False)
    applied = serializers.BooleanField(required=False)
    lmid = serializers.IntegerField(required=False)
    lmidAdvances = LmidAdvance(many=True, required=False)


class SessionExecRequest(serializers.Serializer):
    sessionId = StrictCharField(max_length=64, trim_whitespace=False)
    statements = StatementSerializer(many=True)


class SessionQueryRequest(serializers.Serializer):
    sessionId = StrictCharField(max_length=64, trim_whitespace=False)
    sql = StrictCharField(trim_whitespace=False)
    params = serializers.ListField(child=serializers.JSONField(), required=False)


class SessionRefRequest(serializers.Serializer):
    sessionId = StrictCharField(max_length=64, trim_whitespace=False)


class MigrateOutput(serializers.Serializer):
    applied = serializers.BooleanField()
    hashOverridden = serializers.BooleanField()
    schemaVersion = serializers.CharField(allow_null=True)


class StatsResponse(serializers.Serializer):
    subscriptions = serializers.IntegerField()
    materializations = serializers.IntegerField()
    leases = serializers.IntegerField()
    connections = serializers.IntegerField()


class VersionResponse(serializers.Serializer):
    version = serializers.CharField()
    bootId = serializers.CharField()
    protocol = serializers.CharField()


# --- helpers -----------------------------------------------------------------------------


def statements_of(items, vendor, base=0):
    """The daemon's ``[{sql, params?}]`` as parsed public SQL statements."""
    return [
        parse_statement({"sql": item["sql"], "args": item.get("params")}, base + i, vendor)
        for i, item in enumerate(items)
    ]


def parsed_ast(engine, ast):
    """The parsed query of a caller's AST: its refusals are the caller's (400)."""
    try:
        return parse(ast, engine.tables)
    except QueryError as exc:
        raise InvalidInput(str(exc), code=exc.code, path=exc.path) from None


def _read_rows(columns, rows):
    return {"cols": columns, "rows": rows}


class DaemonView(StrictBodyView):
    """A route of the daemon plane: a bearer token with the ``daemon`` scope."""

    required_scope = "daemon"

    def validated(self, serializer_class):
        if self.request.stream is None:  # no body at all: not even the empty object
            raise InvalidInput("the body must be a JSON object", code=INVALID_REQUEST)
        return super().validated(serializer_class)

    def principal(self):
        return DaemonPrincipal(self.request.user, self.request.auth)


# --- the follower's routes ---------------------------------------------------------------


class MaterializeView(DaemonView):
    """``POST /materialize``: a raw AST, validated, leased for the websocket."""

    @extend_schema(
        operation_id="rindle_daemon_materialize",
        summary="Materialize a raw AST and lease it",
        description=(
            "The AST is validated against the schema (a refusal is 400 with its code and "
            "`path`). The lease subscribes `_rindle/ast` on /ws/rindle/ from a socket "
            "without credentials. `policy: {kind: pinned, name?}` keeps the query warm in "
            "this process with no subscriber until /dematerialize (a re-assert of one name "
            "keeps its id); past DAEMON_MAX_PINS a new pin is 409 `too_many_pins`. Any other "
            "materialization lives while subscribed, and `idleTtlMs` longer."
        ),
        request=MaterializeRequest,
        responses={200: MaterializeResponse, **_errors(400, 401, 403, 409)},
    )
    def post(self, request):
        data = self.validated(MaterializeRequest)
        engine = get_engine()
        query = parsed_ast(engine, data["ast"])
        key = query_key(query)
        policy = data.get("policy") or {}
        records = daemon.materializations()
        if policy.get("kind") == "pinned":
            name = policy.get("name")
            materialization_id, reused = self._pin(engine, records, key, name, data["ast"])
        else:
            idle = (policy.get("idleTtlMs") or 0) / 1000
            materialization_id, reused = records.add(key, idle=idle)
        token, _info = leases.mint(daemon.AST_QUERY_NAME, daemon.grant(data["ast"]), None)
        return Response(
            {
                "materializationId": materialization_id,
                "queryKey": key,
                "leaseToken": token,
                "reused": reused,
            }
        )

    @staticmethod
    def _pin(engine, records, key, name, ast):
        """
        Keep ``ast`` warm in the hub, then record the pin; a name re-asserted with
        another AST lets go of the query it pinned before.
        """
        hub = get_hub(engine)
        with records.changing:
            before = records.get(f"pin:{name}") if name else None
            hub.pin(key, ast)  # refused (too_many_pins, a footprint cap): nothing recorded
            materialization_id, reused = records.add(key, name, pinned=True)
            if before is not None and before.key != key and before.key not in records.pinned():
                hub.unpin(before.key)
        return materialization_id, reused


class DematerializeView(DaemonView):
    """``POST /dematerialize``: forget a materialization by id, query key or pin name."""

    @extend_schema(
        operation_id="rindle_daemon_dematerialize",
        summary="Forget a materialization",
        description=(
            "Removes this process's record of it (`removed: false` if none matched); a "
            "pinned query is no longer kept warm, and goes once nobody subscribes it. "
            "Leases already handed out stay valid until they expire."
        ),
        request=DematerializeRequest,
        responses={200: RemovedResponse, **_errors(400, 401, 403)},
    )
    def post(self, request):
        data = self.validated(DematerializeRequest)
        if not data:
            raise InvalidInput("send materializationId, queryKey or name", code=INVALID_REQUEST)
        records = daemon.materializations()
        with records.changing:
            unpinned, removed = records.remove(
                data.get("materializationId"), data.get("queryKey"), data.get("name")
            )
            if unpinned:
                hub = get_hub(get_engine())
                for key in unpinned:
                    hub.unpin(key)
        return Response({"removed": removed})


class QueryOnceView(FollowsSchema, DaemonView):
    """``POST /query``: the SSR one-shot over a raw AST; it subscribes nothing."""

    @extend_schema(
        operation_id="rindle_daemon_query",
        summary="Read a raw AST once (SSR)",
        request=QueryOnceRequest,
        responses={200: QueryOnceResponse, **_errors(400, 401, 403, 503)},
    )
    def post(self, request):
        data = self.validated(QueryOnceRequest)
        engine = get_engine()
        # A raw AST is the caller's: an aggregate there is its input's fault.
        body = read_once(engine, parsed_ast(engine, data["ast"]), refusal=InvalidInput)
        return Response({**body, "bootId": engine.boot_id})


class SqlReadView(DaemonView):
    """``POST /execute-sql-read``: one read, on the read-only connection."""

    @extend_schema(
        operation_id="rindle_daemon_execute_sql_read",
        summary="Run one read-only SQL statement",
        description=(
            "Read-only whatever the token: a statement that writes is 400 `READ_ONLY`, "
            "DDL 400 `DDL_FORBIDDEN`. Rows are bare cell arrays in `cols` order."
        ),
        request=SqlReadRequest,
        responses={200: SqlReadResponse, **_errors(400, 401, 403, 408, 503)},
    )
    def post(self, request):
        data = self.validated(SqlReadRequest)
        engine = get_engine()
        (statement,) = statements_of([data], engine.vendor)
        columns, rows = read_only(engine, self.principal(), statement)
        return Response(_read_rows(columns, rows))


class StatsRequest(serializers.Serializer):
    """``/stats`` takes no fields (an empty object, or no body)."""


class StatsView(DaemonView):
    """``POST /stats``: this process's live subscriptions, sockets and leases."""

    @extend_schema(
        operation_id="rindle_daemon_stats",
        summary="Live counts of this process",
        request=StatsRequest,
        responses={200: StatsResponse, **_errors(401, 403)},
    )
    def post(self, request):
        from ..runtime import get_runtime

        if request.stream is not None:  # no body, or an empty object
            StrictBodyView.validated(self, StatsRequest)

        # Peek at the hub without starting one: a process serving no socket has none.
        hub = getattr(get_runtime(None), "_hub", None)
        conns = list(hub.conns.values()) if hub is not None else []
        subs = [sub for conn in conns for sub in list(conn.subs.values())]
        return Response(
            {
                "subscriptions": len(subs),
                "materializations": hub.materialized if hub is not None else 0,
                "leases": len(daemon.materializations()),
                "connections": len(conns),
            }
        )


class VersionView(DaemonView):
    """``GET /version``: the server's version and boot id."""

    @extend_schema(
        operation_id="rindle_daemon_version",
        summary="The server's version",
        responses={200: VersionResponse, **_errors(401, 403)},
    )
    def get(self, request):
        return Response(
            {
                "version": rindle_app.__version__,
                "bootId": get_engine().boot_id,
                "protocol": "rindle-daemon-client/0.9",
            }
        )


# --- the write master's routes -----------------------------------------------------------


class SqlTxnView(DaemonView):
    """
    ``POST /execute-sql-txn``: statements in ONE writer transaction, with the lmid
    of ``(clientID, mid)`` or the ``idempotencyKey`` (``engine.public_sql.attributed``).
    """

    @extend_schema(
        operation_id="rindle_daemon_execute_sql_txn",
        summary="Apply an attributed SQL transaction once",
        description=(
            "`mid <= lmid` answers `applied: false` with the stored lmid; a gap is 409 "
            "`mid_gap`. A failing statement (400/403/409 with its SQL code) rolls "
            "everything back and advances NO lmid: a corrected retry of the same mid "
            "applies. A replayed `idempotencyKey` answers `applied: false`."
        ),
        request=SqlTxnRequest,
        responses={200: SqlTxnResponse, **_errors(400, 401, 403, 408, 409, 503)},
    )
    def post(self, request):
        data = self.validated(SqlTxnRequest)
        client_id = data.get("clientID")
        if client_id is not None:
            validate_envelope(client_id, data["mid"], "sql", None)
        engine = get_engine()
        statements = statements_of(data["statements"], engine.vendor)
        body = run_txn(
            engine,
            self.principal(),
            statements,
            client_id=client_id,
            mid=data.get("mid"),
            key=data.get("idempotencyKey"),
        )
        return Response(body)


class RejectMutationView(DaemonView):
    """``POST /reject-mutation``: a business rejection, an lmid-only commit."""

    @extend_schema(
        operation_id="rindle_daemon_reject_mutation",
        summary="Record a rejected mutation (advance the lmid)",
        description="Absorbed at or below the lmid; a gap is 409 `mid_gap`.",
        request=RejectRequest,
        responses={200: RejectResponse, **_errors(400, 401, 403, 409, 503)},
    )
    def post(self, request):
        data = self.validated(RejectRequest)
        result = reject(get_engine(), data["clientID"], data["mid"], data.get("reason"))
        return Response({"cv": result.cv, "lmid": result.lmid})


class DaemonMigrateView(DaemonView):
    """
    ``POST /migrate``: the migrations journal of ``/v1/sql/migrate``. An object is
    one migration (its error a 4xx); an array applies in order and stops at the
    first failure, always 200 (``error``, ``errorCode``, ``failedId``).
    """

    @extend_schema(
        operation_id="rindle_daemon_migrate",
        summary="Apply journaled migrations (the daemon's body)",
        request=MigrationSerializer,
        responses={200: MigrateOutput, **_errors(400, 401, 403, 409, 413, 503)},
    )
    def post(self, request):
        engine = get_engine()
        if not isinstance(request.data, list):
            data = self.validated(MigrationSerializer)
            return Response(_migrate_output(journal.apply(engine, _parse(data)).as_dict()))
        if not request.data:
            raise InvalidInput("send at least one migration", code=INVALID_REQUEST)
        items = []
        for i, item in enumerate(request.data):
            serializer = MigrationSerializer(data=item)
            if not isinstance(item, dict) or not serializer.is_valid():
                raise InvalidInput(f"migration [{i}] is malformed", code=INVALID_REQUEST)
            unknown = sorted(set(item) - set(MigrationSerializer().fields))
            if unknown:
                raise InvalidInput(f"[{i}]: unknown field(s) {unknown}", code=INVALID_REQUEST)
            items.append(serializer.validated_data)
        # A refused migration stops the set where it stands (the original's array form):
        # the earlier ones stay committed, and the answer is still 200.
        results, body = [], {}
        for item in items:
            try:
                outcome = journal.apply(engine, _parse(item)).as_dict()
            except Unavailable:
                raise
            except RindleError as exc:
                body = {"error": exc.message, "errorCode": exc.code, "failedId": item["id"]}
                break
            results.append({"id": outcome["id"], **_migrate_output(outcome)})
        version = engine.write(journal.schema_version).value
        applied = sum(1 for r in results if r["applied"])
        return Response({"results": results, "applied": applied, "schemaVersion": version, **body})


def _migrate_output(outcome):
    return {
        "applied": outcome["applied"],
        "hashOverridden": outcome["hashOverridden"],
        "schemaVersion": outcome["schemaVersion"],
    }


# --- interactive mutation sessions -------------------------------------------------------


def _gone(exc):
    """A finished or expired session: the original's 410 (the client retries the envelope)."""
    if isinstance(exc, SqlError) and exc.code in ("TRANSACTION_EXPIRED", "TRANSACTION_CLOSED"):
        return SessionGone(exc.message)
    return exc


class SessionView(DaemonView):
    """A ``/mutate-session/*`` route: public SQL interactive transactions."""

    def run(self, fn, *args):
        try:
            return fn(*args)
        except SqlError as exc:
            raise _gone(exc) from None

    @staticmethod
    def op():
        return secrets.token_hex(8)

    def registry(self):
        return transactions(get_engine())


class SessionBeginView(SessionView):
    """
    ``POST /mutate-session/begin``: mid dedup up front (``absorbed``: no session
    opened), then the write prefix and the first read, in a new session.
    """

    @extend_schema(
        operation_id="rindle_daemon_session_begin",
        summary="Begin an interactive mutation session",
        request=SessionBeginRequest,
        responses={200: SessionBeginResponse, **_errors(400, 401, 403, 409, 503)},
    )
    def post(self, request):
        data = self.validated(SessionBeginRequest)
        engine = get_engine()
        client_id, mid = data.get("clientID"), data.get("mid")
        key = data.get("idempotencyKey")
        principal = self.principal()
        if key is not None:
            replay = stored_key(engine, principal, key)
            if replay is not None:
                return Response({"absorbed": True, **replay})
        if client_id is not None:
            validate_envelope(client_id, mid, "session", None)
            lmid = stored_lmid(engine, client_id, None)
            if mid <= lmid:
                return Response({"absorbed": True, **client_receipt(client_id, lmid, None, False)})
            if mid > lmid + 1:
                raise MutationGap(client_id, mid, lmid)
        hooks = session_ledger(principal, client_id, mid, None, key)
        prefix = statements_of(data.get("statements") or [], engine.vendor)
        query = data.get("query")
        registry = self.registry()
        began = registry.begin(principal, hooks=hooks)
        session = began["transaction_id"]
        body = {"sessionId": session}
        try:
            if prefix:
                self.run(registry.execute, principal, session, self.op(), prefix)
            if query is not None:
                (st,) = statements_of([query], engine.vendor)
                answer = self.run(registry.execute, principal, session, self.op(), [st])
                body["read"] = _answer_rows(answer)
        except Exception:
            registry.rollback(principal, session, self.op())
            raise
        return Response(body)


def _answer_rows(answer):
    result = answer.body["results"][0]
    return _read_rows([c["name"] for c in result["columns"]], result["rows"])


class SessionExecView(SessionView):
    """``POST /mutate-session/exec``: writes inside the session."""

    @extend_schema(
        operation_id="rindle_daemon_session_exec",
        summary="Execute statements in a mutation session",
        request=SessionExecRequest,
        responses={200: None, **_errors(400, 401, 403, 409, 410)},
    )
    def post(self, request):
        data = self.validated(SessionExecRequest)
        engine = get_engine()
        statements = statements_of(data["statements"], engine.vendor)
        if not statements:
            raise protocol_error("statements must be a non-empty list")
        answer = self.run(
            self.registry().execute, self.principal(), data["sessionId"], self.op(), statements
        )
        return Response({"results": len(answer.body["results"])})


class SessionQueryView(SessionView):
    """``POST /mutate-session/query``: a read through the session (read-your-writes)."""

    @extend_schema(
        operation_id="rindle_daemon_session_query",
        summary="Read in a mutation session",
        request=SessionQueryRequest,
        responses={200: SqlReadResponse, **_errors(400, 401, 403, 409, 410)},
    )
    def post(self, request):
        data = self.validated(SessionQueryRequest)
        engine = get_engine()
        (st,) = statements_of([data], engine.vendor)
        answer = self.run(
            self.registry().execute, self.principal(), data["sessionId"], self.op(), [st]
        )
        return Response(_answer_rows(answer))


class SessionCommitView(SessionView):
    """``POST /mutate-session/commit``: apply the session with its lmid, or nothing."""

    @extend_schema(
        operation_id="rindle_daemon_session_commit",
        summary="Commit a mutation session",
        request=SessionRefRequest,
        responses={200: SqlTxnResponse, **_errors(400, 401, 403, 409, 410, 503)},
    )
    def post(self, request):
        data = self.validated(SessionRefRequest)
        registry = self.registry()
        txn = registry._find(self.principal(), data["sessionId"])
        answer = self.run(registry.commit, self.principal(), data["sessionId"], self.op())
        body = answer.body
        if "absorbed" in body:
            return Response(body["absorbed"])
        hooks = getattr(txn, "hooks", None)
        receipt = client_receipt(None, None, body["cv"], True)
        if hooks is not None:
            receipt = client_receipt(*hooks[2], body["cv"], True)
        return Response(receipt)


class SessionRollbackView(SessionView):
    """``POST /mutate-session/rollback``: drop the session; nothing was applied."""

    @extend_schema(
        operation_id="rindle_daemon_session_rollback",
        summary="Roll back a mutation session",
        request=SessionRefRequest,
        responses={200: None, **_errors(400, 401, 403, 410)},
    )
    def post(self, request):
        data = self.validated(SessionRefRequest)
        self.run(self.registry().rollback, self.principal(), data["sessionId"], self.op())
        return Response({"rolledBack": True})
