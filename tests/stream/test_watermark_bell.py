"""
The watermarker's bell (``stream.watermark``, "The bell"): capture notifies
``rindle_outbox`` only while the leader sleeps, so a steady stream of commits sends
no notifications (each one would wake every listening session of the database, the
app servers' listeners included), while the first commit after a quiet spell still
wakes a sleeping leader at once, and nothing ever waits for the lease renewal.
"""

import random
import time

from rindle_app.engine.capture import NOTIFY_CHANNEL, WAKE_KEY
from rindle_app.stream.watermark import Watermarker
from tests.support.waiting import wait_for

from .watermark_support import last_seq, pg, raw, safe_seq, write_user

__all__ = ["pg"]

# Long enough that a leader sleeping until its renewal would fail every bound below.
TTL = 30.0


def notes(listener, timeout):
    return [n.payload for n in listener.notifies(timeout=timeout)]


def committed_seq(conn):
    """One captured write on ``conn`` (autocommit off), committed; its seq."""
    write_user(conn)
    seq = last_seq(conn)
    conn.commit()
    return seq


def published_within(seq, limit):
    """Seconds until safe_seq reaches ``seq`` (polled); fails past ``limit``."""
    started = time.monotonic()
    wait_for(lambda: safe_seq() >= seq, limit, f"safe_seq to reach {seq}", interval=0.005)
    return time.monotonic() - started


def test_capture_notifies_only_while_the_leader_sleeps(pg):
    listener = raw()
    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
    writer = raw()
    write_user(writer)  # nobody leads: the bell is free, so capture rings
    assert len(notes(listener, 1.0)) == 1
    wm = Watermarker(lease_ttl=TTL)
    assert wm.step().advanced  # it saw commits: awake, it steps every interval anyway
    for _ in range(5):
        write_user(writer)
    assert notes(listener, 0.5) == []
    assert wm.step().advanced  # still busy: still awake
    write_user(writer)
    assert notes(listener, 0.3) == []
    wm.step()
    assert not wm.step().advanced  # a step that found nothing: asleep
    write_user(writer)
    assert len(notes(listener, 1.0)) == 1
    wm.close()
    write_user(writer)  # a closed watermarker leaves the bell free
    assert len(notes(listener, 1.0)) == 1
    listener.close()
    writer.close()


def test_a_busy_stream_sends_no_notifications_and_a_quiet_spell_never_waits_for_renewal(pg):
    """
    The loop: commits at random gaps around the refresh interval (the awake/asleep
    transitions) are each published within a few intervals, never at the renewal
    (TTL/3 = 10 s); a dense stream costs at most a handful of notifications.
    """
    interval = 0.03
    listener = raw()
    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
    wm = Watermarker(refresh_interval=interval, lease_ttl=TTL).start()
    writer = raw(autocommit=False)
    rng = random.Random(15)
    waits = []
    for _ in range(40):
        time.sleep(rng.choice([0, 0.005, interval / 2, interval, 2 * interval, 0.15]))
        waits.append(published_within(committed_seq(writer), 2.0))
    assert max(waits) < 1.0, sorted(waits)[-5:]
    notes(listener, 0.01)  # drain
    commits, started = 0, time.monotonic()
    while time.monotonic() - started < 1.0:
        committed_seq(writer)
        commits += 1
    rung = notes(listener, 0.2)
    wm.close()
    assert commits > 50
    # The first commit wakes it; then it is awake and capture is silent (a pause of a
    # refresh interval on a loaded machine may let it sleep, and ring, once more).
    assert len(rung) * 10 <= commits, (len(rung), commits)
    listener.close()
    writer.close()


def test_a_leader_that_cannot_confirm_the_bell_steps_every_interval(pg):
    """
    A paused ex-leader still holding WAKE_KEY keeps capture silent: the new leader
    must not sleep until a notification that never comes.
    """
    zombie = raw()
    zombie.execute("SELECT pg_advisory_lock(%s)", [WAKE_KEY])
    wm = Watermarker(refresh_interval=0.03, lease_ttl=TTL).start()
    writer = raw(autocommit=False)
    try:
        for _ in range(5):
            time.sleep(0.2)  # quiet: a leader trusting the bell would be asleep
            assert published_within(committed_seq(writer), 2.0) < 1.0
    finally:
        wm.close()
        zombie.close()
        writer.close()
