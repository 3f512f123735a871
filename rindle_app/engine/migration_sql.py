"""
Reading migration SQL: statements split and classified, before any database is touched.

Splitting. ``sql_text`` (the lexer public SQL uses too) cuts the text at every
``;`` outside string literals (``'...'`` with ``''`` escapes), quoted identifiers
(``"..."``, ``\\`...\\```) and comments (``-- ...``, ``/* ... */``), in its
``portable`` dialect: the journal reads a migration before it knows the database,
so it accepts only what PostgreSQL and SQLite read alike. The rest is refused
(``unsupported_syntax``): ``$`` (dollar quoting and parameters), ``E'...'``
strings, a ``/*`` inside a comment (PostgreSQL nests them, SQLite does not),
unterminated literals or comments, unbalanced parentheses, schema-qualified table
names. Trigger and function bodies are therefore unsupported.

Classification, by the leading keywords (an allow-list; anything else is
``unsupported_statement``):

- DDL: ``CREATE [UNIQUE] INDEX``, ``CREATE TABLE``, ``CREATE VIEW``, ``DROP TABLE``,
  ``DROP INDEX``, ``DROP VIEW`` and ``ALTER TABLE`` with ``ADD [COLUMN]``, ``ADD``
  a constraint, ``DROP [COLUMN]``, ``DROP CONSTRAINT`` or ``ALTER [COLUMN] ...
  SET/DROP DEFAULT | SET/DROP NOT NULL``. Drops are destructive: the report marks
  them and the management command prints ``[destructive]``.
- DML: ``INSERT``, ``UPDATE``, ``DELETE`` and ``WITH ... INSERT|UPDATE|DELETE``.
- Refused with their own codes: ``RENAME`` anywhere in an ``ALTER``
  (``rename_refused``); a column type change (``type_change_refused``);
  ``ATTACH``/``DETACH`` (``attach_refused``); ``PRAGMA`` (``pragma_refused``);
  transaction control (``transaction_control_refused``); ``DROP ... CASCADE``
  (``cascade_refused``); ``REPLACE``/``OR REPLACE``/``OR ROLLBACK`` (their implicit
  deletes are not captured); ``TRUNCATE`` (not captured row by row).
"""

from dataclasses import dataclass
from typing import NamedTuple

from ..exceptions import (
    ATTACH_REFUSED,
    CASCADE_REFUSED,
    PRAGMA_REFUSED,
    RENAME_REFUSED,
    RESERVED_TABLE,
    TRANSACTION_CONTROL_REFUSED,
    TYPE_CHANGE_REFUSED,
    UNSUPPORTED_STATEMENT,
    UNSUPPORTED_SYNTAX,
    MigrationRefused,
)
from . import sql_text
from .tables import HIDDEN_PREFIXES

_DOLLAR_REFUSED = "'$' (dollar quoting or a parameter) is not supported"
_REFUSED = {"estring": "E'...' strings are not supported", "dollar": _DOLLAR_REFUSED}
_TX_CONTROL = {"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "START", "ABORT"}
_ALTER_COLUMN_OK = {("SET", "DEFAULT"), ("DROP", "DEFAULT"), ("SET", "NOT"), ("DROP", "NOT")}
_CONSTRAINTS = {"CONSTRAINT", "PRIMARY", "UNIQUE", "FOREIGN", "CHECK", "EXCLUDE"}


# --- parsing ------------------------------------------------------------------------


class Token(NamedTuple):
    kind: str  # word | ident | string | number | op
    text: str  # as written
    value: str  # a word upper-cased, an identifier unquoted, else the text
    depth: int  # parenthesis depth


@dataclass(frozen=True)
class Step:
    """One classified statement of a migration."""

    index: int
    sql: str
    kind: str  # ddl | dml
    action: str  # create_table, drop_column, insert, ...
    tables: tuple = ()  # ((name as written, quoted), ...): the tables it acts on
    destructive: bool = False

    def report(self):
        out = {"index": self.index, "sql": self.sql, "action": self.action}
        if self.tables:
            out["tables"] = [name for name, _quoted in self.tables]
        if self.destructive:
            out["destructive"] = True
        return out


_new = tuple.__new__  # as in sql_text: a Token without NamedTuple's slower __new__


def tokenize(sql):
    """``[(statement text, [Token])]``: ``sql`` cut at top-level semicolons."""
    try:
        split = sql_text.split(sql, sql_text.PORTABLE)
    except sql_text.SqlTextError as exc:
        raise MigrationRefused(exc.message, code=UNSUPPORTED_SYNTAX) from None
    return [(text, _journal_tokens(tokens)) for text, tokens in split]


def _journal_tokens(tokens):
    out, depth = [], 0
    for t in tokens:
        if t.kind in _REFUSED or ("$" in t.text and t.kind not in ("string", "ident")):
            raise MigrationRefused(_REFUSED.get(t.kind, _DOLLAR_REFUSED), code=UNSUPPORTED_SYNTAX)
        if t.text == ")":
            depth -= 1
            if depth < 0:
                raise MigrationRefused("unbalanced parentheses", code=UNSUPPORTED_SYNTAX)
        if t.kind == "ident":
            value = t.text[1:-1].replace(t.text[0] * 2, t.text[0])
        else:
            value = t.text.upper() if t.kind == "word" else t.text
        out.append(_new(Token, (t.kind, t.text, value, depth)))
        if t.text == "(":
            depth += 1
    if depth != 0:
        raise MigrationRefused("unbalanced parentheses", code=UNSUPPORTED_SYNTAX)
    return out


def _refuse(index, message, code):
    return MigrationRefused(f"statement {index + 1}: {message}", code=code, statement=index)


class _Reader:
    """Walks one statement's tokens while classifying it."""

    def __init__(self, index, tokens):
        self.index, self.tokens, self.pos = index, tokens, 0

    def peek(self, ahead=0):
        k = self.pos + ahead
        return self.tokens[k] if k < len(self.tokens) else None

    def word(self, ahead=0):
        t = self.peek(ahead)
        return t.value if t is not None and t.kind == "word" else None

    def take(self, *words):
        """Consume the words ``words`` if they come next; True if they did."""
        if all(self.word(k) == w for k, w in enumerate(words)):
            self.pos += len(words)
            return True
        return False

    def name(self):
        """The next token as a table name: ``(name, quoted)``."""
        t = self.peek()
        if t is None or t.kind not in ("word", "ident"):
            raise _refuse(self.index, "expected a table name", UNSUPPORTED_STATEMENT)
        self.pos += 1
        nxt = self.peek()
        if nxt is not None and nxt.kind == "op" and nxt.text == ".":
            raise _refuse(
                self.index, "schema-qualified names are not supported", UNSUPPORTED_SYNTAX
            )
        return (t.value, True) if t.kind == "ident" else (t.text, False)


def classify(index, text, tokens):
    """The ``Step`` of one statement; refusals raise ``MigrationRefused``."""
    r = _Reader(index, tokens)
    first = r.word()
    top = {t.value for t in tokens if t.kind == "word" and t.depth == 0}

    def step(kind, action, tables=(), destructive=False):
        return Step(index, text, kind, action, tuple(tables), destructive)

    def refuse(message, code=UNSUPPORTED_STATEMENT):
        return _refuse(index, message, code)

    if first in ("ATTACH", "DETACH"):
        raise refuse("ATTACH and DETACH are refused", ATTACH_REFUSED)
    if first == "PRAGMA":
        raise refuse("PRAGMA is refused", PRAGMA_REFUSED)
    if first in _TX_CONTROL:
        raise refuse(
            "transaction control is refused: a migration is one transaction already",
            TRANSACTION_CONTROL_REFUSED,
        )
    if first == "ALTER" and "RENAME" in top:
        raise refuse("RENAME is refused: add the new name and migrate the data", RENAME_REFUSED)
    if first == "CREATE":
        r.pos = 1
        if r.word() in ("TEMP", "TEMPORARY"):
            raise refuse("temporary tables are not migrations")
        if r.take("TABLE"):
            r.take("IF", "NOT", "EXISTS")
            return step("ddl", "create_table", [r.name()])
        r.take("UNIQUE")
        if r.take("INDEX"):
            if r.word() == "CONCURRENTLY":
                raise refuse("CREATE INDEX CONCURRENTLY cannot run in a transaction")
            r.take("IF", "NOT", "EXISTS")
            while r.peek() is not None and not (r.word() == "ON" and r.peek().depth == 0):
                r.pos += 1
            if not r.take("ON"):
                raise refuse("CREATE INDEX without ON <table>")
            r.take("ONLY")
            return step("ddl", "create_index", [r.name()])
        if r.take("VIEW"):
            r.take("IF", "NOT", "EXISTS")
            view, _quoted = r.name()
            if view.lower().startswith(HIDDEN_PREFIXES):
                # Reserved like tables: nothing a user creates may pass for rindle's own.
                raise refuse(f"view {view!r} is reserved", RESERVED_TABLE)
            return step("ddl", "create_view")
        raise refuse(f"CREATE {r.word() or ''} is not a supported migration statement".strip())
    if first == "DROP":
        r.pos = 1
        if "CASCADE" in top:
            raise refuse("DROP ... CASCADE is refused: drop in dependency order", CASCADE_REFUSED)
        if r.take("TABLE"):
            r.take("IF", "EXISTS")
            names = [r.name()]
            while r.peek() is not None and r.peek().text == ",":
                r.pos += 1
                names.append(r.name())
            return step("ddl", "drop_table", names, destructive=True)
        if r.take("INDEX"):
            if r.word() == "CONCURRENTLY":
                raise refuse("DROP INDEX CONCURRENTLY cannot run in a transaction")
            return step("ddl", "drop_index", destructive=True)
        if r.take("VIEW"):
            return step("ddl", "drop_view", destructive=True)
        raise refuse(f"DROP {r.word() or ''} is not a supported migration statement".strip())
    if first == "ALTER":
        r.pos = 1
        if not r.take("TABLE"):
            raise refuse(f"ALTER {r.word() or ''} is not a supported migration statement".strip())
        r.take("IF", "EXISTS")
        r.take("ONLY")
        table = r.name()
        actions, destructive = [], False
        for action in _split_actions(tokens[r.pos :]):
            name, is_destructive = _alter_action(index, action)
            actions.append(name)
            destructive = destructive or is_destructive
        if not actions:
            raise refuse("ALTER TABLE without an action")
        return step("ddl", "alter_table:" + ",".join(actions), [table], destructive)
    if first in ("INSERT", "UPDATE", "DELETE", "WITH", "REPLACE"):
        verb = first
        if first == "WITH":
            verb = next(
                (
                    t.value
                    for t in tokens[1:]
                    if t.kind == "word"
                    and t.depth == 0
                    and t.value in ("INSERT", "UPDATE", "DELETE", "SELECT", "VALUES", "REPLACE")
                ),
                None,
            )
        if verb in ("SELECT", "VALUES", None):
            raise refuse("a migration statement must write: a query changes nothing")
        targets = _dml_targets(index, tokens)
        if not targets:
            raise refuse("no table written")
        return step("dml", verb.lower(), targets)
    if first == "TRUNCATE":
        raise refuse("TRUNCATE is not captured row by row: use DELETE")
    if first in ("SELECT", "VALUES", "EXPLAIN"):
        raise refuse("a migration statement must write: a query changes nothing")
    raise refuse(f"{first or tokens[0].text!r} is not a supported migration statement")


def _split_actions(tokens):
    actions, current = [], []
    for t in tokens:
        if t.kind == "op" and t.text == "," and t.depth == 0:
            actions.append(current)
            current = []
        else:
            current.append(t)
    if current:
        actions.append(current)
    return actions


def _alter_action(index, tokens):
    """(action name, destructive) of one ALTER TABLE action."""
    r = _Reader(index, tokens)
    if r.take("ADD"):
        if r.word() in _CONSTRAINTS:
            return "add_constraint", False
        return "add_column", False
    if r.take("DROP"):
        if r.take("CONSTRAINT"):
            return "drop_constraint", True
        return "drop_column", True
    if r.take("ALTER"):
        r.take("COLUMN")
        if r.peek() is None:
            raise _refuse(index, "ALTER COLUMN without a column", UNSUPPORTED_STATEMENT)
        r.pos += 1
        if r.word() == "TYPE" or (r.word() == "SET" and r.word(1) == "DATA"):
            raise _refuse(index, "a column type change is refused", TYPE_CHANGE_REFUSED)
        if (r.word(), r.word(1)) in _ALTER_COLUMN_OK:
            return "alter_column", False
    first = tokens[0].text if tokens else ""
    raise _refuse(index, f"ALTER TABLE ... {first} is not supported", UNSUPPORTED_STATEMENT)


def _dml_targets(index, tokens):
    r = _Reader(index, tokens)
    targets = []
    while r.peek() is not None:
        w = r.word()
        r.pos += 1
        if w == "REPLACE" and r.pos == 1:
            message = "REPLACE deletes without capture: use INSERT ... ON CONFLICT"
            raise _refuse(index, message, UNSUPPORTED_STATEMENT)
        if w in ("INSERT", "UPDATE") and r.word() == "OR":
            mode = r.word(1)
            if mode in ("REPLACE", "ROLLBACK"):
                raise _refuse(
                    index,
                    f"OR {mode} is refused: use INSERT ... ON CONFLICT",
                    UNSUPPORTED_STATEMENT,
                )
            r.pos += 2
        if w == "INSERT":
            if r.take("INTO"):
                targets.append(r.name())
        elif w == "UPDATE":
            if r.word() == "SET":  # ON CONFLICT ... DO UPDATE SET
                continue
            r.take("ONLY")
            targets.append(r.name())
        elif w == "DELETE" and r.take("FROM"):
            r.take("ONLY")
            targets.append(r.name())
    return list(dict.fromkeys(targets))
