"""
Migrations seen from a live websocket: DML rows arrive as ordinary batches, and a
schema change bounces only the subscriptions on the changed table.
"""

import pytest
from channels.db import database_sync_to_async
from django.db import connection, transaction

from rindle_app.engine import capture, journal, schema_changes
from rindle_app.engine.tables import introspect
from rindle_app.ivm.builder import table
from rindle_app.named import named_query
from rindle_app.signals import install_capture_after_migrate
from rindle_app.testing import fresh_runtime
from tests.realtime.conftest import Client

from .conftest import drop_scratch_tables

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

db = database_sync_to_async


@named_query("journalA")
def journal_a(args, ctx):
    return table("jt_a")


@named_query("journalB")
def journal_b(args, ctx):
    return table("jt_b")


@pytest.fixture
def live(transactional_db):
    """The process engine and hub, started fresh; scratch tables dropped after."""
    with fresh_runtime() as runtime:
        drop_scratch_tables()
        yield runtime.engine
    drop_scratch_tables()


def migrate(engine, mid, statements):
    return journal.apply(engine, journal.parse(mid, statements))


async def subscribe(client, query_id, name):
    frame = {"t": "subscribe", "queryId": query_id, "name": name, "args": None}
    await client.send({**frame, "mode": "normalized"})
    return await client.recv_until("progress")


async def test_a_dml_migration_reaches_a_live_subscriber_as_an_ordinary_batch(live):
    client = Client()
    assert await client.connect()
    _hello, snap, _ = await subscribe(client, 1, "users")
    assert snap["batch"]["ops"] == []
    sql = """INSERT INTO "user" (id, name) VALUES ('u1', 'Ada'), ('u2', 'Grace')"""
    outcome = await db(migrate)(live, "0001_seed_users", sql)
    batch, progress = await client.recv_until("progress")
    assert batch["t"] == "nbatch" and batch["queryId"] == 1 and batch["batch"]["seq"] == 1
    assert batch["batch"]["ops"] == [
        {"table": "user", "op": "add", "row": ["u1", "Ada"]},
        {"table": "user", "op": "add", "row": ["u2", "Grace"]},
    ]
    assert batch["batch"]["cv"] == progress["frame"]["cvMin"] == outcome.cv
    again = await db(migrate)(live, "0001_seed_users", sql)
    assert not again.applied
    assert await client.nothing()
    await client.close()


async def _two_tables(live):
    await db(migrate)(
        live,
        "0001",
        ["CREATE TABLE jt_a (id TEXT PRIMARY KEY)", "CREATE TABLE jt_b (id TEXT PRIMARY KEY)"],
    )
    client, other = Client(), Client()
    assert await client.connect() and await other.connect()
    await subscribe(client, 1, "journalA")
    await subscribe(client, 2, "journalB")
    await subscribe(other, 1, "users")
    return client, other


async def test_journal_ddl_bounces_the_changed_tables_subscriptions_retryably(live):
    client, other = await _two_tables(live)
    await db(migrate)(live, "0002", "ALTER TABLE jt_a ADD COLUMN tag TEXT")
    frames = [await client.recv()]
    while frames[-1]["queryId"] != 1:
        frames.append(await client.recv())
    assert frames[-1]["t"] == "queryError" and frames[-1]["code"] == "schema_changed"
    assert frames[-1]["retryable"] is True
    frames = await subscribe(client, 1, "journalA")
    hello = next(f for f in frames if f["t"] == "nhello" and f["queryId"] == 1)
    assert hello["hello"]["tables"][0]["columns"] == ["id", "tag"]
    await client.close()
    await other.close()


async def test_journal_ddl_leaves_subscriptions_on_other_tables_alone(live):
    client, other = await _two_tables(live)
    await db(migrate)(live, "0002", "ALTER TABLE jt_a ADD COLUMN tag TEXT")
    frame = await client.recv()
    assert frame["t"] == "queryError" and frame["queryId"] == 1
    try:
        assert await client.nothing() and await other.nothing()
        await db(migrate)(live, "0003", "INSERT INTO jt_b (id) VALUES ('b1')")
        batch, _ = await client.recv_until("progress")
        assert batch["queryId"] == 2 and batch["batch"]["ops"][0]["row"] == ["b1"]
    finally:
        await client.close()
        await other.close()


def _alter_tag(add):
    # What Django's schema editor does to a synced model's table, then its post_migrate.
    with connection.cursor() as cursor:
        if add:
            cursor.execute('ALTER TABLE "tag" ADD COLUMN "color" TEXT')
        else:
            if connection.vendor == "sqlite":  # the capture triggers name the column
                capture.remove(cursor, connection.vendor, "tag")
            cursor.execute('ALTER TABLE "tag" DROP COLUMN "color"')
    install_capture_after_migrate(sender=None, using="default")


async def _migrate_tag(live, check):
    client = Client()
    assert await client.connect()
    await subscribe(client, 1, "tagOptions")
    await subscribe(client, 2, "users")
    await db(_alter_tag)(True)
    try:
        assert "color" in live.tables.get("tag").column_names
        await check(client)
    finally:
        await client.close()
        await db(_alter_tag)(False)
    assert "color" not in live.tables.get("tag").column_names


async def test_a_django_migration_of_a_synced_model_bounces_its_subscriptions(live):
    async def check(client):
        frames = [await client.recv()]
        while frames[-1]["queryId"] != 1:
            frames.append(await client.recv())
        assert frames[-1]["t"] == "queryError" and frames[-1]["code"] == "schema_changed"
        assert frames[-1]["retryable"] is True

    await _migrate_tag(live, check)


async def test_a_django_migration_of_a_synced_model_leaves_other_tables_alone(live):
    async def check(client):
        frame = await client.recv()
        assert frame["t"] == "queryError" and frame["queryId"] == 1
        assert await client.nothing()

    await _migrate_tag(live, check)


def _alter_elsewhere(table, column):
    """A schema change as another process commits it: DDL, capture, DDL marker, nothing else."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" ADD COLUMN "{column}" TEXT')
        t = introspect(connection, cursor, table)
        capture.install(cursor, connection.vendor, t)
        schema_changes.mark(cursor, connection.vendor, table)


async def test_a_ddl_marker_committed_elsewhere_bounces_only_the_changed_tables_queries(live):
    """
    The tail meets a DDL marker no listener of this process announced: the table is
    re-read, only its subscription is told schema_changed, and the new hello and the
    rows after it carry the new column.
    """
    client, other = await _two_tables(live)
    try:
        await db(_alter_elsewhere)("jt_a", "tag")
        frame = await client.recv()
        assert frame["t"] == "queryError" and frame["queryId"] == 1
        assert frame["code"] == "schema_changed" and frame["retryable"] is True
        assert await client.nothing() and await other.nothing()
        frames = await subscribe(client, 1, "journalA")
        hello = next(f for f in frames if f["t"] == "nhello" and f["queryId"] == 1)
        assert hello["hello"]["tables"][0]["columns"] == ["id", "tag"]
        await db(migrate)(live, "0003", "INSERT INTO jt_a (id, tag) VALUES ('a1', 'red')")
        batch, _ = await client.recv_until("progress")
        assert batch["queryId"] == 1 and batch["batch"]["ops"][0]["row"] == ["a1", "red"]
    finally:
        await client.close()
        await other.close()


async def test_the_first_subscriber_after_a_ddl_marker_committed_elsewhere_gets_the_new_shape(
    live,
):
    """
    With nothing subscribed (no wake-up armed), a schema change committed elsewhere
    and a row in the new shape: the next subscriber's hello and rows have the column.
    """
    await db(migrate)(live, "0001", ["CREATE TABLE jt_a (id TEXT PRIMARY KEY)"])
    client = Client()
    assert await client.connect()
    try:
        await db(_alter_elsewhere)("jt_a", "tag")
        await db(journal.apply)(
            live, journal.parse("0002", "INSERT INTO jt_a (id, tag) VALUES ('a1', 'red')")
        )
        frames = await subscribe(client, 1, "journalA")
        hello = next(f for f in frames if f["t"] == "nhello")
        assert hello["hello"]["tables"][0]["columns"] == ["id", "tag"]
        batch = next(f for f in frames if f["t"] == "nbatch")
        assert [op["row"] for op in batch["batch"]["ops"]] == [["a1", "red"]]
    finally:
        await client.close()
