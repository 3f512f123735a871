"""Public SQL guards: who is asking, and which tables a statement may touch."""

import json
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...adapter import get_adapter
from ...conf import rindle_settings
from ...exceptions import (
    SQL_DDL_FORBIDDEN,
    SQL_FUNCTION_FORBIDDEN,
    SQL_READ_FORBIDDEN,
    SQL_READ_ONLY,
    SQL_STATEMENT_TIMEOUT,
    SQL_STATEMENT_UNSUPPORTED,
    SQL_WRITE_FORBIDDEN,
)
from ..capture import OUTBOX
from .statements import SqlError

PROTECTED_PREFIXES = ("_rindle_", "django_", "auth_", "sqlite_")


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
        f"this caller may not write table {table!r}", code=SQL_WRITE_FORBIDDEN, status=403
    )


def _read_forbidden(table):
    return SqlError(f"table {table!r} is not readable here", code=SQL_READ_FORBIDDEN, status=403)


# --- guards: which tables a statement touches --------------------------------------------

# sqlite3 authorizer action codes.
_SQLITE_INSERT, _SQLITE_UPDATE, _SQLITE_DELETE = 18, 23, 9
_SQLITE_READ, _SQLITE_SELECT, _SQLITE_FUNCTION, _SQLITE_RECURSIVE = 20, 21, 31, 33
_SQLITE_DDL = {1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 26, 29, 30}
# The capture triggers (``capture.trigger_names``): no user can create a trigger
# (public SQL refuses DDL, the journal refuses CREATE TRIGGER), and SQLite names a
# trigger as ``source`` only for what the trigger's own body does.
_CAPTURE_TRIGGER = re.compile(r"^_rindle_cap_[0-9a-f]{10}_(?:ins|upd|del)$")
# VM instructions between two looks at the clock (a look costs well under 1 %).
_PROGRESS_STEPS = 1000

# The functions public SQL may call on SQLite: the core scalar, aggregate, window,
# date/time, math and JSON functions. Everything else is refused, notably
# load_extension, the sqlite_* introspection, last_insert_rowid/changes (which
# would show other writers' work on the shared writer), zeroblob/randomblob, and
# every function Django registers in Python (regexp, lpad, repeat, ...), which no
# time budget can interrupt. ``->`` and ``->>`` are the JSON operators.
SQLITE_FUNCTIONS = frozenset(
    """
    abs char coalesce format glob hex ifnull iif instr length like likelihood likely
    lower ltrim max min nullif printf quote random replace round rtrim sign substr
    substring trim typeof unicode unlikely upper octet_length concat concat_ws unhex
    avg count group_concat string_agg sum total
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value
    last_value nth_value
    date time datetime julianday unixepoch strftime timediff
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln
    log log10 log2 mod pi pow power radians sin sinh sqrt tan tanh trunc
    json json_array json_array_length json_extract json_insert json_object json_patch
    json_remove json_replace json_set json_type json_valid json_quote json_group_array
    json_group_object json_error_position json_pretty -> ->>
    """.split()
)


def _budget():
    return float(rindle_settings.SQL_STATEMENT_TIMEOUT_SECONDS)


def writer_deadline():
    """
    When one request's statements must be done on the writer (None: no budget): they
    share one budget there, so no request holds the single writer longer.
    """
    seconds = _budget()
    return time.monotonic() + seconds if seconds > 0 else None


def statement_timeout(seconds):
    return SqlError(
        f"the statement ran past the {seconds:g} s budget (on the writer, shared by the "
        "request's statements) and was interrupted; nothing it did was kept",
        code=SQL_STATEMENT_TIMEOUT,
        status=408,
    )


class SqliteGuard:
    """
    The sqlite3 authorizer of one public statement. It sees every table the
    statement reads or writes as it is compiled, triggers, views, CTEs and cascades
    included, and refuses at compile time (nothing runs). A read is decided by the
    table it really reads (``arg1``), whatever the CTE or view (``source``) it
    comes through. The capture triggers' outbox insert is the one write allowed on
    a protected table. Functions are an allow-list (``SQLITE_FUNCTIONS``).
    """

    def __init__(self, principal, allow_writes):
        self.principal = principal
        self.allow_writes = allow_writes
        self.writes = set()
        self.inserted = False
        self.denied = None

    @contextmanager
    def installed(self, raw, deadline=None):
        """
        This authorizer on driver connection ``raw`` for the block, with the
        statement's time budget (``SQL_STATEMENT_TIMEOUT_SECONDS``, 0: none; ending
        at ``deadline`` if that is sooner) as a progress handler. Both are removed
        after, so the writer's other work runs unguarded and is never interrupted.
        """
        seconds = _budget()
        if seconds > 0:
            end = time.monotonic() + seconds
            end = end if deadline is None else min(end, deadline)

            def tick():
                if time.monotonic() < end:
                    return 0
                self._deny(statement_timeout(seconds))
                return 1  # SQLITE_INTERRUPT

            raw.set_progress_handler(tick, _PROGRESS_STEPS)
        raw.set_authorizer(self)
        try:
            yield self
        finally:
            raw.set_progress_handler(None, 0)
            raw.set_authorizer(None)

    def __call__(self, action, arg1, arg2, database, source):
        import sqlite3

        if action in (_SQLITE_SELECT, _SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == _SQLITE_FUNCTION:
            if (arg2 or "").lower() in SQLITE_FUNCTIONS:
                return sqlite3.SQLITE_OK
            return self._deny(_function_forbidden(f"function {arg2}()"))
        if action == _SQLITE_READ:
            if database not in (None, "main"):
                return self._deny(_read_forbidden(f"{database}.{arg1}"))
            if arg1 and protected(arg1):
                return self._deny(_read_forbidden(arg1))
            return sqlite3.SQLITE_OK
        if action in (_SQLITE_INSERT, _SQLITE_UPDATE, _SQLITE_DELETE):
            if (
                action == _SQLITE_INSERT
                and arg1 == OUTBOX
                and database == "main"
                and source
                and _CAPTURE_TRIGGER.match(source)
            ):
                return sqlite3.SQLITE_OK
            if action == _SQLITE_UPDATE and arg1 in ("sqlite_master", "sqlite_temp_master"):
                # What SQLite reports for a table-valued function (json_each, pragma_*).
                return self._deny(_function_forbidden("a table-valued function (json_each...)"))
            if database not in (None, "main"):
                return self._deny(_write_forbidden(f"{database}.{arg1}"))
            if not self.principal.can_write(arg1):
                return self._deny(_write_forbidden(arg1))
            self.writes.add(arg1)
            if action == _SQLITE_INSERT and source is None:
                self.inserted = True
            if not self.allow_writes:
                return self._deny(
                    SqlError("a read-only statement may not write", code=SQL_READ_ONLY)
                )
            return sqlite3.SQLITE_OK
        if action in _SQLITE_DDL:
            return self._deny(SqlError("DDL goes through /v1/sql/migrate", code=SQL_DDL_FORBIDDEN))
        # Everything else (PRAGMA, ATTACH/DETACH, transaction control, savepoints,
        # ANALYZE, REINDEX...) is refused.
        return self._deny(
            SqlError("this kind of statement is not accepted", code=SQL_STATEMENT_UNSUPPORTED)
        )

    def _deny(self, error):
        import sqlite3

        if self.denied is None:
            self.denied = error
        return sqlite3.SQLITE_DENY


def _function_forbidden(what):
    return SqlError(
        f"{what} is not available to public SQL", code=SQL_FUNCTION_FORBIDDEN, status=403
    )


def _pg_written(plan):
    """The tables an EXPLAIN (FORMAT JSON, VERBOSE) plan writes (its ModifyTable nodes)."""
    written = set()
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
        if node.get("Node Type") == "ModifyTable":
            if not node.get("Relation Name"):
                raise SqlError(
                    "cannot tell which table this statement writes", code=SQL_STATEMENT_UNSUPPORTED
                )
            written.add(node["Relation Name"])
        stack.extend(node.get("Plans", ()))
    return written


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
            "a writing statement may not change session settings", code=SQL_STATEMENT_UNSUPPORTED
        )
    for (s, t), count in after[1].items():
        if count == before[1].get((s, t), 0):
            continue
        if s == schema and t == OUTBOX:
            continue  # the capture triggers' own rows
        if s in ("pg_catalog", "information_schema"):
            raise SqlError("the statement changed the schema", code=SQL_DDL_FORBIDDEN)
        if s != schema or not principal.can_write(t):
            raise _write_forbidden(t if s == schema else f"{s}.{t}")
