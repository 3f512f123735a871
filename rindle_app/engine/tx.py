"""The transaction handle a write request (and a mutator) receives."""

import itertools
from contextlib import contextmanager

from ..exceptions import INVALID_KEY, INVALID_ROW, UNKNOWN_COLUMN
from .errors import InvalidInput
from .identifiers import quote

_savepoint_ids = itertools.count(1)


class Tx:
    """
    One open write transaction on the engine's writer connection.

    Row helpers take table and column names that must be registered in the table
    map; values are always bound as parameters. ``execute``/``query`` run any SQL
    with ``%s`` placeholders through Django's cursor. The Django ORM used inside a
    request runs in the same transaction too, since the writer thread owns the
    connection. Row helpers and the engine's own statements use the driver's cursor
    directly: they are generated here, so Django's per-statement rewriting and
    logging would only cost time on the writer.
    """

    __slots__ = (
        "connection",
        "_cursor",
        "_raw",
        "_wrap",
        "_tables",
        "using",
        "vendor",
        "_ph",
        "solo",
        "cv",
    )

    def __init__(self, connection, raw_cursor, tables, solo=False):
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
        self.using = connection.alias
        self._ph = "?" if connection.vendor == "sqlite" else "%s"

    @property
    def cursor(self):
        """A Django cursor on the writer connection (``%s`` placeholders)."""
        if self._cursor is None:
            self._cursor = self.connection.cursor()
        return self._cursor

    # --- raw SQL ---------------------------------------------------------------

    def execute(self, sql, params=()):
        """Run one statement; return the number of rows it changed."""
        self.cursor.execute(sql, params)
        return self.cursor.rowcount

    def query(self, sql, params=()):
        """Run one query; return its rows as dicts."""
        self.cursor.execute(sql, params)
        names = [d[0] for d in self.cursor.description]
        return [dict(zip(names, row)) for row in self.cursor.fetchall()]

    def scalar(self, sql, params=()):
        """Run generated SQL (``{ph}`` marks a parameter); return the first cell or None."""
        with self._wrap:
            self._raw.execute(sql.format(ph=self._ph), params)
            row = self._raw.fetchone()
        return row[0] if row else None

    def run(self, sql, params=()):
        """Run generated SQL (``{ph}`` marks a parameter); return the changed row count."""
        with self._wrap:
            self._raw.execute(sql.format(ph=self._ph), params)
        return self._raw.rowcount

    @contextmanager
    def savepoint(self):
        """All-or-nothing block inside the transaction: an exception rolls it back."""
        name = f"rindle_sp_{next(_savepoint_ids)}"
        with self._wrap:
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

    # --- row helpers -------------------------------------------------------------

    def row(self, table, pk):
        """The row of ``table`` whose primary key is ``pk`` (a dict), or None."""
        t = self._tables.get(table)
        where, params = self._key(t, pk)
        with self._wrap:
            self._raw.execute(f"SELECT * FROM {quote(table)} WHERE {where}", params)
            row = self._raw.fetchone()
        if row is None:
            return None
        return dict(zip([d[0] for d in self._raw.description], row))

    def insert(self, table, row):
        """Insert one full row; a duplicate key raises IntegrityError."""
        sql, params = self._insert_sql(table, row)
        return self._exec(sql, params)

    def insert_ignore(self, table, row):
        """Insert one row unless its key exists; return 1 if inserted, else 0."""
        sql, params = self._insert_sql(table, row)
        return self._exec(sql + " ON CONFLICT DO NOTHING", params)

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
        return self._exec(sql, params)

    def update(self, table, pk, changes):
        """Set ``changes`` on the row keyed ``pk``; a missing row is a no-op (0)."""
        t = self._tables.get(table)
        self._check_columns(t, changes)
        if not changes:
            return 0
        where, key_params = self._key(t, pk)
        sets = ", ".join(f"{quote(c)} = {self._ph}" for c in changes)
        return self._exec(
            f"UPDATE {quote(table)} SET {sets} WHERE {where}", [*changes.values(), *key_params]
        )

    def delete(self, table, pk):
        """Delete the row keyed ``pk``; return 1 if it existed, else 0."""
        t = self._tables.get(table)
        where, params = self._key(t, pk)
        return self._exec(f"DELETE FROM {quote(table)} WHERE {where}", params)

    # --- internals -----------------------------------------------------------------

    def _exec(self, sql, params):
        with self._wrap:
            self._raw.execute(sql, params)
        return self._raw.rowcount

    def _insert_sql(self, table, row):
        t = self._tables.get(table)
        self._check_columns(t, row)
        if not row:
            raise InvalidInput(f"empty row for table {table!r}", code=INVALID_ROW)
        cols = ", ".join(quote(c) for c in row)
        marks = ", ".join([self._ph] * len(row))
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

    def _key(self, t, pk):
        if not isinstance(pk, dict) or set(pk) != set(t.primary_key):
            raise InvalidInput(
                f"key for {t.name!r} must name exactly {list(t.primary_key)}", code=INVALID_KEY
            )
        where = " AND ".join(f"{quote(c)} = {self._ph}" for c in t.primary_key)
        return where, [pk[c] for c in t.primary_key]
