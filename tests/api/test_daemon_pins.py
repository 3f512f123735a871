"""
Pinned materializations of the daemon plane (``rindle_app.daemon``, "Policies"):
``POST /materialize`` with ``policy: {kind: "pinned"}`` keeps its query warm in the
hub with no subscriber, maintained after every write (it equals SQL), until
``/dematerialize`` lets it go; re-asserting a pin is idempotent; the pins of a
process are bounded by DAEMON_MAX_PINS, and a refused pin changes nothing.
"""

import pytest

from project.demo import models as demo
from rindle_app.realtime.hub import get_hub
from rindle_app.testing import fresh_result, publish_watermark
from tests.support.demo import issue
from tests.support.waiting import wait_for

from .conftest import error, post, token_client

pytestmark = pytest.mark.django_db(transaction=True)

NEWEST = {"table": "issue", "orderBy": [["createdAt", "desc"], ["id", "asc"]], "limit": 3}
OLDEST = {"table": "issue", "orderBy": [["createdAt", "asc"], ["id", "asc"]], "limit": 2}


@pytest.fixture
def daemon(alice):
    return token_client(alice, "daemon")


@pytest.fixture
def issues(engine):
    demo.User.objects.create(id="u1", name="User 1")
    demo.Issue.objects.bulk_create([issue(f"i{n}", owner="u1", created=float(n)) for n in range(6)])


def pin(daemon, ast, name=None):
    policy = {"kind": "pinned", **({"name": name} if name else {})}
    return post(daemon, "/materialize", {"ast": ast, "policy": policy})


def stats(daemon):
    return post(daemon, "/stats", {}).json()


def assert_warm(engine, key):
    """The hub keeps ``key`` with no subscriber, and its view equals SQL now."""
    hub = get_hub(engine)
    target = publish_watermark(engine.using)  # on Postgres the hub reads up to it
    wait_for(lambda: hub.step() >= target, 5, "the hub to apply every commit")
    with hub.lock:
        shared = hub.catalog.queries[key]
        assert not shared.subscribers
        assert shared.view.result() == fresh_result(engine, shared.query)


def test_a_pin_stays_warm_without_subscribers_and_follows_every_write(daemon, engine, issues):
    answer = pin(daemon, NEWEST, "front-page")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["materializationId"] == "pin:front-page" and body["reused"] is False
    key = body["queryKey"]
    assert_warm(engine, key)
    demo.Issue.objects.bulk_create([issue("i9", owner="u1", created=99.0)])
    assert_warm(engine, key)
    demo.Issue.objects.filter(id="i9").update(title="renamed")
    assert_warm(engine, key)
    demo.Issue.objects.filter(id="i9").delete()
    assert_warm(engine, key)
    assert stats(daemon)["materializations"] == 1


def test_a_reasserted_pin_keeps_its_id_and_a_renamed_ast_lets_the_old_query_go(
    daemon, engine, issues
):
    first = pin(daemon, NEWEST, "board").json()
    again = pin(daemon, NEWEST, "board").json()
    assert again["materializationId"] == first["materializationId"] and again["reused"] is True
    hub = get_hub(engine)
    assert hub.pinned == {first["queryKey"]}
    moved = pin(daemon, OLDEST, "board").json()
    assert moved["materializationId"] == "pin:board"
    assert hub.pinned == {moved["queryKey"]}
    assert first["queryKey"] not in hub.catalog.queries
    assert_warm(engine, moved["queryKey"])


def test_dematerialize_lets_a_pin_go_and_its_query_with_it(daemon, engine, issues):
    key = pin(daemon, NEWEST, "board").json()["queryKey"]
    hub = get_hub(engine)
    assert key in hub.catalog.queries
    assert post(daemon, "/dematerialize", {"name": "board"}).json() == {"removed": True}
    assert hub.pinned == set() and key not in hub.catalog.queries
    assert post(daemon, "/dematerialize", {"name": "board"}).json() == {"removed": False}
    assert stats(daemon)["materializations"] == 0


def test_an_unpinned_materialization_keeps_nothing_warm(daemon, engine, issues):
    body = post(daemon, "/materialize", {"ast": NEWEST}).json()
    assert body["materializationId"].startswith("mat:")
    hub = get_hub(engine)
    assert hub.pinned == set() and body["queryKey"] not in hub.catalog.queries


def test_a_pinned_query_outlives_its_last_subscriber(daemon, engine, issues):
    key = pin(daemon, NEWEST).json()["queryKey"]
    hub = get_hub(engine)

    class Loop:  # the hub hands frames over through the socket's loop; none here
        def call_soon_threadsafe(self, callback, *args):
            pass

    conn = hub.connect("c", Loop(), lambda frames: None)
    sub = hub.subscribe(conn, 1, NEWEST, "normalized")
    assert sub.key == key
    hub.unsubscribe(conn, 1)
    hub.disconnect("c")
    assert_warm(engine, key)
    post(daemon, "/dematerialize", {"queryKey": key})
    assert key not in hub.catalog.queries


def test_pins_past_the_cap_are_refused_and_change_nothing(daemon, engine, issues, settings):
    settings.RINDLE = {**settings.RINDLE, "DAEMON_MAX_PINS": 1}
    first = pin(daemon, NEWEST, "one").json()
    error(pin(daemon, OLDEST, "two"), 409, "too_many_pins")
    hub = get_hub(engine)
    assert hub.pinned == {first["queryKey"]}
    assert len(hub.catalog.queries) == 1
    assert post(daemon, "/dematerialize", {"name": "two"}).json() == {"removed": False}
    assert pin(daemon, NEWEST, "one").json()["reused"] is True  # a re-assert is always taken


def test_a_pin_is_rebuilt_after_a_resnapshot_and_a_schema_change(daemon, engine, issues):
    """A restored database (a new epoch) and a migration rebuild the pinned view."""
    from django.db import connection

    from rindle_app.stream import state as stream

    key = pin(daemon, NEWEST, "board").json()["queryKey"]
    hub = get_hub(engine)
    resnapshots = sum(hub.live.resnapshots.values())
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {stream.TABLE} SET epoch = %s WHERE name = %s",
            [stream.mint_epoch(), stream.STREAM],
        )
    demo.Issue.objects.bulk_create([issue("i8", owner="u1", created=88.0)])
    publish_watermark(engine.using)
    wait_for(lambda: sum(hub.live.resnapshots.values()) > resnapshots, 5, "a resnapshot")
    assert hub.pinned == {key}
    assert_warm(engine, key)
    hub._on_schema_change("issue")  # what a migration of the table calls
    assert hub.pinned == {key}
    assert_warm(engine, key)


def test_a_pinned_query_that_faults_is_unpinned(daemon, engine, issues, monkeypatch):
    from rindle_app.ivm.view import View

    key = pin(daemon, NEWEST, "board").json()["queryKey"]
    hub = get_hub(engine)

    def apply(self, changes, affected=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(View, "apply", apply)
    demo.Issue.objects.bulk_create([issue("i8", owner="u1", created=88.0)])
    target = publish_watermark(engine.using)
    wait_for(lambda: hub.step() >= target, 5, "the hub to apply the write")
    assert hub.pinned == set() and key not in hub.catalog.queries
    assert stats(daemon)["materializations"] == 0


# --- whileSubscribed with idleTtlMs: the query lingers after its last subscriber ------------


class _Loop:  # the hub hands frames over through the socket's loop; none here
    def call_soon_threadsafe(self, callback, *args):
        pass


def subscribe_and_leave(hub, ast):
    """One socket subscribes ``ast`` and leaves; the shared query it used."""
    conn = hub.connect("c", _Loop(), lambda frames: None)
    sub = hub.subscribe(conn, 1, ast, "normalized")
    shared = hub.catalog.queries[sub.key]
    hub.disconnect("c")
    return shared


def linger(daemon, ast, idle_ms):
    return post(
        daemon,
        "/materialize",
        {"ast": ast, "policy": {"kind": "whileSubscribed", "idleTtlMs": idle_ms}},
    )


def test_an_idle_ttl_keeps_the_query_after_its_last_subscriber_then_lets_it_go(
    daemon, engine, issues
):
    key = linger(daemon, NEWEST, 4000).json()["queryKey"]
    hub = get_hub(engine)
    first = subscribe_and_leave(hub, NEWEST)
    assert_warm(engine, key)  # kept, and maintained meanwhile
    assert stats(daemon)["materializations"] == 1
    again = subscribe_and_leave(hub, NEWEST)
    assert again is first  # the same view: no rebuild
    wait_for(lambda: key not in hub.catalog.queries, 10, "the lingering query to go")
    assert stats(daemon)["materializations"] == 0


def test_without_an_idle_ttl_the_last_subscriber_takes_the_query_with_it(daemon, engine, issues):
    key = post(daemon, "/materialize", {"ast": NEWEST}).json()["queryKey"]
    hub = get_hub(engine)
    subscribe_and_leave(hub, NEWEST)
    assert key not in hub.catalog.queries


def test_lingering_queries_are_bounded(daemon, engine, issues, settings):
    settings.RINDLE = {**settings.RINDLE, "DAEMON_MAX_PINS": 1}
    kept = linger(daemon, NEWEST, 60_000).json()["queryKey"]
    other = linger(daemon, OLDEST, 60_000).json()["queryKey"]
    hub = get_hub(engine)
    subscribe_and_leave(hub, NEWEST)
    subscribe_and_leave(hub, OLDEST)
    assert kept in hub.catalog.queries and other not in hub.catalog.queries


@pytest.mark.parametrize("idle", [-1, "5", True, 1.5, 10**9])
def test_a_bad_idle_ttl_is_refused_and_records_nothing(daemon, engine, idle):
    error(linger(daemon, NEWEST, idle), 400, "invalid_request")
    assert stats(daemon)["leases"] == 0
