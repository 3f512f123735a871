"""Tx: one ``%s`` parameter style, its public cursor methods, the model helpers, the ORM."""

import pytest
from django.contrib.auth.models import Group
from django.contrib.auth.models import User as Account
from django.db import connection

from project.demo.models import Issue, User
from rindle_app.engine import InvalidInput
from rindle_app.mutators import MutationRejected, mutator
from rindle_app.testing import outbox_high_water, outbox_since


def write(engine, fn):
    return engine.write(fn).value


def issue_fields(id, owner="u1", **extra):
    return {
        "id": id,
        "title": f"title {id}",
        "status": "todo",
        "priority": "low",
        "owner_id": owner,
        "created_at": 1.5,
        "updated_at": 2.5,
        **extra,
    }


def stored_issue(id):
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT "title", "ownerId", "createdAt", "updatedAt" FROM "issue" WHERE "id" = %s',
            [id],
        )
        return cursor.fetchone()


@pytest.fixture
def owners(engine):
    write(engine, lambda tx: [tx.insert(User, id=u, name=u.upper()) for u in ("u1", "u2")])
    return User.objects.in_bulk()


def test_every_sql_method_takes_percent_s_placeholders(engine):
    """scalar, fetchone, fetchall, run, run_many, execute and query all bind ``%s``."""

    def work(tx):
        tx.run_many('INSERT INTO "user" ("id", "name") VALUES (%s, %s)', [("a", "A"), ("b", "B")])
        changed = tx.run('UPDATE "user" SET "name" = %s WHERE "id" = %s', ["AA", "a"])
        return (
            changed,
            tx.scalar('SELECT "name" FROM "user" WHERE "id" = %s', ["a"]),
            tx.fetchone('SELECT "id", "name" FROM "user" WHERE "id" = %s', ["b"]),
            tx.fetchall('SELECT "id" FROM "user" WHERE "id" IN (%s, %s) ORDER BY "id"', ["a", "b"]),
            tx.execute('UPDATE "user" SET "name" = %s WHERE "id" = %s', ["BB", "b"]),
            tx.query('SELECT "name" FROM "user" WHERE "id" = %s', ["b"]),
            tx.scalar('SELECT "name" FROM "user" WHERE "id" = %s', ["missing"]),
        )

    assert write(engine, work) == (
        1,
        "AA",
        ("b", "B"),
        [("a",), ("b",)],
        1,
        [{"name": "BB"}],
        None,
    )


def test_a_doubled_percent_is_one_literal_percent_on_every_path(engine):
    """``%%`` reads as ``%`` through the driver path and Django's cursor alike."""
    got = write(
        engine,
        lambda tx: (tx.scalar("SELECT 'a%%b'"), tx.query("SELECT 'a%%b' AS v")[0]["v"]),
    )
    assert got == ("a%b", "a%b")


def test_insert_maps_fields_to_columns_and_returns_the_pk(engine, owners):
    """Field names and attnames land in their columns (db_column, a ForeignKey's _id)."""
    assert write(engine, lambda tx: tx.insert(Issue, **issue_fields("i1"))) == "i1"
    by_instance = {**issue_fields("i2"), "owner": owners["u2"]}
    del by_instance["owner_id"]
    assert write(engine, lambda tx: tx.insert(Issue, **by_instance)) == "i2"
    assert stored_issue("i1") == ("title i1", "u1", 1.5, 2.5)
    assert stored_issue("i2") == ("title i2", "u2", 1.5, 2.5)


def test_a_model_insert_is_captured_like_any_write(engine, owners):
    """A row written by tx.insert(Model, ...) reaches the outbox with its column names."""
    before = outbox_high_water()
    write(engine, lambda tx: tx.insert(Issue, **issue_fields("i1")))
    (event,) = [e for e in outbox_since(before) if e["table"] == "issue"]
    assert (event["op"], event["new"]["ownerId"], event["new"]["createdAt"]) == ("add", "u1", 1.5)


def test_insert_returns_a_generated_pk_and_applies_model_defaults(engine):
    """An auto pk comes back from the database; omitted fields get the model's defaults."""
    gid = write(engine, lambda tx: tx.insert(Group, name="editors"))
    assert Group.objects.get(pk=gid).name == "editors"
    aid = write(engine, lambda tx: tx.insert(Account, username="ann", password="!"))
    account = Account.objects.get(pk=aid)
    assert (account.is_active, account.is_staff, account.date_joined is not None) == (
        True,
        False,
        True,
    )


def test_update_and_delete_find_the_row_by_pk(engine, owners):
    """update/delete take the pk value (or an instance) and report the rows they touched."""
    write(engine, lambda tx: tx.insert(Issue, **issue_fields("i1")))

    def change(tx):
        return (
            tx.update(Issue, "i1", title="renamed", owner=owners["u2"], created_at=9.0),
            tx.update(Issue, "missing", title="x"),
            tx.update(Issue, "i1"),
        )

    assert write(engine, change) == (1, 0, 0)
    assert stored_issue("i1") == ("renamed", "u2", 9.0, 2.5)
    issue = Issue.objects.get(pk="i1")
    assert write(engine, lambda tx: (tx.delete(Issue, issue), tx.delete(Issue, "i1"))) == (1, 0)
    assert not Issue.objects.filter(pk="i1").exists()


def test_an_unknown_field_is_refused_and_writes_nothing(engine, owners):
    """A field the model does not have is a clear InvalidInput; the transaction rolls back."""

    def bad(tx):
        tx.insert(Issue, **issue_fields("i1"))
        tx.update(Issue, "i1", colour="red")

    with pytest.raises(InvalidInput) as info:
        write(engine, bad)
    assert info.value.code == "unknown_column"
    assert stored_issue("i1") is None


def test_model_and_table_forms_do_not_mix(engine):
    """A dict after a model, or keywords after a table name, is a TypeError, not a guess."""
    with pytest.raises(TypeError):
        write(engine, lambda tx: tx.insert(User, {"id": "x", "name": "X"}))
    with pytest.raises(TypeError):
        write(engine, lambda tx: tx.insert("user", id="x", name="X"))
    assert not User.objects.filter(pk="x").exists()


def test_the_table_name_forms_still_work(engine):
    """tx.insert/update/delete with a table name and dicts keep their meaning."""

    def work(tx):
        return (
            tx.insert("user", {"id": "t1", "name": "T"}),
            tx.update("user", {"id": "t1"}, {"name": "U"}),
            tx.row("user", {"id": "t1"}),
            tx.delete("user", {"id": "t1"}),
        )

    assert write(engine, work) == (1, 1, {"id": "t1", "name": "U"}, 1)


@mutator("t_ormThreeWaysThenReject")
def orm_three_ways_then_reject(tx, args, user):
    User(id="saved", name="S").save()
    User.objects.bulk_create([User(id="bulk1", name="B"), User(id="bulk2", name="B")])
    User.objects.filter(id="u1").update(name="changed")
    if args.get("reject"):
        raise MutationRejected("no", code="nope")


def test_orm_writes_in_a_mutator_roll_back_on_rejection(engine, owners):
    """save(), bulk_create and QuerySet.update run in the mutator's transaction."""
    before = outbox_high_water()
    result = engine.mutate("c1", 1, "t_ormThreeWaysThenReject", {"reject": True})
    assert (result.status, result.code) == ("rejected", "nope")
    assert sorted(User.objects.values_list("id", "name")) == [("u1", "U1"), ("u2", "U2")]
    assert [e["table"] for e in outbox_since(before)] == ["_rindle_client_mutations"]
    applied = engine.mutate("c1", 2, "t_ormThreeWaysThenReject", {})
    assert applied.status == "applied"
    assert User.objects.get(pk="u1").name == "changed"
    assert {"saved", "bulk1", "bulk2"} <= set(User.objects.values_list("id", flat=True))
