"""
The SQL oracle: a normalized query compiled to ONE SQL SELECT whose single JSON
text value is the whole nested view, for SQLite and PostgreSQL.

It states rindle's semantics a second time, in the database's own terms, so the
reference evaluator and the incremental operators can be checked against a fresh
query. The result has exactly the shape ``evaluate`` returns: a list of row objects
(every column in table order, or only the ``select``ed ones) carrying each visible
relationship under its alias (a list; an object or null under ``one``; an integer
for ``count``; a number or null for ``sum``/``avg``). A root ``one`` query yields an
object or None, a root aggregate a scalar. ``render="snapshot"`` gives the SSR shape
instead, as ``evaluate`` does: each row's cells nested under ``cols``.

COMPARATOR_VERSION 2 is rebuilt from portable pieces: ``NULLS FIRST``/``LAST`` and
``COLLATE "C"`` for the order, ``GLOB`` on SQLite (whose LIKE ignores ASCII case)
and ``translate`` on Postgres (whose ILIKE folds all of Unicode) for the patterns.
A comparison between a column and a literal of another kind (a number column
against a string, say) is decided here from the comparator's kind order, as the
evaluator decides it, instead of by the database's casts. Columns are assumed to
hold values of their declared wire type; ``json`` columns render but cannot be
filtered, ordered or correlated on. Every literal is a bound parameter.
"""

import json
import re

from ..engine.values import BINARY, TEMPORAL, stored
from ..exceptions import UNKNOWN_COLUMN, UNKNOWN_TABLE, UNSUPPORTED
from .ast import And, Exists, Or, Query, QueryError, Simple, parse

_NULL, _BOOL, _NUMBER, _STRING = range(4)
_KINDS = {"boolean": _BOOL, "number": _NUMBER, "int64": _NUMBER, "string": _STRING}
_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_FOLD = str.maketrans(_UPPER, _UPPER.lower())
_MAX_FINITE = "1.7976931348623157e308"
# json_build_object takes at most 100 arguments; SQLite functions at most 127.
_MAX_PAIRS = {"postgresql": 50, "sqlite": 63}
_PARAM = re.compile("\x00(\\d+)\x00")


def compile_query(query, vendor, schema, *, render="fixture"):
    """``(sql, params)``: one SELECT returning the view of ``query`` as JSON text."""
    if vendor not in _MAX_PAIRS:
        raise ValueError(f"no SQL oracle for {vendor!r}")
    if render not in ("fixture", "snapshot"):
        raise ValueError(f"unknown render {render!r}")
    if not isinstance(query, Query):
        query = parse(query, schema)
    compiler = _Compiler(vendor, schema, render)
    return _numbered(compiler, compiler.root(query))


def compile_rows(query, vendor, schema):
    """
    ``(sql, params)``: ``FROM <table> t WHERE ... ORDER BY ... LIMIT ...`` of ONE level
    of ``query`` (its where, start, order and limit; its relationships ignored), the
    rows aliased ``t``: what the partition store reads a page or a partition with, in
    the same semantics as the oracle's own levels.
    """
    if vendor not in _MAX_PAIRS:
        raise ValueError(f"no SQL for {vendor!r}")
    compiler = _Compiler(vendor, schema)
    return _numbered(compiler, compiler.rows(query, compiler.table(query.table), "t"))


def _numbered(compiler, sql):
    """``(sql, params)`` with the compiler's placeholders renumbered in text order."""
    params = []

    def positional(match):
        params.append(compiler.values[int(match.group(1))])
        return "%s"

    return _PARAM.sub(positional, sql), params


def run_query(query, connection, schema, *, render="fixture"):
    """The view of ``query`` read from ``connection`` (a Django connection) now."""
    if not isinstance(query, Query):
        query = parse(query, schema)
    sql, params = compile_query(query, connection.vendor, schema, render=render)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        (text,) = cursor.fetchone()
    view = None if text is None else json.loads(text)
    return decode_view(query, schema, view, snapshot=render == "snapshot")


def decode_view(query, schema, view, *, snapshot=False):
    """
    A view rendered by the compiled SQL (stored values) with every cell in the wire
    encoding, as the engine's own rows are (``engine.tables.Table.decode``); changed
    in place and returned. ``snapshot``: cells sit under each row's ``cols``.
    """
    if view is None or query.aggregate is not None:
        return view
    table = schema.get(query.table)
    related = query.visible_related
    if not table.decoders and not related:
        return view
    for row in [view] if isinstance(view, dict) else view:
        if table.decoders:
            table.decode(row["cols"] if snapshot else row)
        for r in related:
            decode_view(r.subquery, schema, row.get(r.subquery.alias), snapshot=snapshot)
    return view


def _quote(name):
    if not isinstance(name, str) or not name or "\x00" in name:
        raise QueryError(f"invalid identifier {name!r}")
    return '"' + name.replace('"', '""') + '"'


def _text(name):
    """A column name as an SQL string literal (a key of the row object)."""
    return "'" + name.replace("'", "''") + "'"


def _kind_of(value):
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, (int, float)):
        return _NUMBER
    return _STRING


def like_tokens(pattern):
    """A LIKE pattern as ("lit", ch) / ("any",) / ("one",) tokens (``\\`` escapes)."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            out.append(("lit", pattern[i + 1]))
            i += 2
            continue
        out.append(("any",) if ch == "%" else ("one",) if ch == "_" else ("lit", ch))
        i += 1
    return out


def _glob(tokens):
    return _pattern(tokens, "*", "?", lambda ch: f"[{ch}]" if ch in "*?[" else ch)


def _like_bang(tokens):
    """The pattern for ``LIKE ... ESCAPE '!'`` (no backslash-quoting questions)."""
    return _pattern(tokens, "%", "_", lambda ch: "!" + ch if ch in "%_!" else ch)


def _pattern(tokens, any_, one, literal):
    """``like_tokens`` spelled with the wildcards ``any_`` and ``one``, each literal
    character as ``literal(ch)`` spells it."""
    wildcards = {"any": any_, "one": one}
    return "".join(wildcards[t[0]] if t[0] in wildcards else literal(t[1]) for t in tokens)


def _junction(parts, word, identity, absorbing):
    """SQL ``parts`` joined by ``word`` (AND / OR): ``identity`` parts dropped, and an
    ``absorbing`` one is the answer (TRUE and FALSE for AND, the other way for OR)."""
    parts = [p for p in parts if p != identity]
    if absorbing in parts:
        return absorbing
    if not parts:
        return identity
    return parts[0] if len(parts) == 1 else "(" + f" {word} ".join(parts) + ")"


def _holds(op, sign):
    """Whether ``cell <op> literal`` holds when compare(cell, literal) == sign."""
    return {
        "=": sign == 0,
        "!=": sign != 0,
        "<": sign < 0,
        "<=": sign <= 0,
        ">": sign > 0,
        ">=": sign >= 0,
    }[op]


class _Compiler:
    def __init__(self, vendor, schema, render="fixture"):
        self.vendor = vendor
        self.pg = vendor == "postgresql"
        self.schema = schema
        self.snapshot = render == "snapshot"
        self.values = []
        self.aliases = 0

    # --- small pieces -------------------------------------------------------------

    def param(self, value):
        self.values.append(value)
        return f"\x00{len(self.values) - 1}\x00"

    def literal(self, table, name, value):
        """A wire literal compared with column ``name``, bound in the column's stored form."""
        encoding = self.column(table, name).encoding
        return self.param(stored(encoding, self.vendor, value) if encoding else value)

    def alias(self):
        self.aliases += 1
        return f"t{self.aliases}"

    def table(self, name):
        try:
            table = self.schema.get(name)
        except (KeyError, LookupError, ValueError):
            table = None
        if table is None:
            raise QueryError(f"unknown table {name!r}", code=UNKNOWN_TABLE)
        return table

    def column(self, table, name):
        for column in table.columns:
            if column.name == name:
                return column
        raise QueryError(f"unknown column {name!r} of table {table.name!r}", code=UNKNOWN_COLUMN)

    def kind(self, table, name, what):
        """The comparator kind of a column; json columns have no SQL order here."""
        column = self.column(table, name)
        if column.type not in _KINDS:
            raise QueryError(
                f"the SQL oracle cannot {what} {column.type} column {table.name}.{name}",
                code=UNSUPPORTED,
            )
        return _KINDS[column.type]

    def ref(self, alias, name):
        return f"{alias}.{_quote(name)}"

    def ordered(self, table, alias, name):
        """A column reference that compares bytewise when it is text, whatever its collation."""
        ref = self.ref(alias, name)
        if self.pg and self.column(table, name).encoding in TEMPORAL:
            return ref  # a date, time or uuid type: its own order is the wire text's
        if self.kind(table, name, "compare") == _STRING:
            return f'{ref} COLLATE "C"' if self.pg else f"{ref} COLLATE BINARY"
        return ref

    def conj(self, parts):
        return _junction(parts, "AND", "TRUE", "FALSE")

    def disj(self, parts):
        return _junction(parts, "OR", "FALSE", "TRUE")

    # --- conditions ---------------------------------------------------------------

    def condition(self, cond, table, alias):
        if cond is None:
            return "TRUE"
        if isinstance(cond, Simple):
            return self.simple(cond, table, alias)
        if isinstance(cond, And):
            return self.conj([self.condition(c, table, alias) for c in cond.conditions])
        if isinstance(cond, Or):
            return self.disj([self.condition(c, table, alias) for c in cond.conditions])
        if isinstance(cond, Exists):
            sub = cond.related.subquery
            child = self.table(sub.table)
            c = self.alias()
            where = self.conj(
                [
                    self.correlation(cond.related, table, alias, child, c),
                    self.condition(sub.where, child, c),
                    self.start(sub, child, c),
                ]
            )
            limit = "" if sub.limit is None else f" LIMIT {int(sub.limit)}"
            found = f"EXISTS (SELECT 1 FROM {_quote(sub.table)} {c} WHERE {where}{limit})"
            return f"NOT {found}" if cond.negated else found
        raise TypeError(f"not a condition: {cond!r}")

    def correlation(self, related, parent, p, child, c):
        """Child rows whose fields equal the parent's (a null never correlates)."""
        parts = []
        for pf, cf in zip(related.parent_fields, related.child_fields, strict=True):
            if self.kind(parent, pf, "correlate on") != self.kind(child, cf, "correlate on"):
                return "FALSE"  # values of different kinds are never equal
            parts.append(f"{self.ordered(child, c, cf)} = {self.ref(p, pf)}")
        return self.conj(parts)

    def simple(self, cond, table, alias):
        op, name, value = cond.op, cond.column, cond.value
        if op.endswith("LIKE"):
            return self.like(op, table, alias, name, value)
        kind = self.kind(table, name, "filter on")
        ref = self.ref(alias, name)
        bytewise = self.ordered(table, alias, name)
        if op in ("IS", "IS NOT"):
            if value is None:
                return f"{ref} {op} NULL"
            if _kind_of(value) != kind:
                return "FALSE" if op == "IS" else "TRUE"
            if self.pg:
                distinct = "NOT DISTINCT" if op == "IS" else "DISTINCT"
                return f"{bytewise} IS {distinct} FROM {self.literal(table, name, value)}"
            return f"{bytewise} {op} {self.literal(table, name, value)}"
        if op in ("IN", "NOT IN"):
            if op == "NOT IN" and any(v is None for v in value):
                return "FALSE"  # unknown for every cell, as in SQL
            same = [v for v in value if v is not None and _kind_of(v) == kind]
            if not same:
                return "FALSE" if op == "IN" else f"{ref} IS NOT NULL"
            return f"{bytewise} {op} ({', '.join(self.literal(table, name, v) for v in same)})"
        if value is None:
            return "FALSE"
        if _kind_of(value) != kind:
            # Every non-null cell sits on the same side of a literal of another kind.
            sign = 1 if kind > _kind_of(value) else -1
            return f"{ref} IS NOT NULL" if _holds(op, sign) else "FALSE"
        sql_op = "<>" if op == "!=" else op
        return f"{bytewise} {sql_op} {self.literal(table, name, value)}"

    def like(self, op, table, alias, name, pattern):
        column = self.column(table, name)
        if column.type == "json":
            raise QueryError(
                f"the SQL oracle cannot match json column {table.name}.{name}",
                code=UNSUPPORTED,
            )
        if column.type != "string" and self.pg:
            return "FALSE"  # a non-text cell matches neither LIKE nor NOT LIKE
        fold = op.endswith("ILIKE")
        tokens = like_tokens(pattern)
        if fold:
            tokens = [(t[0], t[1].translate(_FOLD)) if t[0] == "lit" else t for t in tokens]
        ref = self.ref(alias, name)
        negate = "NOT " if op.startswith("NOT") else ""
        if self.pg:
            cell = f"translate({ref}, '{_UPPER}', '{_UPPER.lower()}')" if fold else ref
            return (
                f"({cell} COLLATE \"C\" {negate}LIKE {self.param(_like_bang(tokens))} ESCAPE '!')"
            )
        # SQLite: GLOB is case-sensitive whatever case_sensitive_like says; lower()
        # folds ASCII only. typeof() keeps numbers (and null) from matching.
        cell = f"lower({ref})" if fold else ref
        glob = f"{cell} GLOB {self.param(_glob(tokens))}"
        return f"(typeof({ref}) = 'text' AND {negate}{glob})"

    # --- order and start ----------------------------------------------------------

    def order_by(self, query, table, alias):
        parts = []
        for name, direction in query.order_by:
            ref = self.ordered(table, alias, name)
            parts.append(
                f"{ref} ASC NULLS FIRST" if direction == "asc" else f"{ref} DESC NULLS LAST"
            )
        return ", ".join(parts)

    def start(self, query, table, alias):
        """Rows after the keyset bound in the full order (at or after when inclusive)."""
        if query.start is None:
            return "TRUE"
        directions = dict(query.order_by)
        ties, options = [], []
        for name, value in query.start.row:
            options.append(
                self.conj(ties + [self.after(table, alias, name, value, directions[name])])
            )
            ties.append(self.tie(table, alias, name, value))
        if not query.start.exclusive:
            options.append(self.conj(ties))
        return self.disj(options)

    def tie(self, table, alias, name, value):
        kind, ref = self.kind(table, name, "order by"), self.ref(alias, name)
        if value is None:
            return f"{ref} IS NULL"
        if _kind_of(value) != kind:
            return "FALSE"
        return f"{self.ordered(table, alias, name)} = {self.literal(table, name, value)}"

    def after(self, table, alias, name, value, direction):
        """The cell sorts strictly after ``value`` in ``direction`` (null is smallest)."""
        kind, ref = self.kind(table, name, "order by"), self.ref(alias, name)
        vkind = _kind_of(value)
        if direction == "asc":
            if value is None:
                return f"{ref} IS NOT NULL"
            if vkind != kind:
                return f"{ref} IS NOT NULL" if kind > vkind else "FALSE"
            return f"{self.ordered(table, alias, name)} > {self.literal(table, name, value)}"
        if value is None:
            return "FALSE"
        if vkind != kind:
            return "TRUE" if kind < vkind else f"{ref} IS NULL"
        lit = self.literal(table, name, value)
        return f"({ref} IS NULL OR {self.ordered(table, alias, name)} < {lit})"

    # --- rendering ----------------------------------------------------------------

    def value(self, column, ref):
        """A column as a JSON value inside the row object."""
        if self.pg:
            return ref
        if column.encoding == BINARY:  # as capture renders it (engine.capture)
            return f"CASE WHEN typeof({ref}) = 'blob' THEN hex({ref}) ELSE {ref} END"
        if column.type == "boolean":
            return (
                f"json(CASE WHEN {ref} IS NULL THEN 'null' WHEN {ref} THEN 'true' ELSE 'false' END)"
            )
        if column.type == "string":
            return ref
        # json_object() prints a REAL with 15 significant digits; %!.17g round-trips.
        # JSON text parses as itself (and a json number may be stored as a REAL).
        return f"json({self.sqlite_number(ref)})"

    def sqlite_number(self, ref):
        return (
            f"CASE WHEN typeof({ref}) = 'real' AND abs({ref}) <= {_MAX_FINITE} "
            f"THEN printf({self.param('%!.17g')}, {ref}) ELSE {ref} END"
        )

    def key(self, text):
        return f"CAST({self.param(text)} AS text)" if self.pg else self.param(text)

    def row_object(self, query, table, alias):
        names = query.select if query.select is not None else [c.name for c in table.wire_columns]
        pairs = [(_text(n), self.value(self.column(table, n), self.ref(alias, n))) for n in names]
        if self.snapshot:
            pairs = [("'cols'", self.json_object(pairs))]
        for related in query.visible_related:
            pairs.append(
                (self.key(related.subquery.alias), self.relationship(related, table, alias))
            )
        return self.json_object(pairs)

    def json_object(self, pairs):
        if len(pairs) > _MAX_PAIRS[self.vendor]:
            raise QueryError(
                f"the SQL oracle renders at most {_MAX_PAIRS[self.vendor]} fields per row",
                code=UNSUPPORTED,
            )
        body = ", ".join(f"{k}, {v}" for k, v in pairs)
        return f"json_build_object({body})" if self.pg else f"json_object({body})"

    def rows(self, query, table, alias, extra="TRUE"):
        """FROM ... WHERE ... ORDER BY ... LIMIT ... of one level."""
        where = self.conj(
            [extra, self.condition(query.where, table, alias), self.start(query, table, alias)]
        )
        limit = "" if query.limit is None else f" LIMIT {int(query.limit)}"
        order = self.order_by(query, table, alias)
        return f"FROM {_quote(table.name)} {alias} WHERE {where} ORDER BY {order}{limit}"

    def many(self, query, table, alias, extra="TRUE"):
        """A JSON array of the level's row objects, in order."""
        obj = self.row_object(query, table, alias)
        s = self.alias()
        if self.pg:
            number = f"ROW_NUMBER() OVER (ORDER BY {self.order_by(query, table, alias)})"
            rows = self.rows(query, table, alias, extra)
            return (
                f"(SELECT COALESCE(json_agg({s}.o ORDER BY {s}.n), '[]'::json) "
                f"FROM (SELECT {obj} AS o, {number} AS n {rows}) {s})"
            )
        # SQLite (before 3.44) has no ORDER BY inside an aggregate; it keeps a
        # subquery's ORDER BY when the outer query aggregates with json_group_array.
        rows = self.rows(query, table, alias, extra)
        return (
            f"(SELECT COALESCE(json_group_array(json({s}.o)), '[]') "
            f"FROM (SELECT {obj} AS o {rows}) {s})"
        )

    def first(self, query, table, alias, extra="TRUE"):
        obj = self.row_object(query, table, alias)
        return f"(SELECT {obj} {self.rows(query, table, alias, extra)})"

    def relationship(self, related, parent, p):
        sub = related.subquery
        child = self.table(sub.table)
        c = self.alias()
        corr = self.correlation(related, parent, p, child, c)
        if sub.aggregate is not None:
            return self.aggregate(sub, child, c, corr)
        if sub.one:
            found = self.first(sub, child, c, corr)
            return found if self.pg else f"json({found})"
        rows = self.many(sub, child, c, corr)
        return rows if self.pg else f"json({rows})"

    def aggregate(self, query, table, alias, extra="TRUE"):
        where = self.conj(
            [extra, self.condition(query.where, table, alias), self.start(query, table, alias)]
        )
        source = f"FROM {_quote(table.name)} {alias} WHERE {where}"
        if query.aggregate == "count":
            return f"(SELECT COUNT(*) {source})"
        fn, name = query.aggregate
        if self.kind(table, name, "aggregate") != _NUMBER:
            raise QueryError(f"{fn} needs a number column", code=UNSUPPORTED)
        ref = self.ref(alias, name)
        if self.pg:
            if fn == "sum":
                return f"(SELECT SUM({ref}) {source})"
            # AVG(integer) is numeric, rounded to its own scale: divide as doubles.
            return (
                f"(SELECT CAST(SUM({ref}) AS double precision) / NULLIF(COUNT({ref}), 0) {source})"
            )
        s = self.alias()
        total = f"{fn.upper()}({ref})"
        return (
            f"json((SELECT {self.sqlite_number(f'{s}.v')} FROM (SELECT {total} AS v {source}) {s}))"
        )

    def root(self, query):
        table = self.table(query.table)
        alias = self.alias()
        if query.aggregate is not None:
            value = self.aggregate(query, table, alias)
            return (
                f"SELECT CAST(to_json({value}) AS text)"
                if self.pg
                else f"SELECT CAST({value} AS TEXT)"
            )
        if query.one:
            found = self.first(query, table, alias)
            return f"SELECT CAST({found} AS text)" if self.pg else f"SELECT {found}"
        rows = self.many(query, table, alias)
        return f"SELECT CAST({rows} AS text)" if self.pg else f"SELECT {rows}"
