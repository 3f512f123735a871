"""
The PostgreSQL sandbox of public SQL: the roles its statements run as, and their grants.

Every public statement runs under ``SET LOCAL ROLE`` to a NOLOGIN role that holds
privileges only on what its caller may touch, so whatever a statement runs (a
function that plans SQL text, like ``ts_stat`` or ``query_to_xml``, included) the
database checks it against those privileges:

- the base role (``SQL_SANDBOX_ROLE``, default ``rindle_sql``): SELECT on the base
  tables of the app's schema that are not protected (``_rindle_*``, ``django_*``,
  ``auth_*``), and nothing else. Views are never granted: they read with their
  owner's rights.
- one write role per distinct set of writable tables, ``<base>_w_<digest>``: a member
  of the base role, plus INSERT, UPDATE and DELETE on exactly those tables (USAGE on
  their sequences). The set is what ``Principal.can_write`` allows (the token's
  ``tables`` or the adapter), so the grants follow the caller.

Roles are cluster-wide and are created idempotently (another process or database
creating one at the same moment is fine); grants are per database, refreshed in a
short transaction of a separate connection whenever the schema's tables change
(their oids are the fingerprint). The roles must also be unable to call
``set_config``, which could ``SET ROLE NONE`` in the middle of a statement: revoking it
from PUBLIC takes the function's owner, a superuser (``superuser_sql()``); until then
public SQL is refused with ``SANDBOX_MISSING``.
"""

import hashlib
import re
import time

from django.db import connections

from ...conf import rindle_settings
from ...exceptions import (
    SQL_FUNCTION_FORBIDDEN,
    SQL_LOCK_TIMEOUT,
    SQL_READ_FORBIDDEN,
    SQL_SANDBOX_MISSING,
    SQL_STATEMENT_TIMEOUT,
    SQL_WRITE_FORBIDDEN,
)
from ...runtime import get_runtime, runtimes
from .guards import protected
from .statements import WRITES, SqlError

# The advisory lock that serializes grant refreshes in one database ("rindsbox").
SANDBOX_LOCK = 0x72696E6473626F78
SET_CONFIG = "pg_catalog.set_config(text,text,boolean)"

_TABLES = (
    "SELECT c.oid::bigint, c.relname FROM pg_class c "
    "WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind IN ('r', 'p') "
    "ORDER BY c.relname"
)
# The schema's SECURITY DEFINER functions: they run as their owner, so the sandbox
# may call none of them (the capture trigger's is fired, never called).
_DEFINERS = (
    "SELECT p.oid::regprocedure::text FROM pg_proc p "
    "WHERE p.pronamespace = current_schema()::regnamespace AND p.prosecdef ORDER BY 1"
)

# What the sandbox must not reach besides tables: the GUC setter (a role escape),
# server-side large objects, and the extensions that reach files or other databases.
_REVOKED = """
SELECT p.oid::regprocedure::text FROM pg_proc p
WHERE (p.pronamespace = 'pg_catalog'::regnamespace
       AND (p.proname IN ('set_config', 'loread', 'lowrite') OR p.proname LIKE 'lo\\_%'))
   OR p.oid IN (SELECT d.objid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
                WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
                  AND e.extname IN ('dblink', 'postgres_fdw', 'file_fdw', 'adminpack', 'lo'))
ORDER BY 1
"""

_UNLOCK = "SELECT pg_advisory_unlock_all()"


def sandbox_missing(message):
    return SqlError(
        f"the public SQL sandbox is not usable: {message}",
        code=SQL_SANDBOX_MISSING,
        status=503,
    )


def base_role():
    return str(rindle_settings.SQL_SANDBOX_ROLE)


def role_for(writes):
    """The role of a caller who may write ``writes`` (the base role when none)."""
    if not writes:
        return base_role()
    digest = hashlib.sha256("\x00".join(sorted(writes)).encode()).hexdigest()[:16]
    return f"{base_role()}_w_{digest}"


def readable(cur):
    """``[(oid, name)]`` of the schema's tables public SQL may read."""
    cur.execute(_TABLES)
    return [(oid, name) for oid, name in cur.fetchall() if not protected(name)]


def _fingerprint(tables):
    return hashlib.sha256(repr(tables).encode()).hexdigest()


def _milliseconds(seconds):
    """A budget in PostgreSQL's unit; 0 or None is no budget (0 there too)."""
    return max(1, int(float(seconds) * 1000)) if seconds else 0


def _ident(name):
    return '"' + name.replace('"', '""') + '"'


# --- entering the sandbox ------------------------------------------------------------


def enter(alias, raw, principal, idle_seconds=None, savepoint=False):
    """
    Put the transaction open on driver connection ``raw`` (of database ``alias``)
    under the caller's role, with the statement and lock budgets (and the idle budget,
    when given). Everything is ``LOCAL``: it ends with the transaction, or at
    ``leave`` / ``abandon`` (``savepoint``: inside a savepoint of its own, for a
    transaction that goes on, the writer's).
    """
    with raw.cursor() as cur:
        if savepoint:
            cur.execute("SAVEPOINT rindle_sandbox")
        tables = readable(cur)
        writes = sorted(name for _oid, name in tables if principal.can_write(name))
        role = role_for(writes)
        key = (raw.info.host, raw.info.port, raw.info.dbname, role)
        cur.execute(_DEFINERS)
        fingerprint = _fingerprint([tables, cur.fetchall()])
        # The runtime keeps (database, role) -> the table fingerprint its grants were made for.
        runtime = get_runtime(alias)
        if runtime.sandbox_grants.get(key) != fingerprint:
            refresh(alias, writes)
            with runtime.sandbox_grants_lock:
                runtime.sandbox_grants[key] = fingerprint
        budgets = [
            ("statement_timeout", rindle_settings.SQL_STATEMENT_TIMEOUT_SECONDS),
            ("lock_timeout", rindle_settings.SQL_LOCK_TIMEOUT_SECONDS),
        ]
        if idle_seconds is not None:
            budgets.append(("idle_in_transaction_session_timeout", idle_seconds))
        # One round trip (no parameters: the simple protocol takes several statements).
        sets = [f"SET LOCAL {name} = {_milliseconds(sec)}" for name, sec in budgets]
        cur.execute("; ".join([*sets, f"SET LOCAL ROLE {_ident(role)}"]))


def leave(raw, savepoint=False):
    """Back to the app's own role and budgets, in a transaction that goes on."""
    statements = [
        "SET LOCAL ROLE NONE",
        "SET LOCAL statement_timeout TO DEFAULT",
        "SET LOCAL lock_timeout TO DEFAULT",
        *(["RELEASE SAVEPOINT rindle_sandbox"] if savepoint else []),
        _UNLOCK,
    ]
    raw.execute("; ".join(statements))


def abandon(raw):
    """After a failed statement: back to where ``enter(savepoint=True)`` began."""
    try:
        raw.execute("ROLLBACK TO SAVEPOINT rindle_sandbox")
        raw.execute("RELEASE SAVEPOINT rindle_sandbox")
        release_session_locks(raw)
    except Exception:
        pass  # the connection is gone: the writer deals with that


def release_session_locks(raw):
    """
    Release the session-level advisory locks a statement took: they outlive its
    transaction, and rindle takes only transaction-level ones (a session lock on
    the outbox fence's key would stall every reader of the outbox).
    """
    raw.execute(_UNLOCK)


def forget():
    """Drop what this process knows of the grants (after a migration, say)."""
    for runtime in runtimes():
        runtime.forget_sandbox_grants()


# --- creating the roles and their grants ---------------------------------------------


def refresh(alias, writes=(), revoke=False):
    """
    Create the base role (and the write role of ``writes``) and set their grants to
    what the schema's tables are now, on a connection of its own. With ``revoke``,
    also revoke the sandbox's functions from PUBLIC as far as this user may. Returns
    the statements that need a superuser (empty when the sandbox is complete); raises
    ``SANDBOX_MISSING`` when the sandbox cannot be used.
    """
    conn = connections.create_connection(alias)
    try:
        conn.ensure_connection()
        raw = conn.connection
        raw.autocommit = True
        for attempt in range(3):
            try:
                with raw.transaction(), raw.cursor() as cur:
                    return _refresh(cur, writes, revoke)
            except SqlError:
                raise
            except Exception as exc:
                # Roles are the cluster's: another database may be granting them now.
                if attempt == 2:
                    raise sandbox_missing(str(exc).strip()) from exc
                time.sleep(0.05 * (attempt + 1))
    finally:
        conn.close()


def _refresh(cur, writes, revoke):
    # Called from the writer too: never wait without end on a lock its transaction holds.
    cur.execute("SET LOCAL lock_timeout = 5000")
    cur.execute("SELECT pg_advisory_xact_lock(%s)", [SANDBOX_LOCK])
    cur.execute("SELECT current_schema(), current_user")
    schema, app = cur.fetchone()
    base, role = base_role(), role_for(writes)
    _create(cur, base)
    tables = readable(cur)
    _reset(cur, base, schema)
    cur.execute(f"GRANT USAGE ON SCHEMA {_ident(schema)} TO {_ident(base)}")
    if tables:
        names = ", ".join(_ident(name) for _oid, name in tables)
        cur.execute(f"GRANT SELECT ON {names} TO {_ident(base)}")
    if writes:
        _create(cur, role)
        _reset(cur, role, schema)
        cur.execute(f"GRANT {_ident(base)} TO {_ident(role)}")
        names = ", ".join(_ident(name) for name in writes)
        cur.execute(f"GRANT INSERT, UPDATE, DELETE ON {names} TO {_ident(role)}")
        cur.execute(
            "SELECT DISTINCT s.relname FROM pg_depend d JOIN pg_class s ON s.oid = d.objid "
            "WHERE s.relkind = 'S' AND d.refobjid = ANY(%s::regclass[])",
            [[_ident(name) for name in writes]],
        )
        for (sequence,) in cur.fetchall():
            cur.execute(f"GRANT USAGE ON SEQUENCE {_ident(sequence)} TO {_ident(role)}")
    cur.execute(_DEFINERS)
    for (signature,) in cur.fetchall():
        cur.execute(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
    needed = _revoke(cur, app, revoke)
    for name in {base, role}:
        _check_usable(cur, name)
    return needed


def _create(cur, name):
    cur.execute(
        "SELECT rolsuper OR rolcanlogin OR rolcreaterole OR rolcreatedb OR rolbypassrls "
        "OR rolreplication FROM pg_roles WHERE rolname = %s",
        [name],
    )
    row = cur.fetchone()
    if row is None:
        cur.execute(f"CREATE ROLE {_ident(name)} NOLOGIN INHERIT")
    elif row[0]:
        raise sandbox_missing(f"role {name!r} exists with LOGIN or other powers; drop it")
    cur.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    if not cur.fetchone()[0]:
        cur.execute("SELECT pg_has_role(current_user, %s, %s)", [name, _can_set(cur)])
        if not cur.fetchone()[0]:
            cur.execute(f"GRANT {_ident(name)} TO CURRENT_USER")


def _can_set(cur):
    """The pg_has_role privilege that means "may SET ROLE" (PostgreSQL 16 split it)."""
    return "SET" if cur.connection.info.server_version >= 160000 else "MEMBER"


def _reset(cur, role, schema):
    """Drop every table and sequence privilege ``role`` holds in ``schema``."""
    cur.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {_ident(schema)} FROM {_ident(role)}")
    cur.execute(f"REVOKE ALL ON ALL SEQUENCES IN SCHEMA {_ident(schema)} FROM {_ident(role)}")


def _revoke(cur, app, revoke):
    """Revoke what this user may; the statements still needed (as superuser)."""
    needed = []
    cur.execute("SELECT to_regrole(%s) IS NOT NULL", [_ident(base_role())])
    exists = cur.fetchone()[0]
    cur.execute(_REVOKED)
    for (signature,) in cur.fetchall():
        if exists:
            cur.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", [base_role(), signature]
            )
            if not cur.fetchone()[0]:
                continue
        statements = [
            f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC",
            f"GRANT EXECUTE ON FUNCTION {signature} TO {_ident(app)}",
        ]
        if revoke:
            cur.execute("SAVEPOINT rindle_revoke")
            try:
                for statement in statements:
                    cur.execute(statement)
                cur.execute("RELEASE SAVEPOINT rindle_revoke")
                continue
            except Exception:
                cur.execute("ROLLBACK TO SAVEPOINT rindle_revoke")
        needed.extend(s + ";" for s in statements)
    return needed


def _check_usable(cur, role):
    cur.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, SET_CONFIG])
    if cur.fetchone()[0]:
        raise sandbox_missing(
            f"role {role!r} may call set_config(), which would let a statement leave it; "
            f"as a superuser, run: REVOKE EXECUTE ON FUNCTION {SET_CONFIG} FROM PUBLIC; "
            f"GRANT EXECUTE ON FUNCTION {SET_CONFIG} TO <the app's user>;"
        )


def superuser_sql(alias):
    """The statements, for a superuser, that the sandbox still needs in ``alias``."""
    with connections[alias].cursor() as cur:
        cur.execute("SELECT current_user")
        return _revoke(cur, cur.fetchone()[0], revoke=False)


def install(alias):
    """
    Create and refresh every role public SQL uses now in ``alias``: the base role (and
    the revokes, as far as this user may), and the write role of each active ``sql``
    token. Returns the statements that still need a superuser; raises
    ``SANDBOX_MISSING`` when the sandbox cannot be used.
    """
    from ...models import RindleToken
    from .guards import Principal

    forget()
    needed = refresh(alias, revoke=True)
    with connections[alias].cursor() as cur:
        tables = [name for _oid, name in readable(cur)]
    sets = set()
    for token in RindleToken.objects.using(alias).select_related("user"):
        if token.is_active() and token.has_scope("sql"):
            principal = Principal(token.user, token)
            sets.add(tuple(name for name in tables if principal.can_write(name)))
    for writes in sorted(sets - {()}):
        refresh(alias, writes)
    return needed


def status(alias):
    """None when the base role is usable in ``alias``'s database, else what is wrong."""
    conn = connections[alias]
    with conn.cursor() as cur:
        cur.execute(
            "SELECT rolsuper OR rolcanlogin OR rolcreaterole OR rolcreatedb OR rolbypassrls "
            "OR rolreplication FROM pg_roles WHERE rolname = %s",
            [base_role()],
        )
        row = cur.fetchone()
        if row is None:
            return f"role {base_role()!r} does not exist"
        if row[0]:
            return f"role {base_role()!r} has LOGIN or other powers"
        cur.execute(
            "SELECT rolsuper OR pg_has_role(current_user, %s, %s) FROM pg_roles "
            "WHERE rolname = current_user",
            [base_role(), _can_set(cur.cursor)],
        )
        if not cur.fetchone()[0]:
            return f"the app's user may not SET ROLE {base_role()!r}"
        cur.execute("SELECT has_function_privilege(%s, %s, 'EXECUTE')", [base_role(), SET_CONFIG])
        if cur.fetchone()[0]:
            return f"role {base_role()!r} may call set_config() (REVOKE it FROM PUBLIC)"
    return None


# --- what the database refused --------------------------------------------------------

_DENIED = re.compile(
    r"permission denied for (table|view|sequence|schema|function|large object) (\S+)"
)


def refusal(cause, keyword=None):
    """
    The SqlError of a PostgreSQL refusal of the sandbox (its budgets, its missing
    privileges), or None. Which privilege was missing is told from the message only
    to pick the code: the database has already refused.
    """
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate == "57014":  # query_canceled: statement_timeout
        seconds = rindle_settings.SQL_STATEMENT_TIMEOUT_SECONDS
        return SqlError(
            f"the statement ran longer than its {seconds} s budget and was cancelled; "
            "nothing of it was applied",
            code=SQL_STATEMENT_TIMEOUT,
            status=408,
        )
    if sqlstate == "55P03":  # lock_not_available: lock_timeout
        seconds = rindle_settings.SQL_LOCK_TIMEOUT_SECONDS
        return SqlError(
            f"the statement waited longer than {seconds} s for a lock; nothing was applied",
            code=SQL_LOCK_TIMEOUT,
            status=408,
            retry_scope="request",
        )
    if sqlstate != "42501":  # insufficient_privilege
        return None
    diag = getattr(cause, "diag", None)
    message = (getattr(diag, "message_primary", None) or str(cause)).strip()
    match = _DENIED.search(message)
    kind, name = match.groups() if match else (None, None)
    if kind in ("function", "large object"):
        code = SQL_FUNCTION_FORBIDDEN
    elif kind == "sequence" or (
        kind == "table" and not protected(name) and not name.startswith("pg_")
    ):
        code = SQL_WRITE_FORBIDDEN  # every app table that is not protected is readable
    elif kind is None and keyword not in WRITES:
        code = SQL_FUNCTION_FORBIDDEN
    else:
        code = SQL_WRITE_FORBIDDEN if keyword in WRITES else SQL_READ_FORBIDDEN
    return SqlError(message, code=code, status=403)
