"""
Retention: the outbox is pruned to a contiguous seq prefix older than an age.

The rule. Each batch, in ONE short transaction, reads the stream's state, walks the
outbox BY SEQ from the horizon (at most ``batch_size + 1`` rows, all at or below
``safe_seq``), stops at the first row younger than ``now - age``, deletes every row
below that cut and raises ``horizon`` to the cut (``GREATEST``: it never moves back).
Consequences, each deliberate:

- Only a prefix goes, never a set chosen by timestamp: ``created_at`` is not
  monotonic in seq (a long transaction's rows are stamped at its start), so one
  young row keeps every row after it, however old.
- The cut is the seq of a row that stays, so the horizon is the first seq kept and
  never passes ``safe_seq + 1``: a late-committing writer (its seq above
  ``safe_seq``) can never land below it. The newest row at or below ``safe_seq`` is
  always kept, so ``MAX(seq)`` (the engine's commit version, SQLite's safe_seq)
  never falls back because of pruning.
- The delete and the horizon commit together: a pruner killed at any point leaves
  ``horizon`` equal to the first seq kept, never a deleted row above it.
- No consumer cursor is consulted (seed 002, DESIGN section 7): a reader whose next
  seq fell below the horizon is told to resnapshot (``ResnapshotRequired``).
- Two pruners at once (the beat task and an embedded timer, or two processes) are
  harmless: both delete a prefix and raise the horizon with ``GREATEST``. A lease
  would only save the duplicate work.
- Lowering the age prunes more at the next run; raising it again brings nothing
  back (the horizon, not the setting, says what history exists).

On PostgreSQL a batch takes no fence: every row it deletes is at or below the
published ``safe_seq``, so no writer can still be inserting among them, and the row
lock on ``_rindle_stream`` is taken by its last statement, so a watermark publish
waits at most for that commit. On SQLite a batch is an IMMEDIATE transaction of its
own (the write lock for one batch), and it also stores ``safe_seq`` (``MAX(seq)``
there), so an outbox pruned down to its last row still knows how far it went.

Each run first checks the database's identity (``state.check_identity``), so a
restored database gets a new epoch before anything is pruned against it.

Scheduling: the Celery beat task ``rindle_app.tasks.stream_retention`` every
``STREAM_RETENTION_PERIOD_SECONDS``, and in the embedded mode the runtime's
``RetentionTimer`` (``rindle_app/runtime.py``) runs the same ``run_once``.
"""

import datetime
import itertools
import logging
import random
import threading
import time
from dataclasses import dataclass, field

from django.core.exceptions import ImproperlyConfigured
from django.db import connections, transaction
from django.utils import timezone

from ..engine.capture import OUTBOX
from ..periodic import Periodic
from . import state

logger = logging.getLogger("rindle.stream")

# The locked floor of the age (seed 002, C-S7): a week of history is always kept.
FLOOR = datetime.timedelta(days=7)
# The longest a starting timer waits before its first run (spread over a fleet).
FIRST_RUN_MAX_DELAY_SECONDS = 30.0


def _seconds(value, name):
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds or a timedelta, not {value!r}")
    return float(value)


def _aware_utc(value):
    """``created_at`` as the driver returned it, as an aware datetime (SQLite: UTC text)."""
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if timezone.is_naive(value):
        value = value.replace(tzinfo=datetime.UTC)
    return value


def settings_problem(settings):
    """What is wrong with the STREAM_RETENTION_* settings (a ``rindle_settings``), or None."""
    try:
        _validate(
            settings.STREAM_RETENTION_SECONDS,
            settings.STREAM_RETENTION_PERIOD_SECONDS,
            settings.STREAM_RETENTION_BATCH,
            FLOOR,
        )
    except ValueError as exc:
        return str(exc)
    return None


def _validate(age, period, batch_size, floor):
    age = datetime.timedelta(seconds=_seconds(age, "the retention age"))
    floor = datetime.timedelta(seconds=_seconds(floor, "the retention floor"))
    if age < floor:
        raise ValueError(
            f"the retention age {age} is below the {floor} floor: a reader offline for "
            "less than the floor must still be able to catch up without a resnapshot"
        )
    period = _seconds(period, "the retention period")
    if not period > 0:
        raise ValueError(f"the retention period must be positive, not {period!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"the retention batch size must be a positive integer, not {batch_size!r}")
    return age, period, batch_size


@dataclass
class RetentionStats:
    """
    What this process's pruning did (``/metrics``) and the stream ``State`` it last
    saw (``seen``: a later read behind it means the database was swapped for an
    older copy, ``state.check_identity``); updated under ``lock``.
    """

    pruned: int = 0
    batches: int = 0
    runs: int = 0
    failures: int = 0
    epochs_minted: int = 0
    horizon: int = 0
    last_run_at: float = 0.0  # Unix seconds of the last finished run
    last_prune_at: float = 0.0  # Unix seconds of the last batch that deleted rows
    seen: object = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)


@dataclass(frozen=True)
class Batch:
    """One batch: rows deleted, the horizon after it, and whether the prefix is done."""

    pruned: int
    horizon: int
    done: bool


@dataclass(frozen=True)
class Run:
    """One ``run_once``: rows deleted, batches, the horizon after it, a new epoch minted."""

    pruned: int
    batches: int
    horizon: int
    minted: bool


class Retention:
    """
    Prunes the outbox of database alias ``using`` (the seed's ``Retention``).

    Options, each defaulting to its setting:

    - ``age`` (seconds or a timedelta; ``STREAM_RETENTION_SECONDS``): history kept.
      Below the 7-day floor it is refused: ``ValueError`` for an argument,
      ``ImproperlyConfigured`` for the setting.
    - ``period`` (seconds; ``STREAM_RETENTION_PERIOD_SECONDS``): between runs of
      ``run`` and the timer.
    - ``batch_size`` (``STREAM_RETENTION_BATCH``): rows deleted per transaction.
    - ``now``: a callable returning an aware datetime (the clock ``age`` counts
      back from; a test passes a fake one).
    - ``on_prune(stream, horizon)``: called after each batch that deleted rows has
      committed (an exception in it is logged, never stops pruning).
    - ``floor``: TEST ONLY. Lowers the locked floor for a test of a tight retention;
      the settings path and the scheduled runs never pass it.
    - ``stats``: the ``RetentionStats`` to count into (the runtime's for scheduled
      runs; a fresh one otherwise).
    """

    def __init__(
        self,
        using="default",
        *,
        age=None,
        period=None,
        batch_size=None,
        now=None,
        on_prune=None,
        floor=FLOOR,
        stats=None,
    ):
        from ..conf import rindle_settings

        from_settings = age is None
        try:
            self.age, self.period, self.batch_size = _validate(
                rindle_settings.STREAM_RETENTION_SECONDS if age is None else age,
                rindle_settings.STREAM_RETENTION_PERIOD_SECONDS if period is None else period,
                rindle_settings.STREAM_RETENTION_BATCH if batch_size is None else batch_size,
                floor,
            )
        except ValueError as exc:
            if from_settings:
                raise ImproperlyConfigured(f"RINDLE['STREAM_RETENTION_*']: {exc}") from exc
            raise
        self.using = using
        self.now = now or timezone.now
        self.on_prune = on_prune
        self.lock_timeout_ms = rindle_settings.STREAM_FENCE_LOCK_TIMEOUT_MS
        self.stats = stats if stats is not None else RetentionStats()

    def __repr__(self):
        return f"<Retention {self.using!r} age {self.age}>"

    def cutoff(self):
        """Rows stamped before this may go: ``now() - age``."""
        now = self.now()
        if not isinstance(now, datetime.datetime) or timezone.is_naive(now):
            raise ValueError(f"the retention clock must return an aware datetime, not {now!r}")
        return now - self.age

    def check_identity(self):
        """Mint a new epoch if the database was restored (``state.check_identity``)."""
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            current, minted = state.check_identity(cursor, self.stats.seen, self.lock_timeout_ms)
        with self.stats.lock:
            self.stats.seen = current
            self.stats.epochs_minted += minted
        return current, minted

    def step(self, cutoff=None):
        """Delete one batch of the prefix older than ``cutoff`` (default ``cutoff()``)."""
        cutoff = self.cutoff() if cutoff is None else cutoff
        vendor = connections[self.using].vendor
        greatest = "GREATEST" if vendor == "postgresql" else "MAX"
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            if vendor != "postgresql":
                # A write first: a DEFERRED transaction (no IMMEDIATE in OPTIONS) takes
                # the write lock here, waiting, instead of failing on a later upgrade.
                state.ensure(cursor)
            st = state.read(cursor)
            if vendor != "postgresql":
                state.publish(cursor, st.safe_seq)
            cursor.execute(
                f"SELECT seq, created_at FROM {OUTBOX} WHERE seq >= %s AND seq <= %s "
                "ORDER BY seq LIMIT %s",
                [st.horizon, st.safe_seq, self.batch_size + 1],
            )
            rows = cursor.fetchall()
            cut, done = _cut(rows, cutoff, self.batch_size)
            pruned, horizon = 0, st.horizon
            if cut is not None and cut > st.horizon:
                # From the horizon: an index scan then skips the dead entries of the
                # batches before (until vacuum), instead of walking them every batch.
                cursor.execute(
                    f"DELETE FROM {OUTBOX} WHERE seq >= %s AND seq < %s", [st.horizon, cut]
                )
                pruned = cursor.rowcount
                cursor.execute(
                    f"UPDATE {state.TABLE} SET horizon = {greatest}(horizon, %s) "
                    "WHERE name = %s RETURNING horizon",
                    [cut, state.STREAM],
                )
                horizon = int(cursor.fetchone()[0])
        with self.stats.lock:
            self.stats.seen = state.State(st.epoch, st.safe_seq, horizon)
            self.stats.batches += 1
            self.stats.horizon = horizon
            if pruned:
                self.stats.pruned += pruned
                self.stats.last_prune_at = time.time()
        if pruned and self.on_prune is not None:
            try:
                self.on_prune(state.STREAM, horizon)
            except Exception:
                logger.exception("rindle retention: the on_prune callback failed")
        return Batch(pruned, horizon, done)

    def run_once(self, stop=None):
        """
        Check the identity, then prune batch after batch until the prefix older than
        the age is gone (or ``stop``, a ``threading.Event``, is set); a ``Run``.
        """
        try:
            _current, minted = self.check_identity()
            cutoff = self.cutoff()
            pruned = batches = 0
            while True:
                batch = self.step(cutoff)
                pruned += batch.pruned
                batches += 1
                if batch.done or (stop is not None and stop.is_set()):
                    break
        except Exception:
            with self.stats.lock:
                self.stats.failures += 1
            raise
        with self.stats.lock:
            self.stats.runs += 1
            self.stats.last_run_at = time.time()
        if pruned:
            logger.info(
                "rindle retention: pruned %d outbox row(s) in %d batch(es); horizon %d",
                pruned,
                batches,
                batch.horizon,
            )
        return Run(pruned, batches, batch.horizon, minted)


def _cut(rows, cutoff, batch_size):
    """
    ``(cut, done)`` for one batch's rows ``(seq, created_at)`` in seq order: delete
    every seq below ``cut`` (None: nothing); ``done`` when the prefix ends here.
    """
    if not rows:
        return None, True
    for seq, created_at in rows:
        if _aware_utc(created_at) >= cutoff:
            return seq, True  # the first young row: it and everything after it stay
    if len(rows) > batch_size:
        return rows[batch_size][0], False  # a full batch of old rows; more may follow
    return rows[-1][0], True  # every row is old: keep the newest


class RetentionTimer(Periodic):
    """
    A daemon thread running ``retention.run_once`` every ``retention.period`` seconds
    until ``stop()``: the embedded mode's scheduler (``Runtime.start_retention``).

    It checks the database's identity as soon as it starts (a restored database
    gets its new epoch before readers serve long from the old one), then runs
    first after a random delay of at most ``FIRST_RUN_MAX_DELAY_SECONDS`` (or the
    period, if shorter), so a fleet restarted together does not prune in step, and
    a process restarted more often than the period still prunes. A failing run is
    logged and retried at the next one.
    """

    log = logger
    failure = "rindle retention: the run failed; the next one retries"

    def __init__(self, retention):
        super().__init__()
        self.retention = retention
        self.name = f"rindle-retention-{retention.using}"

    def prepare(self):
        try:
            self.retention.check_identity()
        except Exception:
            logger.exception("rindle retention: the identity check failed; the run retries")

    def delays(self):
        period = self.retention.period
        yield random.uniform(0, min(period, FIRST_RUN_MAX_DELAY_SECONDS))
        yield from itertools.repeat(period)

    def step(self):
        self.retention.run_once(self._stop)
