"""
One watermark step on PostgreSQL: it publishes the greatest committed seq while
holding the exclusive fence, waits for no open writer longer than the lock
timeout, never stalls on a rolled-back seq and never lowers safe_seq.
"""

import time

import pytest
from django.db import connection, transaction

from rindle_app.stream.watermark import NOTIFY_CHANNEL, Watermarker, WatermarkProgress
from tests.support.waiting import wait_for

from .watermark_support import fence_locks, last_seq, max_seq, pg, raw, safe_seq, write_user

__all__ = ["pg"]


def test_a_step_publishes_the_greatest_committed_seq_and_notifies_it(pg):
    """A step after commits publishes MAX(seq) and sends it on rindle_watermark at commit."""
    listener = raw()
    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
    writer = raw()
    for _ in range(3):
        write_user(writer)
    seen = []
    wm = Watermarker(observer=seen.append)
    progress = wm.step()
    top = max_seq()
    assert progress == WatermarkProgress(top, top, top, True, False)
    assert safe_seq() == top and seen == [progress]
    notes = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert notes == [str(top)]
    again = wm.step()
    assert again.advanced is False and again.safe_seq == top
    wm.close()
    listener.close()
    writer.close()


def test_an_open_writer_holds_safe_seq_below_its_seq_until_it_commits(pg):
    """
    A writer sleeping inside its transaction keeps safe_seq below its seq while
    later writers commit; the step times out within about the lock timeout, leaves
    no exclusive request waiting, and the first step after the commit publishes all.
    """
    wm = Watermarker(fence_lock_timeout=0.1)
    wm.step()
    slow = raw(autocommit=False)
    write_user(slow)
    held = last_seq(slow)
    fast = raw()
    write_user(fast)
    started = time.monotonic()
    progress = wm.step()
    elapsed = time.monotonic() - started
    assert progress.fence_timed_out and progress.candidate_seq is None
    assert not progress.advanced
    assert progress.safe_seq < held < progress.max_seq
    assert elapsed < 1.0
    assert [m for _pid, m, granted in fence_locks() if not granted] == []
    assert safe_seq() < held
    slow.commit()
    after = wm.step()
    assert after.advanced and after.safe_seq == max_seq() > held
    wm.close()
    slow.close()
    fast.close()


def test_a_rolled_back_seq_is_a_hole_that_never_stalls_the_watermark(pg):
    """A seq whose transaction rolled back is never waited for: the next step passes it."""
    wm = Watermarker()
    doomed = raw(autocommit=False)
    write_user(doomed)
    hole = last_seq(doomed)
    doomed.rollback()
    writer = raw()
    write_user(writer)
    progress = wm.step()
    assert not progress.fence_timed_out
    assert progress.safe_seq == max_seq() > hole
    wm.close()
    doomed.close()
    writer.close()


def test_safe_seq_never_moves_back(pg):
    """A step that finds less than is published (a pruned outbox) leaves safe_seq as it is."""
    writer = raw()
    write_user(writer)
    wm = Watermarker()
    top = wm.step().safe_seq
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM _rindle_change_events")
    progress = wm.step()
    assert progress.safe_seq == top == safe_seq()
    assert progress.candidate_seq == 0 and not progress.advanced
    wm.close()
    writer.close()


def test_a_step_refuses_to_run_inside_a_transaction(pg):
    """Inside an atomic block a step would read a snapshot older than the fence: refused."""
    wm = Watermarker()
    with transaction.atomic():
        with pytest.raises(RuntimeError, match="inside a transaction"):
            wm.step()
    wm.close()


def test_a_step_refuses_repeatable_read(pg, settings):
    """A connection configured for REPEATABLE READ is refused, and nothing is published."""
    import psycopg

    databases = {**settings.DATABASES}
    default = {**databases["default"]}
    default["OPTIONS"] = {
        **default.get("OPTIONS", {}),
        "isolation_level": psycopg.IsolationLevel.REPEATABLE_READ,
    }
    connection.close()
    old = connection.settings_dict
    connection.settings_dict = default
    try:
        wm = Watermarker()
        with pytest.raises(RuntimeError, match="READ COMMITTED"):
            wm.step()
        wm.close()
    finally:
        connection.close()
        connection.settings_dict = old
    assert safe_seq() == 0


def test_close_releases_the_lease_and_leaves_safe_seq(pg):
    """After close() another watermarker leads at once, and safe_seq is untouched."""
    writer = raw()
    write_user(writer)
    first = Watermarker()
    top = first.step().safe_seq
    first.close()
    assert safe_seq() == top
    second = Watermarker()
    progress = second.step()
    assert progress.safe_seq == top
    assert second.lease.epoch == first_epoch_plus_one(first, second)
    second.close()
    writer.close()


def first_epoch_plus_one(first, second):
    with connection.cursor() as cursor:
        cursor.execute("SELECT epoch FROM _rindle_stream_leases WHERE name = 'watermark'")
        return cursor.fetchone()[0]


def test_the_loop_publishes_a_commit_within_a_few_intervals(pg):
    """run() wakes on the commit notification and publishes it promptly."""
    wm = Watermarker(refresh_interval=0.05).start()
    writer = raw()
    time.sleep(0.2)
    write_user(writer)
    target = max_seq()
    wait_for(lambda: safe_seq() >= target, 3, "safe_seq past the write", interval=0.01)
    wm.close()
    assert not wm.running
    writer.close()


def test_a_stream_of_commits_wakes_the_leader_once_per_interval_not_once_per_commit(pg):
    """
    Under a steady stream of commits the leader steps about once per refresh
    interval, and a notification that cannot bring the next step forward does not
    wake it: the watermarker's cost stays per interval, not per commit.
    """
    interval = 0.2
    wm = Watermarker(refresh_interval=interval)
    waits, steps = [], []
    real_wait, real_step = wm._wait, wm.step

    def counting_wait(timeout):
        waits.append(timeout)
        return real_wait(timeout)

    def counting_step():
        steps.append(time.monotonic())
        return real_step()

    wm._wait, wm.step = counting_wait, counting_step
    wm.start()
    writer = raw()
    commits, started = 0, time.monotonic()
    while time.monotonic() - started < 2.0:
        write_user(writer)
        commits += 1
    elapsed = time.monotonic() - started
    target = max_seq()
    wait_for(lambda: safe_seq() >= target, 3, "safe_seq past the last write", interval=0.01)
    wm.close()
    writer.close()
    bound = 2 * elapsed / interval + 10
    assert commits > 3 * bound  # the stream really was denser than the bound
    assert len(steps) <= elapsed / interval + 5
    assert len(waits) <= bound, (len(waits), commits)
