"""
Public SQL: one-shot statements, atomic batches and interactive transactions, with
the replay of retained outcomes (the original's ``/v1/sql/*``).

Statements are ``{sql, args?, want_rows?}``; placeholders are ``?`` (``args`` a
list) or ``:name`` (``args`` an object), values JSON scalars or tagged
``{"$rindle": "i64" | "float", "value": "..."}``. Only SELECT/VALUES/WITH and
INSERT/UPDATE/DELETE (REPLACE on SQLite, MERGE on PostgreSQL) are accepted: DDL
goes through the migrations journal, and transaction control, settings, pragmas
and the like are refused.

Where a statement runs:

- A request that writes nothing runs on a read-only connection (SQLite
  ``PRAGMA query_only``, PostgreSQL ``READ ONLY`` transactions that always roll
  back), never on the writer.
- A request that writes runs in ONE writer transaction (``engine.write``), so
  captured tables reach live subscribers like any write, and its outcome, when it
  is replayable, commits in the same transaction (``engine.outcomes``).

Which tables a statement writes is read from the database, not from the text: on
SQLite an authorizer sees every write as the statement is compiled (triggers and
cascades included); on PostgreSQL the plan's ModifyTable nodes (CTEs included)
route and refuse it, and the transaction's per-table tuple counters, read around
its execution, catch writes the plan cannot show (functions, triggers). A write
may touch only tables ``RindleAdapter.authorize_sql_write`` allows, never
``_rindle_*``, ``django_*`` or ``auth_*`` (those are not readable either). On
PostgreSQL a writing statement that changes a session setting is refused too.
This is a table allow-list, not a sandbox: give untrusted callers a database
role instead.

Interactive transactions never hold the writer across requests. Each statement
is answered when it is executed (reads with no earlier write of the transaction
on a read-only connection; anything after a write by re-running the
transaction's writes in a writer transaction that is rolled back). The commit
re-runs every statement, in order, in ONE writer transaction and applies it only
if every statement gives exactly the answer the client was given (rows, counts,
last insert rowid); otherwise nothing is applied (``TRANSACTION_CONFLICT``: retry
the whole transaction). A committed transaction is therefore serializable, at its
commit. One consequence: on PostgreSQL a statement whose answer shows a value
drawn from a sequence during the transaction conflicts at commit (the sequence
moved on), so prefer client-made keys there. The commit outcome is stored with
the effects under the transaction id, so a retried commit (same ``operation_id``)
replays it, from any process; the open transactions themselves live in the
memory of the process that began them.
"""

import hashlib
import json
import math
import re
import secrets
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import date, datetime
from datetime import time as dtime
from decimal import Decimal

from django.db import DatabaseError, IntegrityError, connections

from ..adapter import get_adapter
from ..conf import rindle_settings
from . import outcomes
from .capture import OUTBOX
from .errors import RindleError, Unavailable
from .writer import is_infrastructure_error

PROTECTED_PREFIXES = ("_rindle_", "django_", "auth_", "sqlite_")
MAX_KEY_LENGTH = 255
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
SAFE_INT = 2**53 - 1
TRANSACTION_ID = re.compile(r"^tx_[0-9a-f]{32}$")
RETRY_SCOPES = ("request", "transaction", "closure", "never")


# --- errors -------------------------------------------------------------------------


class SqlError(RindleError):
    """
    A public SQL request failed; its details follow the original's envelope:
    ``retry_scope`` (``request``: send the same request again; ``transaction``: the
    same operation; ``closure``: run the whole transaction again; ``never``),
    ``transaction_state`` (``open``, ``closed`` or ``unknown``) and, when one
    statement is to blame, ``statement_index``.
    """

    code = "SQL_ERROR"
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


def protocol_error(message, index=None):
    return SqlError(message, code="PROTOCOL_ERROR", statement_index=index)


# --- values ----------------------------------------------------------------------------


def decode_value(value, where):
    """A JSON argument as a driver value; tagged values carry what JSON cannot."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        if not I64_MIN <= value <= I64_MAX:
            raise _unsupported(f"{where}: {value} is outside the 64-bit integer range")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, dict) and set(value) == {"$rindle", "value"}:
        tag, text = value["$rindle"], value["value"]
        if tag == "i64" and isinstance(text, str) and re.fullmatch(r"-?[0-9]{1,19}", text):
            number = int(text)
            if I64_MIN <= number <= I64_MAX:
                return number
        if tag == "float" and isinstance(text, str):
            try:
                return float(text)
            except ValueError:
                pass
    raise _unsupported(f"{where}: unsupported value {json.dumps(value)[:80]}")


def _unsupported(message):
    return SqlError(message, code="VALUE_UNSUPPORTED")


def encode_value(value):
    """A database value as JSON: big integers and non-finite floats tagged."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value if -SAFE_INT <= value <= SAFE_INT else {"$rindle": "i64", "value": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return {"$rindle": "float", "value": text}
    if isinstance(value, Decimal):
        if value.is_finite() and value == value.to_integral_value():
            return encode_value(int(value))
        return encode_value(float(value))
    if isinstance(value, (datetime, date, dtime)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    raise _unsupported(f"a result value of type {type(value).__name__} has no JSON form")


# --- statements ------------------------------------------------------------------------

READS = {"SELECT", "VALUES", "WITH", "TABLE"}
WRITES = {"INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE"}
DDL = {
    "CREATE",
    "ALTER",
    "DROP",
    "TRUNCATE",
    "RENAME",
    "COMMENT",
    "GRANT",
    "REVOKE",
    "REINDEX",
    "CLUSTER",
    "REFRESH",
    "SECURITY",
    "IMPORT",
}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")


@dataclass
class Statement:
    """One validated statement: its text, driver text, decoded args and identity."""

    index: int
    sql: str
    args: object  # list, dict or None, decoded
    want_rows: bool
    keyword: str
    driver_sql: str
    wire: dict  # as sent, for the request identity
    size: int


def parse_statements(items, vendor, *, many=True):
    """Validate ``items`` (a list of statements; one statement when not ``many``)."""
    if not many:
        return [parse_statement(items, 0, vendor)]
    if not isinstance(items, list) or not items:
        raise protocol_error("statements must be a non-empty list")
    limit = int(rindle_settings.SQL_MAX_STATEMENTS)
    if len(items) > limit:
        raise protocol_error(f"{len(items)} statements; the limit is {limit}")
    return [parse_statement(item, i, vendor) for i, item in enumerate(items)]


def parse_statement(item, index, vendor):
    if isinstance(item, str):
        item = {"sql": item}
    if not isinstance(item, dict):
        raise protocol_error("a statement is an object {sql, args?, want_rows?}", index)
    unknown = set(item) - {"sql", "args", "want_rows"}
    if unknown:
        raise protocol_error(f"unknown statement field(s) {sorted(unknown)}", index)
    sql = item.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        raise protocol_error("sql must be a non-empty string", index)
    size = len(sql.encode())
    limit = int(rindle_settings.SQL_MAX_STATEMENT_BYTES)
    if size > limit:
        raise protocol_error(f"the statement takes {size} bytes; the limit is {limit}", index)
    if "\x00" in sql:
        raise protocol_error("sql contains a NUL character", index)
    want_rows = item.get("want_rows", True)
    if not isinstance(want_rows, bool):
        raise protocol_error("want_rows must be a boolean", index)
    raw_args = item.get("args")
    try:
        keyword, positional, names, driver_sql = scan(sql, vendor)
        args = _bind(raw_args, positional, names)
    except SqlError as exc:
        raise exc.at(index) from None
    _check_keyword(keyword, index)
    wire = {"sql": sql, "args": raw_args, "want_rows": want_rows}
    size += len(json.dumps(raw_args))
    return Statement(index, sql, args, want_rows, keyword, driver_sql, wire, size)


def _bind(raw, positional, names):
    if positional and names:
        raise protocol_error("use either ? or :name placeholders in one statement, not both")
    if names:
        if not isinstance(raw, dict):
            raise protocol_error("named placeholders take args as an object")
        missing = sorted(set(names) - set(raw))
        extra = sorted(set(raw) - set(names))
        if missing or extra:
            raise protocol_error(
                f"args do not match the placeholders: missing {missing}, extra {extra}"
            )
        return {k: decode_value(v, f"args.{k}") for k, v in raw.items()}
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise protocol_error("positional placeholders take args as a list")
    if len(raw) != positional:
        raise protocol_error(f"the statement has {positional} placeholder(s) but {len(raw)} args")
    return [decode_value(v, f"args[{i}]") for i, v in enumerate(raw)] or None


def _check_keyword(keyword, index):
    if keyword is None:
        raise protocol_error("the statement is empty", index)
    if keyword in READS or keyword in WRITES:
        return
    if keyword in DDL:
        raise SqlError(
            f"{keyword} is DDL: apply schema changes through /v1/sql/migrate",
            code="DDL_FORBIDDEN",
            statement_index=index,
        )
    raise SqlError(
        f"{keyword} statements are not accepted here (only SELECT, VALUES, WITH, INSERT, "
        "UPDATE, DELETE)",
        code="STATEMENT_UNSUPPORTED",
        statement_index=index,
    )


def scan(sql, vendor):
    """
    ``(first keyword, ? count, :names, driver text)`` of one statement.

    Strings, quoted identifiers, dollar quotes and comments are skipped, so a
    placeholder or a ``;`` inside them counts for nothing. Only whitespace and
    comments may follow a top-level ``;``. On PostgreSQL the driver text uses
    psycopg's ``%s``/``%(name)s`` (a literal ``%`` doubled).
    """
    pg = vendor == "postgresql"
    out, i, n = [], 0, len(sql)
    keyword, positional, names, ended = None, 0, [], False
    while i < n:
        ch = sql[i]
        if ch.isspace():
            out.append(ch)
            i += 1
            continue
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j + 1
            out.append(sql[i:j])
            i = j
            continue
        if sql.startswith("/*", i):
            j = _comment_end(sql, i, nested=pg)
            out.append(sql[i:j])
            i = j
            continue
        if ended:
            raise protocol_error("send one statement per entry (text follows a ';')")
        if ch == ";":
            ended = True
            i += 1
            continue
        if ch in "'\"" or (not pg and ch in "[`"):
            closing = {"[": "]"}.get(ch, ch)
            j = _quoted_end(sql, i, closing, backslash=False)
            out.append(sql[i:j])
            i = j
            continue
        if pg and ch == "$":
            m = _DOLLAR.match(sql, i)
            if m:
                end = sql.find(m.group(0), m.end())
                if end < 0:
                    raise protocol_error("unterminated dollar-quoted string")
                j = end + len(m.group(0))
                out.append(sql[i:j])
                i = j
                continue
            if i + 1 < n and sql[i + 1].isdigit():
                raise protocol_error("use ? or :name placeholders, not $n")
        if ch == "?":
            positional += 1
            out.append("%s" if pg else "?")
            i += 1
            continue
        if ch == ":" and (i == 0 or sql[i - 1] != ":") and i + 1 < n:
            m = _WORD.match(sql, i + 1)
            if m and not (pg and "$" in m.group(0)):
                names.append(m.group(0))
                out.append(f"%({m.group(0)})s" if pg else sql[i : m.end()])
                i = m.end()
                continue
        if ch == "%" and pg:
            out.append("%%")
            i += 1
            continue
        m = _WORD.match(sql, i)
        if m:
            word = m.group(0)
            if keyword is None:
                keyword = word.upper()
            j = m.end()
            if pg and word in ("E", "e") and j < n and sql[j] == "'":
                k = _quoted_end(sql, j, "'", backslash=True)
                out.append(sql[i:k])
                i = k
                continue
            out.append(word)
            i = j
            continue
        out.append(ch)
        i += 1
    names = list(dict.fromkeys(names))
    driver = "".join(out) if pg and (positional or names) else sql.rstrip().rstrip(";")
    return keyword, positional, names, driver


def _comment_end(sql, i, nested):
    depth, j = 0, i
    while j < len(sql):
        if sql.startswith("/*", j):
            depth += 1
            j += 2
            if not nested and depth > 1:
                depth = 1
            continue
        if sql.startswith("*/", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
            continue
        j += 1
    raise protocol_error("unterminated /* comment")


def _quoted_end(sql, i, closing, backslash):
    j = i + 1
    while j < len(sql):
        c = sql[j]
        if backslash and c == "\\":
            j += 2
            continue
        if c == closing:
            if j + 1 < len(sql) and sql[j + 1] == closing and closing in "'\"`":
                j += 2
                continue
            return j + 1
        j += 1
    raise protocol_error("unterminated quoted string or identifier")


def identity(route, statements):
    """The request identity: what a replay must repeat exactly."""
    text = json.dumps(
        {"route": route, "statements": [s.wire for s in statements]},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(text.encode()).hexdigest()


# --- who is asking ---------------------------------------------------------------------


def protected(table):
    return table.lower().startswith(PROTECTED_PREFIXES)


@dataclass
class Principal:
    """The caller: a token (scope ``sql``) or a session user; ``key`` namespaces replay."""

    user: object
    token: object = None
    _allowed: dict = field(default_factory=dict, repr=False)

    @property
    def key(self):
        if self.token is not None:
            return f"t{self.token.pk}"
        return f"u{getattr(self.user, 'pk', None)}"

    def can_write(self, table):
        if table not in self._allowed:
            ok = not protected(table) and bool(
                get_adapter().authorize_sql_write(self.user, self.token, table)
            )
            self._allowed[table] = ok
        return self._allowed[table]


def _write_forbidden(table):
    return SqlError(
        f"this caller may not write table {table!r}", code="WRITE_FORBIDDEN", status=403
    )


def _read_forbidden(table):
    return SqlError(f"table {table!r} is not readable here", code="READ_FORBIDDEN", status=403)


# --- guards: which tables a statement touches --------------------------------------------

# sqlite3 authorizer action codes.
_SQLITE_INSERT, _SQLITE_UPDATE, _SQLITE_DELETE = 18, 23, 9
_SQLITE_READ, _SQLITE_SELECT, _SQLITE_FUNCTION, _SQLITE_RECURSIVE = 20, 21, 31, 33
_SQLITE_DDL = {1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 26, 29, 30}
_CAPTURE_TRIGGER = "_rindle_cap_"


class SqliteGuard:
    """
    The sqlite3 authorizer of one public statement. It sees every table the
    statement reads or writes as it is compiled, triggers and cascades included,
    and refuses at compile time (nothing runs). The capture triggers' outbox insert
    is the one write allowed on a protected table.
    """

    def __init__(self, principal, allow_writes):
        self.principal = principal
        self.allow_writes = allow_writes
        self.writes = set()
        self.inserted = False
        self.denied = None

    def __call__(self, action, arg1, arg2, database, source):
        import sqlite3

        if action in (_SQLITE_SELECT, _SQLITE_FUNCTION, _SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == _SQLITE_READ:
            if source is None and arg1 and protected(arg1):
                return self._deny(_read_forbidden(arg1))
            return sqlite3.SQLITE_OK
        if action in (_SQLITE_INSERT, _SQLITE_UPDATE, _SQLITE_DELETE):
            if source and source.startswith(_CAPTURE_TRIGGER) and arg1 == OUTBOX:
                return sqlite3.SQLITE_OK
            if database not in (None, "main"):
                return self._deny(_write_forbidden(f"{database}.{arg1}"))
            if not self.principal.can_write(arg1):
                return self._deny(_write_forbidden(arg1))
            self.writes.add(arg1)
            if action == _SQLITE_INSERT and source is None:
                self.inserted = True
            if not self.allow_writes:
                return self._deny(SqlError("a read-only statement may not write", code="READ_ONLY"))
            return sqlite3.SQLITE_OK
        if action in _SQLITE_DDL:
            return self._deny(SqlError("DDL goes through /v1/sql/migrate", code="DDL_FORBIDDEN"))
        return self._deny(
            SqlError("this kind of statement is not accepted", code="STATEMENT_UNSUPPORTED")
        )

    def _deny(self, error):
        import sqlite3

        if self.denied is None:
            self.denied = error
        return sqlite3.SQLITE_DENY


def _pg_plan_tables(plan):
    """(tables written, tables read) of an EXPLAIN (FORMAT JSON, VERBOSE) plan."""
    written, read = set(), set()
    stack = [plan]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if "Plan" in node:
            stack.append(node["Plan"])
        name = node.get("Relation Name")
        if node.get("Node Type") == "ModifyTable":
            if not name:
                raise SqlError(
                    "cannot tell which table this statement writes", code="STATEMENT_UNSUPPORTED"
                )
            written.add((node.get("Schema"), name))
        elif name:
            read.add((node.get("Schema"), name))
        stack.extend(node.get("Plans", ()))
    return written, read


# Functions a plan may not call: server files and processes, locks, settings, and
# the ones that run SQL given as text (query_to_xml would read any table unseen by
# the plan's relation check). Matched in the plan, where quoting cannot hide them;
# a string literal that merely spells one is refused too, which is conservative.
_PG_DENIED_FUNCTION = re.compile(
    r"\b((?:pg|lo)_\w+|dblink\w*|\w*_to_xml\w*|xpath\w*|set_config|current_setting)\s*\(",
    re.IGNORECASE,
)

_PG_STATE = (
    "SELECT (SELECT md5(string_agg(name || '=' || COALESCE(setting, ''), ',' ORDER BY name)) "
    "FROM pg_settings) || current_user || session_user, "
    "(SELECT COALESCE(json_agg(json_build_array(schemaname, relname, "
    "n_tup_ins + n_tup_upd + n_tup_del)), '[]') FROM pg_stat_xact_all_tables "
    "WHERE n_tup_ins + n_tup_upd + n_tup_del > 0 AND schemaname <> 'pg_toast')"
)


def _pg_state(raw):
    with raw.cursor() as cur:
        cur.execute(_PG_STATE)
        settings, counters = cur.fetchone()
    if isinstance(counters, str):
        counters = json.loads(counters)
    return settings, {(s, t): c for s, t, c in counters}


def _pg_check_effects(before, after, principal, schema):
    if before[0] != after[0]:
        raise SqlError(
            "a writing statement may not change session settings", code="STATEMENT_UNSUPPORTED"
        )
    for (s, t), count in after[1].items():
        if count == before[1].get((s, t), 0):
            continue
        if s == schema and t == OUTBOX:
            continue  # the capture triggers' own rows
        if s in ("pg_catalog", "information_schema"):
            raise SqlError("the statement changed the schema", code="DDL_FORBIDDEN")
        if s != schema or not principal.can_write(t):
            raise _write_forbidden(t if s == schema else f"{s}.{t}")


# --- running one statement ------------------------------------------------------------------


def _failure(exc, index, guard=None, state="closed"):
    """The SqlError of a database exception, or None for an infrastructure failure."""
    if guard is not None and guard.denied is not None:
        return guard.denied.at(index, state)
    if isinstance(exc, SqlError):
        return exc.at(index, state)
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate == "25006":  # read_only_sql_transaction: a function tried to write
        return SqlError(
            "the statement writes, through a function, on a read-only connection",
            code="WRITE_FORBIDDEN",
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
        error = SqlError(str(exc), code="CONSTRAINT_VIOLATION", status=409, **extra)
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


def _execute(raw, vendor, st, writes):
    """Run ``st`` on driver connection ``raw``; its result (``writes``: it may write)."""
    cur = _cursor(raw, vendor)
    try:
        if vendor == "postgresql":
            # binary=True forces the extended protocol, which refuses a second statement.
            cur.execute(st.driver_sql, st.args, binary=True)
        else:
            cur.execute(st.driver_sql, st.args or ())
        limit = int(rindle_settings.SQL_MAX_RESULT_ROWS)
        rows, columns = [], []
        if cur.description is not None:
            columns = [_column(raw, vendor, d) for d in cur.description]
            rows = cur.fetchmany(limit + 1)
            if len(rows) > limit:
                raise SqlError(
                    f"the statement returns more than {limit} rows", code="RESULT_TOO_LARGE"
                )
        affected = max(cur.rowcount, 0) if writes else 0
        last = cur.lastrowid if vendor == "sqlite" and affected else None
    finally:
        cur.close()
    rows = [[encode_value(v) for v in row] for row in rows]
    return {
        "columns": columns,
        "rows": rows,
        "rows_affected": affected,
        "last_insert_rowid": encode_value(last),
        "rows_read": len(rows),
        "rows_written": affected,
    }


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
        except Exception as exc:  # the driver's own errors, or Django's
            self._close()
            raise Unavailable(f"database unavailable: {exc}") from exc
        return self

    def __exit__(self, *exc):
        try:
            self.raw.execute("ROLLBACK")
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
                self.raw.set_authorizer(guard)
                try:
                    self.raw.execute("EXPLAIN " + st.driver_sql, st.args or ()).fetchall()
                except Exception as exc:
                    raise self._error(exc, st, guard) from None
                finally:
                    self.raw.set_authorizer(None)
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
            written, read = _pg_plan_tables(plan)
            for schema, table in written:
                if schema != self.schema or not self.principal.can_write(table):
                    raise _write_forbidden(table).at(st.index)
            for schema, table in read:
                # System catalogs (pg_authid's password hashes, say) are never readable.
                if protected(table) or schema != self.schema:
                    raise _read_forbidden(
                        table if schema == self.schema else f"{schema}.{table}"
                    ).at(st.index)
            denied = _PG_DENIED_FUNCTION.search(json.dumps(plan))
            if denied is not None:
                raise SqlError(
                    f"function {denied.group(1)}() is not available to public SQL",
                    code="FUNCTION_FORBIDDEN",
                    status=403,
                ).at(st.index)
            return {table for _schema, table in written}
        except RindleError:
            raise
        except Exception as exc:
            raise self._error(exc, st) from None

    def run(self, st):
        """Run read statement ``st`` here; its result."""
        guard = None
        if self.vendor == "sqlite":
            guard = SqliteGuard(self.principal, allow_writes=False)
            self.raw.set_authorizer(guard)
        else:
            self.raw.execute("SAVEPOINT rindle_read")
        try:
            return _execute(self.raw, self.vendor, st, writes=False)
        except Exception as exc:
            if self.vendor == "postgresql":
                self.raw.execute("ROLLBACK TO SAVEPOINT rindle_read")
            raise self._error(exc, st, guard) from None
        finally:
            if guard is not None:
                self.raw.set_authorizer(None)

    def _error(self, exc, st, guard=None):
        wrapped = _wrap_driver_error(self.conn, exc)
        error = _failure(wrapped, st.index, guard)
        if error is None:
            return Unavailable(f"database unavailable: {exc}")
        return error


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

    def statements(self, statements, writes, state="closed"):
        return [self.one(st, w, state) for st, w in zip(statements, writes)]

    def one(self, st, writes, state="closed"):
        """Run ``st`` (``writes``: classified as writing); its result."""
        tx = self.tx
        guard = None
        if self.vendor == "sqlite":
            guard = SqliteGuard(self.principal, allow_writes=True)
            self.raw.set_authorizer(guard)
        else:
            before = _pg_state(self.raw)
        try:
            with tx.connection.wrap_database_errors:
                result = _execute(self.raw, self.vendor, st, writes=bool(writes))
            if guard is not None:
                if not guard.inserted:
                    result["last_insert_rowid"] = None
            else:
                _pg_check_effects(before, _pg_state(self.raw), self.principal, self.schema)
            return result
        except Exception as exc:
            error = _failure(exc, st.index, guard, state)
            if error is None:
                raise
            raise error from None
        finally:
            if guard is not None:
                self.raw.set_authorizer(None)

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
            return _replay(found, ident, "IDEMPOTENCY_KEY_REUSED")
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

    record, replayed = engine.write(apply).value
    if replayed:
        return _replay(record, ident, "IDEMPOTENCY_KEY_REUSED")
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


# --- interactive transactions ----------------------------------------------------------------


@dataclass
class _Entry:
    statement: Statement
    writes: bool
    fingerprint: str


@dataclass
class Transaction:
    """One interactive transaction: the statements it ran and the answers it gave."""

    id: str
    owner: str
    read_only: bool
    entries: list = field(default_factory=list)
    size: int = 0
    state: str = "open"  # open | committed | rolled_back | failed | expired
    touched: float = field(default_factory=time.monotonic)
    last_op: tuple = None  # (operation_id, identity, Answer or SqlError)
    seen_ops: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def writes(self):
        return any(e.writes for e in self.entries)


def transaction_error(code, message, state, status, retry_scope="never"):
    return SqlError(
        message, code=code, status=status, retry_scope=retry_scope, transaction_state=state
    )


class Transactions:
    """The open interactive transactions of one engine, in this process (bounded)."""

    def __init__(self, engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._open = {}
        self._ended = OrderedDict()

    # --- registry --------------------------------------------------------------------

    def begin(self, principal, read_only=False):
        if not isinstance(read_only, bool):
            raise protocol_error("read_only must be a boolean")
        with self._lock:
            self._expire()
            limit = int(rindle_settings.SQL_TRANSACTIONS_MAX_OPEN)
            if len(self._open) >= limit:
                raise transaction_error(
                    "TOO_MANY_TRANSACTIONS",
                    f"{limit} transactions are open in this process; retry later",
                    "closed",
                    503,
                    retry_scope="request",
                )
            txn = Transaction("tx_" + secrets.token_hex(16), principal.key, read_only)
            self._open[txn.id] = txn
        return {
            "transaction_id": txn.id,
            "read_only": read_only,
            "idle_timeout_ms": self._idle_ms(),
        }

    def _idle_ms(self):
        return int(float(rindle_settings.SQL_TRANSACTION_IDLE_SECONDS) * 1000)

    def _expire(self):
        idle = self._idle_ms() / 1000
        now = time.monotonic()
        for txn in list(self._open.values()):
            # Never under a running operation: it holds the lock until it is done.
            if now - txn.touched > idle and txn.lock.acquire(blocking=False):
                try:
                    if txn.state == "open":
                        txn.state = "expired"
                        self._end(txn)
                finally:
                    txn.lock.release()

    def _end(self, txn):
        self._open.pop(txn.id, None)
        txn.entries = []
        if txn.last_op is not None and isinstance(txn.last_op[2], Answer):
            op, ident, answer = txn.last_op
            body = json.loads(outcomes.encode({"body": answer.body}))["body"]
            txn.last_op = (op, ident, Answer(answer.status, body))
        self._ended[txn.id] = txn
        while len(self._ended) > 4 * int(rindle_settings.SQL_TRANSACTIONS_MAX_OPEN):
            self._ended.popitem(last=False)

    def _find(self, principal, transaction_id):
        if not isinstance(transaction_id, str) or not TRANSACTION_ID.match(transaction_id):
            raise protocol_error("malformed transaction id")
        with self._lock:
            self._expire()
            txn = self._open.get(transaction_id) or self._ended.get(transaction_id)
        if txn is None or txn.owner != principal.key:
            return None
        return txn

    def _unknown(self):
        return transaction_error(
            "TRANSACTION_EXPIRED",
            "no open transaction has this id here: it expired, or never existed",
            "unknown",
            404,
            retry_scope="closure",
        )

    def _closed(self, txn):
        if txn.state == "expired":
            return transaction_error(
                "TRANSACTION_EXPIRED",
                "the transaction expired after being idle; nothing of it was applied",
                "closed",
                404,
                retry_scope="closure",
            )
        return transaction_error(
            "TRANSACTION_CLOSED", f"the transaction is {txn.state.replace('_', ' ')}", "closed", 409
        )

    def _operation(self, txn, operation_id, ident):
        """A stored answer to replay (or raise), else None: the operation is new."""
        if txn.last_op is not None and txn.last_op[0] == operation_id:
            if txn.last_op[1] != ident:
                raise transaction_error(
                    "OPERATION_ID_REUSED",
                    "this operation_id already answered a different operation",
                    "open" if txn.state == "open" else "closed",
                    409,
                )
            answer = txn.last_op[2]
            if isinstance(answer, SqlError):
                raise answer
            return Answer(answer.status, answer.body, replayed=True)
        if operation_id in txn.seen_ops:
            raise transaction_error(
                "OPERATION_ID_REUSED",
                "this operation_id was used by an earlier operation",
                "open" if txn.state == "open" else "closed",
                409,
            )
        return None

    def _record(self, txn, operation_id, ident, answer):
        txn.seen_ops.add(operation_id)
        txn.last_op = (operation_id, ident, answer)
        txn.touched = time.monotonic()

    @staticmethod
    def _op_id(operation_id):
        if isinstance(operation_id, int) and not isinstance(operation_id, bool):
            operation_id = str(operation_id)
        _check_key(operation_id, "operation_id")
        return operation_id

    # --- operations --------------------------------------------------------------------

    def execute(self, principal, transaction_id, operation_id, statements):
        operation_id = self._op_id(operation_id)
        txn = self._find(principal, transaction_id)
        if txn is None:
            raise self._unknown()
        ident = identity("transaction.execute", statements)
        with _locked(txn):
            replay = self._operation(txn, operation_id, ident)
            if replay is not None:
                return replay
            if txn.state != "open":
                raise self._closed(txn)
            try:
                answer = self._execute(principal, txn, statements)
            except SqlError as exc:
                if exc.details.get("transaction_state") == "closed":
                    txn.state = "failed"
                    with self._lock:
                        self._end(txn)
                self._record(txn, operation_id, ident, exc)
                raise
            self._record(txn, operation_id, ident, answer)
            return answer

    def _execute(self, principal, txn, statements):
        count = len(txn.entries) + len(statements)
        limit = int(rindle_settings.SQL_MAX_STATEMENTS)
        size = txn.size + sum(st.size for st in statements)
        byte_limit = int(rindle_settings.SQL_TRANSACTION_MAX_BYTES)
        if count > limit or size > byte_limit:
            raise transaction_error(
                "TRANSACTION_TOO_LARGE",
                f"the transaction would hold {count} statements and {size} bytes; the "
                f"limits are {limit} and {byte_limit} (it stays open, without them)",
                "open",
                400,
            )
        # Number the new statements after the ones already run.
        base = len(txn.entries)
        statements = [_renumber(st, base + i) for i, st in enumerate(statements)]
        try:
            with Reader(self.engine.using, principal) as reader:
                writes = [bool(reader.classify(st)) for st in statements]
                if txn.read_only and any(writes):
                    index = statements[writes.index(True)].index
                    raise transaction_error(
                        "TRANSACTION_READ_ONLY", "this transaction is read-only", "open", 400
                    ).at(index)
                if not txn.writes and not any(writes):
                    results = [reader.run(st) for st in statements]
                    return self._answer(txn, statements, writes, results)
        except SqlError as exc:
            raise _relative(exc, base, "open") from None
        except Unavailable as exc:
            raise _unavailable(exc, "open") from exc
        prior = [e for e in txn.entries if e.writes]

        def speculate(tx):
            run = _Run(tx, principal)
            for entry in prior:
                try:
                    result = run.one(entry.statement, True)
                except SqlError as exc:
                    # An earlier statement fails now: the answers given no longer hold.
                    raise _conflict(entry.statement.index, exc.message) from None
                if fingerprint(result) != entry.fingerprint:
                    raise _conflict(entry.statement.index)
            raise _Speculation(run.statements(statements, writes, state="open"))

        try:
            self.engine.write(speculate)
        except _Speculation as done:
            return self._answer(txn, statements, writes, done.results)
        except SqlError as exc:
            raise _relative(exc, base) from None
        except Unavailable as exc:
            raise _unavailable(exc, "open") from exc
        raise AssertionError("speculation must roll back")  # pragma: no cover

    def _answer(self, txn, statements, writes, results):
        for st, w, result in zip(statements, writes, results):
            txn.entries.append(_Entry(st, w, fingerprint(result)))
            txn.size += st.size
        shown_results = [shown(r, st) for r, st in zip(results, statements)]
        return Answer(200, {"results": shown_results})

    def commit(self, principal, transaction_id, operation_id):
        operation_id = self._op_id(operation_id)
        key = f"txn:{transaction_id}"
        ident = "commit"
        txn = self._find(principal, transaction_id)
        if txn is not None:
            with _locked(txn):
                replay = self._operation(txn, operation_id, ident)
                if replay is not None:
                    return replay
                if txn.state != "open":
                    raise self._closed(txn)
                try:
                    answer = self._commit(principal, txn, key, operation_id)
                except SqlError as exc:
                    if exc.retryable:  # nothing was decided: the same commit may be retried
                        raise
                    txn.state = "failed"
                    self._record(txn, operation_id, ident, exc)
                    with self._lock:
                        self._end(txn)
                    raise
                if answer.replayed:  # committed by an earlier attempt whose answer was lost
                    answer = self._from_record(answer.body, principal, operation_id)
                self._record(txn, operation_id, ident, Answer(answer.status, answer.body))
                txn.state = "committed"
                with self._lock:
                    self._end(txn)
                return answer
        # Unknown here (another process, a restart, an eviction): the stored outcome.
        if not TRANSACTION_ID.match(transaction_id):
            raise protocol_error("malformed transaction id")
        record = _stored(self.engine, key)
        if record is None:
            raise self._unknown()
        return self._from_record(record, principal, operation_id)

    def _from_record(self, record, principal, operation_id):
        if record.get("owner") != principal.key:
            raise self._unknown()
        if record.get("operation_id") != operation_id:
            raise transaction_error(
                "TRANSACTION_CLOSED", "the transaction is committed", "closed", 409
            )
        return Answer(record["status"], record["body"], replayed=True)

    def _commit(self, principal, txn, key, operation_id):
        entries = list(txn.entries)
        if not txn.writes:
            # Nothing to apply: the reads must still hold together, in one snapshot.
            try:
                with Reader(self.engine.using, principal) as reader:
                    results = []
                    for e in entries:
                        try:
                            result = reader.run(e.statement)
                        except SqlError as exc:
                            raise _conflict(e.statement.index, exc.message) from None
                        if fingerprint(result) != e.fingerprint:
                            raise _conflict(e.statement.index)
                        results.append(shown(result, e.statement))
            except Unavailable as exc:
                raise _unavailable(exc, "open") from exc
            body = {"committed": True, "results": results, "cv": None, "commit_cursor": None}
            return Answer(200, body)

        def apply(tx):
            now = outcomes.now_ms()
            outcomes.lock(tx, key)
            found = outcomes.read_in(tx, key, now)
            if found is not None:
                return found, True
            run = _Run(tx, principal)
            results = []
            for e in entries:
                try:
                    result = run.one(e.statement, e.writes)
                except SqlError as exc:
                    raise _conflict(e.statement.index, exc.message) from None
                if fingerprint(result) != e.fingerprint:
                    raise _conflict(e.statement.index)
                results.append(shown(result, e.statement))
            cv = run.cv()
            body = {
                "committed": True,
                "results": results,
                "cv": cv,
                "commit_cursor": commit_cursor(cv),
            }
            record = {
                "owner": principal.key,
                "identity": "commit",
                "operation_id": operation_id,
                "status": 200,
                "body": body,
            }
            outcomes.store(tx, key, record, now)
            return record, False

        try:
            record, replayed = self.engine.write(apply).value
        except Unavailable as exc:
            # A timed-out commit may still land: retry it with the same operation_id.
            raise _unavailable(exc, "unknown" if exc.code == "timeout" else "open") from exc
        if replayed:
            return Answer(record["status"], record, replayed=True)
        return Answer(record["status"], record["body"])

    def rollback(self, principal, transaction_id, operation_id):
        operation_id = self._op_id(operation_id)
        txn = self._find(principal, transaction_id)
        if txn is None:
            if _stored(self.engine, f"txn:{transaction_id}") is not None:
                raise transaction_error(
                    "TRANSACTION_CLOSED", "the transaction is committed", "closed", 409
                )
            raise self._unknown()
        with _locked(txn):
            replay = self._operation(txn, operation_id, "rollback")
            if replay is not None:
                return replay
            if txn.state != "open":
                raise self._closed(txn)
            answer = Answer(200, {"rolled_back": True})
            txn.state = "rolled_back"
            self._record(txn, operation_id, "rollback", answer)
            with self._lock:
                self._end(txn)
            return answer


class _Speculation(Exception):
    """Raised to roll back a speculative run, carrying its results."""

    def __init__(self, results):
        super().__init__("speculation")
        self.results = results


def _conflict(index, detail=None):
    message = "the transaction's earlier answers no longer hold; run it again"
    if detail:
        message += f" ({detail})"
    return transaction_error(
        "TRANSACTION_CONFLICT", message, "closed", 409, retry_scope="closure"
    ).at(index)


def _renumber(st, index):
    st.index = index
    return st


def _relative(exc, base, state=None):
    """
    ``exc`` with its statement index counted in the request, not the transaction,
    unless it is a conflict (whose index counts every statement the transaction ran).
    """
    index = exc.details.get("statement_index")
    if exc.code != "TRANSACTION_CONFLICT" and index is not None and index >= base:
        exc.details["statement_index"] = index - base
    if state is not None and exc.code != "TRANSACTION_CONFLICT":
        exc.details["transaction_state"] = state
    return exc


def _unavailable(exc, state):
    return SqlError(
        exc.message, code=exc.code, status=503, retry_scope="request", transaction_state=state
    )


class _locked:
    """Hold a transaction's lock (operations on one transaction run one at a time)."""

    def __init__(self, txn):
        self.txn = txn

    def __enter__(self):
        if not self.txn.lock.acquire(timeout=float(rindle_settings.WRITE_TIMEOUT)):
            raise SqlError(
                "another operation of this transaction is still running",
                code="TRANSACTION_BUSY",
                status=409,
                retry_scope="request",
                transaction_state="unknown",
            )
        self.txn.touched = time.monotonic()

    def __exit__(self, *exc):
        self.txn.lock.release()


_registries = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


def transactions(engine):
    """The interactive transactions of ``engine`` in this process."""
    with _registries_lock:
        registry = _registries.get(engine)
        if registry is None:
            registry = _registries[engine] = Transactions(engine)
        return registry
