"""
The migrations journal: SQL migrations applied once each, by id and checksum.

A migration is an id and a list of SQL statements, either all DDL or all DML. Its
statements, the bookkeeping they need (capture triggers) and the journal row in
``_rindle_applied_ddl`` (the marker, with the apply report) commit in ONE writer
transaction, so a crash leaves a migration either fully applied with its marker
or absent.

Statements are split and classified by ``migration_sql`` (the scanner, the
allow-list and the refusals that need only the SQL text). The journal refuses more,
with their own codes:

- DML: every table they write must be registered with the engine (captured), so
  their row changes reach the outbox like any write and replicas never re-run the
  SQL (``table_not_captured`` otherwise).
- A column type change detected by comparing the table before and after
  (``type_change_refused``); DDL and DML in one migration (``mixed_migration``);
  ``_rindle_*``, ``__*`` and ``sqlite_*`` tables and views (``reserved_table``);
  dropping a table another table references (``referenced_table``); a created
  table without a primary key (``no_primary_key``); a new BLOB/BYTEA column
  (``blob_refused``).

Identity. ``content_checksum`` is the SHA-256 of the statements with comments
dropped and whitespace collapsed, so it changes only when the SQL does.
``checksum`` is the caller's opaque SHA-256 (the command hashes the file's bytes,
its ``-- OVERRIDE_HASH:`` first line left out); it is optional. Against a stored
migration of the same id:

- a different kind fails (``kind_mismatch``, 409), different SQL fails
  (``checksum_mismatch``, 409) whatever the override says;
- the same SQL under another checksum is a cosmetic edit: it fails
  (``checksum_mismatch``) unless ``override_hash`` names the stored checksum
  (``override_mismatch`` when it names another), and is then recorded as the
  new checksum (``hashOverridden``);
- otherwise it is ``present``: nothing runs and the stored report is returned. A
  checksum supplied for a migration stored without one is adopted.

DML limits: 8,191 captured row changes and 64 MiB of SQL or of captured images
per migration (``too_many_row_changes``, ``migration_too_large``; 413).

After a DDL commit the tables it created or changed are re-registered
(``Engine.register_existing_table``), so the table map refreshes and only the
subscriptions on a changed table are bounced; a dropped table leaves the map.
Tables created by the journal are captured from the transaction that creates
them, and ``restore_tables`` re-registers them whenever the engine starts or
refreshes. ``schema_version`` is the id of the latest applied DDL migration.
"""

import dataclasses
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.db import DatabaseError

from ..exceptions import (
    BLOB_REFUSED,
    EMPTY_MIGRATION,
    ID_TAKEN,
    INVALID_MIGRATION_ID,
    INVALID_STATEMENTS,
    KIND_MISMATCH,
    MIXED_MIGRATION,
    OVERRIDE_MISMATCH,
    REFERENCED_TABLE,
    RESERVED_TABLE,
    TOO_MANY_ROW_CHANGES,
    TYPE_CHANGE_REFUSED,
    MigrationConflict,
    MigrationTooLarge,
    StatementFailed,
)
from . import capture
from .errors import InvalidInput, UnknownTable
from .identifiers import validate
from .migration_sql import MigrationRefused, _refuse, classify, tokenize
from .schema_changes import mark, shape
from .tables import HIDDEN_PREFIXES, introspect
from .writer import is_infrastructure_error

logger = logging.getLogger("rindle.engine")

JOURNAL = "_rindle_applied_ddl"
MAX_ROW_CHANGES = 8191
MAX_BYTES = 64 * 1024 * 1024
MAX_ID_LENGTH = 200
# Serializes journal applies across processes on PostgreSQL ("rindlj" in ASCII);
# SQLite's write lock already does.
JOURNAL_LOCK = 0x72696E646C6A

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_OVERRIDE = re.compile(r"^--\s*OVERRIDE_HASH\s*:\s*(\S*)\s*$")


# --- parsing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    """A parsed, classified migration, ready to apply."""

    id: str
    kind: str  # ddl | dml
    steps: tuple
    content_checksum: str
    checksum: str = None
    override_hash: str = None
    size: int = field(default=0, compare=False)

    @property
    def destructive(self):
        return [s for s in self.steps if s.destructive]


def parse(migration_id, statements, *, checksum=None, override_hash=None):
    """
    A ``Migration`` from ``statements`` (one SQL text, or a list of them).

    Raises ``MigrationRefused`` (``InvalidInput``) for anything the journal refuses
    without looking at the database.
    """
    if not isinstance(migration_id, str) or not (
        0 < len(migration_id) <= MAX_ID_LENGTH and _ID.match(migration_id)
    ):
        raise MigrationRefused(
            f"invalid migration id {migration_id!r}: letters, digits, '_', '-' and '.', "
            f"starting with a letter or digit, at most {MAX_ID_LENGTH} characters",
            code=INVALID_MIGRATION_ID,
        )
    checksum = _hex(checksum, "checksum", "invalid_checksum")
    override_hash = _hex(override_hash, "override hash", "invalid_override_hash")
    texts = [statements] if isinstance(statements, str) else statements
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise MigrationRefused("statements must be SQL text", code=INVALID_STATEMENTS)
    size = sum(len(t.encode()) for t in texts)
    if size > MAX_BYTES:
        raise MigrationTooLarge(f"the migration's SQL is {size} bytes; the limit is {MAX_BYTES}")
    split = [s for text in texts for s in tokenize(text)]
    if not split:
        raise MigrationRefused("the migration has no statements", code=EMPTY_MIGRATION)
    steps = tuple(classify(i, text, tokens) for i, (text, tokens) in enumerate(split))
    kinds = {s.kind for s in steps}
    if len(kinds) > 1:
        first_dml = next(s.index for s in steps if s.kind == "dml")
        raise MigrationRefused(
            "a migration is pure DDL or pure DML: split it in two files",
            code=MIXED_MIGRATION,
            statement=first_dml,
        )
    for s in steps:
        for name, _quoted in s.tables:
            if name.lower().startswith(HIDDEN_PREFIXES):
                raise _refuse(s.index, f"table {name!r} is reserved", RESERVED_TABLE)
    normalized = ";\n".join(" ".join(t.text for t in tokens) for _text, tokens in split)
    content = hashlib.sha256(normalized.encode()).hexdigest()
    return Migration(migration_id, kinds.pop(), steps, content, checksum, override_hash, size)


def _hex(value, what, code):
    if value is None:
        return None
    if not isinstance(value, str) or not _HEX64.match(value):
        raise MigrationRefused(f"the {what} must be 64 hex digits (SHA-256)", code=code)
    return value.lower()


def parse_file(path):
    """
    The ``Migration`` of one ``.sql`` file: id = file stem, checksum = SHA-256 of its
    bytes without an ``-- OVERRIDE_HASH: <hex>`` first line, which sets the override.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise MigrationRefused(f"{path.name} is not UTF-8", code=INVALID_STATEMENTS) from exc
    override = None
    first, sep, rest = text.partition("\n")
    m = _OVERRIDE.match(first.rstrip("\r"))
    if m:
        override = m.group(1)
        text = rest
        data = rest.encode()
    checksum = hashlib.sha256(data).hexdigest()
    return parse(path.stem, text, checksum=checksum, override_hash=override)


# --- applying -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What applying a migration answered."""

    id: str
    kind: str
    applied: bool
    report: dict
    schema_version: str = None
    hash_overridden: bool = False
    cv: int = None

    def as_dict(self):
        return {
            "id": self.id,
            "kind": self.kind,
            "applied": self.applied,
            "hashOverridden": self.hash_overridden,
            "schemaVersion": self.schema_version,
            "destructive": [s["sql"] for s in self.report.get("steps", ()) if s.get("destructive")],
            "report": self.report,
            "cv": self.cv,
        }


def apply(engine, migration, *, on_step=None):
    """
    Apply ``migration`` once through ``engine``; an exact replay returns the stored
    report. ``on_step(tx, step)`` runs after each statement, inside the transaction
    (bookkeeping effects of a caller; an exception rolls everything back).
    """
    commit = engine.write(lambda tx: _apply(engine, tx, migration, on_step))
    outcome, register, dropped = commit.value
    if outcome.applied:
        from .registry import synced_models

        models = {m._meta.db_table: m for m in synced_models()}
        for name in register:
            engine.register_existing_table(name, model=models.get(name))
        for name in dropped:
            _forget(engine, name)
        outcome = dataclasses.replace(outcome, cv=commit.cv)
    return outcome


def _apply(engine, tx, migration, on_step):
    # The journal read and the marker insert must not interleave with another
    # process's apply of the same id (SQLite's write lock already orders them).
    if tx.vendor == "postgresql":
        tx.execute("SELECT pg_advisory_xact_lock(%s)", [JOURNAL_LOCK])
    stored = _stored(tx, migration.id)
    if stored is not None:
        return _replay(tx, migration, stored), (), ()
    if migration.kind == "ddl":
        report, register, dropped = _apply_ddl(engine, tx, migration, on_step)
    else:
        report, register, dropped = _apply_dml(engine, tx, migration, on_step), (), ()
    report = {"journal": "migration", "id": migration.id, "kind": migration.kind, **report}
    latest = tx.scalar(f"SELECT MAX(applied_at) FROM {JOURNAL}") or 0
    tx.execute(
        f"INSERT INTO {JOURNAL} (key, actions, checksum, content_checksum, applied_at) "
        f"VALUES (%s, {'%s::jsonb' if tx.vendor == 'postgresql' else '%s'}, %s, %s, %s)",
        [
            migration.id,
            json.dumps(report),
            migration.checksum,
            migration.content_checksum,
            max(int(time.time() * 1000), latest + 1),
        ],
    )
    outcome = Outcome(migration.id, migration.kind, True, report, schema_version(tx))
    return outcome, register, dropped


def _replay(tx, migration, stored):
    report = stored["actions"]
    if not isinstance(report, dict) or report.get("journal") != "migration":
        raise MigrationConflict(
            f"{migration.id!r} names a journal entry that is not a migration", code=ID_TAKEN
        )
    if report.get("kind") != migration.kind:
        raise MigrationConflict(
            f"migration {migration.id!r} was applied as {report.get('kind')}, not {migration.kind}",
            code=KIND_MISMATCH,
        )
    if stored["content_checksum"] != migration.content_checksum:
        raise MigrationConflict(
            f"migration {migration.id!r} was applied with different SQL "
            f"(content checksum {stored['content_checksum']}); write a new migration",
            stored=stored["content_checksum"],
        )
    overridden = False
    new = migration.checksum
    if new is not None and stored["checksum"] is not None and new != stored["checksum"]:
        if migration.override_hash is None:
            raise MigrationConflict(
                f"migration {migration.id!r} was applied with checksum {stored['checksum']}; "
                "a cosmetic edit needs '-- OVERRIDE_HASH: <stored checksum>'",
                stored=stored["checksum"],
            )
        if migration.override_hash != stored["checksum"]:
            raise MigrationConflict(
                f"the override hash does not name the stored checksum of {migration.id!r}",
                code=OVERRIDE_MISMATCH,
            )
        overridden = True
    if new is not None and new != stored["checksum"]:
        tx.execute(f"UPDATE {JOURNAL} SET checksum = %s WHERE key = %s", [new, migration.id])
    return Outcome(migration.id, migration.kind, False, report, schema_version(tx), overridden)


def _apply_ddl(engine, tx, migration, on_step):
    vendor = tx.vendor
    registered = engine.tables.by_name()
    existing = set(tx.connection.introspection.table_names(tx.cursor))
    resolved = {}  # (name, quoted) -> the table's name in the database
    for s in migration.steps:
        for ref in s.tables:
            resolved[ref] = _resolve(s.index, ref, existing, vendor)
    targets = set(resolved.values())
    before = {
        name: introspect(tx.connection, tx.cursor, name, model=_model(name))
        for name in targets
        if name in registered and name in existing
    }
    if vendor == "sqlite":
        # SQLite refuses to drop a column a trigger names: capture comes back below.
        for name in before:
            capture.remove(tx.cursor, vendor, name)
    for s in migration.steps:
        if s.action == "drop_table" and vendor == "postgresql":
            _refuse_pg_references(tx, [resolved[ref] for ref in s.tables])
        _execute(tx, s)
        if on_step is not None:
            on_step(tx, s)
    after = set(tx.connection.introspection.table_names(tx.cursor))
    created = [
        resolved[ref]
        for s in migration.steps
        if s.action == "create_table"
        for ref in s.tables
        if resolved[ref] not in existing and resolved[ref] in after
    ]
    dropped = sorted(t for t in targets if t in existing and t not in after)
    if vendor == "sqlite" and dropped:
        _refuse_references(tx, dropped, after)
    register = []
    for name in sorted(set(created) | (set(before) & after)):
        try:
            table = introspect(tx.connection, tx.cursor, name, model=_model(name))
        except UnknownTable as exc:
            raise MigrationRefused(
                f"table {name!r} has no primary key: rindle captures rows by key",
                code=exc.code,
                table=name,
            ) from None
        _check_columns(before.get(name), table)
        capture.install(tx.cursor, vendor, table)
        if shape(before.get(name)) != shape(table):
            mark(tx.cursor, vendor, name)  # other processes re-read it in order
        register.append(name)
    for name in dropped:
        if name in registered:
            mark(tx.cursor, vendor, name)
    report = {
        "steps": [s.report() for s in migration.steps],
        "created": sorted(set(created)),
        "altered": sorted(set(register) - set(created)),
        "dropped": dropped,
    }
    return report, register, [d for d in dropped if d in registered]


def _apply_dml(engine, tx, migration, on_step):
    registered = engine.tables.by_name()
    existing = set(tx.connection.introspection.table_names(tx.cursor))
    for s in migration.steps:
        for ref in s.tables:
            name = _resolve(s.index, ref, existing, tx.vendor)
            if name not in registered:
                raise _refuse(
                    s.index,
                    f"table {name!r} is not captured: its changes would never reach "
                    "subscribers or replicas (register it, or sync its model)",
                    "table_not_captured",
                )
    start = tx.scalar(f"SELECT COALESCE(MAX(seq), 0) FROM {capture.OUTBOX}")
    steps = []
    for s in migration.steps:
        rows = _execute(tx, s)
        if on_step is not None:
            on_step(tx, s)
        steps.append({**s.report(), "rows": rows})
    changes, size = _captured(tx, start)
    if changes > MAX_ROW_CHANGES:
        raise MigrationTooLarge(
            f"the migration made {changes} row changes; the limit is {MAX_ROW_CHANGES}",
            code=TOO_MANY_ROW_CHANGES,
        )
    if size > MAX_BYTES:
        raise MigrationTooLarge(
            f"the migration's row changes take {size} bytes; the limit is {MAX_BYTES}"
        )
    return {"steps": steps, "rowChanges": changes}


def _execute(tx, step):
    try:
        with tx.connection.wrap_database_errors:
            tx.cursor.execute(step.sql)
    except DatabaseError as exc:
        if is_infrastructure_error(exc):
            raise
        raise StatementFailed(
            f"statement {step.index + 1} failed: {exc}", statement=step.index
        ) from exc
    return max(tx.cursor.rowcount, 0)


def _captured(tx, start):
    """(row changes, bytes of their images) this transaction appended after ``start``."""
    if tx.vendor == "postgresql":
        sql = (
            "SELECT COUNT(*), COALESCE(SUM(octet_length(COALESCE(old::text, '')) "
            f"+ octet_length(COALESCE(new::text, ''))), 0) FROM {capture.OUTBOX} "
            "WHERE seq > %s AND txid = pg_current_xact_id()::text::bigint"
        )
    else:
        sql = (
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(COALESCE(old, '') AS BLOB)) "
            f"+ LENGTH(CAST(COALESCE(new, '') AS BLOB))), 0) FROM {capture.OUTBOX} "
            "WHERE seq > %s"
        )
    tx.cursor.execute(sql, [start])
    count, size = tx.cursor.fetchone()
    return int(count), int(size)


def _resolve(index, ref, existing, vendor):
    """A table name as the database stores it (unquoted names fold)."""
    name, quoted = ref
    if not quoted:
        if vendor == "postgresql":
            name = name.lower()
        else:
            name = next((e for e in existing if e.lower() == name.lower()), name)
    if name.lower().startswith(HIDDEN_PREFIXES):
        raise _refuse(index, f"table {name!r} is reserved", RESERVED_TABLE)
    try:
        return validate(name, "table name")
    except InvalidInput as exc:
        raise _refuse(index, exc.message, exc.code) from None


def _model(name):
    from .registry import synced_models

    return next((m for m in synced_models() if m._meta.db_table == name), None)


def _check_columns(before, table):
    old = {} if before is None else {c.name: c for c in before.columns}
    for c in table.columns:
        if c.name not in old:
            declared = c.declared.lower()
            if "blob" in declared or "bytea" in declared:
                raise MigrationRefused(
                    f"column {table.name}.{c.name} is {c.declared}: binary columns are refused",
                    code=BLOB_REFUSED,
                    table=table.name,
                )
        elif old[c.name].declared.lower() != c.declared.lower():
            raise MigrationRefused(
                f"column {table.name}.{c.name} changed type from {old[c.name].declared} "
                f"to {c.declared}: type changes are refused",
                code=TYPE_CHANGE_REFUSED,
                table=table.name,
            )


def _refuse_references(tx, dropped, remaining):
    # PostgreSQL refuses such a drop itself; SQLite would leave a dangling reference.
    for other in sorted(remaining):
        if other.startswith("sqlite_"):
            continue
        tx.cursor.execute(f'PRAGMA foreign_key_list("{other}")')
        for row in tx.cursor.fetchall():
            if row[2] in dropped:
                raise MigrationRefused(
                    f"table {row[2]!r} is referenced by {other!r}: drop in dependency order",
                    code=REFERENCED_TABLE,
                    table=row[2],
                )


def _refuse_pg_references(tx, names):
    # PostgreSQL would refuse the drop too, as a bare statement failure.
    for name in names:
        tx.cursor.execute(
            "SELECT c.conrelid::regclass::text FROM pg_constraint c "
            "WHERE c.contype = 'f' AND c.confrelid = to_regclass(%s) "
            "AND c.conrelid <> c.confrelid",
            [f'"{name}"'],
        )
        others = sorted({row[0].strip('"') for row in tx.cursor.fetchall()} - set(names))
        if others:
            raise MigrationRefused(
                f"table {name!r} is referenced by {others}: drop in dependency order",
                code=REFERENCED_TABLE,
                table=name,
            )


def _forget(engine, name):
    """Remove a dropped table from the engine's table map and tell its listeners."""
    engine.forget_table(name)


# --- reading the journal ------------------------------------------------------------


def _stored(tx, migration_id):
    tx.cursor.execute(
        f"SELECT actions, checksum, content_checksum, applied_at FROM {JOURNAL} WHERE key = %s",
        [migration_id],
    )
    row = tx.cursor.fetchone()
    if row is None:
        return None
    actions = json.loads(row[0]) if isinstance(row[0], (str, bytes)) else row[0]
    return {
        "actions": actions,
        "checksum": row[1],
        "content_checksum": row[2],
        "applied_at": row[3],
    }


def _migrations(tx):
    """Every journaled migration's report, in apply order."""
    return _journaled(tx.cursor)


def _journaled(cursor):
    cursor.execute(f"SELECT key, actions FROM {JOURNAL} ORDER BY applied_at, key")
    out = []
    for key, actions in cursor.fetchall():
        actions = json.loads(actions) if isinstance(actions, (str, bytes)) else actions
        if isinstance(actions, dict) and actions.get("journal") == "migration":
            out.append((key, actions))
    return out


def schema_version(tx):
    """The id of the latest applied DDL migration (None before the first)."""
    ddl = [key for key, report in _migrations(tx) if report.get("kind") == "ddl"]
    return ddl[-1] if ddl else None


def migration_record(engine, migration_id):
    """The stored journal row of ``migration_id`` (a dict), or None."""
    return engine.write(lambda tx: _stored(tx, migration_id)).value


def journaled_tables(connection, cursor):
    """The tables journaled migrations created and did not drop that exist, in order."""
    existing = set(connection.introspection.table_names(cursor))
    if JOURNAL not in existing:
        return []
    live = {}
    for _key, report in _journaled(cursor):
        for name in report.get("created", ()):
            live[name] = True
        for name in report.get("dropped", ()):
            live.pop(name, None)
    return [name for name in live if name in existing]


def restore_tables(engine):
    """
    Re-register the tables journaled migrations created and did not drop (called
    when the engine starts or refreshes); returns their names.
    """

    restored = []
    for name in engine.write(lambda tx: journaled_tables(tx.connection, tx.cursor)).value:
        try:
            engine.register_existing_table(name, model=_model(name))
        except UnknownTable as exc:  # changed outside the journal: start without it
            logger.warning("rindle journal: table %r not registered: %s", name, exc.message)
            continue
        restored.append(name)
    return restored
