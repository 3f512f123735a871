"""
The runtime: one per database alias owns the engine, the hub, the ledger and the
quota cache; the old accessors are its delegates; one shutdown stops them all.
"""

import asyncio
import os
import threading

import pytest
from django.core.exceptions import SynchronousOnlyOperation

from rindle_app import flow, runtime
from rindle_app.engine import get_engine
from rindle_app.flow import quota
from rindle_app.realtime.hub import HubLock, get_hub
from rindle_app.runtime import get_runtime
from rindle_app.testing import fresh_runtime, outbox_high_water

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_old_accessors_hand_out_the_parts_of_the_aliases_runtime(rindle_runtime):
    hub = get_hub()
    assert get_runtime() is rindle_runtime
    assert hub is rindle_runtime.hub and hub.engine is get_engine() is rindle_runtime.engine
    meter = quota.meter("acme")
    assert flow.get_ledger() is rindle_runtime.ledger is flow.running_ledger()
    assert quota.get_quotas() is rindle_runtime.quotas and meter is not None


def test_shutdown_stops_every_part_and_the_next_use_starts_a_new_runtime():
    with fresh_runtime() as first:
        hub, engine = first.hub, first.engine
        flow.get_ledger()
        hub_thread = hub._thread
    assert first.closed and engine.closed and not hub_thread.is_alive()
    assert runtime.running() is None and flow.running_ledger() is None
    assert get_runtime() is not first and get_engine() is not engine


def test_an_event_loop_may_not_wait_for_the_writer(rindle_runtime):
    engine = rindle_runtime.engine
    before = outbox_high_water()

    async def on_the_loop():
        engine.write(lambda tx: tx.execute("SELECT 1"))

    with pytest.raises(SynchronousOnlyOperation, match="sync_to_async"):
        asyncio.run(on_the_loop())
    assert outbox_high_water() == before
    assert engine.write(lambda tx: 7).value == 7  # off the loop it writes as before


def test_the_hub_lock_tells_its_holder_from_other_threads():
    lock = HubLock()
    seen = []
    with lock:
        with lock:  # reentrant
            assert lock.held()
        thread = threading.Thread(target=lambda: seen.append(lock.held()))
        thread.start()
        thread.join()
        assert lock.acquire(blocking=False)  # its holder gets it again at once
        lock.release()
    assert seen == [False] and not lock.held()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork() here")
def test_a_forked_child_forgets_its_parents_runtime(rindle_runtime):
    assert rindle_runtime.engine.vendor  # the writer thread runs before the fork
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        os._exit(0 if runtime.running() is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert runtime.running() is rindle_runtime  # the parent's is untouched


def test_hub_ready_starts_the_hub_once_in_its_own_thread(rindle_runtime, monkeypatch):
    from rindle_app.ivm.live import LiveQueries

    starts, release = [], threading.Event()
    real = LiveQueries.start

    def start(self):
        starts.append(threading.current_thread().name)
        assert release.wait(10)
        return real(self)

    monkeypatch.setattr(LiveQueries, "start", start)
    first = rindle_runtime.hub_ready()
    second = rindle_runtime.hub_ready()
    assert second is first and not first.done()  # it never blocks its caller
    assert not first.cancel()  # a waiter going away cannot cancel the shared start
    release.set()
    hub = first.result(10)
    assert hub is rindle_runtime.hub and hub.started
    assert starts == ["rindle-start-default"]
    assert rindle_runtime.hub_ready().result(0) is hub  # running: done at once


def test_a_failed_hub_start_is_in_the_future_and_the_next_call_starts_again(
    rindle_runtime, monkeypatch
):
    from rindle_app.ivm.live import LiveQueries

    real = LiveQueries.start
    monkeypatch.setattr(LiveQueries, "start", lambda self: 1 / 0)
    failed = rindle_runtime.hub_ready()
    with pytest.raises(ZeroDivisionError):
        failed.result(10)
    monkeypatch.setattr(LiveQueries, "start", real)
    again = rindle_runtime.hub_ready()
    assert again is not failed and again.result(10).started


def test_a_stopped_hub_is_started_anew_by_hub_ready(rindle_runtime):
    hub = rindle_runtime.hub_ready().result(10)
    rindle_runtime.stop_hub()
    fresh = rindle_runtime.hub_ready().result(10)
    assert fresh is not hub and fresh.started and fresh is rindle_runtime.hub


def test_a_misspelt_watermarker_placement_refuses_to_start_the_hub_and_the_retention_timer(
    settings,
):
    """
    STREAM_WATERMARKER "externel" is refused with a clear error at start (naming the
    setting, the value and check E033), instead of running no watermarker.
    """
    from django.core.exceptions import ImproperlyConfigured

    settings.RINDLE = {**settings.RINDLE, "STREAM_WATERMARKER": "externel"}
    with fresh_runtime() as rt:
        with pytest.raises(ImproperlyConfigured, match=r"STREAM_WATERMARKER.*'externel'.*E033"):
            rt.hub_for(rt.engine)
        with pytest.raises(ImproperlyConfigured, match="E033"):
            rt.hub_for(rt.engine)  # and again: a refused start leaves no half-started hub behind
        with pytest.raises(ImproperlyConfigured, match="E033"):
            rt.start_retention()
        settings.RINDLE = {**settings.RINDLE, "STREAM_WATERMARKER": "external"}
        assert rt.hub.started and rt.watermarker is None
