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
from typing import NamedTuple

POSTGRESQL, SQLITE, PORTABLE = "postgresql", "sqlite", "portable"
DIALECTS = (POSTGRESQL, SQLITE, PORTABLE)
SKIPPED = ("space", "comment")

# Whitespace, words, numbers and the multi-character operators, in one match.
_SIMPLE = re.compile(
    r"(?P<space>\s+)|(?P<word>[A-Za-z_][A-Za-z0-9_$]*)"
    r"|(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<op>->>|<=|>=|<>|!=|\|\||::|->|==|<<|>>)"
)
_DOLLAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)?\$")
_PARAM = re.compile(r"\$\d+")


class SqlTextError(ValueError):
    """The text cannot be read as SQL of the dialect (unterminated, ambiguous)."""

    def __init__(self, message, at):
        super().__init__(message)
        self.message, self.at = message, at


class Token(NamedTuple):
    kind: str
    text: str  # as written
    start: int  # offset in the text

    @property
    def end(self):
        return self.start + len(self.text)


_new = tuple.__new__  # a Token without NamedTuple's Python-level __new__: 3x faster


def lex(sql, dialect):
    """The tokens of ``sql`` in order (see the module docstring)."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}")
    pg_like = dialect != SQLITE
    quotes = "'\"[`" if dialect == SQLITE else ("'\"`" if dialect == PORTABLE else "'\"")
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        m = _SIMPLE.match(sql, i)  # most tokens: tried first
        if m is not None:
            kind, j = m.lastgroup, m.end()
            if j == i + 1 and pg_like and ch in "Ee" and sql.startswith("'", j):
                kind, j = "estring", _estring_end(sql, j)
        elif ch in quotes:
            kind = "string" if ch == "'" else "ident"
            j = _quoted_end(sql, i, "]" if ch == "[" else ch)
        elif ch == ";":
            kind, j = ";", i + 1
        elif ch == "-" and sql.startswith("--", i):
            newline = sql.find("\n", i)
            kind, j = "comment", n if newline < 0 else newline + 1
        elif ch == "/" and sql.startswith("/*", i):
            kind, j = "comment", _comment_end(sql, i, dialect)
        elif pg_like and ch == "$" and (m := _DOLLAR.match(sql, i) or _PARAM.match(sql, i)):
            kind, j = ("param", m.end()) if m.re is _PARAM else ("dollar", _dollar_end(sql, m))
        else:
            kind, j = "op", i + 1
        yield _new(Token, (kind, sql[i:j], i))
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


def _comment_end(sql, i, dialect):
    depth, j = 1, i + 2
    while (close := sql.find("*/", j)) >= 0:
        # The leftmost of "/*" and "*/" wins, as in both databases' own lexers.
        opened = -1 if dialect == SQLITE else sql.find("/*", j, close + 1)
        if opened < 0:
            depth, j = depth - 1, close + 2
            if depth == 0:
                return j
        elif dialect == PORTABLE:
            raise SqlTextError(
                "a /* inside a comment: PostgreSQL nests comments and SQLite does not", opened
            )
        else:
            depth, j = depth + 1, opened + 2
    raise SqlTextError("unterminated /* comment", i)


def _quoted_end(sql, i, closing):
    j = i + 1
    while (k := sql.find(closing, j)) >= 0:
        if closing == "]" or not sql.startswith(closing, k + 1):
            return k + 1
        j = k + 2  # a doubled quote stands for itself
    raise SqlTextError("unterminated quoted string or identifier", i)


def _estring_end(sql, i):
    j = i + 1
    while j < len(sql):
        c = sql[j]
        if c == "\\":
            j += 2
        elif c != "'":
            j += 1
        elif sql.startswith("'", j + 1):
            j += 2
        else:
            return j + 1
    raise SqlTextError("unterminated quoted string or identifier", i)


def _dollar_end(sql, match):
    end = sql.find(match.group(), match.end())
    if end < 0:
        raise SqlTextError("unterminated dollar-quoted string", match.start())
    return end + len(match.group())
