"""Splitting and classifying migration SQL: what the journal accepts, and every refusal."""

import hashlib

import pytest

from rindle_app.engine import journal
from rindle_app.engine.journal import MigrationRefused, parse, parse_file

STORED = "ab" * 32


def refusal(sql, **kwargs):
    with pytest.raises(MigrationRefused) as info:
        parse("m1", sql, **kwargs)
    return info.value


def test_semicolons_inside_literals_identifiers_and_comments_do_not_split():
    """Only a top-level ';' ends a statement."""
    m = parse(
        "0001",
        """
        -- a comment; with a semicolon
        CREATE TABLE "semi;colon" (id TEXT PRIMARY KEY, note TEXT DEFAULT 'a;''b' /* x;y */);
        CREATE INDEX semi_note ON "semi;colon" (note);;
        """,
    )
    assert [s.action for s in m.steps] == ["create_table", "create_index"]
    assert m.steps[0].sql.startswith('CREATE TABLE "semi;colon"')
    assert m.steps[0].tables == (("semi;colon", True),)
    assert m.kind == "ddl" and not m.destructive


def test_statements_may_come_as_a_list_and_items_may_hold_several():
    one = parse("m", "INSERT INTO a (id) VALUES ('1'); DELETE FROM b WHERE id = '2'")
    many = parse("m", ["INSERT INTO a (id) VALUES ('1')", "DELETE FROM b WHERE id = '2';"])
    assert one.kind == many.kind == "dml"
    assert [s.action for s in one.steps] == ["insert", "delete"]
    assert one.content_checksum == many.content_checksum


def test_the_content_checksum_ignores_comments_and_spacing_but_not_sql():
    base = parse("m", "CREATE TABLE a (id TEXT PRIMARY KEY)")
    cosmetic = parse("m", "-- why\nCREATE  TABLE a (\n  id TEXT PRIMARY KEY -- key\n);\n")
    edited = parse("m", "CREATE TABLE a (id TEXT PRIMARY KEY, b TEXT)")
    assert cosmetic.content_checksum == base.content_checksum
    assert edited.content_checksum != base.content_checksum


def test_drops_are_marked_destructive():
    m = parse(
        "m",
        "ALTER TABLE a DROP COLUMN b; DROP INDEX a_b; DROP TABLE IF EXISTS c, d; "
        "ALTER TABLE a ADD COLUMN e TEXT",
    )
    assert [s.destructive for s in m.steps] == [True, True, True, False]
    assert m.steps[2].tables == (("c", False), ("d", False))


def test_dml_targets_include_ctes_and_upserts_but_not_read_tables():
    m = parse(
        "m",
        "WITH src AS (SELECT id FROM a) INSERT INTO b (id) SELECT id FROM src "
        "ON CONFLICT (id) DO UPDATE SET id = excluded.id",
    )
    assert m.kind == "dml" and m.steps[0].tables == (("b", False),)


@pytest.mark.parametrize(
    ("sql", "code"),
    [
        ("ALTER TABLE a RENAME TO b", "rename_refused"),
        ("ALTER TABLE a RENAME COLUMN b TO c", "rename_refused"),
        ("ALTER TABLE a ALTER COLUMN b TYPE BIGINT", "type_change_refused"),
        ("ALTER TABLE a ALTER b SET DATA TYPE TEXT", "type_change_refused"),
        ("ATTACH DATABASE 'x.db' AS x", "attach_refused"),
        ("DETACH DATABASE x", "attach_refused"),
        ("PRAGMA foreign_keys = OFF", "pragma_refused"),
        ("BEGIN", "transaction_control_refused"),
        ("COMMIT", "transaction_control_refused"),
        ("ROLLBACK", "transaction_control_refused"),
        ("SAVEPOINT s", "transaction_control_refused"),
        ("RELEASE s", "transaction_control_refused"),
        ("INSERT INTO a VALUES ('1'); CREATE TABLE b (id TEXT PRIMARY KEY)", "mixed_migration"),
        ("CREATE TABLE _rindle_x (id TEXT PRIMARY KEY)", "reserved_table"),
        ("DELETE FROM _rindle_client_mutations", "reserved_table"),
        ("UPDATE sqlite_sequence SET seq = 0", "reserved_table"),
        ("DROP TABLE a CASCADE", "cascade_refused"),
        ("CREATE TABLE public.a (id TEXT PRIMARY KEY)", "unsupported_syntax"),
        ("CREATE FUNCTION f() RETURNS int AS $$ SELECT 1 $$ LANGUAGE sql", "unsupported_syntax"),
        ("INSERT INTO a VALUES (E'it\\'s')", "unsupported_syntax"),
        ("INSERT INTO a VALUES ('open", "unsupported_syntax"),
        ("CREATE TABLE a (id TEXT PRIMARY KEY", "unsupported_syntax"),
        # PostgreSQL nests comments and SQLite does not: they would end this one apart.
        ("CREATE TABLE a (id TEXT PRIMARY KEY) /* /* */ ; DROP TABLE b; */", "unsupported_syntax"),
        ("DELETE FROM a /*/*/ WHERE id = '1'", "unsupported_syntax"),
        ("DELETE FROM a$b", "unsupported_syntax"),
        ("DELETE FROM a WHERE id = $1", "unsupported_syntax"),
        ("CREATE TRIGGER t AFTER INSERT ON a BEGIN DELETE FROM b; END", "unsupported_statement"),
        ("REPLACE INTO a VALUES ('1')", "unsupported_statement"),
        ("INSERT OR REPLACE INTO a VALUES ('1')", "unsupported_statement"),
        ("TRUNCATE a", "unsupported_statement"),
        ("SELECT 1", "unsupported_statement"),
        ("WITH q AS (SELECT 1) SELECT * FROM q", "unsupported_statement"),
        ("VACUUM", "unsupported_statement"),
        ("CREATE TEMP TABLE a (id TEXT PRIMARY KEY)", "unsupported_statement"),
        ("ALTER TABLE a DISABLE TRIGGER ALL", "unsupported_statement"),
        ("", "empty_migration"),
        ("-- only a comment\n;", "empty_migration"),
    ],
)
def test_refusals_have_their_own_codes(sql, code):
    exc = refusal(sql)
    assert exc.code == code, exc.message
    assert exc.status == 400 and exc.message


def test_a_refusal_names_the_statement():
    exc = refusal("CREATE TABLE a (id TEXT PRIMARY KEY); ALTER TABLE a RENAME TO b")
    assert exc.details["statement"] == 1 and "statement 2" in exc.message


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"migration_id": ""}, "invalid_migration_id"),
        ({"migration_id": "../etc"}, "invalid_migration_id"),
        ({"migration_id": "x" * 201}, "invalid_migration_id"),
        ({"checksum": "abc"}, "invalid_checksum"),
        ({"override_hash": "zz" * 32}, "invalid_override_hash"),
        ({"statements": [1]}, "invalid_statements"),
    ],
)
def test_bad_identity_is_refused(kwargs, code):
    args = {"migration_id": "m1", "statements": "DELETE FROM a", **kwargs}
    with pytest.raises(MigrationRefused) as info:
        parse(
            args["migration_id"],
            args["statements"],
            checksum=args.get("checksum"),
            override_hash=args.get("override_hash"),
        )
    assert info.value.code == code


def test_a_migration_over_the_size_limit_is_refused(monkeypatch):
    monkeypatch.setattr(journal, "MAX_BYTES", 64)
    exc = refusal("INSERT INTO a (id) VALUES ('" + "x" * 100 + "')")
    assert exc.code == "migration_too_large" and exc.status == 413


def test_a_file_is_identified_by_its_stem_and_the_hash_of_its_bytes(tmp_path):
    path = tmp_path / "0007_notes.sql"
    path.write_text("CREATE TABLE a (id TEXT PRIMARY KEY);\n")
    m = parse_file(path)
    assert m.id == "0007_notes" and m.override_hash is None
    assert m.checksum == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_override_line_is_read_and_left_out_of_the_file_hash(tmp_path):
    body = "CREATE TABLE a (id TEXT PRIMARY KEY);\n"
    path = tmp_path / "0007_notes.sql"
    path.write_text(f"-- OVERRIDE_HASH: {STORED.upper()}\n" + body)
    m = parse_file(path)
    assert m.override_hash == STORED
    assert m.checksum == hashlib.sha256(body.encode()).hexdigest()


def test_a_malformed_override_line_is_refused(tmp_path):
    path = tmp_path / "0001.sql"
    path.write_text("-- OVERRIDE_HASH: nope\nCREATE TABLE a (id TEXT PRIMARY KEY);\n")
    with pytest.raises(MigrationRefused) as info:
        parse_file(path)
    assert info.value.code == "invalid_override_hash"
