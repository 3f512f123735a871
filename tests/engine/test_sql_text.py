"""The one SQL lexer the journal and public SQL share: splits as each database reads the text."""

import sqlite3

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rindle_app.engine import sql_text
from rindle_app.engine.public_sql import SqlError, scan
from rindle_app.engine.sql_text import PORTABLE, POSTGRESQL, SQLITE, SqlTextError

ALL = (POSTGRESQL, SQLITE, PORTABLE)


def statements(sql, dialect):
    return [text for text, _tokens in sql_text.split(sql, dialect)]


def keywords(sql, dialect):
    split = sql_text.split(sql, dialect)
    return [next(t.text.upper() for t in tokens if t.kind == "word") for _text, tokens in split]


# The SQL texts of the journal's and public SQL's suites, as both of them must split them.
UNION = [
    (
        "-- a comment; with a semicolon\n"
        "CREATE TABLE \"semi;colon\" (id TEXT PRIMARY KEY, note TEXT DEFAULT 'a;''b' /* x;y */);\n"
        'CREATE INDEX semi_note ON "semi;colon" (note);;',
        ["CREATE", "CREATE"],
    ),
    ("INSERT INTO a (id) VALUES ('1'); DELETE FROM b WHERE id = '2'", ["INSERT", "DELETE"]),
    ("-- why\nCREATE  TABLE a (\n  id TEXT PRIMARY KEY -- key\n);\n", ["CREATE"]),
    (
        "ALTER TABLE a DROP COLUMN b; DROP INDEX a_b; DROP TABLE IF EXISTS c, d",
        ["ALTER", "DROP", "DROP"],
    ),
    (
        "WITH src AS (SELECT id FROM a) INSERT INTO b (id) SELECT id FROM src "
        "ON CONFLICT (id) DO UPDATE SET id = excluded.id",
        ["WITH"],
    ),
    ("ATTACH DATABASE 'x.db' AS x", ["ATTACH"]),
    ("PRAGMA foreign_keys = OFF", ["PRAGMA"]),
    ("CREATE TRIGGER t AFTER INSERT ON a BEGIN DELETE FROM b; END", ["CREATE", "END"]),
    ("-- only a comment\n;", []),
    ("", []),
    ("SELECT ? AS big, :s AS s", ["SELECT"]),
    ("INSERT INTO issue (id, title) VALUES (?, ?); DELETE FROM issue", ["INSERT", "DELETE"]),
    ('WITH gone AS (DELETE FROM "user" RETURNING id) SELECT id FROM gone', ["WITH"]),
    ("EXPLAIN ANALYZE DELETE FROM issue", ["EXPLAIN"]),
    ("SELECT query_to_xml('select id from issue', true, true, '')::text", ["SELECT"]),
    ("(SELECT 1)", ["SELECT"]),
]


@pytest.mark.parametrize("dialect", ALL)
@pytest.mark.parametrize(("sql", "expected"), UNION)
def test_the_suites_texts_split_alike_in_every_dialect(sql, expected, dialect):
    """The statements both suites send are cut and named the same in every dialect."""
    assert keywords(sql, dialect) == expected


def test_a_statement_keeps_its_text_as_written_without_comments_around_it():
    sql = "  /* lead */ SELECT  'a;b' -- tail\n ; \n DELETE FROM t /* trailing */ ;"
    assert statements(sql, SQLITE) == ["SELECT  'a;b'", "DELETE FROM t"]
    tokens = sql_text.split(sql, SQLITE)[0][1]
    assert [(t.kind, t.text) for t in tokens] == [("word", "SELECT"), ("string", "'a;b'")]


# The cases the two lexers used to read differently, with what each database reads.
DISAGREEMENTS = [
    # dollar quotes: PostgreSQL only; the portable reading lexes them so the journal refuses
    ("SELECT $$a;b$$; SELECT 2", POSTGRESQL, ["SELECT $$a;b$$", "SELECT 2"]),
    ("SELECT $tag$ $$ ; $tag$", POSTGRESQL, ["SELECT $tag$ $$ ; $tag$"]),
    ("SELECT $$a;b$$", PORTABLE, ["SELECT $$a;b$$"]),
    ("SELECT $$a;b$$", SQLITE, ["SELECT $$a", "b$$"]),
    ("SELECT a$b; SELECT 1", POSTGRESQL, ["SELECT a$b", "SELECT 1"]),
    # nested comments: PostgreSQL nests them, SQLite ends at the first */
    ("SELECT 1 /* a /* b */ ; */", POSTGRESQL, ["SELECT 1"]),
    ("SELECT 1 /* a /* b */ ; SELECT 2", SQLITE, ["SELECT 1", "SELECT 2"]),
    ("SELECT 1 /*/*/ ; SELECT 2", SQLITE, ["SELECT 1", "SELECT 2"]),
    # quoting: '' and "" double in every dialect
    ("SELECT 'it''s;' ; SELECT \"a\"\";b\"", POSTGRESQL, ["SELECT 'it''s;'", 'SELECT "a"";b"']),
    ("SELECT 'it''s;' ; SELECT \"a\"\";b\"", SQLITE, ["SELECT 'it''s;'", 'SELECT "a"";b"']),
    ("SELECT 'it''s;' ; SELECT \"a\"\";b\"", PORTABLE, ["SELECT 'it''s;'", 'SELECT "a"";b"']),
    # E'...' takes backslash escapes on PostgreSQL only
    ("SELECT E'it\\'s;'; SELECT 2", POSTGRESQL, ["SELECT E'it\\'s;'", "SELECT 2"]),
    ("SELECT e'\\\\'; SELECT 2", POSTGRESQL, ["SELECT e'\\\\'", "SELECT 2"]),
    # [brackets] and backticks quote identifiers on SQLite
    ("SELECT [a;b], `c;d` FROM t; SELECT 2", SQLITE, ["SELECT [a;b], `c;d` FROM t", "SELECT 2"]),
    ("SELECT arr[1]; SELECT 2", POSTGRESQL, ["SELECT arr[1]", "SELECT 2"]),
]


@pytest.mark.parametrize(("sql", "dialect", "expected"), DISAGREEMENTS)
def test_each_dialect_splits_as_its_database_reads(sql, dialect, expected):
    """Dollar quotes, nested comments, E-strings and bracket names follow the database."""
    assert statements(sql, dialect) == expected


@pytest.mark.parametrize(
    ("sql", "dialect", "message"),
    [
        ("SELECT 'open", SQLITE, "unterminated quoted string"),
        ('SELECT "open', POSTGRESQL, "unterminated quoted string"),
        ("SELECT [open", SQLITE, "unterminated quoted string"),
        ("SELECT E'it\\'s", POSTGRESQL, "unterminated quoted string"),
        ("SELECT E'it\\'s;'", SQLITE, "unterminated quoted string"),
        ("SELECT $$ open", POSTGRESQL, "unterminated dollar-quoted string"),
        ("SELECT 1 /* open", SQLITE, "unterminated /* comment"),
        ("SELECT 1 /* a /* b */", POSTGRESQL, "unterminated /* comment"),
        ("SELECT 1 /*/*/ */", POSTGRESQL, "unterminated /* comment"),
        ("SELECT 1 /* a /* b */ */", PORTABLE, "PostgreSQL nests comments"),
    ],
)
def test_text_a_dialect_cannot_read_is_an_error_naming_where(sql, dialect, message):
    with pytest.raises(SqlTextError) as info:
        sql_text.split(sql, dialect)
    assert message in info.value.message and 0 <= info.value.at < len(sql)


def test_tokens_say_what_they_are():
    sql = "SELECT E'x', $1, $q$y$q$, \"id\", 1.5e3, a::text -- c"
    kinds = [(t.kind, t.text) for t in sql_text.lex(sql, POSTGRESQL) if t.kind != "space"]
    assert kinds == [
        ("word", "SELECT"),
        ("estring", "E'x'"),
        ("op", ","),
        ("param", "$1"),
        ("op", ","),
        ("dollar", "$q$y$q$"),
        ("op", ","),
        ("ident", '"id"'),
        ("op", ","),
        ("number", "1.5e3"),
        ("op", ","),
        ("word", "a"),
        ("op", "::"),
        ("word", "text"),
        ("comment", "-- c"),
    ]
    assert "".join(t.text for t in sql_text.lex(sql, POSTGRESQL)) == sql


def test_an_unknown_dialect_is_a_programming_error():
    with pytest.raises(ValueError):
        sql_text.split("SELECT 1", "oracle")


# SQLite's own reading of where a statement ends is sqlite3_complete(); texts of these atoms
# (no CREATE TRIGGER, whose BEGIN ... END it also tracks) must end where it says they do.
ATOMS = [
    "SELECT", "x", "E", "'a'", "'", "''", '"q"', '"', "`b`", "`", "[c]", "[", "]", "$$", "$1",
    "?", ":n", "::", ";", " ", "\n", "-- c\n", "--", "/*", "*/", "/", "*", "-", "(", ")", "1",
]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(ATOMS), max_size=12).map("".join))
def test_the_sqlite_dialect_ends_statements_where_sqlite_does(sql):
    """A text ends with a complete statement exactly when sqlite3_complete says so."""
    try:
        tokens = [t for t in sql_text.lex(sql, SQLITE) if t.kind not in sql_text.SKIPPED]
        complete = bool(tokens) and tokens[-1].kind == ";"
    except SqlTextError:
        complete = False
    assert complete == sqlite3.complete_statement(sql)


def test_sqlite_ends_a_comment_at_the_first_close_which_public_sql_now_follows():
    """'/*/*/' is a whole comment to SQLite: the statement around it runs, placeholders count."""
    sql = "SELECT ? /*/*/ + ?"
    assert sqlite3.connect(":memory:").execute(sql, (1, 2)).fetchall() == [(3,)]
    keyword, positional, names, driver = scan(sql, "sqlite")
    assert (keyword, positional, names, driver) == ("SELECT", 2, [], sql)


@pytest.mark.parametrize(
    ("sql", "vendor", "expected"),
    [
        ("SELECT ? AS a, ':x' AS b", "postgresql", ("SELECT", 1, [], "SELECT %s AS a, ':x' AS b")),
        ("SELECT :a, :a::text, 5 % 2", "postgresql", ("SELECT", 0, ["a"], None)),
        ("SELECT $$ ? :n $$, ?", "postgresql", ("SELECT", 1, [], "SELECT $$ ? :n $$, %s")),
        ("SELECT [?], `:n`, ?", "sqlite", ("SELECT", 1, [], "SELECT [?], `:n`, ?")),
        ("SELECT 1 /* ; ? */ ;  -- after", "sqlite", ("SELECT", 0, [], None)),
        ("SELECT 1 /* /* ? */ ? */", "postgresql", ("SELECT", 0, [], None)),
    ],
)
def test_public_sql_counts_placeholders_outside_quotes_and_comments(sql, vendor, expected):
    keyword, positional, names, driver = scan(sql, vendor)
    assert (keyword, positional, names) == expected[:3]
    if expected[3] is not None:
        assert driver == expected[3]
    if names:
        assert driver == "SELECT %(a)s, %(a)s::text, 5 %% 2"


@pytest.mark.parametrize(
    ("sql", "vendor", "message"),
    [
        ("SELECT 1; SELECT 2", "sqlite", "one statement per entry"),
        ("SELECT 1; 'open", "postgresql", "one statement per entry"),
        ("SELECT 1; /* open", "postgresql", "unterminated /* comment"),
        ("SELECT $1", "postgresql", "not $n"),
        ("SELECT $$ open", "postgresql", "unterminated dollar-quoted string"),
        ("SELECT 1 /* a /* b */", "postgresql", "unterminated /* comment"),
    ],
)
def test_public_sql_refuses_what_it_cannot_route_with_a_protocol_error(sql, vendor, message):
    with pytest.raises(SqlError) as info:
        scan(sql, vendor)
    assert info.value.code == "PROTOCOL_ERROR" and message in info.value.message
