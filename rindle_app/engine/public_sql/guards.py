"""Public SQL guards: who is asking, and which tables a statement may touch."""

import json
from dataclasses import dataclass, field

from ...adapter import get_adapter
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
                    "cannot tell which table this statement writes", code="STATEMENT_UNSUPPORTED"
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
