"""Public SQL runs: statements on a read-only connection or the writer, and one-shot requests."""

import hashlib
import json
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice

from django.db import DatabaseError, IntegrityError, connections

from ...conf import rindle_settings
from ...exceptions import (
    SQL_CONSTRAINT_VIOLATION,
    SQL_IDEMPOTENCY_KEY_REUSED,
    SQL_RESULT_TOO_LARGE,
    SQL_WRITE_FORBIDDEN,
)
from .. import outcomes
from ..capture import OUTBOX
from ..errors import RindleError, Unavailable
from ..writer import is_infrastructure_error
from . import sandbox
from .guards import SqliteGuard, _pg_check_effects, _pg_state, _pg_written, writer_deadline
from .statements import SqlError, encode_value, identity, protocol_error

MAX_KEY_LENGTH = 255


# --- running one statement ------------------------------------------------------------------


def _failure(exc, index, guard=None, state="closed", keyword=None):
    """The SqlError of a database exception, or None for an infrastructure failure."""
    if guard is not None and guard.denied is not None:
        return guard.denied.at(index, state)
    if isinstance(exc, SqlError):
        return exc.at(index, state)
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None)
    refused = sandbox.refusal(cause, keyword)
    if refused is not None:
        return refused.at(index, state)
    if sqlstate == "25006":  # read_only_sql_transaction: a function tried to write
        return SqlError(
            "the statement writes, through a function, on a read-only connection",
            code=SQL_WRITE_FORBIDDEN,
            status=403,
        ).at(index, state)
    if not isinstance(exc, DatabaseError) or is_infrastructure_error(exc):
        return None
    extra = {}
    if sqlstate:
        extra["sqlstate"] = sqlstate
    code = getattr(cause, "sqlite_errorcode", None)
    if code is not None:
        extra["sqlite_code"] = code
    if isinstance(exc, IntegrityError):
        error = SqlError(str(exc), code=SQL_CONSTRAINT_VIOLATION, status=409, **extra)
    else:
        error = SqlError(str(exc) or type(exc).__name__, **extra)
    return error.at(index, state)


def _cursor(raw, vendor):
    """
    A driver cursor. On PostgreSQL one that binds on the server (Django's binds on
    the client): with ``binary=True`` it uses the extended protocol, which refuses a
    second statement in the text.
    """
    if vendor == "postgresql":
        import psycopg

        return psycopg.Cursor(raw)
    return raw.cursor()


def _execute(raw, vendor, st, writes, stream=False):
    """
    Run ``st`` on driver connection ``raw``; its result (``writes``: it may write).
    ``stream`` (PostgreSQL, on the read-only connection only): fetch row by row,
    cancelled as soon as a cap is passed, so a large answer is refused before it is
    all in memory.
    """
    cur = _cursor(raw, vendor)
    streamed = None
    try:
        first = []
        if stream and vendor == "postgresql":
            streamed = cur.stream(st.driver_sql, st.args, binary=True)
            first = list(islice(streamed, 1))
            take = lambda n: list(islice(streamed, n))  # noqa: E731
        if not first:
            # Not streamed, or streamed to no row: psycopg then has no description, and
            # the read-only snapshot gives the same empty answer again.
            if vendor == "postgresql":
                # binary=True forces the extended protocol: one statement only.
                cur.execute(st.driver_sql, st.args, binary=True)
            else:
                cur.execute(st.driver_sql, st.args or ())
            take = cur.fetchmany
        rows, columns = [], []
        if cur.description is not None:
            columns = [_column(raw, vendor, d) for d in cur.description]
            rows = _fetch(first, take)
        affected = max(cur.rowcount, 0) if writes else 0
        last = cur.lastrowid if vendor == "sqlite" and affected else None
    finally:
        if streamed is not None:
            streamed.close()
        cur.close()
    return {
        "columns": columns,
        "rows": rows,
        "rows_affected": affected,
        "last_insert_rowid": encode_value(last),
        "rows_read": len(rows),
        "rows_written": affected,
    }


def _fetch(first, take):
    """
    The encoded rows ``first`` then ``take(n)`` give, refused as soon as they pass the
    row or byte cap.
    """
    limit = int(rindle_settings.SQL_MAX_RESULT_ROWS)
    byte_limit = int(rindle_settings.SQL_MAX_RESULT_BYTES)
    rows, size, chunk = [], 0, first
    while True:
        if not chunk:
            chunk = take(min(256, limit + 1 - len(rows)))
            if not chunk:
                return rows
        chunk = [[encode_value(v) for v in row] for row in chunk]
        rows.extend(chunk)
        if len(rows) > limit:
            raise SqlError(
                f"the statement returns more than {limit} rows", code=SQL_RESULT_TOO_LARGE
            )
        size += len(json.dumps(chunk, separators=(",", ":")))
        if size > byte_limit:
            raise SqlError(
                f"the statement returns more than {byte_limit} bytes", code=SQL_RESULT_TOO_LARGE
            )
        chunk = None


def _column(raw, vendor, d):
    decltype = None
    if vendor == "postgresql":
        info = raw.adapters.types.get(d.type_code)
        decltype = info.name if info is not None else None
    return {"name": d[0], "decltype": decltype}


def shown(result, st):
    """``result`` as answered for ``st`` (rows dropped unless wanted)."""
    return result if st.want_rows else {**result, "rows": []}


def fingerprint(result):
    """What a commit must reproduce of a statement's answer."""
    text = json.dumps(
        [result["columns"], result["rows"], result["rows_affected"], result["last_insert_rowid"]],
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode()).hexdigest()


# --- the read-only connection --------------------------------------------------------------


class Reader:
    """
    The read-only side of one request: the thread's own database connection (a new
    one when the thread is inside a transaction), switched to read-only for the
    duration. Everything runs in one snapshot that is rolled back at the end, so
    nothing a statement does, a setting included, outlives it.
    """

    def __init__(self, using, principal):
        self.using = using
        self.principal = principal
        self.conn = None
        self.raw = None
        self.fresh = False
        self.vendor = connections[using].vendor
        self._schema = None

    def __enter__(self):
        own = connections[self.using]
        self.fresh = own.in_atomic_block
        self.conn = connections.create_connection(self.using) if self.fresh else own
        try:
            self.conn.ensure_connection()
            self.raw = self.conn.connection
            if self.vendor == "sqlite":
                self.raw.execute("PRAGMA query_only = ON")
                self.raw.execute("BEGIN")
            else:
                self.raw.execute("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ")
                idle = rindle_settings.SQL_TRANSACTION_IDLE_SECONDS
                sandbox.enter(self.using, self.raw, self.principal, idle_seconds=idle)
        except SqlError:
            self.__exit__()
            raise
        except Exception as exc:  # the driver's own errors, or Django's
            self._close()
            raise Unavailable(f"database unavailable: {exc}") from exc
        return self

    def __exit__(self, *exc):
        try:
            self.raw.execute("ROLLBACK")
            if self.vendor == "postgresql":
                sandbox.release_session_locks(self.raw)
            if self.vendor == "sqlite":
                self.raw.set_authorizer(None)
                self.raw.execute("PRAGMA query_only = OFF")
        except Exception:
            self._close()  # Django reconnects the thread's connection on next use
            return False
        if self.fresh:
            self._close()
        return False

    def _close(self):
        try:
            self.conn.close()
        except Exception:
            pass

    def cursor(self):
        return _cursor(self.raw, self.vendor)

    @property
    def schema(self):
        if self._schema is None and self.vendor == "postgresql":
            with self.raw.cursor() as cur:
                cur.execute("SELECT current_schema()")
                self._schema = cur.fetchone()[0]
        return self._schema

    def classify(self, st):
        """The tables ``st`` writes (empty: a read), refusing what it may not touch."""
        try:
            if self.vendor == "sqlite":
                guard = SqliteGuard(self.principal, allow_writes=True)
                with guard.installed(self.raw):
                    try:
                        self.raw.execute("EXPLAIN " + st.driver_sql, st.args or ()).fetchall()
                    except Exception as exc:
                        raise self._error(exc, st, guard) from None
                return guard.writes
            with self.cursor() as cur:
                self.raw.execute("SAVEPOINT rindle_classify")
                try:
                    cur.execute(
                        "EXPLAIN (FORMAT JSON, VERBOSE) " + st.driver_sql, st.args, binary=True
                    )
                    plan = cur.fetchone()[0]
                except Exception as exc:
                    self.raw.execute("ROLLBACK TO SAVEPOINT rindle_classify")
                    raise self._error(exc, st) from None
            if isinstance(plan, (str, bytes)):
                plan = json.loads(plan)
            # The plan only routes the statement (to the writer or not); what it may read
            # and write the sandbox role's privileges decide, when it is planned and run.
            return _pg_written(plan)
        except RindleError:
            raise
        except Exception as exc:
            raise self._error(exc, st) from None

    def run(self, st):
        """Run read statement ``st`` here; its result."""
        guard = None
        if self.vendor == "sqlite":
            guard = SqliteGuard(self.principal, allow_writes=False)
        else:
            self.raw.execute("SAVEPOINT rindle_read")
        try:
            with _guarded(guard, self.raw):
                return _execute(self.raw, self.vendor, st, writes=False, stream=True)
        except Exception as exc:
            if self.vendor == "postgresql":
                self.raw.execute("ROLLBACK TO SAVEPOINT rindle_read")
            raise self._error(exc, st, guard) from None

    def _error(self, exc, st, guard=None):
        wrapped = _wrap_driver_error(self.conn, exc)
        error = _failure(wrapped, st.index, guard, keyword=st.keyword)
        if error is None:
            return Unavailable(f"database unavailable: {exc}")
        return error


def _guarded(guard, raw, deadline=None):
    """The SQLite guard's authorizer and time budget on ``raw`` (nothing on PostgreSQL)."""
    return nullcontext() if guard is None else guard.installed(raw, deadline)


def _wrap_driver_error(conn, exc):
    """A driver exception as Django's (so it classifies like the writer's)."""
    if isinstance(exc, (SqlError, DatabaseError)):
        return exc
    try:
        with conn.wrap_database_errors:
            raise exc
    except Exception as wrapped:
        return wrapped


# --- running on the writer ----------------------------------------------------------------


class _Run:
    """Statements executed in a writer transaction, guarded; collects their results."""

    def __init__(self, tx, principal):
        self.tx = tx
        self.principal = principal
        self.vendor = tx.vendor
        self.raw = tx.connection.connection
        self._schema = None
        self._deadline = writer_deadline() if self.vendor == "sqlite" else None

    def statements(self, statements, writes, state="closed"):
        return [self.one(st, w, state) for st, w in zip(statements, writes)]

    def one(self, st, writes, state="closed"):
        """Run ``st`` (``writes``: classified as writing); its result."""
        tx = self.tx
        guard = None
        if self.vendor == "sqlite":
            guard = SqliteGuard(self.principal, allow_writes=True)
        else:
            before = _pg_state(self.raw)
        try:
            with _guarded(guard, self.raw, self._deadline):
                with tx.connection.wrap_database_errors:
                    if guard is None:
                        sandbox.enter(tx.connection.alias, self.raw, self.principal, savepoint=True)
                    result = _execute(self.raw, self.vendor, st, writes=bool(writes))
                    if guard is None:
                        sandbox.leave(self.raw, savepoint=True)
            if guard is not None:
                if not guard.inserted:
                    result["last_insert_rowid"] = None
            else:
                _pg_check_effects(before, _pg_state(self.raw), self.principal, self.schema)
            return result
        except Exception as exc:
            if guard is None:
                sandbox.abandon(self.raw)
            error = _failure(exc, st.index, guard, state, keyword=st.keyword)
            if error is None:
                raise
            raise error from None

    @property
    def schema(self):
        if self._schema is None:
            self._schema = self.tx.scalar("SELECT current_schema()")
        return self._schema

    def cv(self):
        return self.tx.scalar(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")


def commit_cursor(cv):
    return None if cv is None else f"w:{cv:016x}"


# --- one-shot execute and batch ------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """An HTTP-ready answer: status, body, and whether it replays a stored outcome."""

    status: int
    body: dict
    replayed: bool = False


def run_once(engine, principal, route, statements, idempotency_key=None):
    """
    ``/v1/sql/execute`` (``route="execute"``, one statement) or ``/v1/sql/batch``
    (all statements atomically, in order). With ``idempotency_key``, a request that
    writes stores its answer with its effects; a retry with the same key and the same
    request replays it, the same key with another request is refused (409). A failed
    request writes nothing, its outcome included.
    """
    if idempotency_key is not None:
        _check_key(idempotency_key, "idempotency_key")
    ident = identity(route, statements)
    key = None if idempotency_key is None else f"once:{principal.key}:{idempotency_key}"
    if key is not None:
        found = _stored(engine, key)
        if found is not None:
            return _replay(found, ident, SQL_IDEMPOTENCY_KEY_REUSED)
    with Reader(engine.using, principal) as reader:
        writes = [reader.classify(st) for st in statements]
        if not any(writes):
            results = [shown(reader.run(st), st) for st in statements]
            return Answer(200, _body(route, results, None))

    def apply(tx):
        now = outcomes.now_ms()
        if key is not None:
            outcomes.lock(tx, key)
            found = outcomes.read_in(tx, key, now)
            if found is not None:
                return found, True
        run = _Run(tx, principal)
        results = [shown(r, st) for r, st in zip(run.statements(statements, writes), statements)]
        body = _body(route, results, run.cv())
        record = {"owner": principal.key, "identity": ident, "status": 200, "body": body}
        if key is not None:
            outcomes.store(tx, key, record, now)
        return record, False

    record, replayed = engine.write(apply, alone=True).value
    if replayed:
        return _replay(record, ident, SQL_IDEMPOTENCY_KEY_REUSED)
    return Answer(record["status"], record["body"])


def _body(route, results, cv):
    if route == "execute":
        return {"result": results[0], "cv": cv, "commit_cursor": commit_cursor(cv)}
    return {"results": results, "cv": cv, "commit_cursor": commit_cursor(cv)}


def _check_key(value, name):
    if not isinstance(value, str) or not value or len(value) > MAX_KEY_LENGTH:
        raise protocol_error(f"{name} must be a non-empty string of at most {MAX_KEY_LENGTH} chars")


def _stored(engine, key):
    try:
        return outcomes.stored(engine.using, key)
    except DatabaseError as exc:
        raise Unavailable(f"database unavailable: {exc}") from exc


def _replay(record, ident, code):
    if record.get("identity") != ident:
        raise SqlError(
            "this key already answered a different request",
            code=code,
            status=409,
            transaction_state="closed",
        )
    return Answer(record["status"], record["body"], replayed=True)
