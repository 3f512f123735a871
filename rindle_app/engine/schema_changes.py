"""
Schema changes: capture kept intact across Django migrations, and the DDL marker
that tells every reader of the outbox, in every process, that a table changed.

**Capture across ``migrate``.** Before ``migrate`` runs its plan (``pre_migrate``),
``instrument`` puts a pair of ``CaptureGuard`` operations around every schema
operation of every migration in the plan: one just before it, one just after it.
Django runs a migration's operations in ONE transaction (its atomic schema editor;
SQLite and PostgreSQL both have transactional DDL), so the guards run in the same
transaction as the DDL they surround:

- the guard before an operation snapshots the shape of every table the operation
  may touch (the models it references, read from Django's ``ProjectState``, never
  from the SQL), and on SQLite drops their capture triggers: a SQLite trigger names
  every column, so ``ALTER TABLE ... DROP COLUMN`` refuses to run under one, and a
  table rebuild (``_remake_table``) would silently drop them with the old table
  (an operation on the outbox itself, rindle's own upgrade, drops every table's:
  SQLite refuses to rebuild a table that triggers name);
- the guard after it re-introspects those tables, reinstalls their capture in the
  new shape (dropping triggers named after a table's old name, left by a
  ``RenameModel``), and appends one DDL marker to the outbox per table whose shape
  changed, appeared or went away.

So no other connection ever sees a table without capture, or capture of the wrong
shape: the triggers, the DDL and the marker commit together, and until then the
DDL's own locks (SQLite's write lock, PostgreSQL's ACCESS EXCLUSIVE) keep other
writers off the table. A ``RunPython`` between two operations writes through
reinstalled, current triggers and is captured. The guards of a ``RunSQL`` never
drop triggers, so a data ``RunSQL`` stays captured and a schema one is still
reinstalled after and marked (a ``RunSQL`` that drops a column of a synced table
on SQLite is refused by SQLite: write it as a Django operation or a journaled
migration). A migration with ``atomic = False`` runs each operation in its own
transaction, so on SQLite capture is off between an operation and its guard;
``migrate --run-syncdb`` creates whole tables, which ``post_migrate`` captures
(``signals.install_capture_after_migrate``) as before.

**The DDL marker.** An outbox row ``op = 'ddl'``, ``pk = []``, with neither an old
nor a new image (no row change has neither, so readers tell it apart by that
alone), naming the changed table. It takes a seq like any change, behind the
writer fence on PostgreSQL, so every reader meets it in order: the live tail
(``ivm.live.LiveQueries.poll``) re-introspects the table when it reads one
(``Engine.reload_tables``) before it applies later changes, and the public stream
shows it as an event of op ``ddl``. Partition reads skip it. Journaled migrations
(``engine.journal``) append the same marker.
"""

import copy

from django.db.migrations.operations import RunPython, RunSQL, SeparateDatabaseAndState
from django.db.migrations.operations.base import Operation

from . import capture
from .capture import NOTIFY_CHANNEL, OUTBOX, trigger_names
from .errors import UnknownTable
from .identifiers import quote
from .tables import introspect

DDL_OP = "ddl"
_TRIGGER_PREFIX = "_rindle_cap_"


def is_marker(old, new):
    """True for a DDL marker's images (the one outbox event with neither)."""
    return old is None and new is None


def mark(cursor, vendor, table_name):
    """Append a DDL marker for ``table_name`` to the outbox, in this transaction."""
    if vendor == "postgresql":
        # seq 0: the outbox's guard trigger draws the real one behind the fence.
        cursor.execute(
            f'INSERT INTO {OUTBOX} (seq, txid, "table", op, pk, old, new) VALUES '
            "(0, pg_current_xact_id()::text::bigint, %s, %s, '[]'::jsonb, NULL, NULL)",
            [table_name, DDL_OP],
        )
        # Wake the watermarker as a captured row does (capture._PG_FUNCTION).
        cursor.execute("SELECT pg_notify(%s, pg_current_xact_id()::text)", [NOTIFY_CHANNEL])
    else:
        cursor.execute(
            f'INSERT INTO {OUTBOX} (txid, "table", op, pk, old, new) '
            "VALUES (NULL, %s, %s, '[]', NULL, NULL)",
            [table_name, DDL_OP],
        )


def shape(table):
    """What a DDL marker is about: columns (name, declared type, null), pk, fks."""
    if table is None:
        return None
    columns = tuple((c.name, c.declared.lower(), c.nullable) for c in table.columns)
    return columns, table.primary_key, table.foreign_keys


def capture_triggers(cursor, vendor, table_name):
    """The names of the rindle capture triggers on ``table_name``."""
    if vendor == "sqlite":
        cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s",
            [table_name],
        )
    else:
        cursor.execute(
            "SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace "
            "AND NOT t.tgisinternal",
            [table_name],
        )
    return {name for (name,) in cursor.fetchall() if name.startswith(_TRIGGER_PREFIX)}


def remove_strays(cursor, vendor, table_name):
    """Drop capture triggers on ``table_name`` named after another table (a rename)."""
    wanted = set(trigger_names(table_name).values())
    for name in sorted(capture_triggers(cursor, vendor, table_name) - wanted):
        if vendor == "sqlite":
            cursor.execute(f"DROP TRIGGER IF EXISTS {quote(name)}")
        else:
            cursor.execute(f"DROP TRIGGER IF EXISTS {quote(name)} ON {quote(table_name)}")


# --- migrations -------------------------------------------------------------------


def instrument(plan):
    """
    Put ``CaptureGuard`` pairs around the schema operations of every migration in
    ``plan`` (``pre_migrate``'s: the very migration objects ``migrate`` applies).
    Idempotent; a migration's ``operations`` is a per-instance copy (Django's
    ``Migration.__init__``), so the migration files' classes are untouched.
    """
    for migration, _backwards in plan or ():
        migration.operations = _guarded(migration.operations)


def _guarded(operations):
    if any(isinstance(op, CaptureGuard) for op in operations):
        return operations
    out = []
    for op in operations:
        if isinstance(op, RunPython):
            out.append(op)
            continue
        if isinstance(op, SeparateDatabaseAndState):
            op = copy.copy(op)
            op.database_operations = _guarded(op.database_operations)
            out.append(op)
            continue
        shared = {}
        drop = not isinstance(op, RunSQL)
        out += [CaptureGuard(op, True, shared, drop), op, CaptureGuard(op, False, shared, drop)]
    return out


class CaptureGuard(Operation):
    """
    One side of the pair around ``operation`` (see the module): ``opening`` runs
    before it (when migrating forwards; after it when unapplying), snapshotting
    and, on SQLite, dropping capture; the other side reinstalls capture and marks
    changed tables. It changes no state and is never written to a migration file.
    """

    reduces_to_sql = False
    reversible = True
    elidable = True

    def __init__(self, operation, opening, shared, drop=True):
        self.operation = operation
        self.opening = opening
        self.shared = shared
        self.drop = drop

    def deconstruct(self):  # pragma: no cover - never serialized
        return self.__class__.__name__, [], {}

    def state_forwards(self, app_label, state):
        pass

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        (self._before if self.opening else self._after)(schema_editor, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        (self._after if self.opening else self._before)(schema_editor, to_state)

    def describe(self):
        return f"rindle capture around: {self.operation.describe()}"

    # --- the two sides ---------------------------------------------------------------

    def _before(self, schema_editor, state):
        conn = schema_editor.connection
        self.shared.clear()
        if not _ours(conn):
            return
        with conn.cursor() as cursor:
            existing = set(conn.introspection.table_names(cursor))
            if OUTBOX not in existing:  # rindle's own tables are not there yet
                return
            synced = synced_tables()
            models = self._tables(state)
            names = set(models)
            if OUTBOX in names and conn.vendor == "sqlite":
                # Every capture trigger names the outbox: SQLite refuses to rebuild it
                # (rename a table into its place) while one exists.
                names |= _captured_tables(cursor)
            before = {}
            for name in sorted(names):
                if name not in existing:
                    continue
                if name not in synced and not capture_triggers(cursor, conn.vendor, name):
                    continue
                try:
                    model = models.get(name) or synced.get(name)
                    before[name] = introspect(conn, cursor, name, model=model)
                except UnknownTable:
                    continue
                if self.drop and conn.vendor == "sqlite":
                    capture.remove(cursor, conn.vendor, name)
            self.shared["before"] = before

    def _after(self, schema_editor, state):
        conn = schema_editor.connection
        if not _ours(conn) or "before" not in self.shared:
            return
        before = self.shared.pop("before")
        vendor = conn.vendor
        with conn.cursor() as cursor:
            existing = set(conn.introspection.table_names(cursor))
            synced = synced_tables()
            models = self._tables(state)
            targets = {
                n: models.get(n) for n in set(models) | set(before) if n in synced or n in before
            }
            if vendor == "sqlite":
                # A table rebuilt as a side effect (its foreign key's target changed
                # type) lost its triggers with the old table.
                for name, model in synced.items():
                    if name in existing and name not in targets:
                        if len(capture_triggers(cursor, vendor, name)) < 3:
                            targets[name] = model
            for name, model in sorted(targets.items()):
                if name not in existing:
                    continue
                try:
                    table = introspect(conn, cursor, name, model=model or synced.get(name))
                except UnknownTable:
                    continue
                remove_strays(cursor, vendor, name)
                capture.install(cursor, vendor, table)
                if shape(before.get(name)) != shape(table):
                    mark(cursor, vendor, name)
            for name in sorted(before):
                if name not in existing:  # dropped, or renamed away
                    mark(cursor, vendor, name)

    def _tables(self, state):
        """{db table: historical model} of the models ``operation`` may touch in ``state``."""
        out = {}
        for app_label, model_name in list(state.models):
            if not self.operation.references_model(model_name, app_label):
                continue
            model = state.apps.get_model(app_label, model_name)
            meta = model._meta
            if meta.proxy or not meta.managed or meta.swapped:
                continue
            out[meta.db_table] = model
            for field in meta.local_many_to_many:  # auto-created join tables
                through = field.remote_field.through
                if through is not None and through._meta.auto_created:
                    out.setdefault(through._meta.db_table, through)
        return out


def _captured_tables(cursor):
    """The SQLite tables that carry a capture trigger."""
    cursor.execute("SELECT tbl_name, name FROM sqlite_master WHERE type = 'trigger'")
    return {table for table, name in cursor.fetchall() if name.startswith(_TRIGGER_PREFIX)}


def _ours(conn):
    from ..conf import rindle_settings

    return conn.alias == rindle_settings.DATABASE


def synced_tables():
    """{db table: model} of the synced models (the code's, not a migration state's)."""
    from django.apps import apps

    from .registry import synced_labels

    out = {}
    for label in synced_labels():
        try:
            model = apps.get_model(label)
        except LookupError:  # a label whose model is gone (rindle.E checks say so)
            continue
        out[model._meta.db_table] = model
    return out
