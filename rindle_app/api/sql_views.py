"""
Public SQL over HTTP (``/v1/sql/*``): one-shot statements, atomic batches and
interactive transactions, with retained outcomes a retry replays (see
``rindle_app.engine.public_sql`` for the rules).

Callers: bearer tokens with the ``sql`` scope (writes limited to the tables the
adapter allows, by default the token's ``tables``) and signed-in staff. Every
error is ``{"error": {code, message, retryable, retry_scope, transaction_state,
statement_index, partial_results, ...}}``; a replayed answer carries the header
``Rindle-Outcome: replayed``.
"""

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.response import Response

from ..conf import rindle_settings
from ..engine import get_engine
from ..engine.public_sql import (
    Principal,
    SqlError,
    parse_statements,
    protocol_error,
    run_once,
    transactions,
)
from ..exceptions import SQL_DISABLED, to_response
from ..models import RindleToken
from .errors import exception_handler
from .permissions import TokenHasScope
from .views import RindleView

REPLAY_HEADER = "Rindle-Outcome"
CONSISTENCY = ("session", "strong", "eventual")
ISOLATION = ("serializable",)
READ_FIELDS = ("default_consistency", "consistency", "session_cursor")


# --- bodies (for the OpenAPI document; the engine validates) -----------------------------


class SqlStatement(serializers.Serializer):
    sql = serializers.CharField(help_text="One statement; placeholders ? or :name.")
    args = serializers.JSONField(
        required=False,
        help_text="A list (for ?) or an object (for :name) of JSON scalars or tagged values "
        '{"$rindle": "i64" | "float", "value": "..."}.',
    )
    want_rows = serializers.BooleanField(required=False, default=True)


class ExecuteRequest(serializers.Serializer):
    statement = SqlStatement()
    idempotency_key = serializers.CharField(
        required=False,
        max_length=255,
        help_text="A retry with the same key and request replays the stored answer.",
    )
    consistency = serializers.ChoiceField(CONSISTENCY, required=False)


class BatchRequest(serializers.Serializer):
    statements = SqlStatement(many=True, help_text="Run in order, all or nothing.")
    idempotency_key = serializers.CharField(required=False, max_length=255)
    consistency = serializers.ChoiceField(CONSISTENCY, required=False)


class SqlColumn(serializers.Serializer):
    name = serializers.CharField()
    decltype = serializers.CharField(allow_null=True)


class SqlResult(serializers.Serializer):
    columns = SqlColumn(many=True)
    rows = serializers.ListField(child=serializers.ListField(), allow_null=True)
    rows_affected = serializers.IntegerField()
    last_insert_rowid = serializers.JSONField(allow_null=True)
    rows_read = serializers.IntegerField()
    rows_written = serializers.IntegerField()
    rows_elided = serializers.BooleanField(
        required=False, help_text="A replay of an answer too large to keep whole."
    )


class ExecuteResponse(serializers.Serializer):
    result = SqlResult()
    cv = serializers.IntegerField(allow_null=True, help_text="Commit version; null for reads.")
    commit_cursor = serializers.CharField(allow_null=True)
    results_elided = serializers.BooleanField(required=False)


class BatchResponse(serializers.Serializer):
    results = SqlResult(many=True)
    cv = serializers.IntegerField(allow_null=True)
    commit_cursor = serializers.CharField(allow_null=True)
    results_elided = serializers.BooleanField(required=False)


class BeginRequest(serializers.Serializer):
    read_only = serializers.BooleanField(required=False, default=False)
    isolation = serializers.ChoiceField(ISOLATION, required=False)


class BeginResponse(serializers.Serializer):
    transaction_id = serializers.CharField()
    read_only = serializers.BooleanField()
    idle_timeout_ms = serializers.IntegerField()


class TransactionExecuteRequest(serializers.Serializer):
    operation_id = serializers.CharField(help_text="Unique in the transaction; reuse to retry.")
    statement = SqlStatement(required=False)
    statements = SqlStatement(many=True, required=False)


class TransactionExecuteResponse(serializers.Serializer):
    results = SqlResult(many=True)


class OperationRequest(serializers.Serializer):
    operation_id = serializers.CharField(help_text="Reuse it to retry: the outcome is replayed.")


class CommitResponse(serializers.Serializer):
    committed = serializers.BooleanField()
    results = SqlResult(many=True)
    cv = serializers.IntegerField(allow_null=True)
    commit_cursor = serializers.CharField(allow_null=True)
    results_elided = serializers.BooleanField(required=False)


class RollbackResponse(serializers.Serializer):
    rolled_back = serializers.BooleanField()


class SqlErrorDetail(serializers.Serializer):
    code = serializers.CharField(
        help_text="PROTOCOL_ERROR, VALUE_UNSUPPORTED, SQL_ERROR, CONSTRAINT_VIOLATION, "
        "DDL_FORBIDDEN, STATEMENT_UNSUPPORTED, WRITE_FORBIDDEN, READ_FORBIDDEN, "
        "FUNCTION_FORBIDDEN, RESULT_TOO_LARGE, STATEMENT_TIMEOUT (408), LOCK_TIMEOUT (408), "
        "SANDBOX_MISSING (503), SQL_DISABLED (404), IDEMPOTENCY_KEY_REUSED, OPERATION_ID_REUSED, "
        "TRANSACTION_CONFLICT, TRANSACTION_EXPIRED, TRANSACTION_CLOSED, "
        "TRANSACTION_READ_ONLY, TRANSACTION_TOO_LARGE, TRANSACTION_BUSY, "
        "TOO_MANY_TRANSACTIONS, or an authentication/availability code."
    )
    message = serializers.CharField()
    retryable = serializers.BooleanField()
    retry_scope = serializers.ChoiceField(["request", "transaction", "closure", "never"])
    transaction_state = serializers.ChoiceField(["open", "closed", "unknown"])
    statement_index = serializers.IntegerField(allow_null=True)
    partial_results = serializers.JSONField(allow_null=True)


class SqlErrorResponse(serializers.Serializer):
    error = SqlErrorDetail()


def _errors(*statuses):
    return {status: OpenApiResponse(SqlErrorResponse) for status in statuses}


# --- errors and access -----------------------------------------------------------------


def sql_exception_handler(exc, context):
    """The shared error shape, completed with the public SQL envelope's fields."""
    if isinstance(exc, exceptions.ParseError):
        exc = protocol_error(f"the body is not valid JSON: {exc.detail}")
    if isinstance(exc, SqlError):
        return to_response(exc)
    response = exception_handler(exc, context)
    if response is None:
        return None
    error = response.data.get("error") if isinstance(response.data, dict) else None
    if isinstance(error, dict):
        retryable = bool(error.get("retryable", response.status_code >= 500))
        error.setdefault("retryable", retryable)
        error.setdefault("retry_scope", "request" if retryable else "never")
        error.setdefault("transaction_state", "unknown")
        error.setdefault("statement_index", None)
        error.setdefault("partial_results", None)
    return response


class SqlAccess(TokenHasScope):
    """A token with the ``sql`` scope, or a signed-in staff user."""

    message = "Public SQL takes a token with the sql scope, or a staff session."

    def has_permission(self, request, view):
        if isinstance(request.auth, RindleToken):
            return super().has_permission(request, view)
        user = request.user
        return bool(user and user.is_authenticated and user.is_staff)


class SqlView(RindleView):
    required_scope = "sql"
    permission_classes = [SqlAccess]

    def get_exception_handler(self):
        return sql_exception_handler

    def initial(self, request, *args, **kwargs):
        if not rindle_settings.SQL_ENABLED:
            raise SqlError("public SQL is not enabled here", code=SQL_DISABLED, status=404)
        super().initial(request, *args, **kwargs)

    def principal(self):
        token = self.request.auth if isinstance(self.request.auth, RindleToken) else None
        return Principal(self.request.user, token)

    def body(self, allowed, required=()):
        data = self.request.data
        if self.request.stream is None or not isinstance(data, dict):
            raise protocol_error("the body must be a JSON object")
        unknown = sorted(set(data) - set(allowed))
        if unknown:
            raise protocol_error(f"unknown field(s) {unknown}")
        missing = [k for k in required if k not in data]
        if missing:
            raise protocol_error(f"missing field(s) {missing}")
        for name, choices in (("consistency", CONSISTENCY), ("default_consistency", CONSISTENCY)):
            if name in data and data[name] not in choices:
                raise protocol_error(f"{name} must be one of {list(choices)}")
        return data

    @staticmethod
    def answer(answer):
        response = Response(answer.body, status=answer.status)
        if answer.replayed:
            response[REPLAY_HEADER] = "replayed"
        return response


# --- routes -----------------------------------------------------------------------------------


class ExecuteView(SqlView):
    """``POST /v1/sql/execute``: one statement; a write commits on its own."""

    @extend_schema(
        operation_id="rindle_sql_execute",
        summary="Execute one SQL statement",
        request=ExecuteRequest,
        responses={200: ExecuteResponse, **_errors(400, 401, 403, 408, 409, 503)},
    )
    def post(self, request):
        data = self.body(("statement", "idempotency_key", *READ_FIELDS), ("statement",))
        engine = get_engine()
        statements = parse_statements(data["statement"], engine.vendor, many=False)
        return self.answer(
            run_once(engine, self.principal(), "execute", statements, data.get("idempotency_key"))
        )


class BatchView(SqlView):
    """``POST /v1/sql/batch``: statements in order, in one transaction, all or nothing."""

    @extend_schema(
        operation_id="rindle_sql_batch",
        summary="Execute SQL statements atomically",
        request=BatchRequest,
        responses={200: BatchResponse, **_errors(400, 401, 403, 408, 409, 503)},
    )
    def post(self, request):
        data = self.body(("statements", "idempotency_key", *READ_FIELDS), ("statements",))
        engine = get_engine()
        statements = parse_statements(data["statements"], engine.vendor)
        return self.answer(
            run_once(engine, self.principal(), "batch", statements, data.get("idempotency_key"))
        )


class TransactionsView(SqlView):
    """``POST /v1/sql/transactions``: begin an interactive transaction."""

    @extend_schema(
        operation_id="rindle_sql_begin",
        summary="Begin an interactive SQL transaction",
        request=BeginRequest,
        responses={200: BeginResponse, **_errors(400, 401, 403, 503)},
    )
    def post(self, request):
        data = self.body(("read_only", "isolation", *READ_FIELDS))
        isolation = data.get("isolation")
        if isolation is not None and isolation not in ISOLATION:
            raise protocol_error(f"isolation must be one of {list(ISOLATION)}")
        engine = get_engine()
        began = transactions(engine).begin(self.principal(), data.get("read_only", False))
        return Response(began)


class TransactionExecuteView(SqlView):
    """``POST /v1/sql/transactions/{id}/execute``: statements inside the transaction."""

    @extend_schema(
        operation_id="rindle_sql_transaction_execute",
        summary="Execute statements in a transaction",
        request=TransactionExecuteRequest,
        responses={200: TransactionExecuteResponse, **_errors(400, 401, 403, 404, 408, 409, 503)},
    )
    def post(self, request, transaction_id):
        data = self.body(("operation_id", "statement", "statements"), ("operation_id",))
        if ("statement" in data) == ("statements" in data):
            raise protocol_error("send exactly one of statement and statements")
        engine = get_engine()
        if "statement" in data:
            statements = parse_statements(data["statement"], engine.vendor, many=False)
        else:
            statements = parse_statements(data["statements"], engine.vendor)
        registry = transactions(engine)
        return self.answer(
            registry.execute(self.principal(), transaction_id, data["operation_id"], statements)
        )


class TransactionCommitView(SqlView):
    """
    ``POST /v1/sql/transactions/{id}/commit``: apply the transaction, or nothing. A
    retry with the same ``operation_id`` replays the outcome, from any process.
    """

    @extend_schema(
        operation_id="rindle_sql_transaction_commit",
        summary="Commit a transaction",
        request=OperationRequest,
        responses={200: CommitResponse, **_errors(400, 401, 403, 404, 408, 409, 503)},
    )
    def post(self, request, transaction_id):
        data = self.body(("operation_id",), ("operation_id",))
        registry = transactions(get_engine())
        return self.answer(registry.commit(self.principal(), transaction_id, data["operation_id"]))


class TransactionRollbackView(SqlView):
    """``POST /v1/sql/transactions/{id}/rollback``: drop the transaction."""

    @extend_schema(
        operation_id="rindle_sql_transaction_rollback",
        summary="Roll back a transaction",
        request=OperationRequest,
        responses={200: RollbackResponse, **_errors(400, 401, 403, 404, 409)},
    )
    def post(self, request, transaction_id):
        data = self.body(("operation_id",), ("operation_id",))
        registry = transactions(get_engine())
        return self.answer(
            registry.rollback(self.principal(), transaction_id, data["operation_id"])
        )
