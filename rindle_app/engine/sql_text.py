"""
One SQL lexer for the migrations journal and public SQL.

``lex(sql, dialect)`` yields the tokens of ``sql`` lazily (so an error is raised
where a left-to-right reading meets it), whitespace and comments included, so a
caller can rebuild the text or drop them. It only splits and routes: what a
statement may do is the database's decision (SQLite's authorizer, PostgreSQL's
roles), so a statement the lexer reads wrongly still meets that boundary.

Dialects:

- ``postgresql``: ``'...'`` (``''`` escapes), ``E'...'`` (backslash escapes too),
  ``"..."``, dollar quotes ``$$...$$``/``$tag$...$tag$``, ``$1`` parameters,
  nested ``/* /* */ */`` comments.
- ``sqlite``: ``'...'``, ``"..."``, ``\\`...\\``` (doubled-quote escapes),
  ``[...]`` identifiers; ``/*`` comments end at the first ``*/``.
- ``portable``: for text read before the database is known (the journal): quoting
  as both read it (``'``, ``"``, backticks), ``E'...'`` and ``$`` lexed as
  PostgreSQL does so a caller can refuse them, and a ``/*`` inside a comment refused
  (``SqlTextError``): PostgreSQL nests comments and SQLite does not, so the two
  would end the comment, and maybe the statement, in different places.

Token kinds: ``space``, ``comment``, ``string``, ``estring``, ``dollar`` (a
dollar-quoted string), ``ident`` (a quoted identifier), ``word``, ``number``,
``param`` (``$n``), ``op`` and ``;``.
"""

import re
from dataclasses import dataclass

POSTGRESQL, SQLITE, PORTABLE = "postgresql", "sqlite", "portable"
DIALECTS = (POSTGRESQL, SQLITE, PORTABLE)
SKIPPED = ("space", "comment")

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_SPACE = re.compile(r"\s+")
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_PARAM = re.compile(r"\$\d+")
_OPERATORS = ("->>", "<=", ">=", "<>", "!=", "||", "::", "->", "==", "<<", ">>")


class SqlTextError(ValueError):
    """The text cannot be read as SQL of the dialect (unterminated, ambiguous)."""

    def __init__(self, message, at):
        super().__init__(message)
        self.message, self.at = message, at


@dataclass(frozen=True)
class Token:
    kind: str
    text: str  # as written
    start: int  # offset in the text

    @property
    def end(self):
        return self.start + len(self.text)


def lex(sql, dialect):
    """The tokens of ``sql`` in order (see the module docstring)."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}")
    pg_like = dialect != SQLITE
    quotes = "'\"[`" if dialect == SQLITE else ("'\"`" if dialect == PORTABLE else "'\"")
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        kind, j = None, None
        if ch.isspace():
            kind, j = "space", _SPACE.match(sql, i).end()
        elif sql.startswith("--", i):
            newline = sql.find("\n", i)
            kind, j = "comment", n if newline < 0 else newline + 1
        elif sql.startswith("/*", i):
            kind, j = "comment", _comment_end(sql, i, dialect)
        elif ch == ";":
            kind, j = ";", i + 1
        elif ch in quotes:
            closing = "]" if ch == "[" else ch
            kind = "string" if ch == "'" else "ident"
            j = _quoted_end(sql, i, closing, backslash=False)
        elif pg_like and ch == "$" and (m := _DOLLAR.match(sql, i) or _PARAM.match(sql, i)):
            kind, j = ("param", m.end()) if m.re is _PARAM else ("dollar", _dollar_end(sql, m))
        else:
            m = _WORD.match(sql, i)
            if m and pg_like and m.group() in ("E", "e") and sql.startswith("'", m.end()):
                kind, j = "estring", _quoted_end(sql, m.end(), "'", backslash=True)
            elif m:
                kind, j = "word", m.end()
            elif m := _NUMBER.match(sql, i):
                kind, j = "number", m.end()
            else:
                op = next((o for o in _OPERATORS if sql.startswith(o, i)), ch)
                kind, j = "op", i + len(op)
        yield Token(kind, sql[i:j], i)
        i = j


def split(sql, dialect):
    """``[(statement text, [Token])]``: ``sql`` cut at every ``;`` the dialect sees."""
    statements, tokens = [], []

    def close():
        if tokens:
            statements.append((sql[tokens[0].start : tokens[-1].end], list(tokens)))
        tokens.clear()

    for token in lex(sql, dialect):
        if token.kind == ";":
            close()
        elif token.kind not in SKIPPED:
            tokens.append(token)
    close()
    return statements


def first_keyword(tokens):
    """The first word of a statement, upper-cased (None when it has none)."""
    return next((t.text.upper() for t in tokens if t.kind == "word"), None)


def _comment_end(sql, i, dialect):
    depth, j = 0, i
    while j < len(sql):
        if sql.startswith("/*", j):
            if depth and dialect == PORTABLE:
                raise SqlTextError(
                    "a /* inside a comment: PostgreSQL nests comments and SQLite does not", j
                )
            depth = depth + 1 if dialect == POSTGRESQL else 1
            j += 2
        elif sql.startswith("*/", j):
            depth -= 1
            j += 2
            if depth == 0:
                return j
        else:
            j += 1
    raise SqlTextError("unterminated /* comment", i)


def _quoted_end(sql, i, closing, backslash):
    j = i + 1
    while j < len(sql):
        c = sql[j]
        if backslash and c == "\\":
            j += 2
        elif c != closing:
            j += 1
        elif closing != "]" and sql.startswith(closing, j + 1):
            j += 2
        else:
            return j + 1
    raise SqlTextError("unterminated quoted string or identifier", i)


def _dollar_end(sql, match):
    end = sql.find(match.group(), match.end())
    if end < 0:
        raise SqlTextError("unterminated dollar-quoted string", match.start())
    return end + len(match.group())
