"""Capture: every write to a registered table lands in the outbox, whoever makes it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from project.demo.models import Issue, Tag, User
from rindle_app.engine.capture import trigger_names
from rindle_app.testing import outbox_high_water, outbox_since
from tests.conftest import child_env
from tests.support.demo import issue
from tests.support.threads import run_at_once

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


def changes(before):
    return [(e["table"], e["op"], e["pk"]) for e in outbox_since(before)]


def make_issue(id="i1", owner="u1", created=1.5):
    return issue(id, title="T", owner=owner, created=created)


def test_orm_save_insert_and_update_are_captured_with_images():
    """Model.save() of a new and then a changed row records add and edit with both images."""
    before = outbox_high_water()
    user = User.objects.create(id="u1", name="Ann")
    user.name = "Anne"
    user.save()
    events = outbox_since(before)
    assert [(e["op"], e["old"], e["new"]) for e in events] == [
        ("add", None, {"id": "u1", "name": "Ann"}),
        ("edit", {"id": "u1", "name": "Ann"}, {"id": "u1", "name": "Anne"}),
    ]


def test_queryset_update_is_captured_per_row():
    """QuerySet.update() (which fires no signals) is captured row by row."""
    User.objects.bulk_create([User(id=f"u{i}", name="x") for i in range(3)])
    before = outbox_high_water()
    User.objects.filter(id__in=["u0", "u2"]).update(name="y")
    assert sorted(changes(before)) == [("user", "edit", ["u0"]), ("user", "edit", ["u2"])]


def test_bulk_create_is_captured():
    """bulk_create() is captured, one add per row."""
    before = outbox_high_water()
    User.objects.bulk_create([User(id=f"u{i}", name="x") for i in range(5)])
    assert changes(before) == [("user", "add", [f"u{i}"]) for i in range(5)]


def test_delete_and_queryset_delete_are_captured_with_old_image():
    """delete() records a remove carrying the old row."""
    User.objects.bulk_create([User(id=f"u{i}", name="x") for i in range(3)])
    before = outbox_high_water()
    User.objects.get(id="u0").delete()
    User.objects.filter(id__in=["u1", "u2"]).delete()
    events = outbox_since(before)
    assert sorted((e["op"], e["pk"][0], e["old"]["name"], e["new"]) for e in events) == [
        ("remove", "u0", "x", None),
        ("remove", "u1", "x", None),
        ("remove", "u2", "x", None),
    ]


def test_raw_sql_is_captured():
    """Raw SQL through Django's connection is captured like the ORM."""
    before = outbox_high_water()
    with connection.cursor() as cursor:
        cursor.execute('INSERT INTO "user" (id, name) VALUES (%s, %s)', ["raw", "Raw"])
        cursor.execute('UPDATE "user" SET name = %s WHERE id = %s', ["Raw2", "raw"])
    assert changes(before) == [("user", "add", ["raw"]), ("user", "edit", ["raw"])]


def test_an_update_that_changes_nothing_is_not_a_change():
    """Saving an unchanged row records nothing."""
    user = User.objects.create(id="u1", name="Ann")
    before = outbox_high_water()
    user.save()
    User.objects.filter(id="u1").update(name="Ann")
    assert changes(before) == []


def test_rolled_back_writes_leave_no_event():
    """Capture is part of the transaction: a rollback removes the event too."""
    before = outbox_high_water()
    with pytest.raises(RuntimeError), transaction.atomic():
        User.objects.create(id="u1", name="Ann")
        raise RuntimeError("abort")
    assert changes(before) == []


def test_float_values_round_trip_exactly():
    """Captured REAL values equal the stored doubles bit for bit (no 15-digit rounding)."""
    values = [0.1 + 0.2, 1735000000000.123, 1e-320, -2.5, 5.0]
    before = outbox_high_water()
    for i, v in enumerate(values):
        make_issue(id=f"i{i}", created=v).save()
    images = [e["new"]["createdAt"] for e in outbox_since(before)]
    assert images == values
    stored = list(Issue.objects.order_by("id").values_list("created_at", flat=True))
    assert stored == values


def test_a_write_from_another_process_without_rindle_is_captured():
    """A second process writing with a bare database driver is captured by the triggers."""
    before = outbox_high_water()
    name = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        code = (
            "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]);"
            "c.execute('INSERT INTO \"user\" (id, name) VALUES (?, ?)', ('ext', 'External'));"
            "c.commit()"
        )
    else:
        code = (
            "import psycopg,sys; c=psycopg.connect(host='127.0.0.1', user='postgres',"
            " dbname=sys.argv[1]);"
            "c.execute('INSERT INTO \"user\" (id, name) VALUES (%s, %s)', ('ext', 'External'));"
            "c.commit()"
        )
    subprocess.run([sys.executable, "-c", code, name], check=True, timeout=60)
    events = outbox_since(before)
    assert [(e["table"], e["op"], e["new"]) for e in events] == [
        ("user", "add", {"id": "ext", "name": "External"})
    ]


def test_an_orm_write_from_another_django_process_is_captured():
    """A management-command style ORM write in another process is captured."""
    before = outbox_high_water()
    code = (
        "import django; django.setup();"
        "from project.demo.models import Tag; Tag.objects.create(id='t1', issue_id='i1', name='ui')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=child_env(), timeout=60)
    assert changes(before) == [("tag", "add", ["t1"])]
    assert Tag.objects.get(id="t1").name == "ui"


def test_re_registering_after_a_column_change_keeps_capture_in_step(engine):
    """After ALTER TABLE ADD COLUMN and re-registration, images carry the new column."""
    engine.register_table("gadget", ["id", "label"], [0], ["string", "string"])
    with connection.cursor() as cursor:
        cursor.execute('ALTER TABLE "gadget" ADD COLUMN "weight" DOUBLE PRECISION')
    table = engine.register_existing_table("gadget")
    assert [c.name for c in table.columns] == ["id", "label", "weight"]
    before = outbox_high_water()
    engine.write(lambda tx: tx.insert("gadget", {"id": "g1", "label": "L", "weight": 2.5}))
    assert [e["new"] for e in outbox_since(before)] == [{"id": "g1", "label": "L", "weight": 2.5}]


def test_an_update_of_a_table_with_a_json_column_is_captured_when_it_changes(engine):
    """
    A ``json`` column has no equality operator on PostgreSQL: an update that changes
    only it, or nothing, is compared by value, captured in the first case only.
    """
    engine.register_table("doc_meta", ["id", "label", "meta"], [0], ["string", "string", "json"])
    try:
        row = {"id": "d1", "label": "L", "meta": '{"a": 1}'}
        engine.write(lambda tx: tx.insert("doc_meta", row))
        before = outbox_high_water()
        engine.write(lambda tx: tx.update("doc_meta", {"id": "d1"}, {"meta": '{"a": 2}'}))
        engine.write(lambda tx: tx.update("doc_meta", {"id": "d1"}, {"label": "L"}))  # no change
        events = [(e["op"], e["new"]["meta"]) for e in outbox_since(before)]
        assert [(op, json.loads(m) if isinstance(m, str) else m) for op, m in events] == [
            ("edit", {"a": 2})
        ]
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE IF EXISTS "doc_meta"')


def test_migrate_reinstalls_missing_capture_triggers():
    """Running migrate restores the capture triggers of synced tables."""
    names = trigger_names("tag")
    with connection.cursor() as cursor:
        for name in names.values():
            if connection.vendor == "sqlite":
                cursor.execute(f'DROP TRIGGER "{name}"')
            else:
                cursor.execute(f'DROP TRIGGER "{name}" ON "tag"')
    before = outbox_high_water()
    Tag.objects.create(id="lost", issue_id="i1", name="x")
    assert changes(before) == []
    call_command("migrate", verbosity=0)
    before = outbox_high_water()
    Tag.objects.create(id="kept", issue_id="i1", name="x")
    assert changes(before) == [("tag", "add", ["kept"])]


def test_outbox_images_are_json_objects_keyed_by_column():
    """Images use column names from the database (the original's camelCase)."""
    User.objects.create(id="u1", name="Ann")
    before = outbox_high_water()
    make_issue().save()
    (event,) = outbox_since(before)
    assert set(event["new"]) == {
        "id",
        "title",
        "status",
        "priority",
        "ownerId",
        "createdAt",
        "updatedAt",
    }
    json.dumps(event)  # every image is plain JSON


def _install_capture(conn, engine):
    from rindle_app.engine.capture import install

    with conn.cursor() as cursor:
        install(cursor, "postgresql", engine.tables.by_name()["issue"])


def _install_ledger_functions(conn, engine):
    from rindle_app.engine.mutations import install_ledger_functions
    from rindle_app.engine.tx import Tx

    conn.ensure_connection()
    install_ledger_functions(Tx(conn, conn.connection.cursor(), engine.tables))


@pytest.mark.parametrize("installer", [_install_capture, _install_ledger_functions])
def test_processes_starting_together_install_without_a_catalog_race(engine, installer):
    """
    Two processes start at once (two Daphne workers): each refreshes the capture
    triggers and the Postgres helper functions in its own transaction. Concurrent
    ``CREATE OR REPLACE FUNCTION`` of one function fails one of them ("tuple
    concurrently updated") unless installs are serialized; both must succeed.
    """
    import threading
    import time

    from django.db import connections

    if connection.vendor != "postgresql":
        pytest.skip("SQLite's write lock already serializes installs")
    barrier = threading.Barrier(2)
    errors = []

    def start():
        conn = connections.create_connection("default")
        try:
            for _ in range(3):
                barrier.wait(timeout=10)
                conn.set_autocommit(False)
                try:
                    installer(conn, engine)
                    time.sleep(0.05)  # the other one reaches its install meanwhile
                    conn.commit()
                except Exception as exc:
                    conn.rollback()
                    errors.append(exc)
                finally:
                    conn.set_autocommit(True)
        finally:
            conn.close()

    run_at_once([start, start])
    assert errors == []
    before = outbox_high_water()
    make_issue(id="race").save()
    assert changes(before) == [("issue", "add", ["race"])]  # the triggers still capture
    assert (
        engine.mutate(
            "race-client", 1, "setStatus", {"id": "race", "status": "done", "updatedAt": 2.0}
        ).status
        == "applied"
    )  # and the ledger helpers still work
