"""The transaction handle a write request (and a mutator) receives."""

from .errors import InvalidInput
from .identifiers import quote


class Tx:
    """
    One open write transaction on the engine's writer connection.

    Row helpers take table and column names that must be registered in the table
    map; values are always bound as parameters. ``execute``/``query`` run any SQL
    with ``%s`` placeholders. The Django ORM used inside a request runs in the same
    transaction too, since the writer thread owns the connection.
    """

    __slots__ = ("_cursor", "_tables", "using")

    def __init__(self, cursor, tables, using):
        self._cursor = cursor
        self._tables = tables
        self.using = using

    # --- raw SQL ---------------------------------------------------------------

    def execute(self, sql, params=()):
        """Run one statement; return the number of rows it changed."""
        self._cursor.execute(sql, params)
        return self._cursor.rowcount

    def query(self, sql, params=()):
        """Run one query; return its rows as dicts."""
        self._cursor.execute(sql, params)
        names = [d[0] for d in self._cursor.description]
        return [dict(zip(names, row)) for row in self._cursor.fetchall()]

    # --- row helpers -------------------------------------------------------------

    def row(self, table, pk):
        """The row of ``table`` whose primary key is ``pk`` (a dict), or None."""
        t = self._tables.get(table)
        where, params = self._key(t, pk)
        rows = self.query(f"SELECT * FROM {quote(table)} WHERE {where}", params)
        return rows[0] if rows else None

    def insert(self, table, row):
        """Insert one full row; a duplicate key raises IntegrityError."""
        sql, params = self._insert_sql(table, row)
        return self.execute(sql, params)

    def insert_ignore(self, table, row):
        """Insert one row unless its key exists; return 1 if inserted, else 0."""
        sql, params = self._insert_sql(table, row)
        return self.execute(sql + " ON CONFLICT DO NOTHING", params)

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
        return self.execute(sql, params)

    def update(self, table, pk, changes):
        """Set ``changes`` on the row keyed ``pk``; a missing row is a no-op (0)."""
        t = self._tables.get(table)
        self._check_columns(t, changes)
        if not changes:
            return 0
        where, key_params = self._key(t, pk)
        sets = ", ".join(f"{quote(c)} = %s" for c in changes)
        return self.execute(
            f"UPDATE {quote(table)} SET {sets} WHERE {where}", [*changes.values(), *key_params]
        )

    def delete(self, table, pk):
        """Delete the row keyed ``pk``; return 1 if it existed, else 0."""
        t = self._tables.get(table)
        where, params = self._key(t, pk)
        return self.execute(f"DELETE FROM {quote(table)} WHERE {where}", params)

    # --- internals -----------------------------------------------------------------

    def _insert_sql(self, table, row):
        t = self._tables.get(table)
        self._check_columns(t, row)
        if not row:
            raise InvalidInput(f"empty row for table {table!r}", code="invalid_row")
        cols = ", ".join(quote(c) for c in row)
        marks = ", ".join(["%s"] * len(row))
        return f"INSERT INTO {quote(table)} ({cols}) VALUES ({marks})", list(row.values())

    @staticmethod
    def _check_columns(t, values):
        if not isinstance(values, dict):
            raise InvalidInput(f"row for {t.name!r} must be an object", code="invalid_row")
        unknown = [c for c in values if c not in t.column_names]
        if unknown:
            raise InvalidInput(
                f"unknown column(s) {unknown} in table {t.name!r}", code="unknown_column"
            )

    @staticmethod
    def _key(t, pk):
        if not isinstance(pk, dict) or set(pk) != set(t.primary_key):
            raise InvalidInput(
                f"key for {t.name!r} must name exactly {list(t.primary_key)}", code="invalid_key"
            )
        where = " AND ".join(f"{quote(c)} = %s" for c in t.primary_key)
        return where, [pk[c] for c in t.primary_key]
