"""The FlowLedger contract, method by method, on a fake clock (explicit ms)."""

import pytest

from rindle_app.engine import InvalidInput
from rindle_app.flow import DAY_MS, REASONS, FlowDay, Refusal, Transfer
from rindle_app.flow.sessions import K
from rindle_app.models import FlowDayRecord

from .conftest import DAY, HOUR_MS, MIDNIGHT, NOON, RETENTION, stored

# --- record / today -------------------------------------------------------------------


def test_record_counts_wire_bytes_bulk_inside_transfers_and_sessions(ledger):
    """A recorded transfer shows in today's figure at once, before any flush."""
    ledger.record("acme", NOON, Transfer(100, 2000, 40, 1500, session="s1"))
    ledger.record("acme", NOON + 1, Transfer(10, 20, session="s2"))
    ledger.record("acme", NOON + 2, Transfer(1, 2, session="s1"))
    day = ledger.today("acme", NOON + 3)
    assert (day.bytes_in, day.bytes_out) == (111, 2022)
    assert (day.bulk_bytes_in, day.bulk_bytes_out) == (40, 1500)
    assert day.moved == 2133  # wire bytes only: the bulk bytes are inside them
    assert day.transfers == 3
    assert day.sessions == 2
    assert day.last_seen_ms == NOON + 2
    assert day.day == DAY and str(day.date) == "2024-10-04"
    assert stored() == []  # the record path never touches the store


def test_today_is_none_when_nothing_happened(ledger):
    """A namespace nobody saw today has no figure: a fact, not a gap."""
    assert ledger.today("quiet", NOON) is None


def test_today_sums_this_process_live_and_other_processes_flushed(db, make_ledger):
    """today() is the tenant's whole day: other nodes' copies plus the live slot."""
    a, b = make_ledger("node-a"), make_ledger("node-b")
    a.record("acme", NOON, Transfer(100, 100, session="s1"))
    b.record("acme", NOON, Transfer(5, 5, session="s1"))
    b.flush(NOON)
    day = a.today("acme", NOON)
    assert day.moved == 210 and day.transfers == 2
    assert day.sessions == 1  # the same session seen by two nodes counts once


# --- refuse / auth_failure / observe --------------------------------------------------


def test_refuse_counts_by_reason_and_moves_no_bytes(ledger):
    """A refusal is counted under its reason, by enum member or by its string."""
    ledger.refuse("acme", NOON, Refusal.QUOTA)
    ledger.refuse("acme", NOON, "quota")
    ledger.refuse("acme", NOON + 5, Refusal.RATE_LIMIT)
    day = ledger.today("acme", NOON + 6)
    assert day.refusals == {**dict.fromkeys(REASONS, 0), "quota": 2, "rate_limit": 1}
    assert day.refused == 3
    assert (day.moved, day.transfers) == (0, 0)
    assert day.last_seen_ms == NOON + 5  # the tenant met a door: it was there


def test_auth_failure_is_counted_but_does_not_make_the_namespace_seen(ledger):
    """A principal with no grant is not the tenant: counted, never "last seen"."""
    ledger.auth_failure("acme", NOON)
    ledger.auth_failure("acme", NOON + 1)
    day = ledger.today("acme", NOON + 2)
    assert day.auth_failures == 2
    assert day.last_seen_ms is None
    assert ledger.glance("acme", NOON + 2).last_seen_ms is None


def test_observer_hears_every_kind_of_flow_and_is_replaceable(ledger):
    """observe() names the namespace of each record, refusal and auth failure."""
    heard, later = [], []
    ledger.observe(heard.append)
    ledger.record("a", NOON, Transfer(1, 1))
    ledger.refuse("b", NOON, Refusal.FENCED)
    ledger.auth_failure("c", NOON)
    ledger.observe(later.append)
    ledger.record("d", NOON, Transfer(1, 1))
    ledger.observe(None)
    ledger.record("e", NOON, Transfer(1, 1))
    assert heard == ["a", "b", "c"]
    assert later == ["d"]


def test_a_failing_observer_does_not_lose_the_count(ledger):
    """The count stands even when the observer raises."""

    def broken(namespace):
        raise RuntimeError("observer bug")

    ledger.observe(broken)
    ledger.record("acme", NOON, Transfer(7, 0))
    assert ledger.today("acme", NOON).bytes_in == 7


# --- bad input: a clear error with a code, and nothing counted -------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bytes_in": -1},
        {"bytes_out": 1.5},
        {"bytes_in": True},
        {"bytes_out": float("nan")},
        {"bytes_in": 2**63},
        {"bytes_in": 10, "bulk_bytes_in": 11},
        {"bytes_out": 0, "bulk_bytes_out": 1},
        {"session": ""},
        {"session": 42},
        {"session": "x" * 257},
    ],
)
def test_a_bad_transfer_is_refused(kwargs):
    """Transfer validates at construction, so the record path need not."""
    with pytest.raises(InvalidInput) as info:
        Transfer(**kwargs)
    assert info.value.code == "flow_invalid_transfer"


@pytest.mark.parametrize(
    "namespace",
    ["", "a\x00b", "tab\there", "x" * 201, 42, None, b"acme", "lone\ud800surrogate"],
)
def test_a_bad_namespace_is_refused_and_nothing_is_counted(ledger, namespace):
    """Empty, non-text, control characters, too long, lone surrogates: refused."""
    for call in (
        lambda: ledger.record(namespace, NOON, Transfer(1, 1)),
        lambda: ledger.refuse(namespace, NOON, Refusal.QUOTA),
        lambda: ledger.auth_failure(namespace, NOON),
    ):
        with pytest.raises(InvalidInput) as info:
            call()
        assert info.value.code == "flow_invalid_namespace"
    with pytest.raises(InvalidInput):
        ledger.today(namespace, NOON)
    assert ledger.flush(NOON) == 0 and stored() == []


@pytest.mark.parametrize("at", [NOON + 0.5, -1, True, "1728043200000", None, 2**60])
def test_a_bad_time_is_refused_for_new_and_known_namespaces(ledger, at):
    """Time is integer Unix milliseconds, on first sight and later alike."""
    ledger.record("known", NOON, Transfer(1, 1))
    for namespace in ("known", "new"):
        for call in (
            lambda ns: ledger.record(ns, at, Transfer(1, 1)),
            lambda ns: ledger.refuse(ns, at, Refusal.QUOTA),
            lambda ns: ledger.auth_failure(ns, at),
        ):
            with pytest.raises(InvalidInput) as info:
                call(namespace)
            assert info.value.code == "flow_invalid_time"
    day = ledger.today("known", NOON)
    assert (day.transfers, day.refused, day.auth_failures) == (1, 0, 0)
    assert ledger.today("new", NOON) is None


@pytest.mark.parametrize("reason", ["nope", "", None, 3, ["quota"]])
def test_an_unknown_refusal_reason_is_refused(ledger, reason):
    """The reasons are a closed set; anything else is a caller bug, reported."""
    ledger.refuse("acme", NOON, Refusal.OTHER)
    with pytest.raises(InvalidInput) as info:
        ledger.refuse("acme", NOON, reason)
    assert info.value.code == "flow_unknown_reason"
    assert ledger.today("acme", NOON).refused == 1


def test_record_refuses_anything_but_a_transfer(ledger):
    with pytest.raises(InvalidInput) as info:
        ledger.record("acme", NOON, {"bytes_in": 5})
    assert info.value.code == "flow_invalid_transfer"
    assert ledger.today("acme", NOON) is None


def test_bad_windows_and_policies_are_refused(ledger):
    for call in (
        lambda: ledger.moved("acme", NOON, -1),
        lambda: ledger.moved("acme", NOON, 1.0),
        lambda: ledger.window_bytes("acme", NOON, "7"),
        lambda: ledger.fleet(NOON, 0),
        lambda: ledger.fleet(NOON, "14"),
    ):
        with pytest.raises(InvalidInput) as info:
            call()
        assert info.value.code == "flow_invalid_window"
    for call in (
        lambda: ledger.flush(-5),
        lambda: ledger.today("acme", 1.5),
        lambda: ledger.glance("acme", None),
    ):
        with pytest.raises(InvalidInput) as info:
            call()
        assert info.value.code == "flow_invalid_time"


# --- midnight: rolling, parking, the read just after ---------------------------------


def test_each_side_of_midnight_lands_in_its_own_day(ledger):
    """23:59:59.999 and 00:00:00.001 are two days; yesterday's figure is final."""
    ledger.record("acme", MIDNIGHT - 1, Transfer(100, 0))
    ledger.record("acme", MIDNIGHT + 1, Transfer(0, 7))
    assert ledger.today("acme", MIDNIGHT + 2).moved == 7
    assert ledger.moved("acme", MIDNIGHT + 2, 2) == [(DAY, 100), (DAY + 1, 7)]
    assert ledger.flush(MIDNIGHT + 2) == 2  # the parked day and today
    rows = {r["day"]: (r["bytes_in"], r["bytes_out"]) for r in stored("acme")}
    assert rows == {DAY: (100, 0), DAY + 1: (0, 7)}


def test_the_read_just_after_midnight_does_not_take_yesterday_for_today(ledger):
    """A slot still holding yesterday is rolled (and parked) before it is read."""
    ledger.record("acme", MIDNIGHT - 1, Transfer(100, 0))
    assert ledger.today("acme", MIDNIGHT + 1) is None
    assert ledger.moved("acme", MIDNIGHT + 1, 2) == [(DAY, 100)]
    assert ledger.glance("acme", MIDNIGHT + 1).today.moved == 0
    assert ledger.glance("acme", MIDNIGHT + 1).last_seen_ms == MIDNIGHT - 1
    # The rolled day was parked: the next flush keeps it.
    assert ledger.flush(MIDNIGHT + 1) == 1
    assert [(r["day"], r["bytes_in"]) for r in stored("acme")] == [(DAY, 100)]


def test_a_rolled_day_is_parked_before_todays_first_increment(ledger):
    """The parked figure is yesterday's whole day, today's first transfer not in it."""
    ledger.record("acme", NOON, Transfer(10, 0))
    ledger.record("acme", MIDNIGHT, Transfer(1, 0))
    parked = ledger._parked[("acme", DAY)]
    assert (parked.bytes_in, parked.transfers) == (10, 1)
    assert ledger.today("acme", MIDNIGHT).bytes_in == 1


def test_a_parked_final_figure_replaces_the_stored_copy_never_adds(ledger):
    """moved() takes the parked figure over the last tick's copy of the same day."""
    ledger.record("acme", NOON, Transfer(100, 0))
    ledger.flush(NOON)  # the store holds 100 for DAY
    ledger.record("acme", NOON + HOUR_MS, Transfer(50, 0))
    ledger.record("acme", MIDNIGHT + 1, Transfer(1, 0))  # parks DAY at 150
    assert ledger.moved("acme", MIDNIGHT + 2, 2) == [(DAY, 150), (DAY + 1, 1)]
    assert ledger.window_bytes("acme", MIDNIGHT + 2, 2) == 151
    ledger.flush(MIDNIGHT + 2)
    assert ledger.moved("acme", MIDNIGHT + 2, 2) == [(DAY, 150), (DAY + 1, 1)]
    assert [(r["day"], r["bytes_in"]) for r in stored("acme")] == [(DAY, 150), (DAY + 1, 1)]


def test_a_late_record_counts_into_the_open_day_never_a_closed_one(ledger):
    """A record dated before its slot's day (a clock stepped back) counts today."""
    ledger.record("acme", MIDNIGHT + HOUR_MS, Transfer(1, 0))
    ledger.record("acme", MIDNIGHT - 2 * HOUR_MS, Transfer(5, 0))  # clock went back 3 h
    assert ledger.late_records == 1
    assert ledger.moved("acme", MIDNIGHT + HOUR_MS, 2) == [(DAY + 1, 6)]


# --- moved / window_bytes ---------------------------------------------------------------


def test_moved_is_oldest_first_skips_idle_days_and_stays_in_the_kept_window(ledger):
    for offset, n in [(-3, 30), (-1, 10), (0, 1)]:
        ledger.record("acme", NOON + offset * DAY_MS, Transfer(n, 0))
    ledger.record("acme", NOON - (RETENTION + 5) * DAY_MS, Transfer(999, 0))  # late: today
    assert ledger.late_records == 1
    ledger.flush(NOON)
    assert ledger.moved("acme", NOON, 5) == [(DAY - 3, 30), (DAY - 1, 10), (DAY, 1000)]
    assert ledger.moved("acme", NOON, 2) == [(DAY - 1, 10), (DAY, 1000)]
    assert ledger.moved("acme", NOON, 1) == [(DAY, 1000)]
    assert ledger.moved("acme", NOON, 0) == []
    assert ledger.window_bytes("acme", NOON, 3) == 1010
    assert ledger.moved("nobody", NOON, 7) == []
    # Beyond the kept window: clamped to it.
    assert ledger.moved("acme", NOON, 10_000) == ledger.moved("acme", NOON, RETENTION)


def test_moved_sums_every_node(db, make_ledger):
    a, b = make_ledger("node-a"), make_ledger("node-b")
    a.record("acme", NOON - DAY_MS, Transfer(1, 1))
    b.record("acme", NOON - DAY_MS, Transfer(10, 10))
    b.record("acme", NOON, Transfer(100, 100))
    a.flush(NOON)
    b.flush(NOON)
    a.record("acme", NOON, Transfer(1000, 0))
    assert a.moved("acme", NOON, 2) == [(DAY - 1, 22), (DAY, 1200)]


# --- glance -----------------------------------------------------------------------------


def test_glance_keeps_today_and_last_seen_apart(db, make_ledger):
    """Six weeks idle: today is zeroes, last seen is six weeks ago."""
    six_weeks_ago = NOON - 42 * DAY_MS
    old = make_ledger("node-old", now=six_weeks_ago, retention_days=90)
    old.record("acme", six_weeks_ago, Transfer(5, 5))
    old.flush(six_weeks_ago)
    fresh = make_ledger("node-new", retention_days=90)
    glance = fresh.glance("acme", NOON)
    assert glance.today == FlowDay("acme", DAY)
    assert glance.today.moved == 0
    assert glance.last_seen_ms == six_weeks_ago
    assert fresh.glance("never", NOON).last_seen_ms is None


def test_glance_last_seen_includes_live_and_parked_figures(ledger):
    ledger.record("acme", NOON, Transfer(1, 1))
    assert ledger.glance("acme", NOON + 1).last_seen_ms == NOON
    ledger.record("acme", MIDNIGHT + 5, Transfer(1, 1))
    glance = ledger.glance("acme", MIDNIGHT + 10)
    assert glance.last_seen_ms == MIDNIGHT + 5 and glance.today.transfers == 1


# --- fleet ------------------------------------------------------------------------------


def test_fleet_folds_today_and_counts_quiet_tenants_by_the_callers_policy(db, make_ledger):
    a, b = make_ledger("node-a"), make_ledger("node-b")
    a.record("busy", NOON, Transfer(100, 200, 10, 20, session="s1"))
    b.record("busy", NOON, Transfer(1, 2, session="s1"))
    b.refuse("busy", NOON, Refusal.QUOTA)
    a.record("week-ago", NOON - 7 * DAY_MS, Transfer(5, 5))
    a.record("month-ago", NOON - 20 * DAY_MS, Transfer(5, 5))
    b.auth_failure("knocked-only", NOON)
    a.flush(NOON)
    b.flush(NOON)
    a.record("busy", NOON + 1, Transfer(1000, 0))  # live, not flushed yet

    fleet = a.fleet(NOON + 2, 14)
    assert fleet.day == DAY
    assert (fleet.bytes_in, fleet.bytes_out) == (1101, 202)
    assert (fleet.bulk_bytes_in, fleet.bulk_bytes_out) == (10, 20)
    assert fleet.moved == 1303
    assert fleet.transfers == 3
    assert fleet.refusals["quota"] == 1
    assert fleet.auth_failures == 1
    assert fleet.sessions == 1
    assert fleet.namespaces == 4
    assert fleet.active == 1
    assert fleet.silent == 2  # month-ago, knocked-only
    # Silent: not seen on any of the last N UTC days, today included.
    assert a.fleet(NOON + 2, 8).silent == 2
    assert a.fleet(NOON + 2, 7).silent == 3
    assert a.fleet(NOON + 2, 30).silent == 1
    assert a.fleet(NOON + 2, 1).silent == 3


def test_fleet_of_an_empty_store_is_all_zero(ledger):
    fleet = ledger.fleet(NOON, 14)
    assert (fleet.namespaces, fleet.active, fleet.silent, fleet.moved) == (0, 0, 0, 0)


# --- sessions ---------------------------------------------------------------------------


def test_distinct_sessions_stay_bounded_and_close_beyond_the_exact_range(ledger):
    """Up to K-1 distinct sessions are exact; far more are estimated, memory bounded."""
    for i in range(K - 1):
        ledger.record("small", NOON, Transfer(1, 1, session=f"s{i}"))
        ledger.record("small", NOON, Transfer(1, 1, session=f"s{i}"))
    assert ledger.today("small", NOON).sessions == K - 1
    n = 20_000
    for i in range(n):
        ledger.record("big", NOON, Transfer(1, 1, session=f"user-{i}"))
    slot = ledger._slots["big"]
    assert len(slot.ids) <= 2 * K and len(slot.sketch) <= K
    assert abs(ledger.today("big", NOON).sessions - n) / n < 0.25
    ledger.flush(NOON)
    assert abs(ledger.today("big", NOON).sessions - n) / n < 0.25


def test_reasons_match_the_store_columns():
    """Every refusal reason has its column in the kept half."""
    columns = {f.column for f in FlowDayRecord._meta.concrete_fields}
    assert {f"refused_{r}" for r in REASONS} <= columns
