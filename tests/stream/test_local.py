"""
Commits of this process's own SQLite connections (``rindle_app.stream.local``): a
transaction that captured changes calls the listeners once, right after it commits;
a rollback, a savepoint rolled back, an uncaptured write and the engine's own
commits call nobody.
"""

import pytest
from django.contrib.auth import get_user_model
from django.db import connection, transaction

from project.demo.models import User
from rindle_app.stream import local
from rindle_app.testing import fresh_runtime, outbox_high_water

pytestmark = pytest.mark.django_db(transaction=True)


class Abandoned(Exception):
    """Raised to roll a block back."""


class Calls:
    """A listener: what the outbox held, and whether a transaction was open, per call."""

    def __init__(self):
        self.seen = []

    def __call__(self):
        self.seen.append((outbox_high_water(), connection.in_atomic_block))


@pytest.fixture
def calls():
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's commit notifications; PostgreSQL notifies through the database")
    listener = Calls()
    local.add_listener("default", listener)
    yield listener
    local.remove_listener("default", listener)


def test_a_committed_transaction_calls_the_listener_once_after_the_commit(calls):
    with transaction.atomic():
        User.objects.create(id="a", name="one")
        User.objects.create(id="b", name="two")
        User.objects.filter(id="a").update(name="uno")
        assert calls.seen == []  # not before the commit
    high = outbox_high_water()
    assert calls.seen == [(high, False)]  # once, with the commit's rows readable


def test_a_statement_in_autocommit_calls_the_listener_as_it_returns(calls):
    User(id="c", name="saved").save()
    assert calls.seen == [(outbox_high_water(), False)]
    User.objects.filter(id="c").delete()
    assert len(calls.seen) == 2


def test_a_rolled_back_transaction_calls_nobody(calls):
    with pytest.raises(Abandoned):
        with transaction.atomic():
            User.objects.create(id="d", name="gone")
            raise Abandoned
    assert calls.seen == []
    assert not User.objects.filter(id="d").exists()


def test_a_savepoint_rolled_back_calls_nobody_and_a_later_capture_does(calls):
    with transaction.atomic():
        with pytest.raises(Abandoned):
            with transaction.atomic():
                User.objects.create(id="e", name="gone")
                raise Abandoned
    assert calls.seen == []  # the only capture was rolled back with its savepoint
    with transaction.atomic():
        with pytest.raises(Abandoned):
            with transaction.atomic():
                User.objects.create(id="f", name="gone")
                raise Abandoned
        User.objects.create(id="g", name="kept")
    assert calls.seen == [(outbox_high_water(), False)]
    assert list(User.objects.filter(id__in=["f", "g"]).values_list("id", flat=True)) == ["g"]


def test_a_write_that_captures_nothing_calls_nobody(calls):
    get_user_model().objects.create(username="uncaptured")  # not a synced table
    with transaction.atomic():
        get_user_model().objects.filter(username="uncaptured").update(first_name="x")
    assert calls.seen == []


def test_a_removed_listener_is_not_called_and_one_of_another_alias_never_is(calls):
    other = Calls()
    local.add_listener("elsewhere", other)
    try:
        User(id="h", name="first").save()
        local.remove_listener("default", calls)
        User(id="i", name="second").save()
    finally:
        local.remove_listener("elsewhere", other)
    assert len(calls.seen) == 1
    assert other.seen == []


def test_a_failing_listener_does_not_fail_the_write_or_the_other_listeners(calls, caplog):
    def broken():
        raise RuntimeError("listener bug")

    local.add_listener("default", broken)
    try:
        with transaction.atomic():
            User.objects.create(id="j", name="kept")
        User(id="k", name="kept too").save()
    finally:
        local.remove_listener("default", broken)
    assert User.objects.filter(id__in=["j", "k"]).count() == 2
    assert len(calls.seen) == 2
    assert "a local commit listener failed" in caplog.text


def test_the_engines_own_commits_call_nobody(calls):
    """They reach readers through the engine's listeners: a second call would read again."""
    with fresh_runtime() as runtime:
        sql = 'INSERT INTO "user" (id, name) VALUES (%s, %s)'
        cv = runtime.engine.write(lambda tx: tx.execute(sql, ["l", "by the engine"])).cv
    assert cv == outbox_high_water()
    assert calls.seen == []
