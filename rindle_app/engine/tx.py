"""The transaction handle a write request (and a mutator) receives."""

import functools
import itertools
import re
from contextlib import contextmanager

from django.db.models import Model

from ..exceptions import INVALID_KEY, INVALID_ROW, UNKNOWN_COLUMN
from . import model_rows
from .errors import InvalidInput
from .identifiers import quote

_FORMAT_MARK = re.compile(r"(?<!%)%s")  # as Django's SQLite cursor reads ``%s``


@functools.lru_cache(maxsize=4096)
def _qmark(sql):
    """``sql`` with ``%s`` marks for SQLite's driver: ``?``, and ``%%`` back to ``%``."""
    return _FORMAT_MARK.sub("?", sql).replace("%%", "%")


def _is_model(target):
    return isinstance(target, type) and issubclass(target, Model)


def _no_mapping(value, form):
    if value is not None:
        raise TypeError(f"tx.{form} takes fields as keyword arguments, not a dict")


def _no_fields(fields, form):
    if fields:
        raise TypeError(f"tx.{form} takes a dict of columns, not keyword arguments")


class Tx:
    """
    One open write transaction on the engine's writer connection.

    Every method that takes SQL takes ``%s`` placeholders (``%%`` for a literal
    ``%``), as Django's cursor does, on both backends; values are always bound as
    parameters. ``execute``/``query`` run through Django's cursor (its logging and
    debug tooling). ``scalar``/``run``/``fetchone``/``fetchall``/``run_many`` and
    the row helpers use the driver's cursor directly: the engine's own statements
    are generated, so Django's per-statement wrapping would only cost time on the
    writer (on SQLite the marks are translated to ``?`` once per distinct
    statement). Driver errors leave as ``django.db`` errors either way.

    Row helpers take a model class and field names::

        tx.insert(Issue, id="i1", title="Hello", owner=user)  # returns the pk
        tx.update(Issue, "i1", title="Hi", owner_id="u2")     # returns rows changed
        tx.delete(Issue, "i1")                                 # returns rows deleted

    A field is named by its name or attname and written to its column
    (``db_column`` and a ForeignKey's ``_id`` column included); the mapping is built
    once per model. ``insert`` applies defaults as ``Model.objects.create`` would;
    none of them sends signals or calls ``save()``, and ``delete`` does not cascade.
    The table-name forms (``tx.insert("issue", {...})``, ``tx.update("issue",
    {"id": "i1"}, {...})``, ``tx.delete("issue", {"id": "i1"})``, ``row``,
    ``insert_ignore``, ``upsert``) take table and column names registered in the
    table map.

    The Django ORM works inside a mutator as it is: the writer thread owns the
    connection of ``tx.using``, so ``Issue.objects.filter(...).update(...)``,
    ``obj.save()``, ``bulk_create`` and reads run in this same transaction, and a
    ``MutationRejected`` (or any error) rolls them back with everything else. Use
    the default manager (or ``.using(tx.using)``); never a different alias.
    """

    __slots__ = (
        "connection",
        "_cursor",
        "_raw",
        "_wrap",
        "_tables",
        "_qmark",
        "using",
        "vendor",
        "solo",
        "cv",
        "_savepoint_ids",
    )

    def __init__(self, connection, raw_cursor, tables, solo=False, savepoint_ids=None):
        self.connection = connection
        self.vendor = connection.vendor
        # A request that knows its transaction's last outbox seq may set it here,
        # sparing the writer a query (read only when the request is alone).
        self.cv = None
        # True when this request has the transaction to itself (no savepoint around it).
        self.solo = solo
        self._cursor = None
        self._raw = raw_cursor
        # Driver errors leave as django.db errors, as through Django's own cursor.
        self._wrap = connection.wrap_database_errors
        self._tables = tables
        self._qmark = connection.vendor == "sqlite"
        self.using = connection.alias
        # Savepoint numbers: the writer passes its own counter, so a name is never
        # used twice on its connection; a Tx made alone counts from 1.
        self._savepoint_ids = itertools.count(1) if savepoint_ids is None else savepoint_ids

    @property
    def cursor(self):
        """A Django cursor on the writer connection (``%s`` placeholders)."""
        if self._cursor is None:
            self._cursor = self.connection.cursor()
        return self._cursor

    @property
    def tables(self):
        """The engine's table map (the synced tables and their columns)."""
        return self._tables

    # --- SQL -------------------------------------------------------------------------

    def execute(self, sql, params=()):
        """Run one statement through Django's cursor; return the number of rows it changed."""
        self.cursor.execute(sql, params)
        return self.cursor.rowcount

    def query(self, sql, params=()):
        """Run one query through Django's cursor; return its rows as dicts."""
        self.cursor.execute(sql, params)
        names = [d[0] for d in self.cursor.description]
        return [dict(zip(names, row)) for row in self.cursor.fetchall()]

    def scalar(self, sql, params=()):
        """Run one query; return its first cell, or None without a row."""
        row = self.fetchone(sql, params)
        return row[0] if row else None

    def fetchone(self, sql, params=()):
        """Run one query; return its first row (a tuple), or None."""
        with self._wrap:
            self._raw.execute(_qmark(sql) if self._qmark else sql, params)
            return self._raw.fetchone()

    def fetchall(self, sql, params=()):
        """Run one query; return all its rows (tuples)."""
        with self._wrap:
            self._raw.execute(_qmark(sql) if self._qmark else sql, params)
            return self._raw.fetchall()

    def run(self, sql, params=()):
        """Run one statement; return the changed row count."""
        with self._wrap:
            self._raw.execute(_qmark(sql) if self._qmark else sql, params)
        return self._raw.rowcount

    def run_many(self, sql, param_rows):
        """Run one statement once per parameter row (``executemany``)."""
        with self._wrap:
            self._raw.executemany(_qmark(sql) if self._qmark else sql, param_rows)

    @contextmanager
    def savepoint(self):
        """All-or-nothing block inside the transaction: an exception rolls it back."""
        name = f"rindle_sp_{next(self._savepoint_ids)}"
        with self._wrap:  # no parameters, and a name never seen again: sent as is
            self._raw.execute(f"SAVEPOINT {name}")
        try:
            yield
        except BaseException:
            with self._wrap:
                self._raw.execute(f"ROLLBACK TO SAVEPOINT {name}")
                self._raw.execute(f"RELEASE SAVEPOINT {name}")
            raise
        with self._wrap:
            self._raw.execute(f"RELEASE SAVEPOINT {name}")

    # --- row helpers -------------------------------------------------------------------

    def row(self, table, pk):
        """The row of ``table`` whose primary key is ``pk`` (a dict), or None."""
        t = self._tables.get(table)
        where, params = self._key(t, pk)
        row = self.fetchone(f"SELECT * FROM {quote(table)} WHERE {where}", params)
        if row is None:
            return None
        return dict(zip([d[0] for d in self._raw.description], row))

    def insert(self, table, row=None, /, **fields):
        """
        Insert one row; a duplicate key raises IntegrityError.

        ``insert(Model, **fields)`` returns the new row's primary key;
        ``insert("table", {column: value})`` returns 1.
        """
        if _is_model(table):
            _no_mapping(row, "insert(Model, **fields)")
            sql, params, pk = model_rows.for_model(table).insert(self.connection, fields)
            if pk is not None:
                self.run(sql, params)
                return pk
            return self.fetchone(sql, params)[0]
        _no_fields(fields, 'insert("table", row)')
        sql, params = self._insert_sql(table, row)
        return self.run(sql, params)

    def insert_ignore(self, table, row):
        """Insert one row unless its key exists; return 1 if inserted, else 0."""
        sql, params = self._insert_sql(table, row)
        return self.run(sql + " ON CONFLICT DO NOTHING", params)

    def upsert(self, table, row):
        """Insert one row, or update the non-key columns of the existing one."""
        t = self._tables.get(table)
        sql, params = self._insert_sql(table, row)
        keys = ", ".join(quote(c) for c in t.primary_key)
        rest = [c for c in row if c not in t.primary_key]
        if rest:
            sets = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in rest)
            sql += f" ON CONFLICT ({keys}) DO UPDATE SET {sets}"
        else:
            sql += f" ON CONFLICT ({keys}) DO NOTHING"
        return self.run(sql, params)

    def update(self, table, pk, changes=None, /, **fields):
        """
        Set values on the row keyed ``pk``; return 1, or 0 for a missing row.

        ``update(Model, pk, **fields)``; ``update("table", {pk_column: value}, changes)``.
        """
        if _is_model(table):
            _no_mapping(changes, "update(Model, pk, **fields)")
            statement = model_rows.for_model(table).update(self.connection, pk, fields)
            return 0 if statement is None else self.run(*statement)
        _no_fields(fields, 'update("table", key, changes)')
        t = self._tables.get(table)
        self._check_columns(t, changes)
        if not changes:
            return 0
        where, key_params = self._key(t, pk)
        sets = ", ".join(f"{quote(c)} = %s" for c in changes)
        return self.run(
            f"UPDATE {quote(table)} SET {sets} WHERE {where}", [*changes.values(), *key_params]
        )

    def delete(self, table, pk):
        """
        Delete the row keyed ``pk``; return 1 if it existed, else 0.

        ``delete(Model, pk)``; ``delete("table", {pk_column: value})``.
        """
        if _is_model(table):
            return self.run(*model_rows.for_model(table).delete(self.connection, pk))
        t = self._tables.get(table)
        where, params = self._key(t, pk)
        return self.run(f"DELETE FROM {quote(table)} WHERE {where}", params)

    # --- internals -----------------------------------------------------------------

    def _insert_sql(self, table, row):
        t = self._tables.get(table)
        self._check_columns(t, row)
        if not row:
            raise InvalidInput(f"empty row for table {table!r}", code=INVALID_ROW)
        cols = ", ".join(quote(c) for c in row)
        marks = ", ".join(["%s"] * len(row))
        return f"INSERT INTO {quote(table)} ({cols}) VALUES ({marks})", list(row.values())

    @staticmethod
    def _check_columns(t, values):
        if not isinstance(values, dict):
            raise InvalidInput(f"row for {t.name!r} must be an object", code=INVALID_ROW)
        unknown = [c for c in values if c not in t.column_names]
        if unknown:
            raise InvalidInput(
                f"unknown column(s) {unknown} in table {t.name!r}", code=UNKNOWN_COLUMN
            )

    @staticmethod
    def _key(t, pk):
        if not isinstance(pk, dict) or set(pk) != set(t.primary_key):
            raise InvalidInput(
                f"key for {t.name!r} must name exactly {list(t.primary_key)}", code=INVALID_KEY
            )
        where = " AND ".join(f"{quote(c)} = %s" for c in t.primary_key)
        return where, [pk[c] for c in t.primary_key]
