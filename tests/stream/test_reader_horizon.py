"""
A tail that cannot go on re-hydrates, never skips: below the horizon (retention
pruned changes it had not applied) or in another epoch (a restored database).
"""

import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

from project.demo.models import User
from rindle_app.exceptions import RESNAPSHOT_REQUIRED, ResnapshotRequired
from rindle_app.ivm.live import LiveQueries
from rindle_app.ivm.sql import run_query
from rindle_app.realtime.hub import get_hub
from rindle_app.stream import reader
from rindle_app.stream import state as stream
from rindle_app.testing import fresh_runtime, outbox_high_water, publish_watermark
from tests.conftest import scrape_metrics
from tests.realtime.conftest import Client

from .reader_support import prune, stream_state

pytestmark = pytest.mark.django_db(transaction=True)

USERS = {"table": "user", "orderBy": [["id", "asc"]]}


@pytest.fixture
def serving(transactional_db):
    """The process's engine and hub (as a server runs them), shut down after the test."""
    with fresh_runtime() as runtime:
        yield runtime.engine


def add_users(*ids):
    for pk in ids:
        User.objects.create(id=pk, name=f"user {pk}")


def equal_sql(live, shared):
    return shared.view.result() == run_query(shared.query, connection, live.engine.tables)


def test_a_tail_below_the_horizon_is_told_to_resnapshot_and_never_advanced(engine):
    """
    Retention deletes changes the tail has not applied and raises the horizon past its
    next seq: the poll refuses (below_horizon) and leaves the version where it was;
    after re-hydrating, the view equals SQL.
    """
    add_users("a")
    publish_watermark()
    live = LiveQueries(engine).start()
    at = live.version
    add_users("b", "c")
    publish_watermark()
    prune(outbox_high_water())
    with pytest.raises(ResnapshotRequired) as refused:
        live.poll()
    assert refused.value.reason == ResnapshotRequired.BELOW_HORIZON
    assert live.version == at  # never silently advanced
    with pytest.raises(ResnapshotRequired):
        live.poll()  # and it stays refused: nothing was skipped meanwhile
    live.rehydrate(refused.value.reason)
    users = live.catalog.register(USERS)
    assert [r["id"] for r in users.view.rows()] == ["a", "b", "c"]
    assert equal_sql(live, users)
    assert live.resnapshots[ResnapshotRequired.BELOW_HORIZON] == 1
    add_users("d")
    publish_watermark()
    live.poll()
    assert equal_sql(live, users) and live.version == outbox_high_water()


def test_a_prune_up_to_what_the_tail_applied_costs_no_resnapshot(engine):
    """A horizon at the tail's next seq is no gap: it goes on, nothing re-read."""
    add_users("a", "b")
    publish_watermark()
    live = LiveQueries(engine).start()
    users = live.catalog.register(USERS)
    prune(live.version)  # everything it applied
    add_users("c")
    publish_watermark()
    live.poll()
    assert [r["id"] for r in users.view.rows()] == ["a", "b", "c"]
    assert live.resnapshots == {}


def test_an_epoch_change_is_told_to_resnapshot(engine):
    """A restored database (a new epoch on the state row) makes the tail re-hydrate."""
    add_users("a")
    live = LiveQueries(engine).start()
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {stream.TABLE} SET epoch = %s WHERE name = %s",
            [stream.mint_epoch(), stream.STREAM],
        )
    add_users("b")
    publish_watermark()
    with pytest.raises(ResnapshotRequired) as refused:
        live.poll()
    assert refused.value.reason == ResnapshotRequired.EPOCH_MISMATCH
    live.rehydrate(refused.value.reason)
    users = live.catalog.register(USERS)
    assert equal_sql(live, users) and live.epoch == stream_state().epoch


def test_a_resnapshot_slower_than_a_tight_retention_still_converges(engine, monkeypatch):
    """
    Retention runs while a hydration is reading. Pruned up to the snapshot's own
    watermark, the hydration is still good (its version was read in the same
    snapshot as its rows); pruned past it, the tail re-hydrates once and converges.
    """
    add_users("a")
    publish_watermark()
    real = reader._read_state
    retention = []

    def slow_read_state(cursor):
        current = real(cursor)
        if retention:
            retention.pop(0)(current)
        return current

    monkeypatch.setattr(reader, "_read_state", slow_read_state)

    def up_to_the_snapshot(current):
        add_users("b")  # committed after the snapshot began: not in its rows
        publish_watermark()
        prune(current.safe_seq)  # what the snapshot holds is pruned: no gap for it

    retention.append(up_to_the_snapshot)
    live = LiveQueries(engine).start()
    users = live.catalog.register(USERS)
    assert [r["id"] for r in users.view.rows()] == ["a"]
    live.poll()
    assert equal_sql(live, users) and live.resnapshots == {}

    def past_the_snapshot(current):
        add_users("c")
        publish_watermark()
        prune(outbox_high_water())  # "c" is gone before any tail read it

    retention.append(past_the_snapshot)
    live = LiveQueries(engine).start()
    converged = False
    for _attempt in range(3):
        try:
            live.poll()
            converged = True
            break
        except ResnapshotRequired as exc:
            live.rehydrate(exc.reason)
    assert converged and live.resnapshots[ResnapshotRequired.BELOW_HORIZON] == 1
    users = live.catalog.register(USERS)
    assert [r["id"] for r in users.view.rows()] == ["a", "b", "c"]
    assert equal_sql(live, users)


async def _subscribe(client, qid):
    await client.send({"t": "subscribe", "queryId": qid, "name": "users", "mode": "normalized"})
    frames = await client.recv_until("progress")
    return [f for f in frames if f["t"] == "nbatch"][0]["batch"]


def _ids(batch):
    return sorted(op["row"][0] for op in batch["ops"] if op["op"] == "add")


@pytest.mark.asyncio
@pytest.mark.parametrize("cause", ["below_horizon", "epoch_mismatch"])
async def test_the_hub_resnapshots_and_every_subscriber_gets_fresh_results(serving, cause):
    """
    The hub's tail falls below the horizon (or the epoch changes) while it is behind:
    each subscription is told resnapshot_required (retryable), the re-subscribe gets
    a seq 0 equal to SQL with every committed write, it is logged and metered, and
    later writes flow again.
    """
    await sync_to_async(add_users)("a")
    hub = await sync_to_async(get_hub)(serving)
    client = Client()
    assert await client.connect()
    assert _ids(await _subscribe(client, 1)) == ["a"]

    def behind_then_pruned():
        with hub.lock:  # the hub cannot step: its tail is behind
            add_users("b", "c")
            publish_watermark()
            if cause == "below_horizon":
                prune(outbox_high_water())
            else:
                with connection.cursor() as cursor:
                    cursor.execute(
                        f"UPDATE {stream.TABLE} SET epoch = %s WHERE name = %s",
                        [stream.mint_epoch(), stream.STREAM],
                    )
            hub._wake.set()

    await sync_to_async(behind_then_pruned)()
    frames = await client.recv_until("queryError", timeout=10)
    error = frames[-1]
    assert error["queryId"] == 1 and error["code"] == RESNAPSHOT_REQUIRED
    assert error["retryable"] is True
    assert _ids(await _subscribe(client, 1)) == ["a", "b", "c"]
    assert hub.live.resnapshots[cause] == 1
    metrics = await sync_to_async(scrape_metrics)()
    assert f'rindle_stream_resnapshots_total{{database="default",reason="{cause}"}} 1.0' in (
        metrics
    )
    await sync_to_async(add_users)("d")
    started = time.monotonic()
    frames = await client.recv_until("progress", timeout=10)
    ops = [op for f in frames if f["t"] == "nbatch" for op in f["batch"]["ops"]]
    assert any(op["row"][0] == "d" for op in ops)
    assert time.monotonic() - started < 5
    await client.close()
