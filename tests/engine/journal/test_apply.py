"""Applying migrations through the engine: once, atomically, with their marker and report."""

import pytest
from django.db import connection

from rindle_app.engine import get_engine, shutdown
from rindle_app.engine.journal import (
    MigrationConflict,
    MigrationRefused,
    apply,
    migration_record,
    parse,
)
from rindle_app.testing import outbox_high_water, outbox_since

from .conftest import journal_rows, rows, state

pytestmark = pytest.mark.django_db(transaction=True)

S1, S2, S3 = "a1" * 32, "b2" * 32, "c3" * 32
NOTE = "CREATE TABLE jt_note (id TEXT PRIMARY KEY, body TEXT NOT NULL)"


def migrate(engine, mid, sql, **kwargs):
    return apply(engine, parse(mid, sql, **kwargs))


def refused(engine, mid, sql, code, error=MigrationRefused, **kwargs):
    before = state()
    with pytest.raises(error) as info:
        migrate(engine, mid, sql, **kwargs)
    assert info.value.code == code, info.value.message
    assert state() == before, "a refused migration wrote something"
    return info.value


def test_a_ddl_migration_creates_a_captured_table_and_journals_its_report(engine):
    outcome = migrate(engine, "0001_notes", NOTE, checksum=S1)
    assert outcome.applied and outcome.kind == "ddl" and outcome.schema_version == "0001_notes"
    assert outcome.report["created"] == ["jt_note"]
    assert outcome.report["steps"] == [
        {"index": 0, "sql": NOTE, "action": "create_table", "tables": ["jt_note"]}
    ]
    assert outcome.cv is not None
    assert [c.name for c in engine.tables.get("jt_note").columns] == ["id", "body"]
    stored = migration_record(engine, "0001_notes")
    assert stored["checksum"] == S1 and stored["actions"] == outcome.report
    high = outbox_high_water()
    engine.write(lambda tx: tx.insert("jt_note", {"id": "n1", "body": "hi"}))
    events = outbox_since(high)
    assert [(e["table"], e["op"], e["new"]) for e in events] == [
        ("jt_note", "add", {"id": "n1", "body": "hi"})
    ]


def test_an_exact_replay_returns_the_stored_report_and_runs_nothing(engine):
    first = migrate(engine, "0001_notes", NOTE, checksum=S1)
    before = state()
    again = migrate(engine, "0001_notes", "-- same\n" + NOTE + ";", checksum=S1)
    assert not again.applied and again.cv is None
    assert again.report == first.report and again.schema_version == "0001_notes"
    assert state() == before


def test_the_same_id_with_other_sql_fails_even_with_an_override(engine):
    migrate(engine, "0001_notes", NOTE, checksum=S1)
    edited = NOTE.replace("NOT NULL", "")
    refused(engine, "0001_notes", edited, "checksum_mismatch", MigrationConflict, checksum=S2)
    exc = refused(
        engine,
        "0001_notes",
        edited,
        "checksum_mismatch",
        MigrationConflict,
        checksum=S2,
        override_hash=S1,
    )
    assert exc.status == 409


def test_a_cosmetic_edit_needs_an_override_naming_the_stored_checksum(engine):
    migrate(engine, "0001_notes", NOTE, checksum=S1)
    cosmetic = "-- notes, reformatted\n" + NOTE.replace(" (", "\n(")
    refused(engine, "0001_notes", cosmetic, "checksum_mismatch", MigrationConflict, checksum=S2)
    refused(
        engine,
        "0001_notes",
        cosmetic,
        "override_mismatch",
        MigrationConflict,
        checksum=S2,
        override_hash=S3,
    )
    high = outbox_high_water()
    outcome = migrate(engine, "0001_notes", cosmetic, checksum=S2, override_hash=S1)
    assert not outcome.applied and outcome.hash_overridden
    assert migration_record(engine, "0001_notes")["checksum"] == S2
    assert outbox_high_water() == high
    again = migrate(engine, "0001_notes", cosmetic, checksum=S2)
    assert not again.applied and not again.hash_overridden


def test_a_checksum_is_adopted_by_a_migration_stored_without_one(engine):
    migrate(engine, "0001_notes", NOTE)
    assert migration_record(engine, "0001_notes")["checksum"] is None
    outcome = migrate(engine, "0001_notes", NOTE, checksum=S1)
    assert not outcome.applied
    assert migration_record(engine, "0001_notes")["checksum"] == S1


def test_a_kind_mismatch_fails(engine):
    migrate(engine, "0001_notes", NOTE)
    refused(engine, "0001_notes", "DELETE FROM jt_note", "kind_mismatch", MigrationConflict)


def test_a_failing_statement_rolls_back_the_whole_migration(engine):
    sql = [NOTE, "CREATE INDEX jt_note_body ON jt_note (body)", "CREATE TABLE jt_note (x TEXT)"]
    exc = refused(engine, "0001_notes", sql, "statement_failed")
    assert exc.details["statement"] == 2
    assert "jt_note" not in engine.tables


def test_a_table_without_a_primary_key_is_refused(engine):
    refused(engine, "0001", "CREATE TABLE jt_loose (a TEXT)", "no_primary_key")


def test_a_binary_column_is_refused(engine):
    blob = "BYTEA" if connection.vendor == "postgresql" else "BLOB"
    refused(engine, "0001", f"CREATE TABLE jt_bin (id TEXT PRIMARY KEY, b {blob})", "blob_refused")


def test_a_referenced_table_cannot_be_dropped_before_its_referrers(engine):
    migrate(
        engine,
        "0001",
        [
            "CREATE TABLE jt_parent (id TEXT PRIMARY KEY)",
            "CREATE TABLE jt_child (id TEXT PRIMARY KEY, parent_id TEXT REFERENCES jt_parent (id))",
        ],
    )
    refused(engine, "0002", "DROP TABLE jt_parent", "referenced_table")
    outcome = migrate(engine, "0002", "DROP TABLE jt_child; DROP TABLE jt_parent")
    assert outcome.report["dropped"] == ["jt_child", "jt_parent"]
    assert "jt_child" not in engine.tables and "jt_parent" not in engine.tables


def test_ddl_on_a_registered_table_refreshes_the_map_and_tells_only_its_listeners(engine):
    migrate(engine, "0001", [NOTE, "CREATE TABLE jt_other (id TEXT PRIMARY KEY)"])
    changed = []
    engine.add_schema_listener(changed.append)
    outcome = migrate(engine, "0002", "ALTER TABLE jt_note ADD COLUMN tag TEXT")
    assert outcome.report["altered"] == ["jt_note"] and outcome.schema_version == "0002"
    assert changed == ["jt_note"]
    assert [c.name for c in engine.tables.get("jt_note").columns] == ["id", "body", "tag"]
    high = outbox_high_water()
    engine.write(lambda tx: tx.insert("jt_note", {"id": "n1", "body": "b", "tag": "t"}))
    assert outbox_since(high)[0]["new"] == {"id": "n1", "body": "b", "tag": "t"}


def test_a_destructive_migration_is_reported_and_the_map_follows(engine):
    migrate(engine, "0001", [NOTE, "ALTER TABLE jt_note ADD COLUMN tag TEXT"])
    changed = []
    engine.add_schema_listener(changed.append)
    outcome = migrate(engine, "0002", "ALTER TABLE jt_note DROP COLUMN tag")
    assert outcome.as_dict()["destructive"] == ["ALTER TABLE jt_note DROP COLUMN tag"]
    assert outcome.report["steps"][0]["destructive"] is True
    assert [c.name for c in engine.tables.get("jt_note").columns] == ["id", "body"]
    outcome = migrate(engine, "0003", "DROP TABLE jt_note")
    assert outcome.report["dropped"] == ["jt_note"] and "jt_note" not in engine.tables
    assert changed == ["jt_note", "jt_note"]


def test_a_dml_migration_is_captured_once_and_does_not_move_the_schema_version(engine):
    migrate(engine, "0001", NOTE)
    high = outbox_high_water()
    sql = [
        "INSERT INTO jt_note (id, body) VALUES ('a', 'x'), ('b', 'y')",
        "DELETE FROM jt_note WHERE id LIKE 'a%'",
    ]
    outcome = migrate(engine, "0002_seed", sql)
    assert outcome.applied and outcome.kind == "dml" and outcome.schema_version == "0001"
    assert outcome.report["rowChanges"] == 3
    assert [s["rows"] for s in outcome.report["steps"]] == [2, 1]
    ops = [(e["op"], e["pk"]) for e in outbox_since(high)]
    assert ops == [("add", ["a"]), ("add", ["b"]), ("remove", ["a"])]
    before = state()
    assert not migrate(engine, "0002_seed", sql).applied
    assert state() == before
    assert rows("SELECT id FROM jt_note") == [("b",)]


def test_dml_may_only_write_captured_tables(engine):
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE jt_plain (id TEXT PRIMARY KEY)")
    refused(engine, "0001", "INSERT INTO jt_plain VALUES ('x')", "table_not_captured")
    refused(engine, "0001", "DELETE FROM auth_user", "table_not_captured")


def test_dml_over_the_row_change_limit_is_refused(engine, monkeypatch):
    from rindle_app.engine import journal

    migrate(engine, "0001", NOTE)
    monkeypatch.setattr(journal, "MAX_ROW_CHANGES", 2)
    sql = "INSERT INTO jt_note (id, body) VALUES ('a', 'x'), ('b', 'y'), ('c', 'z')"
    exc = refused(engine, "0002", sql, "too_many_row_changes")
    assert exc.status == 413
    assert rows("SELECT COUNT(*) FROM jt_note") == [(0,)]


def test_a_failing_dml_statement_leaves_no_rows_and_no_marker(engine):
    migrate(engine, "0001", NOTE)
    sql = [
        "INSERT INTO jt_note (id, body) VALUES ('a', 'x')",
        "INSERT INTO jt_note (id, body) VALUES ('a', 'dup')",
    ]
    refused(engine, "0002", sql, "statement_failed")
    assert rows("SELECT COUNT(*) FROM jt_note") == [(0,)]


def test_a_failing_step_effect_rolls_back_the_statements(engine):
    def fail(tx, step):
        raise RuntimeError("bookkeeping failed")

    before = state()
    with pytest.raises(RuntimeError):
        apply(engine, parse("0001", NOTE), on_step=fail)
    assert state() == before


def test_tables_created_by_the_journal_are_registered_again_after_a_restart(engine):
    migrate(engine, "0001", [NOTE, "CREATE TABLE jt_gone (id TEXT PRIMARY KEY)"])
    migrate(engine, "0002", "DROP TABLE jt_gone")
    shutdown()
    restarted = get_engine()
    assert restarted is not engine
    assert "jt_note" in restarted.tables and "jt_gone" not in restarted.tables
    high = outbox_high_water()
    restarted.write(lambda tx: tx.insert("jt_note", {"id": "n1", "body": "b"}))
    assert len(outbox_since(high)) == 1


def test_a_journal_table_changed_outside_the_journal_does_not_stop_the_engine(engine):
    migrate(engine, "0001", [NOTE, "CREATE TABLE jt_other (id TEXT PRIMARY KEY)"])
    shutdown()
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE jt_note")
        cursor.execute("CREATE TABLE jt_note (id TEXT)")
    restarted = get_engine()
    assert "jt_note" not in restarted.tables and "jt_other" in restarted.tables


def test_only_journal_rows_of_migrations_are_read_as_migrations(engine):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO _rindle_applied_ddl (key, actions, checksum, content_checksum, "
            "applied_at) VALUES ('offset-7', NULL, NULL, NULL, 1)"
        )
    refused(engine, "offset-7", NOTE, "id_taken", MigrationConflict)
    assert ("offset-7", None, None) in journal_rows()
