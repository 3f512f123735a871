"""
Every error rindle reports: the base class, the public error classes, and every
code as a constant, registered in ONE table (``CODES``) with its HTTP status, its
retryable default and the protocol frame it travels in.

Two functions map an error to the wire, and every transport uses them:
``to_response(exc)`` (a DRF ``Response`` with the envelope
``{"error": {"code", "message", ...}}``) and ``to_frame(exc, query_id=None, **extra)``
(the text of an ``error`` or ``queryError`` frame, DESIGN §5).

The public SQL plane (``/v1/sql/*``, ``SqlError``) has UPPERCASE codes and a richer
envelope by contract (the original's: ``retry_scope``, ``transaction_state``,
``statement_index``, ``partial_results``); its codes are registered here too, with
``plane="sql"``, and ``api.sql_views`` completes its envelope.

``docs/reference/errors.md`` is generated from ``CODES``
(``python manage.py rindle_docs_errors``); a test checks that it is current.
This module imports nothing from rindle, so every package may import it. It is a
little over 600 lines on purpose: the whole vocabulary, table and classes, in one place.
"""

import inspect
import json
from dataclasses import dataclass

FRAME_ERROR = "error"
FRAME_QUERY_ERROR = "queryError"
RETRY_AFTER_SECONDS = 1  # the Retry-After of a retryable ``Unavailable``


@dataclass(frozen=True)
class Code:
    """One error code: its HTTP status, retryable default and the frames it travels in."""

    code: str
    status: int
    retryable: bool
    frames: tuple
    plane: str
    doc: str


CODES = {}


def _code(code, status=400, doc="", *, retryable=False, frames=(FRAME_ERROR,), plane="app"):
    if code in CODES:
        raise ValueError(f"error code {code!r} is registered twice")
    CODES[code] = Code(code, status, retryable, tuple(frames), plane, doc)
    return code


_HTTP = ()  # an HTTP-only code: it never travels in a frame
_Q = (FRAME_QUERY_ERROR,)
_BOTH = (FRAME_ERROR, FRAME_QUERY_ERROR)


def _http(code, status=400, doc="", **kwargs):
    return _code(code, status, doc, frames=_HTTP, **kwargs)


def _query(code, status=400, doc="", **kwargs):
    return _code(code, status, doc, frames=_Q, **kwargs)


# --- generic -------------------------------------------------------------------------
ERROR = _code("error", 400, "An error without a more specific code.")
INVALID_INPUT = _code("invalid_input", 400, "The request is malformed; nothing was written.")
INVALID_REQUEST = _http("invalid_request", 400, "The body failed validation.")
NOT_FOUND = _http("not_found", 404, "The thing asked for does not exist.")
INTERNAL_ERROR = _code(
    "internal_error", 500, "The server's own code failed (logged); the caller is answered."
)
UNSUPPORTED = _code("unsupported", 400, "Valid, but not something rindle does.", frames=_BOTH)
UNAUTHORIZED = _code("unauthorized", 403, "Not allowed (scope, read rule, lease).", frames=_BOTH)
INSUFFICIENT_SCOPE = _http("insufficient_scope", 403, "The token lacks the route's scope.")
NOT_SUPERUSER = _http("not_superuser", 403, "The route needs a superuser.")
THROTTLED = _http("throttled", 429, "DRF's throttling refused the request.", retryable=True)
METRICS_FORBIDDEN = _http("metrics_forbidden", 403, "GET /metrics without its bearer token.")

# --- the engine ----------------------------------------------------------------------
UNKNOWN_TABLE = _code("unknown_table", 400, "The table is not registered (or does not exist).")
NO_PRIMARY_KEY = _http("no_primary_key", 400, "The table has no primary key.")
UNKNOWN_COLUMN = _code("unknown_column", 400, "The column is not the table's.")
INVALID_ROW = _code("invalid_row", 400, "A row is not an object of the table's columns.")
INVALID_KEY = _code("invalid_key", 400, "A key does not name exactly the primary key.")
NESTED_WRITE = _code("nested_write", 400, "A write request tried to start another write.")
CALLER_HOLDS_WRITE_LOCK = _code(
    "caller_holds_write_lock", 400, "The calling thread holds SQLite's write lock."
)
UNAVAILABLE = _code("unavailable", 503, "The database failed; nothing was written.", retryable=True)
TIMEOUT = _code(
    "timeout", 503, "The write did not complete in time; it may still commit.", retryable=True
)
ENGINE_CLOSED = _code("engine_closed", 503, "The engine is shutting down.", retryable=True)
OVERLOADED = _code("overloaded", 503, "The writer's queue is full.", retryable=True)

# --- client mutations ----------------------------------------------------------------
MID_GAP = _code("mid_gap", 409, "The mutation id skipped past the stored lmid + 1.")
CLIENT_ID_TAKEN = _code("client_id_taken", 403, "The client id belongs to another principal.")
ANONYMOUS_MUTATIONS_DISABLED = _code(
    "anonymous_mutations_disabled", 403, "A mutation from nobody, where that is not allowed."
)
INVALID_CLIENT_ID = _code("invalid_client_id", 400, "The envelope's clientID is unusable.")
INVALID_MID = _code("invalid_mid", 400, "The envelope's mid is not a positive integer.")
INVALID_NAME = _code("invalid_name", 400, "The envelope's name is not a non-empty string.")
INVALID_ARGS = _code("invalid_args", 400, "The arguments are not valid.", frames=_BOTH)
ARGS_TOO_LARGE = _code("args_too_large", 400, "The arguments exceed MAX_ARGS_BYTES.")
REJECTED = _http("rejected", 200, "A mutator rejected the mutation (an outcome, not an error).")
INTEGRITY_ERROR = _http(
    "integrity_error", 200, "A mutator broke a constraint (a rejected outcome)."
)
DATA_ERROR = _http("data_error", 200, "A mutator wrote an unusable value (a rejected outcome).")
MUTATOR_ERROR = _http("mutator_error", 200, "A mutator raised (logged; a rejected outcome).")
UNKNOWN_MUTATOR = _http("unknown_mutator", 200, "No mutator has the name (a rejected outcome).")
PERMISSION_DENIED = _http(
    "permission_denied",
    200,
    "A permission class of the mutator refused it (a rejected outcome; the mid is consumed).",
)
MUTATION_RESULT_INVALID = _http(
    "mutation_result_invalid",
    200,
    "A mutator returned a value that is not JSON or exceeds MAX_MUTATION_RESULT_BYTES "
    "(a rejected outcome; its writes are rolled back).",
)

# --- room hosts ----------------------------------------------------------------------
ROOM_REJECTED = _http("room_rejected", 200, "A room mutator rejected the mutation (an outcome).")
ROOM_CLOSED = _code(
    "room_closed",
    409,
    "The room host was fenced or closed; reconnect to the current host.",
    retryable=True,
)
ROOM_BUSY = _code(
    "room_busy", 503, "The room host holds ROOM_MAX_PENDING unflushed mutations.", retryable=True
)

# --- named queries, live queries and websocket limits --------------------------------
UNKNOWN_QUERY = _query("unknown_query", 404, "No named query has the name.")
INVALID_QUERY = _query(
    "invalid_query", 500, "A named query built an AST the engine cannot build (a server bug)."
)
LEASE_EXPIRED = _query(
    "lease_expired", 401, "The lease expired; ask for a new one.", retryable=True
)
LEASE_PRINCIPAL_MISMATCH = _query(
    "lease_principal_mismatch", 403, "The lease was minted for someone else."
)
TOO_MANY_SUBSCRIPTIONS = _query(
    "too_many_subscriptions", 400, "The socket holds WS_MAX_SUBSCRIPTIONS."
)
FOOTPRINT_TOO_LARGE = _query(
    "footprint_too_large", 400, "The socket's rows exceed WS_MAX_FOOTPRINT_ROWS."
)
RESULT_TOO_LARGE = _query("result_too_large", 400, "The snapshot exceeds WS_MAX_SEND_BYTES.")
BATCH_TOO_LARGE = _query(
    "batch_too_large", 400, "An increment exceeds WS_MAX_SEND_BYTES; resubscribe.", retryable=True
)
SCHEMA_CHANGED = _query(
    "schema_changed", 400, "A migration changed the query's tables; resubscribe.", retryable=True
)
FAULTED = _query(
    "faulted", 500, "The query's view failed to maintain; resubscribe.", retryable=True
)
SHED = _query(
    "shed", 503, "The server shed the subscription under load; resubscribe.", retryable=True
)

# --- websocket frames ----------------------------------------------------------------
BAD_FRAME = _code("bad_frame", 400, "The client frame is malformed; nothing changed.")
FRAME_TOO_LARGE = _code("frame_too_large", 413, "The client frame exceeds WS_MAX_FRAME_BYTES.")
RATE_LIMITED = _code("rate_limited", 429, "Too many frames (WS_RATE, WS_BURST).", retryable=True)

# --- usage ledger and quotas ---------------------------------------------------------
QUOTA_EXCEEDED = _code(
    "quota_exceeded", 429, "The namespace moved its quota of bytes.", retryable=True, frames=_BOTH
)
FLOW_INVALID_TRANSFER = _code("flow_invalid_transfer", 400, "A transfer's figures are unusable.")
FLOW_INVALID_NAMESPACE = _code("flow_invalid_namespace", 400, "The namespace is unusable.")
FLOW_INVALID_TIME = _code("flow_invalid_time", 400, "The time is not Unix milliseconds.")
FLOW_INVALID_WINDOW = _code("flow_invalid_window", 400, "The window of days is unusable.")
FLOW_INVALID_NODE = _code("flow_invalid_node", 400, "The flow node id is unusable.")
FLOW_UNKNOWN_REASON = _code("flow_unknown_reason", 400, "Not one of the ledger's reasons.")
FLOW_UNKNOWN_NAMESPACE = _http("flow_unknown_namespace", 404, "No figure of the namespace is kept.")
FLOW_FORGET_UNCONFIRMED = _http("flow_forget_unconfirmed", 400, "Forgetting needs confirm=yes.")
FLOW_STORE_UNAVAILABLE = _http(
    "flow_store_unavailable", 503, "The flow store cannot be read.", retryable=True
)

# --- producers, change sources and row changes (HTTP) --------------------------------
SEQ_GAP = _http("seq_gap", 409, "The producer's seq skipped past stored + 1.")
DIGEST_CONFLICT = _http("digest_conflict", 409, "A replayed seq carried another payload.")
PRODUCER_NOT_OWNED = _http("producer_not_owned", 403, "The producer belongs to another principal.")
INVALID_PRODUCER = _http("invalid_producer", 400, "The producer id is unusable.")
INVALID_SEQ = _http("invalid_seq", 400, "seq is not a positive integer.")
FENCED = _http("fenced", 409, "The batch's run id or room epoch is not the stored one.")
CONFLICT = _http("conflict", 409, "A room flush's CAS precondition missed; nothing was applied.")
INVALID_DOC = _http("invalid_doc", 400, "The room doc is not a non-empty string.")
INVALID_EPOCH = _http("invalid_epoch", 400, "The room epoch is not a positive integer.")
INVALID_CLIENTS = _http("invalid_clients", 400, "clients is not a list of client ids.")
UNKNOWN_ROOM = _http("unknown_room", 404, "No room profile serves the doc ('<profile>/<key>').")
HASH_MISMATCH = _http("hash_mismatch", 409, "A stored position was replayed with other content.")
INVALID_CHUNK_SEQ = _http("invalid_chunk_seq", 400, "chunk_seq is not >= -1.")
INVALID_HEAD = _http("invalid_head", 400, "head is not a small object.")
ROW_CONFLICT = _http("row_conflict", 409, "An add met an existing row.")
INVALID_CHANGES = _http("invalid_changes", 400, "changes is not a list.")
TOO_MANY_CHANGES = _http("too_many_changes", 400, "The batch holds too many.")
INVALID_CHANGE = _http("invalid_change", 400, "A change is malformed.")
INVALID_OP = _http("invalid_op", 400, "op is not add, edit or remove.")
NO_KEY = _http("no_key", 400, "A row lacks a primary key column.")
INVALID_VALUE = _http("invalid_value", 400, "A value cannot be stored.")

# --- the migration journal (HTTP) ----------------------------------------------------
MIGRATION_REFUSED = _http("migration_refused", 400, "A journal rule refused it.")
UNSUPPORTED_SYNTAX = _http(
    "unsupported_syntax", 400, "The SQL text uses syntax the journal refuses."
)
UNSUPPORTED_STATEMENT = _http("unsupported_statement", 400, "Not a supported migration statement.")
ATTACH_REFUSED = _http("attach_refused", 400, "ATTACH/DETACH are refused.")
PRAGMA_REFUSED = _http("pragma_refused", 400, "PRAGMA is refused.")
TRANSACTION_CONTROL_REFUSED = _http(
    "transaction_control_refused", 400, "BEGIN/COMMIT/... are refused."
)
RENAME_REFUSED = _http("rename_refused", 400, "RENAME is refused.")
CASCADE_REFUSED = _http("cascade_refused", 400, "DROP ... CASCADE is refused.")
RESERVED_TABLE = _http("reserved_table", 400, "The table or view is rindle's.")
TYPE_CHANGE_REFUSED = _http("type_change_refused", 400, "A column type change is refused.")
BLOB_REFUSED = _http("blob_refused", 400, "A blob column change is refused.")
REFERENCED_TABLE = _http("referenced_table", 400, "Another table references the one changed.")
CHECKSUM_MISMATCH = _http("checksum_mismatch", 409, "The id is journaled with other content.")
MIGRATION_TOO_LARGE = _http("migration_too_large", 413, "The migration exceeds a limit.")
TOO_MANY_ROW_CHANGES = _http(
    "too_many_row_changes", 413, "The migration made too many row changes."
)
STATEMENT_FAILED = _http("statement_failed", 400, "A statement failed; all was rolled back.")
INVALID_MIGRATION_ID = _http("invalid_migration_id", 400, "The id is unusable.")
INVALID_STATEMENTS = _http("invalid_statements", 400, "Not SQL text.")
EMPTY_MIGRATION = _http("empty_migration", 400, "The migration has no statements.")
MIXED_MIGRATION = _http("mixed_migration", 400, "Schema and data statements are mixed.")
ID_TAKEN = _http("id_taken", 409, "The id names a journal entry of another kind.")
KIND_MISMATCH = _http("kind_mismatch", 409, "The id is journaled as another kind.")
OVERRIDE_MISMATCH = _http("override_mismatch", 409, "The override does not match the journal.")

# --- public SQL (/v1/sql/*): UPPERCASE codes and the SQL envelope, by contract -------
_SQL = {"frames": _HTTP, "plane": "sql"}
SQL_ERROR = _code("SQL_ERROR", 400, "A public SQL request failed.", **_SQL)
SQL_DISABLED = _code("SQL_DISABLED", 404, "Public SQL is not enabled here.", **_SQL)
SQL_PROTOCOL_ERROR = _code("PROTOCOL_ERROR", 400, "The request body is malformed.", **_SQL)
SQL_VALUE_UNSUPPORTED = _code("VALUE_UNSUPPORTED", 400, "A value has no SQL form.", **_SQL)
SQL_DDL_FORBIDDEN = _code("DDL_FORBIDDEN", 400, "DDL goes through /v1/sql/migrate.", **_SQL)
SQL_STATEMENT_UNSUPPORTED = _code(
    "STATEMENT_UNSUPPORTED", 400, "This kind of statement is not accepted.", **_SQL
)
SQL_READ_ONLY = _code("READ_ONLY", 400, "A read-only statement may not write.", **_SQL)
SQL_IDEMPOTENCY_KEY_REUSED = _code(
    "IDEMPOTENCY_KEY_REUSED", 409, "The idempotency key answered another request.", **_SQL
)
SQL_READ_FORBIDDEN = _code("READ_FORBIDDEN", 403, "The table is not readable here.", **_SQL)
SQL_WRITE_FORBIDDEN = _code("WRITE_FORBIDDEN", 403, "The caller may not write it.", **_SQL)
SQL_FUNCTION_FORBIDDEN = _code("FUNCTION_FORBIDDEN", 403, "The function is not allowed.", **_SQL)
SQL_STATEMENT_TIMEOUT = _code(
    "STATEMENT_TIMEOUT", 408, "The statement ran past its budget.", **_SQL
)
SQL_LOCK_TIMEOUT = _code(
    "LOCK_TIMEOUT", 408, "The statement waited too long for a lock.", retryable=True, **_SQL
)
SQL_CONSTRAINT_VIOLATION = _code("CONSTRAINT_VIOLATION", 409, "A constraint refused it.", **_SQL)
SQL_RESULT_TOO_LARGE = _code("RESULT_TOO_LARGE", 400, "The result exceeds its limit.", **_SQL)
SQL_TRANSACTION_BUSY = _code(
    "TRANSACTION_BUSY", 409, "Another operation of the transaction runs.", retryable=True, **_SQL
)
# The original daemon's control plane (api/daemon_views.py).
DAEMON_SESSION_GONE = _http(
    "session_gone", 410, "The mutation session is finished or expired: retry the envelope."
)
PLANE_NOT_MOUNTED = _http(
    "plane_not_mounted",
    501,
    "The answer names a route of a URLconf plane the project does not include (check rindle.E041).",
)
TOO_MANY_PINS = _http(
    "too_many_pins",
    409,
    "The process keeps DAEMON_MAX_PINS pinned materializations; dematerialize one first.",
)
SQL_SANDBOX_MISSING = _code("SANDBOX_MISSING", 503, "The SQL sandbox is not usable.", **_SQL)


# The change stream (rindle_app.stream, GET /v1/stream).
LEASE_HELD = _http("lease_held", 409, "Another process holds the unexpired singleton lease.")
FENCE_TIMED_OUT = _http(
    "fence_timed_out", 503, "A watermark step waited too long for the fence.", retryable=True
)
RESNAPSHOT_REQUIRED = _code(
    "resnapshot_required",
    409,
    "The cursor cannot continue (below the horizon, another epoch, or ahead): resnapshot.",
    frames=_BOTH,
)
INVALID_CURSOR = _http("invalid_cursor", 400, "The stream cursor is malformed.")
STREAM_BUSY = _http(
    "stream_busy",
    503,
    "This server already holds STREAM_LONG_POLL_MAX_WAITERS waiting stream requests.",
    retryable=True,
)
INVALID_PARAMETER = _http(
    "invalid_parameter",
    400,
    "A query parameter (limit, wait, tables) is malformed or out of range.",
)


def status_of(code, default=400):
    """The HTTP status registered for ``code`` (``default`` for an unregistered one)."""
    entry = CODES.get(code)
    return default if entry is None else entry.status


# --- the error classes ---------------------------------------------------------------


class RindleError(Exception):
    """
    Base of every error rindle reports to a caller.

    ``code`` is stable and machine-readable; ``status`` is the HTTP status the
    transport maps it to; ``retryable`` tells a client whether the same request
    may succeed later unchanged.
    """

    code = ERROR
    status = 400
    retryable = False

    def __init_subclass__(cls, **kwargs):
        """
        A subclass that names its own registered code answers with that code's
        status and retryable default from ``CODES``, unless it states its own: the
        table stays the one place a code's status is written.
        """
        super().__init_subclass__(**kwargs)
        entry = CODES.get(cls.__dict__.get("code"))
        if entry is None:
            return
        if "status" not in cls.__dict__ and not isinstance(
            inspect.getattr_static(cls, "status"), property
        ):
            cls.status = entry.status
        if "retryable" not in cls.__dict__:
            cls.retryable = entry.retryable

    def __init__(self, message, *, code=None, **details):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details

    def as_dict(self):
        return {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
            **self.details,
        }


class InvalidInput(RindleError):
    """The request is malformed; nothing was written."""

    code = INVALID_INPUT


class UnknownTable(InvalidInput):
    """The table is not registered with the engine (or does not exist)."""

    code = UNKNOWN_TABLE


class MutationGap(RindleError):
    """A client mutation id skipped ahead of the stored lmid + 1; nothing was written."""

    code = MID_GAP

    def __init__(self, client_id, mid, lmid):
        super().__init__(
            f"client {client_id!r} sent mutation {mid} but the next expected is {lmid + 1}",
            lmid=lmid,
        )
        self.lmid = lmid


class SessionGone(RindleError):
    """A daemon mutation session is finished or expired (410); nothing more of it applies."""

    code = DAEMON_SESSION_GONE


class PlaneNotMounted(RindleError):
    """A route the answer must name is not mounted (501); nothing was done."""

    code = PLANE_NOT_MOUNTED


class TooManyPins(RindleError):
    """A new pin past ``DAEMON_MAX_PINS`` (409); nothing was pinned."""

    code = TOO_MANY_PINS


class ClientIdTaken(RindleError):
    """The client id belongs to another principal; nothing was read or written."""

    code = CLIENT_ID_TAKEN

    def __init__(self, client_id):
        super().__init__(f"client id {client_id!r} belongs to another principal")


class Unavailable(RindleError):
    """
    The request could not complete now; retry it unchanged.

    For a database failure nothing was written. For ``code=TIMEOUT`` the request
    is still queued and may commit later: a retried client mutation is absorbed by
    its mid, but a plain ``engine.write`` retried after a timeout can run twice.
    """

    code = UNAVAILABLE


class EngineClosed(Unavailable):
    """The engine is shutting down or closed."""

    code = ENGINE_CLOSED


class Overloaded(Unavailable):
    """The writer's queue is full."""

    code = OVERLOADED


class AnonymousMutationsDisabled(RindleError):
    """A client mutation from nobody, where anonymous writes are not allowed."""

    code = ANONYMOUS_MUTATIONS_DISABLED


class MutationRejected(Exception):
    """
    Raise from a mutator to reject the mutation with a reason (a business rejection).

    Not a ``RindleError``: it is an outcome the mutator chooses, recorded as
    ``rejected`` (the mid is consumed), never an error answer. ``details``, a
    JSON-able dict, travels with the outcome (``details`` of the HTTP outcome and of
    the ``mutationOutcome`` frame): for invalid arguments, DRF's field errors
    (``{"title": ["This field is required."]}``).
    """

    def __init__(self, reason, code=REJECTED, *, details=None):
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.details = details


class RoomReject(MutationRejected):
    """
    Raise from a room mutator to reject the mutation with a reason.

    Like ``MutationRejected`` (which a room host treats the same way), an outcome and
    not an error: the mid is consumed and recorded as ``rejected``. ``details``, a
    JSON-able dict, travels with its ``mutationOutcome`` frame (the durable outcome
    row keeps the reason only).
    """

    def __init__(self, reason, code=ROOM_REJECTED, *, details=None):
        super().__init__(reason, code, details=details)


class RoomClosed(RindleError):
    """The room host was fenced by a newer epoch or closed; it accepts nothing more."""

    code = ROOM_CLOSED


class RoomBusy(RindleError):
    """The room host's unflushed mutations reached ``ROOM_MAX_PENDING``; nothing changed."""

    code = ROOM_BUSY


class ProducerGap(RindleError):
    """``seq`` skipped past ``stored + 1``; nothing was written."""

    code = SEQ_GAP

    def __init__(self, producer, seq, stored):
        super().__init__(
            f"producer {producer!r} sent seq {seq} but the next expected is {stored + 1}",
            stored=stored,
        )
        self.stored = stored


class ProducerConflict(RindleError):
    """A replay of the stored ``seq`` carried a different payload; nothing was written."""

    code = DIGEST_CONFLICT


class ProducerNotOwned(RindleError):
    """The producer id belongs to another principal."""

    code = PRODUCER_NOT_OWNED


class SourceFenced(RindleError):
    """The batch's run id is not the stored one; nothing was written."""

    code = FENCED


class RoomFenced(RindleError):
    """A room flush carried an epoch that is not the doc's current one; nothing was written."""

    code = FENCED


class RoomConflict(RindleError):
    """A room flush's CAS precondition missed; the batch rolled back (``conflicts``)."""

    code = CONFLICT


class SourceHashMismatch(RindleError):
    """The stored position was replayed with different content; nothing was written."""

    code = HASH_MISMATCH


class RowConflict(RindleError):
    """An ``add`` met an existing row (or another constraint refused the batch)."""

    code = ROW_CONFLICT


class MigrationRefused(InvalidInput):
    """The migration breaks a journal rule; nothing was written."""

    code = MIGRATION_REFUSED


class MigrationConflict(RindleError):
    """The id is journaled with other content (or another kind); nothing was written."""

    code = CHECKSUM_MISMATCH


class MigrationTooLarge(MigrationRefused):
    """The migration exceeds a per-migration limit; nothing was written."""

    code = MIGRATION_TOO_LARGE


class StatementFailed(MigrationRefused):
    """A statement failed in the database; the whole migration was rolled back."""

    code = STATEMENT_FAILED


class NotFound(RindleError):
    """The thing a route names does not exist."""

    code = NOT_FOUND


class QuotaExceeded(RindleError):
    """The namespace moved its quota of bytes within the window; nothing was done."""

    code = QUOTA_EXCEEDED

    @property
    def retry_after_ms(self):
        return self.details.get("retry_after_ms", 0)


class LeaseError(RindleError):
    """A lease that cannot be used."""

    status = 403


class LeaseExpired(LeaseError):
    """The lease was valid once; ask ``POST /api/rindle/query`` for a new one."""

    code = LEASE_EXPIRED


class LeaseInvalid(LeaseError):
    """The token is not a lease this server signed (tampered, truncated, another key)."""

    code = UNAUTHORIZED


class LeasePrincipalMismatch(LeaseError):
    """A valid lease redeemed by someone other than the principal it was minted for."""

    code = LEASE_PRINCIPAL_MISMATCH


class QueryRefused(RindleError):
    """
    A named query that cannot be run: ``code`` is unknown_query, invalid_args,
    unauthorized, or internal_error (the server's own code failed; logged). Its
    status is the one ``CODES`` registers for its code.
    """

    def __init__(self, message, code):
        super().__init__(message, code=code)

    @property
    def status(self):
        return status_of(self.code)


class LimitExceeded(QueryRefused):
    """A subscribe refused by a per-socket limit (not retryable as it stands)."""

    retryable = False


class QueryError(RindleError, ValueError):
    """
    An AST the engine cannot build. ``code`` is machine-readable; ``path`` locates it.
    Over HTTP it answers 500: a named query built it, so it is the server's bug.
    """

    status = 500

    def __init__(self, message, *, code=INVALID_QUERY, path="$"):
        super().__init__(message, code=code)
        self.args = (f"{path}: {message}",)
        self.path = path

    def as_dict(self):
        return {"code": self.code, "message": str(self), "path": self.path}


class SqlError(RindleError):
    """
    A public SQL request failed; its details follow the original's envelope:
    ``retry_scope`` (``request``: send the same request again; ``transaction``: the
    same operation; ``closure``: run the whole transaction again; ``never``),
    ``transaction_state`` (``open``, ``closed`` or ``unknown``) and, when one
    statement is to blame, ``statement_index``. Its codes are the UPPERCASE ones
    (``plane="sql"``), and ``api.sql_views`` adds the SQL envelope's fields.
    """

    code = SQL_ERROR
    status = 400

    def __init__(
        self,
        message,
        *,
        code=None,
        status=None,
        retry_scope="never",
        transaction_state="closed",
        statement_index=None,
        **details,
    ):
        super().__init__(
            message,
            code=code,
            retry_scope=retry_scope,
            transaction_state=transaction_state,
            statement_index=statement_index,
            partial_results=None,
            **details,
        )
        if status is not None:
            self.status = status
        self.retryable = retry_scope == "request"

    def at(self, index, state=None):
        """This error, blamed on statement ``index`` (and ``state``, if given)."""
        self.details["statement_index"] = index
        if state is not None:
            self.details["transaction_state"] = state
        return self


# --- the two mappings ----------------------------------------------------------------


def envelope(status, code, message, headers=None, **details):
    """The DRF response ``{"error": {"code", "message", **details}}`` with ``status``."""
    from rest_framework.response import Response

    return Response(
        {"error": {"code": code, "message": message, **details}}, status=status, headers=headers
    )


def to_response(exc):
    """
    The DRF response of a ``RindleError``: its status, code and message, and:
    a ``MutationGap`` says "mutation gap" (the clients look for the words) with its
    lmid; an ``Unavailable`` carries ``Retry-After``; a ``QuotaExceeded`` carries
    ``Retry-After`` of its retry time; a ``QueryRefused`` only its code and message;
    a ``QueryError`` is a 500 (a named query built it); a ``SqlError`` keeps all of
    its envelope's fields. Others add their details that are not None.
    """
    if isinstance(exc, SqlError):  # the SQL plane's envelope keeps every field, None too
        return envelope(exc.status, exc.code, exc.message, retryable=exc.retryable, **exc.details)
    if isinstance(exc, QueryRefused):
        return envelope(exc.status, exc.code, exc.message)
    if isinstance(exc, QueryError):
        return envelope(exc.status, exc.code, str(exc))
    if isinstance(exc, MutationGap):
        return envelope(exc.status, exc.code, f"mutation gap: {exc.message}", lmid=exc.lmid)
    if isinstance(exc, Unavailable):
        headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
        return envelope(exc.status, exc.code, exc.message, headers, retryable=True)
    details = {k: v for k, v in exc.details.items() if k not in ("code", "message")}
    details = {k: v for k, v in details.items() if v is not None}
    headers = None
    if isinstance(exc, QuotaExceeded):
        headers = {"Retry-After": str(-(-exc.retry_after_ms // 1000))}
    return envelope(exc.status, exc.code, exc.message, headers, retryable=exc.retryable, **details)


def to_frame(exc, query_id=None, *, kind=None, **extra):
    """
    The text of the protocol frame that answers ``exc`` (DESIGN §5).

    ``kind`` is ``FRAME_ERROR`` or ``FRAME_QUERY_ERROR``; by default the first frame
    ``CODES`` registers for the code. An ``error`` frame is
    ``{t, message, code, queryId?, **extra}``; a ``queryError`` is
    ``{t, queryId, message, code, retryable, retryAfterMs?}``, where ``retryable``
    (default ``exc.retryable``) and ``retry_after_ms`` may come in ``extra``.
    """
    code = exc.code
    if kind is None:
        entry = CODES.get(code)
        kind = entry.frames[0] if entry is not None and entry.frames else FRAME_ERROR
    message = getattr(exc, "message", None) or str(exc)
    if kind == FRAME_QUERY_ERROR:
        frame = {"t": kind, "queryId": query_id, "message": message, "code": code}
        frame["retryable"] = extra.pop("retryable", getattr(exc, "retryable", False))
        retry_after_ms = extra.pop("retry_after_ms", None)
        if retry_after_ms is not None:
            frame["retryAfterMs"] = retry_after_ms
    else:
        frame = {"t": FRAME_ERROR, "message": message, "code": code}
        if query_id is not None:
            frame["queryId"] = query_id
    frame.update(extra)
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class LeaseHeld(RindleError):
    """Another process owns the unexpired singleton lease (the seed's ErrLeaseHeld)."""

    code = LEASE_HELD

    def __init__(self, name, holder):
        super().__init__(f"stream lease {name!r} is held by {holder!r}", holder=holder)
        self.holder = holder


class StreamBusy(Unavailable):
    """
    A waiting ``GET /v1/stream`` (a long-poll or an event stream) past
    STREAM_LONG_POLL_MAX_WAITERS in this process: nothing was read; retry after
    ``Retry-After``, or read without ``wait``.
    """

    code = STREAM_BUSY


class ResnapshotRequired(RindleError):
    """
    A stream cursor cannot continue: its next seq is below the horizon (pruned),
    it names another epoch (a restored database), or it is ahead of safe_seq.
    ``reason`` says which; the reader must resnapshot, never skip.
    """

    code = RESNAPSHOT_REQUIRED

    BELOW_HORIZON = "below_horizon"
    EPOCH_MISMATCH = "epoch_mismatch"
    AHEAD = "ahead"

    def __init__(self, reason, message, **details):
        super().__init__(message, reason=reason, **details)
        self.reason = reason
