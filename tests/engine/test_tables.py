"""The table map: registration, introspection, client schemas, and the FK audit."""

import pytest
from django.db import connection

from project.demo.models import Comment, User
from rindle_app.engine import EngineClosed, InvalidInput, UnknownTable, get_engine, shutdown
from rindle_app.engine.registry import synced_labels
from rindle_app.testing import outbox_high_water, outbox_since
from tests.support.demo import create_issue
from tests.support.threads import run_at_once


def test_register_table_creates_registers_and_is_idempotent(engine):
    """register_table creates the table once; calling it again changes nothing."""
    first = engine.register_table("gizmo", ["id", "n", "on"], [0], ["string", "number", "boolean"])
    second = engine.register_table("gizmo", ["id", "n", "on"], [0], ["string", "number", "boolean"])
    assert first == second
    assert [(c.name, c.type) for c in first.columns] == [
        ("id", "string"),
        ("n", "number"),
        ("on", "boolean"),
    ]
    before = outbox_high_water()
    engine.write(lambda tx: tx.insert("gizmo", {"id": "a", "n": 1, "on": True}))
    assert [e["op"] for e in outbox_since(before)] == ["add"]


def test_register_existing_table_reads_column_order_and_composite_pk(engine):
    """Column order and a composite primary key come from the database, in key order."""
    with connection.cursor() as cursor:
        cursor.execute(
            'CREATE TABLE "pairs" ("b" TEXT, "a" TEXT, "v" TEXT, PRIMARY KEY ("b", "a"))'
        )
    table = engine.register_existing_table("pairs")
    assert [c.name for c in table.columns] == ["b", "a", "v"]
    assert table.primary_key == ("b", "a")
    before = outbox_high_water()
    engine.write(lambda tx: tx.insert("pairs", {"b": "B", "a": "A", "v": "x"}))
    assert outbox_since(before)[0]["pk"] == ["B", "A"]


def test_primary_key_columns_are_never_nullable(engine):
    """
    A key column reads as NOT NULL on both backends, composite keys and SQLite's
    INTEGER PRIMARY KEY (the rowid, which the catalog calls nullable) included.
    """
    with connection.cursor() as cursor:
        cursor.execute('CREATE TABLE "pk_rowid" ("id" INTEGER PRIMARY KEY, "n" INTEGER)')
        cursor.execute(
            'CREATE TABLE "pk_pairs" ("b" TEXT, "a" INTEGER, "v" TEXT, PRIMARY KEY ("b", "a"))'
        )
    counter = engine.register_existing_table("pk_rowid").schema()
    assert counter["columns"] == [
        {"name": "id", "type": "number", "nullable": False},
        {"name": "n", "type": "number", "nullable": True},
    ]
    pairs = engine.register_existing_table("pk_pairs").schema()
    assert pairs["columns"] == [
        {"name": "b", "type": "string", "nullable": False},
        {"name": "a", "type": "number", "nullable": False},
        {"name": "v", "type": "string", "nullable": True},
    ]
    assert pairs["primaryKey"] == ["b", "a"]


def test_synced_models_are_registered_with_model_types(engine):
    """Every synced model's table is in the map, typed from the model where it knows better."""
    assert set(synced_labels()) >= {"demo.User", "demo.Issue", "demo.Tag", "demo.Comment"}
    issue = engine.tables.get("issue")
    assert issue.primary_key == ("id",)
    assert {c.name: c.type for c in issue.columns}["createdAt"] == "number"


def test_base_table_schemas_are_sorted_and_hide_bookkeeping(engine):
    """Client schemas are sorted by name and never show _rindle_*, __* or sqlite_* tables."""
    engine.register_table("__meta", ["k"], [0], ["string"])
    engine.register_table("zebra", ["id"], [0], ["string"])
    assert "_rindle_client_mutations" in engine.tables
    names = [s["name"] for s in engine.base_table_schemas()]
    assert names == sorted(names)
    assert {"comment", "issue", "tag", "user", "zebra"} <= set(names)
    assert not [n for n in names if n.startswith(("_rindle_", "__", "sqlite_"))]
    user = next(s for s in engine.base_table_schemas() if s["name"] == "user")
    assert user == {
        "name": "user",
        "columns": [
            {"name": "id", "type": "string", "nullable": False},
            {"name": "name", "type": "string", "nullable": False},
        ],
        "primaryKey": ["id"],
    }


def test_unknown_table_is_a_clear_error(engine):
    """Registering or writing a table that does not exist names the table and a code."""
    with pytest.raises(UnknownTable) as info:
        engine.register_existing_table("nope")
    assert info.value.code == "unknown_table" and "nope" in info.value.message
    with pytest.raises(UnknownTable):
        engine.write(lambda tx: tx.insert("nope", {"id": 1}))


@pytest.mark.parametrize("name", ["bad name", 'x"; DROP TABLE "user', "", "1abc", "a" * 64])
def test_invalid_identifiers_are_refused_before_any_sql(engine, name):
    """Table names that are not plain identifiers never reach the database."""
    with pytest.raises(InvalidInput):
        engine.register_table(name, ["id"], [0], ["string"])
    assert User.objects.count() == 0  # the user table is untouched


def test_row_helpers_refuse_unknown_columns_and_partial_keys(engine):
    """Row helpers validate columns and keys against the table map."""
    with pytest.raises(InvalidInput) as info:
        engine.write(lambda tx: tx.insert("user", {"id": "u", "nme": "typo"}))
    assert info.value.code == "unknown_column"
    with pytest.raises(InvalidInput) as info:
        engine.write(lambda tx: tx.update("user", {"name": "u"}, {"name": "v"}))
    assert info.value.code == "invalid_key"
    assert User.objects.count() == 0


def test_row_helpers_read_and_write(engine):
    """insert / upsert / insert_ignore / update / row / delete do what they say."""

    def work(tx):
        tx.insert("user", {"id": "u1", "name": "A"})
        assert tx.insert_ignore("user", {"id": "u1", "name": "ignored"}) == 0
        tx.upsert("user", {"id": "u1", "name": "B"})
        assert tx.update("user", {"id": "missing"}, {"name": "C"}) == 0
        assert tx.row("user", {"id": "u1"}) == {"id": "u1", "name": "B"}
        tx.insert("user", {"id": "u2", "name": "X"})
        assert tx.delete("user", {"id": "u2"}) == 1
        return tx.query('SELECT id FROM "user" ORDER BY id')

    assert engine.write(work).value == [{"id": "u1"}]


def test_foreign_key_audit_reports_orphans_up_to_the_cap(engine):
    """The audit finds rows whose declared reference is missing, capped at max_rows."""
    User.objects.create(id="u1", name="Ann")
    create_issue("i1")
    for i in range(3):
        Comment.objects.create(id=f"c{i}", issue_id="gone", author_id="u1", body="b", created_at=1)
    Comment.objects.create(id="ok", issue_id="i1", author_id="u1", body="b", created_at=1)
    audit = engine.foreign_key_audit(max_rows=10)
    assert not audit.ok and not audit.truncated
    assert sorted(v["pk"][0] for v in audit.violations) == ["c0", "c1", "c2"]
    assert {v["references"] for v in audit.violations} == {"issue"}
    capped = engine.foreign_key_audit(max_rows=2)
    assert len(capped.violations) == 2 and capped.truncated


def test_close_drains_every_queued_request(transactional_db):
    """close() finishes what was queued before it, then refuses new work."""
    from rindle_app.engine import Engine

    engine = Engine().start()
    requests = [
        engine.submit(lambda tx, i=i: tx.insert("user", {"id": f"q{i}", "name": "x"}))
        for i in range(200)
    ]
    engine.close()
    assert all(r.finished and r.error is None for r in requests)
    assert User.objects.count() == 200
    with pytest.raises(EngineClosed):
        engine.write(lambda tx: None)


def test_get_engine_is_one_started_engine_per_process(transactional_db):
    """get_engine() starts lazily and returns the same engine to every thread."""
    shutdown()
    seen = []
    run_at_once([lambda: seen.append(get_engine())] * 4, timeout=None)
    try:
        assert len({id(e) for e in seen}) == 1
        assert seen[0].write(lambda tx: 42).value == 42
        assert len(seen[0].boot_id) == 32
    finally:
        shutdown()
    assert seen[0].closed


def test_engine_start_on_a_database_without_migrations_names_the_missing_table(
    transactional_db,
):
    """Starting before migrate fails with the missing table's name, not a crash."""
    from rindle_app.engine import Engine

    with connection.cursor() as cursor:
        cursor.execute('ALTER TABLE "_rindle_client_mutations" RENAME TO "_rindle_cm_away"')
    try:
        with pytest.raises(UnknownTable) as info:
            Engine().start()
        assert "_rindle_client_mutations" in info.value.message
    finally:
        with connection.cursor() as cursor:
            cursor.execute('ALTER TABLE "_rindle_cm_away" RENAME TO "_rindle_client_mutations"')
