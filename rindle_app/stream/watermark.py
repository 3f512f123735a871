"""
The watermarker: publishes the outbox's ``safe_seq`` (``stream.state``) on
PostgreSQL, once per refresh interval for the whole fleet.

Why it exists: seqs are drawn when a row is captured, but transactions commit in
their own order, so seq 11 can be visible while seq 10's transaction is still
open. Every capturing transaction holds the SHARED side of the outbox fence from
before it draws a seq until it ends (``engine.capture``); a step takes the
EXCLUSIVE side, so at that instant no writer is between drawing a seq and its
commit, and the greatest committed seq is final: everything at or below it is
committed or gone for good (a rolled-back seq is a permanent hole, never a
stall). Readers then read the published value and take no lock, so adding app
servers costs writers nothing.

``Watermarker.step()`` does, in this order:

1. renew or acquire the singleton lease (``stream.lease``; database clock, epoch
   fencing token), in its own autocommit statement; ``LeaseHeld`` when another
   process leads;
2. in a READ COMMITTED transaction (anything else is refused: a snapshot taken
   before the lock would see too little), take the exclusive fence under
   ``SET LOCAL lock_timeout``. A time-out is ``fence_timed_out``: retryable,
   metered apart from advances, and it leaves no exclusive request waiting (a
   waiting exclusive request queues every new writer behind it, which is why the
   wait is short);
3. read MAX(seq) in a fresh statement (it starts after the lock was granted, and
   a commit is visible before its locks are released);
4. re-check the lease epoch in the same transaction (a paused ex-leader cannot
   publish);
5. ``state.publish`` (GREATEST: a second or stale publisher is harmless) and, on
   an advance, ``pg_notify('rindle_watermark', safe_seq)``, delivered at commit;
6. still under the fence, set the bell (below): awake after an advance, asleep
   after a step that found nothing new;
7. report ``WatermarkProgress`` to the observer and to the counters ``/metrics``
   reads (``metrics.WatermarkCollector``).

``run(stop)`` loops: a leader steps every interval while it is awake or the
watermark lags, when a commit is notified on ``rindle_outbox`` while it sleeps
(at most once per refresh interval), and at least every third of the lease TTL
to renew it; a standby retries the lease every interval (one UPDATE that matches
nothing), so a failover needs no coordinator. ``close()`` releases the lease and
leaves ``safe_seq`` as it is.

The bell. Postgres delivers a NOTIFY by signalling EVERY session of the database
that listens on any channel (the receiver filters by channel), so a notification
per commit would cost each write a wake-up of every app server's listeners (the
hub's, the stream's doorbell): measured, nine idle listeners took 14% off a
single writer's rate. So capture notifies only while the leader sleeps. A leader
that saw commits in its last step is *awake*: it steps every interval whatever
happens, and holds the session-level advisory lock ``WAKE_KEY`` so that capture's
``pg_try_advisory_xact_lock_shared(WAKE_KEY)`` fails and it sends nothing. A
step that finds nothing new puts it to *sleep*: it releases the lock and waits
for a notification (or the lease renewal). Both changes are made while the step
holds the exclusive fence, when no capturing transaction is open (capture takes
the fence before it tries the bell), so none can fall between: a commit either
came before the step (the step publishes it) or tries the bell after the change.
A leader that cannot take the lock (a paused ex-leader still holds it: capture
is silent) or cannot confirm that nobody holds it never sleeps on the bell: it
steps every interval. So under a steady stream of commits there are no commit
notifications at all and one step per interval; an idle database costs nothing;
the first commit after a quiet spell wakes the leader at once.

``installation_id`` names the installation the lease is for: the lease row is
``watermark`` (no id, the default) or ``watermark:<id>``. Every watermarker of
one database must use the same id: the id scopes the lease, not the data, so
two ids make two leaders. That is safe (the publish is monotonic and the fence
serializes the steps) but takes the fence twice per interval.

Threading model: a Watermarker steps on the thread that calls ``step``/``run``,
through that thread's Django connection (which is why ``step`` refuses to run
inside an atomic block); ``start()`` gives it a thread of its own
(``rindle-watermark``) that runs ``run`` and releases the lease as it ends.
The counters are plain attributes written by that thread and read by a scrape.
"""

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass

from django.db import DatabaseError, connections, transaction

from ..engine.capture import FENCE_KEY, OUTBOX, WAKE_KEY
from ..engine.capture import NOTIFY_CHANNEL as OUTBOX_CHANNEL
from ..exceptions import LeaseHeld
from . import state
from .lease import Lease

logger = logging.getLogger("rindle.stream")

NOTIFY_CHANNEL = "rindle_watermark"
LEASE_NAME = "watermark"
_LOCK_NOT_AVAILABLE = "55P03"
# Where it runs (RINDLE["STREAM_WATERMARKER"]): in whichever serving process wins the
# lease, or only in the rindle_watermark command. Check rindle.E033 refuses the rest.
PLACEMENTS = ("embedded", "external")


def settings_problem(settings):
    """What is wrong with STREAM_WATERMARKER (of a ``rindle_settings``), or None."""
    value = settings.STREAM_WATERMARKER
    if not isinstance(value, str) or value not in PLACEMENTS:
        return (
            f"STREAM_WATERMARKER must be one of {', '.join(map(repr, PLACEMENTS))}, not {value!r}"
        )
    return None


def placement():
    """
    ``RINDLE["STREAM_WATERMARKER"]``: "embedded" or "external". Anything else is
    ``ImproperlyConfigured`` (a misspelt value must not silently run no watermarker).
    """
    from django.core.exceptions import ImproperlyConfigured

    from ..conf import rindle_settings

    problem = settings_problem(rindle_settings)
    if problem is not None:
        raise ImproperlyConfigured(f"{problem} (check rindle.E033)")
    return rindle_settings.STREAM_WATERMARKER


@dataclass(frozen=True)
class WatermarkProgress:
    """
    One observed state of the watermark after a step.

    - ``safe_seq``: the published value after the step;
    - ``max_seq``: the greatest committed seq the step saw (read unfenced after a
      fence time-out, so ``max_seq - safe_seq`` is the lag);
    - ``candidate_seq``: MAX(seq) read under the exclusive fence, None when it timed out;
    - ``advanced``: this step raised ``safe_seq``;
    - ``fence_timed_out``: the exclusive fence was not granted within the lock
      timeout (an open transaction holds the shared side): retryable, not a failure.
    """

    safe_seq: int
    max_seq: int
    candidate_seq: int | None
    advanced: bool
    fence_timed_out: bool


class Stats:
    """What ``/metrics`` reports of one watermarker (written by its stepping thread)."""

    def __init__(self):
        self.steps = 0
        self.advances = 0
        self.fence_timeouts = 0
        self.standby_steps = 0
        self.errors = 0
        self.safe_seq = 0
        self.max_seq = 0
        self.leading = False
        self.lease_epoch = 0
        self.lease_transitions = 0
        self.step_seconds = 0.0


def default_owner():
    """A holder name unique to this watermarker: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Watermarker:
    """
    The leased watermarker of the database alias ``using`` (PostgreSQL only).

    Options (seconds; defaults from the STREAM_* settings): ``refresh_interval``
    (the least time between two steps), ``lease_ttl``, ``fence_lock_timeout``
    (how long a step waits for the exclusive fence), ``owner`` (the lease holder's
    name, unique per watermarker), ``observer`` (called with each
    ``WatermarkProgress``; an observer that raises is logged, never fatal) and
    ``installation_id`` (see the module). ``clock_offset`` shifts the database
    clock the lease is decided on (tests only).
    """

    def __init__(
        self,
        using="default",
        *,
        refresh_interval=None,
        lease_ttl=None,
        fence_lock_timeout=None,
        owner=None,
        observer=None,
        installation_id=None,
        clock_offset=0.0,
    ):
        from ..conf import rindle_settings

        if connections[using].vendor != "postgresql":
            raise ValueError(
                "the watermarker is for PostgreSQL; on SQLite the write lock orders seqs"
            )
        if refresh_interval is None:
            refresh_interval = rindle_settings.STREAM_REFRESH_SECONDS
        if lease_ttl is None:
            lease_ttl = rindle_settings.STREAM_LEASE_TTL_SECONDS
        if fence_lock_timeout is None:
            fence_lock_timeout = rindle_settings.STREAM_FENCE_LOCK_TIMEOUT_MS / 1000
        self.refresh_interval = _positive("refresh_interval", refresh_interval)
        self.fence_lock_timeout = _positive("fence_lock_timeout", fence_lock_timeout)
        self._lock_timeout_ms = max(1, round(self.fence_lock_timeout * 1000))
        if installation_id is not None and not str(installation_id):
            raise ValueError("installation_id must be None or a non-empty value")
        self.installation_id = installation_id
        name = LEASE_NAME if installation_id is None else f"{LEASE_NAME}:{installation_id}"
        self.owner = owner or default_owner()
        self.lease = Lease(name, self.owner, lease_ttl, clock_offset=clock_offset)
        if self.lease.ttl <= self.refresh_interval:
            raise ValueError("lease_ttl must be longer than refresh_interval")
        self.using = using
        self.observer = observer
        self.stats = Stats()
        self._stop = threading.Event()
        self._thread = None
        self._listening = None  # the raw connection LISTEN was issued on
        self._awake = False  # this session holds WAKE_KEY (capture sends no NOTIFY)
        self._bell = False  # capture notifies: the leader may sleep until a commit

    def __repr__(self):
        return f"<Watermarker {self.using!r} {self.owner!r} epoch {self.lease.epoch}>"

    # --- one step ------------------------------------------------------------------

    def step(self):
        """
        Renew or acquire the lease, then publish the greatest committed seq while
        holding the exclusive fence; returns the ``WatermarkProgress``. Raises
        ``LeaseHeld`` when another watermarker leads (or took over mid-step).
        """
        conn = connections[self.using]
        if conn.in_atomic_block:
            raise RuntimeError("a watermark step must not run inside a transaction")
        started = time.monotonic()
        try:
            with conn.cursor() as cursor:
                self._acquire(cursor)
            progress = self._fenced(conn)
        except LeaseHeld:
            self.stats.standby_steps += 1
            self.stats.leading = False
            self._silence_off()
            raise
        finally:
            self.stats.step_seconds += time.monotonic() - started
        self._report(progress)
        return progress

    def _acquire(self, cursor):
        try:
            self.lease.acquire(cursor)
        finally:
            self.stats.lease_transitions = self.lease.transitions
        self.stats.lease_epoch = self.lease.epoch
        if not self.lease.held():  # the renewal itself outlasted the margin
            self.lease.forget()
            raise LeaseHeld(self.lease.name, "nobody (this renewal came too late)")

    def _fenced(self, conn):
        try:
            with transaction.atomic(using=self.using), conn.cursor() as cursor:
                cursor.execute(
                    "SELECT set_config('lock_timeout', %s, true), "
                    "current_setting('transaction_isolation')",
                    [f"{self._lock_timeout_ms}ms"],
                )
                isolation = cursor.fetchone()[1]
                if isolation != "read committed":
                    raise RuntimeError(
                        f"a watermark step needs READ COMMITTED, not {isolation}: a snapshot "
                        "taken before the fence would miss commits"
                    )
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [FENCE_KEY])
                cursor.execute(
                    f"SELECT (SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}), "
                    f"(SELECT safe_seq FROM {state.TABLE} WHERE name = %s)",
                    [state.STREAM],
                )
                candidate, before = cursor.fetchone()
                if not self.lease.check(cursor):
                    raise _LeaseLost()
                safe = state.publish(cursor, candidate)
                advanced = safe > (before or 0)
                if advanced:
                    cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, str(safe)])
                self._set_bell(cursor, awake=advanced)
        except _LeaseLost:
            self.lease.forget()
            self._silence_off()
            raise LeaseHeld(self.lease.name, "another holder") from None
        except DatabaseError as exc:
            if getattr(exc.__cause__, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                raise
            return self._timed_out(conn)
        return WatermarkProgress(safe, candidate, candidate, advanced, False)

    def _set_bell(self, cursor, *, awake):
        """
        Under the exclusive fence: hold WAKE_KEY while ``awake`` (commits keep
        coming: step every interval, capture stays silent), release it otherwise
        (capture notifies). ``self._bell`` says whether capture will notify, i.e.
        whether sleeping until a notification is safe: only when this step saw
        the key free (a paused ex-leader may still hold it).
        """
        if awake:
            if not self._awake:
                cursor.execute("SELECT pg_try_advisory_lock(%s)", [WAKE_KEY])
                self._awake = bool(cursor.fetchone()[0])
            self._bell = False
            return
        if self._awake:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [WAKE_KEY])
            self._awake = False
            self._bell = True
            return
        # Free (nobody silences capture) exactly when it can be taken; give it back.
        cursor.execute(
            "SELECT CASE WHEN pg_try_advisory_lock(%s) THEN pg_advisory_unlock(%s) ELSE false END",
            [WAKE_KEY, WAKE_KEY],
        )
        self._bell = bool(cursor.fetchone()[0])

    def _silence_off(self):
        """Stop silencing capture (this watermarker no longer leads); never raises."""
        self._bell = False
        if not self._awake:
            return
        self._awake = False
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [WAKE_KEY])
        except Exception:  # the session is gone, and the lock with it
            self._drop_connection()

    def _timed_out(self, conn):
        with conn.cursor() as cursor:
            cursor.execute(
                f"SELECT (SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}), "
                f"(SELECT safe_seq FROM {state.TABLE} WHERE name = %s)",
                [state.STREAM],
            )
            max_seq, safe = cursor.fetchone()
        safe = safe or 0
        return WatermarkProgress(safe, max(max_seq, safe), None, False, True)

    def _report(self, progress):
        stats = self.stats
        stats.steps += 1
        stats.leading = True
        stats.advances += progress.advanced
        stats.fence_timeouts += progress.fence_timed_out
        stats.safe_seq = progress.safe_seq
        stats.max_seq = progress.max_seq
        if self.observer is not None:
            try:
                self.observer(progress)
            except Exception:
                logger.exception("rindle watermark: the observer failed on %r", progress)

    # --- the loop ------------------------------------------------------------------

    def run(self, stop=None):
        """
        Step until ``stop`` (a ``threading.Event``; default this watermarker's own,
        set by ``close``) is set: as leader on each notified commit (at most once per
        refresh interval), every interval while lagging and every third of the
        lease TTL regardless; as standby every interval. Errors are logged and the
        connection is dropped and re-made: the loop never dies of one.
        """
        stop = self._stop if stop is None else stop
        interval = self.refresh_interval
        renew_every = self.lease.ttl / 3
        due = 0.0
        last = 0.0
        while not stop.is_set():
            now = time.monotonic()
            if now < due:
                if due <= last + interval:
                    # A notification cannot bring this step forward: sleep until it
                    # is due rather than waking on every commit's notification.
                    stop.wait(min(due - now, 0.1))
                elif self._wait(min(due - now, 0.1)):
                    due = min(due, last + interval)
                continue
            last = now
            try:
                self._listen()
                progress = self.step()
            except LeaseHeld:
                due = last + interval
                continue
            except Exception:
                self.stats.errors += 1
                logger.exception("rindle watermark: a step failed; reconnecting")
                self._drop_connection()
                due = last + max(interval, 0.5)
                continue
            lagging = progress.fence_timed_out or progress.max_seq > progress.safe_seq
            # Sleep until a commit rings only when capture will ring (``_set_bell``).
            due = last + (interval if lagging or not self._bell else renew_every)

    def _listen(self):
        conn = connections[self.using]
        conn.ensure_connection()
        raw = conn.connection
        if self._listening is not raw:
            self._awake = self._bell = False  # a new session holds no advisory lock
            with conn.cursor() as cursor:
                cursor.execute(f"LISTEN {OUTBOX_CHANNEL}")
            self._listening = raw

    def _wait(self, timeout):
        """Wait up to ``timeout`` seconds; True when a commit was notified meanwhile."""
        conn = connections[self.using]
        raw = conn.connection if self._listening is not None else None
        if raw is None or raw is not self._listening:
            self._stop.wait(timeout)
            return False
        try:
            return sum(1 for _ in raw.notifies(timeout=timeout, stop_after=1)) > 0
        except Exception:
            self._drop_connection()
            return False

    def _drop_connection(self):
        self._listening = None
        self._awake = self._bell = False  # a session's advisory locks end with it
        self.lease.forget()
        try:
            connections[self.using].close()
        except Exception:
            pass

    # --- the thread and the end ----------------------------------------------------

    def start(self):
        """Run the loop on a thread of its own (``close`` stops it); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run_thread, name="rindle-watermark", daemon=True
            )
            self._thread.start()
        return self

    def _run_thread(self):
        try:
            self.run()
        finally:
            self._release()
            connections[self.using].close()

    def close(self, timeout=5):
        """Stop the loop and release the lease; ``safe_seq`` stays as published."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            if thread is not threading.current_thread():
                thread.join(timeout)
            return
        self._release()

    @property
    def running(self):
        return self._thread is not None and self._thread.is_alive()

    def _release(self):
        self.stats.leading = False
        self._silence_off()
        if self.lease.epoch is None:
            return
        try:
            conn = connections[self.using]
            if conn.in_atomic_block:
                conn = connections.create_connection(self.using)
                try:
                    with conn.cursor() as cursor:
                        self.lease.release(cursor)
                finally:
                    conn.close()
                return
            with conn.cursor() as cursor:
                self.lease.release(cursor)
        except Exception:
            self.lease.forget()
            logger.exception("rindle watermark: releasing the lease failed; it expires")


class _LeaseLost(Exception):
    pass


def _positive(name, value):
    value = float(value)
    if not value > 0:
        raise ValueError(f"{name} must be positive seconds, not {value!r}")
    return value
