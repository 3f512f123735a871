"""
Schema changes of a synced model through Django migrations, applied by a real
``manage.py migrate`` in another process: every operation applies, capture is
intact afterwards in the new shape, each change appends a DDL marker in order,
and no write committed by another connection meanwhile goes uncaptured.
"""

import threading

import pytest
from django.db import connection, connections

from rindle_app.engine import capture
from rindle_app.engine.capture import trigger_names
from rindle_app.engine.schema_changes import capture_triggers
from rindle_app.engine.tables import introspect
from tests.support.schema_project import SchemaProject, columns, events, execute, last_seq

pytestmark = pytest.mark.django_db(transaction=True)

NOTE = "schema_app_note"

INITIAL = """
migrations.CreateModel(
    name="Note",
    fields=[
        ("id", models.CharField(max_length=20, primary_key=True, serialize=False)),
        ("title", models.CharField(max_length=100, db_default="")),
        ("note", models.TextField(db_default="")),
    ],
),
"""


@pytest.fixture
def project(tmp_path):
    made = []

    def make(**kwargs):
        made.append(SchemaProject(tmp_path, **kwargs))
        return made[-1]

    yield make
    for p in made:
        p.clean()


def markers(after):
    return [t for _s, t, op, _o, _n in events(after) if op == "ddl"]


def added(after, table=NOTE):
    return [new for _s, _t, op, _o, new in events(after, table) if op == "add"]


def wanted_triggers(table):
    return set(trigger_names(table).values())


def test_every_schema_operation_on_a_synced_model_applies_with_capture_intact(project):
    """
    AddField, RemoveField, RenameField, AlterField (a table rebuild on SQLite),
    RenameModel and DeleteModel each apply under migrate; a write afterwards lands
    in the outbox once, with the new columns; each appends a DDL marker naming the
    table; unapplying them all works too.
    """
    p = project(synced=("schema_app.Note", "schema_app.Memo"))
    p.write("0001_initial", INITIAL)
    seq = last_seq()
    p.migrate("schema_app", "0001")
    assert markers(seq) == [NOTE]
    seq = last_seq()
    execute(f"INSERT INTO {NOTE} (id, title, note) VALUES ('n1', 'a', 'x')")
    assert added(seq) == [{"id": "n1", "title": "a", "note": "x"}]

    p.write("0002_done", 'migrations.AddField("note", "done", models.BooleanField(default=False))')
    seq = last_seq()
    p.migrate("schema_app", "0002")
    assert markers(seq) == [NOTE]
    seq = last_seq()
    execute(f"UPDATE {NOTE} SET done = %s WHERE id = 'n1'", [True])
    [(_s, _t, op, old, new)] = events(seq, NOTE)
    assert op == "edit" and old["done"] in (0, False) and new["done"] in (1, True)

    # The SQLite failure: a trigger naming the column refused its drop.
    p.write("0003_no_note", 'migrations.RemoveField("note", "note")')
    seq = last_seq()
    p.migrate("schema_app", "0003")
    assert markers(seq) == [NOTE]
    assert sorted(columns(NOTE)) == ["done", "id", "title"]
    seq = last_seq()
    execute(f"INSERT INTO {NOTE} (id, title, done) VALUES ('n2', 'b', %s)", [False])
    assert [sorted(new) for new in added(seq)] == [["done", "id", "title"]]

    p.write("0004_heading", 'migrations.RenameField("note", "title", "heading")')
    seq = last_seq()
    p.migrate("schema_app", "0004")
    assert markers(seq) == [NOTE]
    seq = last_seq()
    execute(f"INSERT INTO {NOTE} (id, heading, done) VALUES ('n3', 'c', %s)", [False])
    assert [sorted(new) for new in added(seq)] == [["done", "heading", "id"]]

    # A nullability and length change: SQLite rebuilds the table (its triggers went
    # with the old one), PostgreSQL alters it in place.
    p.write(
        "0005_nullable",
        'migrations.AlterField("note", "heading", models.CharField(max_length=200, null=True))',
    )
    seq = last_seq()
    p.migrate("schema_app", "0005")
    assert markers(seq) == [NOTE]
    with connection.cursor() as cursor:
        assert capture_triggers(cursor, connection.vendor, NOTE) == wanted_triggers(NOTE)
    seq = last_seq()
    execute(f"INSERT INTO {NOTE} (id, heading, done) VALUES ('n4', NULL, %s)", [True])
    assert [new["heading"] for new in added(seq)] == [None]

    # RenameModel: the table was captured under its old name (an older deploy synced
    # Draft); afterwards it is captured once, under the new name.
    p.write(
        "0006_draft",
        """
        migrations.CreateModel(
            name="Draft",
            fields=[("id", models.CharField(max_length=20, primary_key=True, serialize=False))],
        ),
        """,
    )
    p.migrate("schema_app", "0006")
    with connection.cursor() as cursor:
        draft = introspect(connection, cursor, "schema_app_draft")
        capture.install(cursor, connection.vendor, draft)
    p.write("0007_memo", 'migrations.RenameModel("Draft", "Memo")')
    seq = last_seq()
    p.migrate("schema_app", "0007")
    assert sorted(markers(seq)) == ["schema_app_draft", "schema_app_memo"]
    with connection.cursor() as cursor:
        found = capture_triggers(cursor, connection.vendor, "schema_app_memo")
    assert found == wanted_triggers("schema_app_memo")
    seq = last_seq()
    execute("INSERT INTO schema_app_memo (id) VALUES ('m1')")
    assert [(t, op, new) for _s, t, op, _o, new in events(seq)] == [
        ("schema_app_memo", "add", {"id": "m1"})
    ]

    p.write("0008_memo_gone", 'migrations.DeleteModel("Memo")')
    seq = last_seq()
    p.migrate("schema_app", "0008")
    assert markers(seq) == ["schema_app_memo"]
    assert "schema_app_memo" not in connection.introspection.table_names()

    # Backwards, every operation again in reverse, to before the first.
    seq = last_seq()
    p.migrate("schema_app", "0002")
    assert sorted(columns(NOTE)) == ["done", "id", "note", "title"]
    assert NOTE in markers(seq)
    seq = last_seq()
    execute(f"INSERT INTO {NOTE} (id, title, note, done) VALUES ('n5', 'e', 'y', %s)", [False])
    assert [sorted(new) for new in added(seq)] == [["done", "id", "note", "title"]]
    p.migrate("schema_app", "zero")
    assert NOTE not in connection.introspection.table_names()


def test_a_data_migration_after_a_schema_operation_is_captured_in_the_new_shape(project):
    """RunPython after AddField in one migration writes through reinstalled triggers."""
    p = project()
    p.write("0001_initial", INITIAL)
    p.migrate("schema_app", "0001")
    p.write(
        "0002_fill",
        """
        migrations.AddField("note", "done", models.BooleanField(default=False)),
        migrations.RunPython(
            lambda apps, editor: apps.get_model("schema_app", "Note").objects.create(
                id="py", title="t", done=True
            ),
            migrations.RunPython.noop,
        ),
        """,
    )
    seq = last_seq()
    p.migrate("schema_app", "0002")
    [(_s, _t, op, old, new)] = [e for e in events(seq, NOTE) if e[2] != "ddl"]
    assert op == "add" and old is None
    assert sorted(new) == ["done", "id", "note", "title"] and new["done"] in (1, True)


def _writer(stop, written, errors):
    """Insert a row after another, each committed at once, on a connection of its own."""
    conn = connections["default"]
    try:
        n = 0
        while not stop.is_set():
            with conn.cursor() as cursor:
                cursor.execute(f"INSERT INTO {NOTE} (id, title) VALUES (%s, 't')", [f"w{n}"])
            written.append(f"w{n}")
            n += 1
    except Exception as exc:  # reported by the test
        errors.append(exc)
    finally:
        conn.close()


def test_writes_committed_by_another_connection_during_migrate_are_all_captured(project):
    """
    While migrate adds a column and then removes another, a concurrent writer keeps
    committing inserts: every row is captured exactly once, and each image has the
    columns of the table at its place in the outbox (before, between or after the
    two DDL markers).
    """
    p = project()
    p.write("0001_initial", INITIAL)
    p.migrate("schema_app", "0001")
    p.write(
        "0002_done", 'migrations.AddField("note", "done", models.BooleanField(db_default=False))'
    )
    p.write("0003_no_note", 'migrations.RemoveField("note", "note")')
    start = last_seq()
    stop, written, errors = threading.Event(), [], []
    thread = threading.Thread(target=_writer, args=(stop, written, errors))
    thread.start()
    try:
        p.migrate("schema_app", "0002")
        p.migrate("schema_app", "0003")
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    shapes = [
        ["id", "note", "title"],
        ["done", "id", "note", "title"],
        ["done", "id", "title"],
    ]
    stage, seen = 0, []
    for _seq, _table, op, _old, new in events(start, NOTE):
        if op == "ddl":
            stage += 1
            continue
        assert op == "add" and sorted(new) == shapes[stage], (stage, new)
        seen.append(new["id"])
    assert stage == 2
    assert sorted(seen) == sorted(written) and len(seen) == len(set(seen))
    assert len(written) > 0


def test_run_syncdb_creates_captured_tables_for_an_app_without_migrations(project):
    """``migrate --run-syncdb`` of an app without migrations leaves its synced tables captured."""
    p = project(synced=("schema_app.Note", "schema_app.Memo"), migrations=False)
    p.migrate("--run-syncdb")
    for table in (NOTE, "schema_app_memo"):
        with connection.cursor() as cursor:
            assert capture_triggers(cursor, connection.vendor, table) == wanted_triggers(table)
    seq = last_seq()
    execute(f"INSERT INTO {NOTE} (id, title) VALUES ('s1', 'a')")
    assert added(seq) == [{"id": "s1", "title": "a"}]


def test_a_schema_run_sql_is_followed_by_capture_in_the_new_shape(project):
    """A RunSQL that adds a column of a synced table: marked, and captured with it after."""
    p = project()
    p.write("0001_initial", INITIAL)
    p.migrate("schema_app", "0001")
    p.write(
        "0002_sql",
        """
        migrations.RunSQL(
            'ALTER TABLE "schema_app_note" ADD COLUMN "extra" TEXT',
            migrations.RunSQL.noop,
        ),
        """,
    )
    seq = last_seq()
    p.migrate("schema_app", "0002")
    assert markers(seq) == [NOTE]
    seq = last_seq()
    execute(f"INSERT INTO {NOTE} (id, title, note, extra) VALUES ('q1', 'a', 'b', 'c')")
    assert added(seq) == [{"id": "q1", "title": "a", "note": "b", "extra": "c"}]
