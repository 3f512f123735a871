"""
The writer side of the fence, enforced by the outbox's guard trigger: every path
that puts a row in the outbox (the ORM, bulk_create, raw SQL, a savepoint rolled
back inside atomic(), the admin, a data migration, a direct outbox insert) draws
its seq only after taking the shared fence; and short writes never queue behind
a waiting exclusive step for longer than the fence lock timeout.
"""

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.db.migrations import Migration, RunPython, RunSQL
from django.test import Client, override_settings

from project.demo.models import User
from rindle_app.engine.capture import FENCE_KEY, OUTBOX
from rindle_app.models import ChangeEvent
from rindle_app.stream.watermark import Watermarker

from .watermark_support import fence_locks, pg, raw, write_user

__all__ = ["pg"]


def _drawn_so_far(conn):
    (sequence,) = conn.execute("SELECT pg_get_serial_sequence(%s, 'seq')", [OUTBOX]).fetchone()
    return conn.execute(
        f"SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {sequence}"
    ).fetchone()[0]


def assert_fenced(path):
    """
    Run ``path`` on a thread while another session holds the EXCLUSIVE fence: it
    must wait (or fail loudly), and every seq it wrote must have been drawn after
    the exclusive holder let go, i.e. above every seq drawn while it held the fence.
    """
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
        before = cursor.fetchone()[0]
    hold = raw(autocommit=False)
    hold.execute("SELECT pg_advisory_xact_lock(%s)", [FENCE_KEY])
    done, failure = threading.Event(), []

    def run():
        try:
            path()
        except Exception as exc:  # reported below
            failure.append(exc)
        finally:
            connections.close_all()
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    blocked = not done.wait(0.5)
    drawn = _drawn_so_far(hold)
    hold.commit()
    hold.close()
    thread.join(20)
    assert done.is_set() and failure == [], failure
    assert blocked, "the path wrote to the outbox while the exclusive fence was held"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT seq FROM {OUTBOX} WHERE seq > %s", [before])
        seqs = [r[0] for r in cursor.fetchall()]
    assert seqs, "the path wrote nothing to the outbox"
    assert min(seqs) > drawn, (seqs, drawn)


def test_an_orm_save_holds_the_fence(pg):
    """Model.save() of a synced model waits for the exclusive fence and draws its seq after it."""
    assert_fenced(lambda: User.objects.create(id="orm", name="x"))


def test_bulk_create_holds_the_fence(pg):
    """bulk_create() of a synced model is fenced, every row."""
    assert_fenced(lambda: User.objects.bulk_create([User(id=f"b{i}", name="x") for i in range(5)]))


def test_raw_sql_holds_the_fence(pg):
    """A raw INSERT into a synced table is fenced."""

    def path():
        with connection.cursor() as cursor:
            cursor.execute("""INSERT INTO "user" (id, name) VALUES ('raw', 'x')""")

    assert_fenced(path)


def test_a_direct_outbox_insert_holds_the_fence_and_its_explicit_seq_is_replaced(pg):
    """
    A row written straight into the outbox (ORM or bulk_create, even with an
    explicit seq) is fenced, and its seq is drawn behind the fence: an explicit
    seq is never kept, so nobody can place a row below the published watermark.
    """

    def path():
        ChangeEvent.objects.create(seq=1, table="user", op="add", key=["x"], new={"id": "x"})
        ChangeEvent.objects.bulk_create(
            [ChangeEvent(table="user", op="add", key=[f"y{i}"]) for i in range(3)]
        )

    assert_fenced(path)
    assert not ChangeEvent.objects.filter(seq=1).exists()


def test_without_the_guard_a_direct_outbox_insert_is_caught_unfenced(pg):
    """The bypass hunt's check fails on a path that writes the outbox without the fence."""
    from rindle_app.engine.capture import GUARD

    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {OUTBOX} DISABLE TRIGGER {GUARD}")
    try:
        with pytest.raises(AssertionError, match="exclusive fence was held"):
            assert_fenced(
                lambda: ChangeEvent.objects.create(table="user", op="add", key=["z"], new={})
            )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {OUTBOX} ENABLE TRIGGER {GUARD}")


def test_the_identity_default_is_drawn_before_a_before_trigger(pg):
    """
    The trap the guard exists for: a column DEFAULT (identity) is evaluated before
    any BEFORE ROW trigger, so a trigger that only took the fence would take it
    after the seq was drawn. (Kept as a regression test: the outbox never relies on
    its identity default.)
    """
    conn = raw()
    conn.execute(
        "CREATE TEMP TABLE trap (seq bigint GENERATED BY DEFAULT AS IDENTITY, seen bigint)"
    )
    conn.execute(
        "CREATE FUNCTION pg_temp.trap_seen() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN NEW.seen := NEW.seq; RETURN NEW; END $$"
    )
    conn.execute(
        "CREATE TRIGGER trap BEFORE INSERT ON trap "
        "FOR EACH ROW EXECUTE FUNCTION pg_temp.trap_seen()"
    )
    seq, seen = conn.execute("INSERT INTO trap DEFAULT VALUES RETURNING seq, seen").fetchone()
    assert seen == seq == 1  # the default had already run when the trigger fired
    conn.close()
    # The outbox: a seq drawn by the default is thrown away and another drawn behind the fence.
    writer = raw()
    writer.execute(f"INSERT INTO {OUTBOX} (txid, \"table\", op, pk) VALUES (0, 't', 'add', '[]')")
    drawn = _drawn_so_far(writer)
    (stored,) = writer.execute(f"SELECT MAX(seq) FROM {OUTBOX}").fetchone()
    assert stored == drawn  # the later of two draws (the default's is a hole)
    writer.close()


def test_a_savepoint_rolled_back_releases_the_fence_and_the_outer_write_takes_it_again(pg):
    """
    ROLLBACK TO SAVEPOINT releases a shared fence first taken inside the savepoint
    (with the rows it fenced); the outer block's next write takes it again, so the
    outer write is still fenced.
    """
    me = connection

    def mine():
        with me.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        return [mode for p, mode, granted in fence_locks(granted=True) if p == pid]

    with transaction.atomic():
        try:
            with transaction.atomic():
                User.objects.create(id="inner", name="x")
                assert mine() == ["ShareLock"]
                raise RuntimeError("roll the savepoint back")
        except RuntimeError:
            pass
        assert mine() == []  # the savepoint's rollback released it
        User.objects.create(id="outer", name="x")
        assert mine() == ["ShareLock"]

    def path():
        with transaction.atomic():
            try:
                with transaction.atomic():
                    User.objects.create(id="inner2", name="x")
                    raise RuntimeError("roll the savepoint back")
            except RuntimeError:
                pass
            User.objects.create(id="outer2", name="x")

    assert_fenced(path)
    assert list(User.objects.filter(id__startswith="inner").values_list("id", flat=True)) == []


@override_settings(ROOT_URLCONF="tests.stream.wm_admin_urls")
def test_an_admin_add_form_holds_the_fence(pg):
    """Saving a synced model through the admin's add form is fenced."""
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("wm-admin", "a@example.com", "pw-123456")
    client = Client()
    client.force_login(admin)

    def path():
        response = client.post("/wm-admin/demo/user/add/", {"id": "adm", "name": "x"})
        assert response.status_code == 302, response.content[:500]

    assert_fenced(path)
    assert User.objects.filter(id="adm").exists()


def test_a_data_migration_holds_the_fence(pg):
    """RunPython and RunSQL operations applied by a migration write fenced rows."""

    def forwards(apps, schema_editor):
        apps.get_model("demo", "User").objects.create(id="mig-py", name="x")

    class DataMigration(Migration):
        operations = [
            RunPython(forwards),
            RunSQL("""INSERT INTO "user" (id, name) VALUES ('mig-sql', 'x')"""),
        ]

    def path():
        from django.db.migrations.loader import MigrationLoader

        state = MigrationLoader(connection).project_state()
        migration = DataMigration("9999_wm_data", "demo")
        with connection.schema_editor(atomic=True) as editor:
            migration.apply(state, editor)

    assert_fenced(path)
    assert User.objects.filter(id__startswith="mig-").count() == 2


def test_short_writes_wait_at_most_about_the_lock_timeout_behind_a_waiting_step(pg):
    """
    While one session idles in a transaction on a synced table (holding the shared
    fence) and the watermarker keeps trying the exclusive side, short writers are
    delayed by at most about the fence lock timeout each, never until the idle
    session ends.
    """
    idle = raw(autocommit=False)
    write_user(idle)
    outcomes = []
    wm = Watermarker(refresh_interval=0.02, fence_lock_timeout=0.05, observer=outcomes.append)
    wm.start()
    writer = raw()
    latencies = []
    try:
        time.sleep(0.2)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            t0 = time.monotonic()
            write_user(writer)
            latencies.append(time.monotonic() - t0)
    finally:
        wm.close()
        idle.rollback()
        idle.close()
        writer.close()
    latencies.sort()
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    timed_out = [p for p in outcomes if p.fence_timed_out]
    assert len(timed_out) >= 10 and not any(p.advanced for p in timed_out)
    # One lock timeout of queueing plus scheduling noise on a shared machine.
    assert p99 < 0.05 + 0.15, (p99, len(latencies))
