"""
The watermarker's lease on the database clock: one holder per epoch, the epoch
grows by one per change of holder, a paused ex-leader cannot publish, a clock
jump at most causes an early failover, and without the lease safe_seq still
never regresses and never skips.
"""

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections

from rindle_app.exceptions import LeaseHeld
from rindle_app.stream.lease import Lease
from rindle_app.stream.lease import read as read_lease
from rindle_app.stream.watermark import Watermarker
from tests.support.threads import run_at_once

from ..conftest import child_env
from .watermark_support import max_seq, pg, raw, safe_seq, write_user

__all__ = ["pg"]

ROOT = Path(__file__).resolve().parents[2]


def lease_row(name="watermark"):
    with connection.cursor() as cursor:
        return read_lease(cursor, name)


def test_a_held_lease_refuses_a_second_holder_until_it_expires(pg):
    """Another holder gets LeaseHeld while the lease is unexpired, then takes it with epoch + 1."""
    first = Lease("t", "a", ttl=0.5)
    second = Lease("t", "b", ttl=0.5)
    with connection.cursor() as cursor:
        assert first.acquire(cursor) == 1
        with pytest.raises(LeaseHeld) as caught:
            second.acquire(cursor)
        assert caught.value.holder == "a" and second.epoch is None
        assert first.acquire(cursor) == 1  # a renewal keeps the epoch
        time.sleep(0.6)
        assert not first.held()
        assert second.acquire(cursor) == 2
        assert not first.check(cursor)
        assert second.check(cursor)
    assert lease_row("t")["transitions"] == 2


def test_racing_contenders_get_exactly_one_holder_per_epoch(pg):
    """
    Contenders racing on many expiring leases: each epoch of each lease has exactly
    one holder, and epochs grow by one per change of holder.
    """
    rounds, holders = 30, 4
    wins = {}
    lock = threading.Lock()
    barrier = threading.Barrier(holders)

    def contend(me):
        conn = connections.create_connection("default")
        try:
            with conn.cursor() as cursor:
                for r in range(rounds):
                    lease = Lease(f"race{r % 3}", f"h{me}", ttl=0.05)
                    barrier.wait()
                    try:
                        epoch = lease.acquire(cursor)
                    except LeaseHeld:
                        continue
                    with lock:
                        wins.setdefault((lease.name, epoch), set()).add(me)
                    time.sleep(0.06)  # let it expire for the next round
        finally:
            conn.close()

    run_at_once([functools.partial(contend, n) for n in range(holders)])
    assert all(len(who) == 1 for who in wins.values()), wins
    for name in ("race0", "race1", "race2"):
        epochs = sorted(e for n, e in wins if n == name)
        row = lease_row(name)
        assert row["transitions"] == row["epoch"]
        # Every change of holder is a new epoch, and no epoch is skipped or won twice.
        assert epochs == sorted(set(epochs)) and set(epochs) <= set(range(1, row["epoch"] + 1))


def test_two_watermarkers_share_one_lease(pg):
    """Of two watermarkers only the lease holder steps; the other is a standby."""
    leader, standby = Watermarker(), Watermarker()
    leader.step()
    with pytest.raises(LeaseHeld):
        standby.step()
    assert standby.stats.standby_steps == 1 and leader.stats.leading
    leader.close()
    standby.step()
    assert standby.lease.epoch == 2
    standby.close()


def test_a_paused_leader_loses_the_lease_and_its_late_publish_is_refused(pg):
    """
    The leader (a subprocess) is SIGSTOPped past its TTL; a standby takes over with
    epoch + 1; the resumed ex-leader publishes nothing more under its old epoch.
    """
    env = child_env(WM_TTL="1", WM_INTERVAL="0.05", PYTHONPATH=str(ROOT))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.stream.wm_child", "paused", "0"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(child.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not any('"step"' in line for line in lines):
            assert time.monotonic() < deadline and child.poll() is None, lines
            time.sleep(0.05)
        old_epoch = lease_row()["epoch"]
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(1.3)
        standby = Watermarker(lease_ttl=1)
        standby.step()
        assert standby.lease.epoch == old_epoch + 1
        writer = raw()
        write_user(writer)
        before = len(lines)
        os.kill(child.pid, signal.SIGCONT)
        time.sleep(0.5)  # the ex-leader resumes mid-loop and tries to step
        late = [json.loads(x) for x in lines[before:] if '"step"' in x]
        assert all(step["epoch"] != old_epoch for step in late), late
        assert lease_row()["holder"] != "paused"
        progress = standby.step()
        assert progress.safe_seq == max_seq()
        standby.close()
        writer.close()
    finally:
        child.send_signal(signal.SIGCONT)
        child.terminate()
        child.wait(30)


def test_a_leader_paused_between_renewing_and_publishing_is_refused_by_the_epoch_check(pg):
    """
    A leader that renewed, then stalled past its TTL while another took over, has
    its publish refused inside the fenced transaction: safe_seq stays the new
    leader's, though the stale one would have advanced it.
    """
    leader = Watermarker(lease_ttl=0.3, refresh_interval=0.01)
    leader.step()
    with connection.cursor() as cursor:
        leader._acquire(cursor)  # renewed; the "pause" follows
    time.sleep(0.4)
    usurper = Watermarker(lease_ttl=5)
    published = usurper.step().safe_seq
    writer = raw()
    write_user(writer)
    with pytest.raises(LeaseHeld):
        leader._fenced(connection)
    assert safe_seq() == published < max_seq()
    usurper.close()
    leader.close()
    writer.close()


def test_a_forward_jump_of_the_database_clock_costs_one_early_failover_and_nothing_else(pg):
    """
    A contender whose database clock runs an hour ahead takes the lease early; the
    old leader's next step is refused by the epoch check, and safe_seq neither
    regresses nor skips a committed seq.
    """
    writer = raw()
    write_user(writer)
    leader = Watermarker()
    published = leader.step().safe_seq
    jumped = Watermarker(clock_offset=3600)
    progress = jumped.step()
    assert jumped.lease.epoch == leader.lease.epoch + 1
    assert progress.safe_seq == published
    write_user(writer)
    with pytest.raises(LeaseHeld):
        leader.step()
    assert safe_seq() == published
    assert jumped.step().safe_seq == max_seq()
    jumped.close()
    leader.close()
    writer.close()


def test_without_the_lease_three_watermarkers_never_regress_nor_skip(pg):
    """
    Three watermarkers each on a lease of its own (no mutual exclusion) step while
    writers commit and roll back: each publication is at least the one before and
    never above a seq that was still uncommitted when it was made.
    """
    published = [[], [], []]
    wms = [
        Watermarker(
            installation_id=f"solo{n}",
            observer=lambda p, n=n: published[n].append(p.safe_seq),
            refresh_interval=0.01,
        )
        for n in range(3)
    ]
    threads = [w.start() for w in wms]
    stop = threading.Event()
    violations = []

    def write():
        conn = raw(autocommit=False)
        try:
            n = 0
            while not stop.is_set():
                n += 1
                write_user(conn)
                mine = conn.execute(
                    "SELECT MAX(seq) FROM _rindle_change_events "
                    "WHERE txid = pg_current_xact_id()::text::bigint"
                ).fetchone()[0]
                time.sleep(0.005)
                # Still open: the published watermark must be below this seq.
                safe = conn.execute("SELECT safe_seq FROM _rindle_stream").fetchone()
                if safe and safe[0] >= mine:
                    violations.append((mine, safe[0]))
                conn.rollback() if n % 3 == 0 else conn.commit()
        finally:
            conn.close()

    writers = [threading.Thread(target=write) for _ in range(2)]
    for t in writers:
        t.start()
    time.sleep(2)
    stop.set()
    for t in writers:
        t.join(10)
    time.sleep(0.2)
    for w in threads:
        w.close()
    assert violations == []
    final = safe_seq()
    assert final == max_seq()
    for mine in published:
        assert len(mine) > 3 and mine == sorted(mine)  # each one's publications never go back
    assert max(max(mine) for mine in published) == final
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM _rindle_stream_leases WHERE name LIKE 'watermark:solo%%'"
        )
        assert cursor.fetchone()[0] == 3
