"""
The change stream's doorbell: what a waiting long-poll or event stream of
``GET /v1/stream`` blocks on until the published ``safe_seq`` moves, instead of
re-reading the state row on a timer.

A ``Bell`` is rung by its source, started with it:

- on PostgreSQL a ``notify.Listener`` on the watermarker's channel
  (``rindle_watermark``): the watermarker notifies in the transaction that
  advances ``safe_seq``, with the new value as payload, so a ring says "safe_seq is
  now at least N";
- on SQLite a ``wake.CommitWatcher`` (inotify on the ``-wal`` file): it rings when
  the outbox holds a seq above the greatest the bell knows (``safe_seq`` is simply
  the greatest seq there), whoever committed it;
- nothing where neither runs (``SQLITE_WAKE = "poll"``, an in-memory database):
  ``live`` is False and the waiters' own poll is all there is.

A waiter holds a ``Turn`` (``enter``) and calls ``turn.wait(epoch, safe_seq,
timeout)`` with what its last read saw. It returns at once when the bell already
knows of a greater safe_seq (a ring between the read and the wait is never lost),
else when a ring brings one, when a ring without a value comes (the listener has
just (re)connected), or at the timeout. The caller reads again after each return,
so the timeout is its safety-net poll (``WAKE_POLL_INTERVAL`` where the bell is
live): a lost notification costs a delay, never an event. What a waiter read is
also what the bell knows (``observe``): a greater value wakes the others, and the
watcher rings only above it, so a commit nobody has read yet always rings. A new
epoch (a flushed or restored database) starts the count again. Each value wakes a
waiter at most once, so a bell that knows more than the reads show (a numbering
that went back without a new epoch) costs one extra read, not a busy loop.

Bounded waiters: each waiting request holds a thread (WSGI, the long-poll) or a
task (ASGI event streams), so ``enter`` admits at most ``max_waiters`` turns at
once (``STREAM_LONG_POLL_MAX_WAITERS``, read at each ``enter``) and refuses the
next with ``StreamBusy`` (503 ``stream_busy``, ``Retry-After``). ``Turn.release``
gives the place back; it is idempotent, and a ``with`` block calls it.

Threading model: ``ring`` is called on the source's thread, ``wait`` on the
request's thread and ``wait_async`` on an event loop; one ``threading.Condition``
guards the counters, and an async waiter's future is resolved on its own loop
(``call_soon_threadsafe``). The bell belongs to the runtime (``Runtime.bell``):
started on first use, closed by ``shutdown()``.
"""

import asyncio
import logging
import threading
import time

from django.db import connections

from ..exceptions import StreamBusy

logger = logging.getLogger("rindle.stream")


def settings_problem(settings):
    """What is wrong with STREAM_LONG_POLL_MAX_WAITERS (of a ``rindle_settings``), or None."""
    value = settings.STREAM_LONG_POLL_MAX_WAITERS
    if type(value) is not int or value < 1:
        return f"STREAM_LONG_POLL_MAX_WAITERS must be a positive integer, not {value!r}"
    return None


def max_waiters():
    """``RINDLE["STREAM_LONG_POLL_MAX_WAITERS"]``; ``ImproperlyConfigured`` when unusable."""
    from django.core.exceptions import ImproperlyConfigured

    from ..conf import rindle_settings

    problem = settings_problem(rindle_settings)
    if problem is not None:
        raise ImproperlyConfigured(f"{problem} (check rindle.E034)")
    return rindle_settings.STREAM_LONG_POLL_MAX_WAITERS


class Bell:
    """Rung when safe_seq moves; admits and wakes the stream's waiters (see the module)."""

    def __init__(self, using="default", *, max_waiters=None):
        self.using = using
        self.max_waiters = max_waiters  # None: STREAM_LONG_POLL_MAX_WAITERS at each enter
        self._cond = threading.Condition()
        self.rings = 0  # every ring, with a value or not
        self.latest = 0  # the greatest safe_seq known (a ring's or a waiter's read)
        self.epoch = None  # the numbering ``latest`` is in (a waiter's read tells)
        self.waiting = 0  # turns held now
        self.refused = 0  # enters refused at the cap
        self._futures = {}  # an async waiter's future -> its loop
        self._source = None
        self._watcher = None
        self.closed = False

    def __repr__(self):
        return f"<Bell {self.using!r} {self.source or 'no source'} waiting={self.waiting}>"

    # --- the source ----------------------------------------------------------------

    def start(self):
        """Start the source for the database's vendor (see the module); returns self."""
        vendor = connections[self.using].vendor
        if vendor == "postgresql":
            from .notify import WATERMARK_CHANNEL, Listener

            self._source = Listener(
                self.using, self.ring, (WATERMARK_CHANNEL,), on_notify=self._notified
            ).start()
        elif vendor == "sqlite":
            from . import wake

            try:
                self._watcher = wake.watch(self.using, self._known, self._committed)
            except ValueError:  # a bad SQLITE_WAKE: check E031 says so; the waiters poll
                logger.exception("rindle bell: no wake-up; the stream's waiters poll")
            self._source = self._watcher
        return self

    @property
    def source(self):
        """ "listen" (PostgreSQL), "inotify" (SQLite) or None: only the poll wakes waiters."""
        if self._source is None:
            return None
        return "inotify" if self._watcher is not None else "listen"

    @property
    def live(self):
        return self._source is not None and not self.closed

    def close(self):
        """Stop the source and wake every waiter (they read once more and end by their deadline)."""
        self.closed = True
        source, self._source, self._watcher = self._source, None, None
        if source is not None:
            source.close()
        self.ring()

    def _notified(self, notify):
        try:
            seq = int(notify.payload)
        except (TypeError, ValueError):
            seq = None
        self.ring(seq)

    def _known(self):
        return self.latest  # the watcher's thread: one attribute read

    def _committed(self):
        watcher = self._watcher
        self.ring(None if watcher is None else watcher.newest)

    # --- ringing -------------------------------------------------------------------

    def ring(self, seq=None):
        """safe_seq moved (to at least ``seq`` when given): wake the waiters."""
        with self._cond:
            self.rings += 1
            if seq is not None and seq > self.latest:
                self.latest = seq
            self._wake_all()

    def observe(self, epoch, seq):
        """A waiter read ``safe_seq`` ``seq`` in ``epoch``: what the bell knows from now on."""
        with self._cond:
            self._observe(epoch, seq)

    def _observe(self, epoch, seq):
        if epoch != self.epoch:  # another numbering: what was known does not compare
            self.epoch, self.latest = epoch, seq
            self._wake_all()
        elif seq > self.latest:
            self.latest = seq
            self._wake_all()

    def _wake_all(self):
        self._cond.notify_all()
        for future, loop in list(self._futures.items()):
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # its loop closed: nobody waits on it any more
                self._futures.pop(future, None)

    def mark(self):
        """The ring count now: take it before the read a ``Turn`` will wait after."""
        return self.rings

    # --- the waiters ---------------------------------------------------------------

    def enter(self, mark=None):
        """
        A ``Turn`` at the bell, or ``StreamBusy`` when ``max_waiters`` turns are held.
        ``mark`` (``mark()`` before the caller's last read) makes a ring since then
        wake its first wait.
        """
        limit = max_waiters() if self.max_waiters is None else self.max_waiters
        with self._cond:
            if self.waiting >= limit:
                self.refused += 1
                raise StreamBusy(
                    f"this server already holds {limit} waiting stream requests "
                    "(STREAM_LONG_POLL_MAX_WAITERS); retry, or read without wait",
                    limit=limit,
                )
            self.waiting += 1
            first = self.waiting == 1
            watcher = self._watcher
            if first and watcher is not None:
                watcher.arm()  # commits wake the bell while anyone waits
        return Turn(self, self.rings if mark is None else mark)

    def _leave(self):
        with self._cond:
            self.waiting -= 1
            watcher = self._watcher
            if self.waiting == 0 and watcher is not None:
                watcher.disarm()


class Turn:
    """One waiting request's place at a ``Bell`` (see the module); release it once done."""

    def __init__(self, bell, mark):
        self.bell = bell
        self.mark = mark
        self.floor = 0  # the ``latest`` this turn already woke for
        self.released = False
        self.wakes = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def release(self):
        """Give the place back (idempotent)."""
        if not self.released:
            self.released = True
            self.bell._leave()

    def _due(self, seq):
        bell = self.bell
        return bell.rings != self.mark or bell.latest > max(seq, self.floor)

    def _woken(self, seq):
        bell = self.bell
        woke = self._due(seq)
        self.mark, self.floor = bell.rings, bell.latest
        self.wakes += woke
        return woke

    def wait(self, epoch, seq, timeout):
        """
        Block until the bell knows of a safe_seq above ``seq`` (what the caller's last
        read in ``epoch`` saw), or a ring came since the last wait, or ``timeout``
        seconds; True when woken, False at the timeout. Read again either way.
        """
        bell = self.bell
        deadline = time.monotonic() + timeout
        with bell._cond:
            bell._observe(epoch, seq)
            while not self._due(seq):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                bell._cond.wait(remaining)
            return self._woken(seq)

    async def wait_async(self, epoch, seq, timeout):
        """``wait`` on an event loop: the task waits, no thread does."""
        bell = self.bell
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with bell._cond:
            bell._observe(epoch, seq)
            if self._due(seq):
                return self._woken(seq)
            bell._futures[future] = loop
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            pass
        finally:
            with bell._cond:
                bell._futures.pop(future, None)
        with bell._cond:
            return self._woken(seq)


def _resolve(future):
    if not future.done():
        future.set_result(None)
