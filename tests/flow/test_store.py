"""
The kept half: flush by copy, node-keyed rows, forget tombstones, restart seeding.

These run with committed transactions (other threads use their own connections).
"""

import threading

import pytest
from django.db import connection

from rindle_app.engine import Unavailable
from rindle_app.flow import DAY_MS, Refusal, Row, Transfer
from rindle_app.models import FlowDayRecord, FlowTombstone

from .conftest import DAY, HOUR_MS, MIDNIGHT, NOON, RETENTION, stored

pytestmark = pytest.mark.django_db(transaction=True)


def busy_day(ledger, namespace="acme", at=NOON):
    ledger.record(namespace, at, Transfer(100, 1000, 10, 500, session="s1"))
    ledger.record(namespace, at + 1, Transfer(1, 2, session="s2"))
    ledger.refuse(namespace, at + 2, Refusal.TOO_LARGE)
    ledger.auth_failure(namespace, at + 3)


# --- flush: copies, idempotent ------------------------------------------------------------


def test_flush_copies_so_running_it_twice_writes_the_same_rows(make_ledger):
    ledger = make_ledger()
    busy_day(ledger, "acme")
    busy_day(ledger, "globex")
    assert ledger.flush(NOON + 10) == 2
    first = stored()
    assert [(r["namespace"], r["bytes_in"], r["transfers"]) for r in first] == [
        ("acme", 101, 2),
        ("globex", 101, 2),
    ]
    assert first[0]["refused_too_large"] == 1 and first[0]["auth_failures"] == 1
    assert first[0]["last_seen_ms"] == NOON + 2
    assert ledger.flush(NOON + 10) == 0  # nothing changed: nothing to copy
    for slot in ledger._slots.values():  # force a second copy of the same figures
        slot.dirty = True
    assert ledger.flush(NOON + 10) == 2
    assert stored() == first


def test_a_later_flush_sets_the_row_to_the_figure_it_never_adds(make_ledger):
    ledger = make_ledger()
    ledger.record("acme", NOON, Transfer(100, 0))
    ledger.flush(NOON)
    ledger.record("acme", NOON + 1, Transfer(5, 0))
    ledger.flush(NOON + 1)
    assert [r["bytes_in"] for r in stored()] == [105]


def test_flush_deletes_rows_that_aged_out_of_the_kept_window(make_ledger):
    old_day = NOON - RETENTION * DAY_MS
    early = make_ledger("node-early", now=old_day)
    early.record("acme", old_day, Transfer(1, 1))
    early.record("acme", old_day + DAY_MS, Transfer(2, 2))
    early.flush(old_day + DAY_MS)
    assert [r["day"] for r in stored()] == [DAY - RETENTION, DAY - RETENTION + 1]
    ledger = make_ledger()
    assert ledger.flush(NOON) == 0
    assert [r["day"] for r in stored()] == [DAY - RETENTION + 1]  # the oldest kept day
    assert ledger.moved("acme", NOON, RETENTION) == [(DAY - RETENTION + 1, 4)]


def test_a_failed_flush_loses_nothing(make_ledger, monkeypatch):
    """The figures a failed flush took are flushed by the next one, even across midnight."""
    ledger = make_ledger()
    ledger.record("acme", NOON, Transfer(10, 0))
    ledger.record("globex", NOON - DAY_MS, Transfer(1, 0))
    ledger.record("globex", NOON, Transfer(2, 0))  # parks globex's DAY - 1
    real_write = ledger.store.write

    def failing(*args, **kwargs):
        # acme's DAY rolls while the flush holds its copy: the slot, clean since the
        # copy, parks nothing, so only the failed flush's copy still has that day.
        ledger.record("acme", MIDNIGHT + 1, Transfer(3, 0))
        raise Unavailable("database down", code="flow_store_unavailable")

    monkeypatch.setattr(ledger.store, "write", failing)
    with pytest.raises(Unavailable):
        ledger.flush(NOON)
    assert ("acme", DAY) in ledger._parked
    monkeypatch.setattr(ledger.store, "write", real_write)
    assert ledger.flush(MIDNIGHT + 1) == 4
    assert [(r["namespace"], r["day"], r["bytes_in"]) for r in stored()] == [
        ("acme", DAY, 10),
        ("acme", DAY + 1, 3),
        ("globex", DAY - 1, 1),
        ("globex", DAY, 2),
    ]


def test_an_older_copy_never_lowers_a_row(make_ledger):
    """A late copy of a smaller figure (a racing flush, a rolling deploy) cannot regress."""
    ledger = make_ledger("node-a")
    ledger.record("acme", NOON, Transfer(100, 0, session="s1"))
    ledger.flush(NOON)
    stale = Row("acme", DAY, "node-a", bytes_in=40, transfers=1, last_seen_ms=NOON - 5)
    ledger.store.write([stale], floor_day=DAY - RETENTION + 1)
    [row] = stored()
    assert (row["bytes_in"], row["transfers"], row["last_seen_ms"]) == (100, 1, NOON)


# --- several processes ------------------------------------------------------------------


def test_two_nodes_flushing_concurrently_lose_nothing(make_ledger):
    """Each node writes its own rows, so interleaved flushes sum to the true total."""
    nodes = [make_ledger("node-a"), make_ledger("node-b")]
    per_thread, threads_per_node = 300, 2
    errors = []

    def work(ledger, worker):
        try:
            for i in range(per_thread):
                at = NOON + i
                ledger.record("acme", at, Transfer(1, 2, session=f"{worker}-{i % 7}"))
                if i % 50 == 0:
                    ledger.flush(at)
            ledger.flush(NOON + per_thread)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=work, args=(ledger, f"{ledger.node}-{t}"))
        for ledger in nodes
        for t in range(threads_per_node)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for ledger in nodes:
        ledger.flush(NOON + per_thread)
    total = 2 * threads_per_node * per_thread
    reader = make_ledger("node-reader")
    day = reader.today("acme", NOON + per_thread)
    assert (day.transfers, day.bytes_in, day.bytes_out) == (total, total, 2 * total)
    assert day.sessions == 2 * threads_per_node * 7
    assert sorted(r["node"] for r in stored()) == ["node-a", "node-b"]


# --- forget -------------------------------------------------------------------------------


def test_forget_drops_the_slot_parked_days_and_every_nodes_rows(make_ledger):
    a, b = make_ledger("node-a"), make_ledger("node-b")
    a.record("acme", NOON - DAY_MS, Transfer(1, 1))
    a.record("acme", NOON, Transfer(1, 1))  # parks DAY - 1
    b.record("acme", NOON, Transfer(1, 1))
    b.record("globex", NOON, Transfer(1, 1))
    b.flush(NOON)
    assert a.forget("acme") is True
    assert stored("acme") == []
    assert a.today("acme", NOON) is None and a.moved("acme", NOON, 7) == []
    assert a.flush(NOON) == 0
    assert [r["namespace"] for r in stored()] == ["globex"]
    assert a.forget("never-seen") is False


def test_a_flush_racing_with_forget_does_not_resurrect_the_namespace(make_ledger, monkeypatch):
    """forget() lands between the flush's copy of the slots and its write."""
    ledger = make_ledger()
    ledger.record("acme", NOON, Transfer(100, 0))
    ledger.record("globex", NOON, Transfer(7, 0))
    real_write = ledger.store.write

    def write_after_a_forget(rows, **kwargs):
        assert {r.namespace for r in rows} == {"acme", "globex"}  # already copied
        forgetter = threading.Thread(target=lambda: (ledger.forget("acme"), connection.close()))
        forgetter.start()
        forgetter.join()
        return real_write(rows, **kwargs)

    monkeypatch.setattr(ledger.store, "write", write_after_a_forget)
    assert ledger.flush(NOON) == 1
    monkeypatch.setattr(ledger.store, "write", real_write)
    assert [r["namespace"] for r in stored()] == ["globex"]
    assert ledger.today("acme", NOON) is None
    # The namespace lives on in a new generation: later records count from zero.
    ledger.record("acme", NOON + 1, Transfer(3, 0))
    assert ledger.flush(NOON + 1) == 1
    assert [(r["namespace"], r["bytes_in"]) for r in stored("acme")] == [("acme", 3)]


def test_a_forget_elsewhere_stops_this_nodes_late_flush(make_ledger):
    """Node B still holds the forgotten namespace: its next flush drops it, not writes it."""
    a, b = make_ledger("node-a"), make_ledger("node-b")
    b.record("acme", NOON, Transfer(50, 0))
    b.flush(NOON)
    b.record("acme", NOON + 1, Transfer(25, 0))  # unflushed when the forget happens
    b.record("acme", MIDNIGHT, Transfer(5, 0))  # parks DAY (75) for the flush
    assert a.forget("acme") is True
    assert b.flush(MIDNIGHT + 1) == 0
    assert stored("acme") == []
    assert b.today("acme", MIDNIGHT + 1) is None
    assert FlowTombstone.objects.get(namespace="acme").generation == 1
    b.record("acme", MIDNIGHT + 2, Transfer(9, 0))
    assert b.flush(MIDNIGHT + 2) == 1
    assert a.moved("acme", MIDNIGHT + 2, 2) == [(DAY + 1, 9)]


def test_a_restart_learns_old_forgets_and_keeps_counting(make_ledger):
    first = make_ledger("node-a")
    first.record("acme", NOON, Transfer(1, 0))
    first.forget("acme")
    first.forget("acme")
    restarted = make_ledger("node-b")
    restarted.record("acme", NOON, Transfer(2, 0))
    assert restarted.flush(NOON) == 1
    assert [r["bytes_in"] for r in stored("acme")] == [2]


# --- restart seeding ----------------------------------------------------------------------


def test_restart_with_the_same_node_id_seeds_today_and_never_double_counts(make_ledger):
    before = make_ledger("web-1")
    busy_day(before)
    before.record("acme", NOON + 5, Transfer(0, 0, session="s3"))
    before.flush(NOON + 10)
    figure = before.today("acme", NOON + 10)

    after = make_ledger("web-1", now=NOON + HOUR_MS)  # same node id, new process
    assert after.today("acme", NOON + HOUR_MS) == figure
    assert after.flush(NOON + HOUR_MS) == 0  # seeded = stored: nothing to write
    after.record("acme", NOON + HOUR_MS, Transfer(7, 0, session="s1"))
    after.flush(NOON + HOUR_MS)
    [row] = stored("acme")
    assert row["node"] == "web-1"
    assert row["bytes_in"] == figure.bytes_in + 7
    assert row["transfers"] == figure.transfers + 1
    day = after.today("acme", NOON + HOUR_MS)
    assert (day.bytes_in, day.sessions, day.refused) == (figure.bytes_in + 7, 3, 1)


def test_restart_with_a_fresh_node_id_reads_the_same_figures(make_ledger):
    before = make_ledger("boot-1")
    busy_day(before)
    before.flush(NOON + 10)
    figure = before.today("acme", NOON + 10)
    after = make_ledger("boot-2", now=NOON + HOUR_MS)
    assert after.today("acme", NOON + HOUR_MS) == figure
    after.record("acme", NOON + HOUR_MS, Transfer(7, 0))
    after.flush(NOON + HOUR_MS)
    assert after.today("acme", NOON + HOUR_MS).bytes_in == figure.bytes_in + 7
    assert sum(r["bytes_in"] for r in stored("acme")) == figure.bytes_in + 7


def test_seeding_only_takes_todays_rows_of_its_own_node(make_ledger):
    other = make_ledger("web-2")
    other.record("acme", NOON, Transfer(1000, 0))
    own = make_ledger("web-1", now=NOON - DAY_MS)
    own.record("acme", NOON - DAY_MS, Transfer(1, 0))
    own.record("acme", NOON, Transfer(2, 0))
    own.flush(NOON)
    other.flush(NOON)
    restarted = make_ledger("web-1", now=NOON + 1)
    assert set(restarted._slots) == {"acme"}
    assert restarted._slots["acme"].bytes_in == 2
    assert restarted.moved("acme", NOON + 1, 2) == [(DAY - 1, 1), (DAY, 1002)]


def test_the_store_being_down_is_a_retryable_error(make_ledger, monkeypatch):
    from django.db import OperationalError

    ledger = make_ledger()
    ledger.record("acme", NOON, Transfer(1, 0))

    def down(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(connection, "cursor", down)
    with pytest.raises(Unavailable) as info:
        ledger.flush(NOON)
    assert info.value.code == "flow_store_unavailable" and info.value.retryable
    monkeypatch.undo()
    assert ledger.flush(NOON) == 1
    assert FlowDayRecord.objects.count() == 1


# --- the process-wide ledger ------------------------------------------------------------


def test_get_ledger_is_one_per_process_and_shutdown_flushes_it(settings):
    from rindle_app import flow

    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "FLOW_NODE_ID": "web-7"}
    try:
        ledger = flow.get_ledger()
        assert flow.get_ledger() is ledger and flow.running_ledger() is ledger
        assert ledger.node == "web-7"
        ledger.record("acme", NOON, Transfer(3, 4))
        flow.shutdown(now=NOON)
        assert flow.running_ledger() is None
        assert [(r["node"], r["bytes_in"]) for r in stored()] == [("web-7", 3)]
        restarted = flow.get_ledger()
        assert restarted is not ledger and restarted.node == "web-7"
    finally:
        flow.shutdown(now=NOON)


def test_records_from_many_threads_are_all_counted(make_ledger):
    ledger = make_ledger()
    threads, per_thread = 8, 5_000

    def work(worker):
        for i in range(per_thread):
            ledger.record("acme", NOON + i, Transfer(1, 2, session=f"w{worker}"))
            if i % 1000 == 0:
                ledger.refuse("acme", NOON + i, Refusal.RATE_LIMIT)

    pool = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    day = ledger.today("acme", NOON + per_thread)
    assert (day.transfers, day.bytes_in, day.bytes_out) == (
        threads * per_thread,
        threads * per_thread,
        2 * threads * per_thread,
    )
    assert day.refusals["rate_limit"] == threads * 5
    assert day.sessions == threads
