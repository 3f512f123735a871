"""
Retention's pruning rule (``rindle_app.stream.retention``), on both backends: the
floor, a contiguous seq prefix whatever the timestamps, batches that each move the
horizon, a horizon that never moves back, and an outbox bounded by age x rate.
"""

import datetime

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from rindle_app.stream.retention import FLOOR, Retention

from .retention_support import (
    DAY,
    T0,
    Clock,
    add_events,
    assert_prefix_invariant,
    outbox_seqs,
    publish,
    read_state,
)

pytestmark = pytest.mark.django_db(transaction=True)

WEEK = datetime.timedelta(days=7)


def rindle(**values):
    from django.conf import settings

    return override_settings(RINDLE={**settings.RINDLE, **values})


def test_an_age_below_the_seven_day_floor_is_refused_with_a_clear_error():
    """An age under 7 days is refused, naming the floor; 7 days exactly is accepted."""
    with pytest.raises(ValueError, match="below the 7 days, 0:00:00 floor"):
        Retention(age=WEEK - datetime.timedelta(seconds=1))
    with pytest.raises(ValueError, match="below"):
        Retention(age=3600)
    assert Retention(age=WEEK).age == FLOOR


def test_the_settings_path_refuses_an_age_below_the_floor():
    """STREAM_RETENTION_SECONDS under 7 days is ImproperlyConfigured, and check E030 says so."""
    from rindle_app.checks import check_settings

    with rindle(STREAM_RETENTION_SECONDS=6 * 24 * 3600):
        with pytest.raises(ImproperlyConfigured, match="STREAM_RETENTION_SECONDS|floor"):
            Retention()
        assert "rindle.E030" in [e.id for e in check_settings(None)]
    assert "rindle.E030" not in [e.id for e in check_settings(None)]


def test_bad_period_batch_size_or_clock_are_refused():
    """A non-positive period or batch size, or a naive clock, is refused before any delete."""
    with pytest.raises(ValueError, match="period"):
        Retention(age=WEEK, period=0)
    with pytest.raises(ValueError, match="batch size"):
        Retention(age=WEEK, batch_size=0)
    seqs = add_events([T0 - 30 * DAY])
    naive = Retention(age=WEEK, now=lambda: datetime.datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="aware"):
        naive.run_once()
    assert outbox_seqs() == seqs


def test_only_a_contiguous_prefix_goes_when_created_at_decreases_while_seq_increases():
    """
    Rows stamped ever OLDER as seq grows: the first row is young, so nothing goes,
    although most rows are far past the age (a timestamp-chosen delete would take them).
    """
    stamps = [T0 - i * DAY for i in range(20)]  # seq order: 0, 1, ... 19 days old
    seqs = add_events(stamps)
    publish()
    run = Retention(age=WEEK, now=Clock(T0)).run_once()
    assert run.pruned == 0
    assert outbox_seqs() == seqs


def test_one_young_row_keeps_every_row_after_it():
    """Old, old, YOUNG, old, old: only the two rows before the young one go."""
    now = T0
    stamps = [now - 30 * DAY, now - 29 * DAY, now - DAY, now - 28 * DAY, now - 27 * DAY]
    seqs = add_events(stamps)
    publish()
    run = Retention(age=WEEK, now=Clock(now)).run_once()
    assert run.pruned == 2 and run.horizon == seqs[2]
    assert outbox_seqs() == seqs[2:]
    assert_prefix_invariant(seqs)


def test_every_batch_moves_the_horizon_and_the_newest_row_stays():
    """
    In batches of 10, 35 old rows and no young one: four batches, each reported with
    the horizon it committed, and the newest row at or below safe_seq is kept.
    """
    seqs = add_events([T0 - 30 * DAY] * 35)
    publish()
    seen = []
    retention = Retention(
        age=WEEK, batch_size=10, now=Clock(T0), on_prune=lambda s, h: seen.append((s, h))
    )
    run = retention.run_once()
    assert run.pruned == 34 and run.batches == 4
    assert seen == [
        ("outbox", seqs[10]),
        ("outbox", seqs[20]),
        ("outbox", seqs[30]),
        ("outbox", seqs[34]),
    ]
    assert outbox_seqs() == [seqs[34]]
    st, _kept = assert_prefix_invariant(seqs)
    assert st.horizon == seqs[34] and retention.stats.pruned == 34


def test_a_step_deletes_at_most_one_batch():
    """``step()`` deletes one batch and says the prefix is not done; the next continues."""
    seqs = add_events([T0 - 30 * DAY] * 25)
    publish()
    retention = Retention(age=WEEK, batch_size=10, now=Clock(T0))
    first = retention.step()
    assert (first.pruned, first.horizon, first.done) == (10, seqs[10], False)
    assert outbox_seqs() == seqs[10:]
    assert_prefix_invariant(seqs)


def test_lowering_then_raising_the_age_never_moves_the_horizon_back():
    """
    A shorter age prunes more; raising it again brings no row back and leaves the
    horizon where it was (the horizon, not the setting, says what history exists).
    """
    clock = Clock(T0)
    seqs = add_events([T0 - d * DAY for d in (40, 30, 20, 10, 5, 1)])
    publish()
    Retention(age=25 * DAY, now=clock).run_once()
    assert outbox_seqs() == seqs[2:]
    Retention(age=15 * DAY, now=clock).run_once()
    after_low = read_state().horizon
    assert after_low == seqs[3] and outbox_seqs() == seqs[3:]
    for age in (30 * DAY, 365 * DAY):
        Retention(age=age, now=clock).run_once()
        assert read_state().horizon == after_low
        assert outbox_seqs() == seqs[3:]


def test_rows_above_safe_seq_are_never_pruned():
    """
    Old rows committed after the last publication (above safe_seq) stay, and the
    horizon stops at a kept row no higher than safe_seq + 1.
    """
    published = add_events([T0 - 30 * DAY] * 5)
    publish()
    unpublished = add_events([T0 - 30 * DAY] * 5)
    st = read_state()
    if st.safe_seq >= unpublished[0]:
        pytest.skip("SQLite: every committed seq is safe (its write lock orders commits)")
    Retention(age=WEEK, now=Clock(T0)).run_once()
    assert outbox_seqs() == published[-1:] + unpublished
    assert read_state().horizon == published[-1]


@pytest.mark.slow
def test_a_simulated_week_keeps_the_outbox_bounded_by_age_times_rate():
    """
    Three simulated weeks of 40 rows every 6 hours, retention after each: the outbox
    never holds more than the last 7 days' rows (plus the one batch being written),
    while history grows to 3360 rows.
    """
    clock = Clock(T0)
    retention = Retention(age=WEEK, now=clock, batch_size=100)
    step = datetime.timedelta(hours=6)
    per_step = 40
    bound = (WEEK // step + 1) * per_step
    written, sizes = 0, []
    for _ in range(3 * 7 * 4):
        clock.advance(step)
        add_events([clock()] * per_step)
        written += per_step
        publish()
        retention.run_once()
        sizes.append(len(outbox_seqs()))
    assert written == 3360
    assert max(sizes) <= bound
    assert sizes[-1] >= WEEK // step * per_step  # a week is kept, not less
    oldest = read_state().horizon
    assert oldest == outbox_seqs()[0]


def test_metrics_report_rows_pruned_the_horizon_and_the_last_prune():
    """/metrics shows the runtime's retention: rows pruned, the horizon, when it pruned."""
    from rindle_app.runtime import get_runtime

    from ..conftest import scrape_metrics

    seqs = add_events([T0 - 30 * DAY] * 3)
    publish()
    get_runtime("default").retention(now=Clock(T0)).run_once()
    text = scrape_metrics()
    assert 'rindle_stream_retention_pruned_rows_total{database="default"} 2.0' in text
    assert f'rindle_stream_horizon{{database="default"}} {float(seqs[2])}' in text
    line = next(
        li for li in text.splitlines() if li.startswith("rindle_stream_retention_last_prune")
    )
    assert float(line.split()[-1]) > 0
