"""
The table map: every registered base table's ordered columns, types, primary key
and declared foreign keys, read from the database itself.
"""

import threading
from dataclasses import dataclass, field

from ..exceptions import NO_PRIMARY_KEY
from .errors import UnknownTable
from .identifiers import quote, validate
from .values import decoder, field_encoding

# Tables the client schema never shows (engine bookkeeping and SQLite internals).
HIDDEN_PREFIXES = ("_rindle_", "__", "sqlite_")

WIRE_TYPES = ("string", "number", "boolean", "json", "int64")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # one of WIRE_TYPES
    nullable: bool = True
    declared: str = ""
    # The value encoding of the model field behind the column (engine.values), or "".
    encoding: str = ""


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple
    ref_table: str
    ref_columns: tuple


@dataclass(frozen=True)
class Table:
    """One registered table. Column order is the database's."""

    name: str
    columns: tuple
    primary_key: tuple
    foreign_keys: tuple = ()
    # Names of columns a query may filter on but no client is ever sent (the owner of
    # a client id): every wire schema is built from ``wire_columns``.
    private: frozenset = frozenset()
    # The database the rows are read from: which stored forms need re-encoding.
    vendor: str = ""
    column_names: frozenset = field(init=False, repr=False, compare=False)
    json_columns: frozenset = field(init=False, repr=False, compare=False)
    wire_columns: tuple = field(init=False, repr=False, compare=False)
    # ((column name, stored -> wire function), ...) for the columns whose stored form
    # is not their wire form on ``vendor``: decoding a row touches only these.
    decoders: tuple = field(init=False, repr=False, compare=False)
    # {column name: encoding} of the columns a written wire value must be re-encoded
    # for (``engine.values.to_stored``); booleans and decimals store as sent.
    encoded: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "column_names", frozenset(c.name for c in self.columns))
        json_columns = frozenset(c.name for c in self.columns if c.type == "json")
        object.__setattr__(self, "json_columns", json_columns)
        wire = tuple(c for c in self.columns if c.name not in self.private)
        object.__setattr__(self, "wire_columns", wire)
        decoders = tuple(
            (c.name, fn)
            for c in self.columns
            if (
                fn := decoder(c.encoding or ("boolean" if c.type == "boolean" else ""), self.vendor)
            )
        )
        object.__setattr__(self, "decoders", decoders)
        encoded = {
            c.name: c.encoding for c in self.columns if c.encoding not in ("", "boolean", "decimal")
        }
        object.__setattr__(self, "encoded", encoded)

    def decode(self, image):
        """A stored row image (a dict, changed in place) in the wire encoding."""
        for name, fn in self.decoders:
            value = image.get(name)
            if value is not None:
                image[name] = fn(value)
        return image

    @property
    def hidden(self):
        return self.name.startswith(HIDDEN_PREFIXES)

    def schema(self):
        """The client-facing schema of this table (``GET /schema`` shape)."""
        return {
            "name": self.name,
            "columns": [
                {"name": c.name, "type": c.type, "nullable": c.nullable} for c in self.wire_columns
            ],
            "primaryKey": list(self.primary_key),
        }


def wire_type(declared):
    """Map a declared SQL column type to a wire type."""
    t = (declared or "").lower()
    if "bool" in t:
        return "boolean"
    if "json" in t:
        return "json"
    if any(k in t for k in ("int", "real", "floa", "doub", "numeric", "decimal", "serial")):
        return "number"
    return "string"


def model_wire_type(field):
    internal = field.get_internal_type()
    if internal in ("BooleanField", "NullBooleanField"):
        return "boolean"
    if internal == "JSONField":
        return "json"
    return None


class TableMap:
    """The registered tables of one engine, safe to read from any thread."""

    def __init__(self):
        self._tables = {}
        self._lock = threading.Lock()

    def put(self, table):
        """Register ``table``; returns the definition it replaces, or None."""
        with self._lock:
            tables = dict(self._tables)
            before = tables.get(table.name)
            tables[table.name] = table
            self._tables = tables
            return before

    def discard(self, name):
        """Unregister table ``name``; returns its definition, or None if absent."""
        with self._lock:
            tables = dict(self._tables)
            removed = tables.pop(name, None)
            self._tables = tables
            return removed

    def by_name(self):
        """{name: Table} as registered now; replaced, never changed, on registration."""
        return self._tables

    def get(self, name):
        table = self._tables.get(name)
        if table is None:
            raise UnknownTable(f"table {name!r} is not registered", table=name)
        return table

    def __contains__(self, name):
        return name in self._tables

    def __iter__(self):
        return iter(sorted(self._tables.values(), key=lambda t: t.name))

    def base_table_schemas(self):
        """Registered tables visible to clients, sorted by name."""
        return [t.schema() for t in self if not t.hidden]


# --- introspection ------------------------------------------------------------


def introspect(connection, cursor, name, *, model=None, private=()):
    """Read ``name``'s columns, pk and foreign keys from the database."""
    validate(name, "table name")
    if name not in connection.introspection.table_names(cursor):
        raise UnknownTable(f"table {name!r} does not exist", table=name)
    if connection.vendor == "sqlite":
        cursor.execute(f"PRAGMA table_info({quote(name)})")
        rows = cursor.fetchall()
        described = [(r[1], r[2], not r[3]) for r in rows]
        pk = [r[1] for r in sorted((r for r in rows if r[5]), key=lambda r: r[5])]
        cursor.execute(f"PRAGMA foreign_key_list({quote(name)})")
        fk_rows = cursor.fetchall()  # id, seq, table, from, to, ...
        grouped = {}
        for r in sorted(fk_rows, key=lambda r: (r[0], r[1])):
            grouped.setdefault(r[0], []).append(r)
        fks = [
            ForeignKey(tuple(r[3] for r in g), g[0][2], tuple(r[4] for r in g))
            for g in grouped.values()
        ]
    else:
        cursor.execute(
            "SELECT column_name, data_type, is_nullable = 'YES' FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
            [name],
        )
        described = cursor.fetchall()
        pk = connection.introspection.get_primary_key_columns(cursor, name) or []
        fks = [
            ForeignKey((column,), ref_table, (ref_column,))
            for column, (ref_column, ref_table) in connection.introspection.get_relations(
                cursor, name
            ).items()
        ]
    if not pk:
        raise UnknownTable(f"table {name!r} has no primary key", code=NO_PRIMARY_KEY, table=name)

    overrides, encodings = {}, {}
    if model is not None:
        for f in model._meta.concrete_fields:
            t = model_wire_type(f)
            if t:
                overrides[f.column] = t
            encodings[f.column] = field_encoding(f)
            if f.remote_field is not None and not f.db_constraint:
                target = f.target_field
                fks.append(ForeignKey((f.column,), target.model._meta.db_table, (target.column,)))
    # A primary-key column is never nullable, whatever the catalog says: SQLite's
    # table_info reports NOT NULL only where it was declared (an INTEGER PRIMARY KEY is
    # the rowid and takes no NULL, yet reads as nullable), where Postgres implies it.
    keys = frozenset(pk)
    columns = tuple(
        Column(
            validate(n, "column name"),
            overrides.get(n) or wire_type(d),
            bool(null) and n not in keys,
            d or "",
            encodings.get(n, ""),
        )
        for n, d, null in described
    )
    private = frozenset(private) & {c.name for c in columns}
    return Table(
        name, columns, tuple(pk), tuple(dict.fromkeys(fks)), private, vendor=connection.vendor
    )


def create_table_sql(name, columns, pk, col_types):
    """CREATE TABLE IF NOT EXISTS for ``register_table``; types are SQL types."""
    validate(name, "table name")
    if len(columns) != len(col_types):
        raise ValueError("columns and col_types differ in length")
    cols = [f"{quote(c)} {_sql_type(t)}" for c, t in zip(columns, col_types)]
    keys = ", ".join(quote(columns[i]) for i in pk)
    return f"CREATE TABLE IF NOT EXISTS {quote(name)} ({', '.join(cols)}, PRIMARY KEY ({keys}))"


_SQL_TYPES = {
    "string": "TEXT",
    "number": "DOUBLE PRECISION",
    "int64": "BIGINT",
    "boolean": "BOOLEAN",
    "json": "JSON",
}


def _sql_type(t):
    if t in _SQL_TYPES:
        return _SQL_TYPES[t]
    upper = str(t).upper()
    if not all(ch.isalnum() or ch in " ()," for ch in upper):
        raise ValueError(f"invalid column type {t!r}")
    return upper
