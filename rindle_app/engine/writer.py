"""
The single writer: one write connection, one lock that serializes every use of
it, a request queue, and a thread that serves the queue.

Writing is a role, held by whoever holds the lock. A caller that finds the queue
empty and the lock free runs its own request on the writer connection, with no
thread hop (waking a thread costs more than a SQLite commit). Otherwise the
request waits in the queue, and the writer thread commits what has queued in one
transaction (group commit), each request inside its own savepoint, so every request
stays all-or-nothing.
"""

import asyncio
import itertools
import logging
import queue
import threading
from contextlib import contextmanager
from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from ..exceptions import CALLER_HOLDS_WRITE_LOCK, NESTED_WRITE, TIMEOUT
from ..stream import local
from . import capture
from .errors import EngineClosed, InvalidInput, Overloaded, Unavailable
from .tx import Tx

logger = logging.getLogger("rindle.engine")

_STOP = object()

# SQLite primary result codes that mean the database, not the statement, failed:
# BUSY, LOCKED, NOMEM, READONLY, INTERRUPT, IOERR, CORRUPT, FULL, CANTOPEN, PROTOCOL.
_SQLITE_INFRA_CODES = frozenset({5, 6, 7, 8, 9, 10, 11, 13, 14, 15})


def is_infrastructure_error(exc):
    """
    True for database failures that say nothing about the request itself.

    SQLite reports a missing table or a syntax error as OperationalError too
    (SQLITE_ERROR); those are deterministic, so only the result codes of a busy,
    locked, full or failing database count as infrastructure.
    """
    if isinstance(exc, OperationalError):
        code = getattr(exc.__cause__, "sqlite_errorcode", None)
        return code is None or (code & 0xFF) in _SQLITE_INFRA_CODES
    return isinstance(exc, InterfaceError) or type(exc) is DatabaseError


@dataclass(frozen=True)
class Commit:
    """What a write request returns: its commit version and the request's value."""

    cv: int
    value: object = None


class Request:
    """One write. Its lock is held until the request is finished."""

    __slots__ = ("fn", "fallback", "alone", "_done", "value", "error", "cv")

    def __init__(self, fn, fallback=None, alone=False):
        self.fn = fn
        # fallback(exc) -> a replacement fn, when fn failed alone on its own account.
        self.fallback = fallback
        # Never grouped with other requests: an interrupted SQLite write statement
        # rolls back its whole transaction, which must then hold nothing else.
        self.alone = alone
        # A bare lock is the cheapest one-shot signal between two threads.
        self._done = threading.Lock()
        self._done.acquire()
        self.value = None
        self.error = None
        self.cv = None

    def finish(self, value=None, error=None, cv=None):
        self.value, self.error, self.cv = value, error, cv
        self._done.release()

    def wait(self, timeout):
        if self._done.acquire(timeout=timeout):
            self._done.release()  # later waiters see it finished too
            return True
        return False

    @property
    def finished(self):
        return not self._done.locked()


class Writer:
    """The one writer of a database alias. ``start()`` it; ``close()`` drains it."""

    def __init__(self, using, tables, *, queue_max, group_max, timeout, on_connect):
        self.using = using
        self.vendor = connections[using].vendor
        self._tables = tables
        self._savepoint_ids = itertools.count(1)  # Tx.savepoint names, unique on the connection
        self._queue = queue.SimpleQueue()
        self._held = None  # an ``alone`` request taken off the queue, run next
        self._queue_max = queue_max
        self._group_max = max(1, group_max)
        self._timeout = timeout
        self._on_connect = on_connect
        self._lock = threading.Lock()
        self._holder = None
        self._conn = None
        self._raw = None
        self._prepared = None
        self._thread = None
        self._closed = False
        self._listeners = []
        self._change_listeners = []

    def add_change_listener(self, since, deliver):
        """
        Hand each commit's outbox rows to an in-process reader, sparing it a read.

        Before each commit the writer reads, in its own transaction, every outbox row
        after ``since()`` (the reader's version): on SQLite the write lock orders all
        writers, so these rows are every change up to this commit, other processes'
        included. After the commit it calls ``deliver(start, rows)`` with rows
        ``(seq, table, old, new)``, oldest first, images as stored (JSON text on
        SQLite), on the committing thread: keep it cheap. On PostgreSQL concurrent
        transactions can commit lower seqs later, so nothing is handed over there and
        readers poll.
        """
        if self.vendor == "sqlite":
            self._change_listeners.append((since, deliver))

    def remove_change_listener(self, deliver):
        # ``!=``, not ``is not``: each ``obj.method`` access is a new bound method object.
        self._change_listeners = [(s, d) for s, d in self._change_listeners if d != deliver]

    def add_commit_listener(self, fn):
        """Call ``fn(cv)`` after every commit (on the committing thread; keep it cheap)."""
        self._listeners.append(fn)

    def remove_commit_listener(self, fn):
        if fn in self._listeners:
            self._listeners.remove(fn)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self):
        self._conn = connections.create_connection(self.using)
        # Its commits reach readers through the change and commit listeners, not as
        # "a commit of this process" (stream.local): that would read them again.
        local.exempt(self._conn)
        self._conn.inc_thread_sharing()  # used by whichever thread holds the lock
        self._thread = threading.Thread(
            target=self._serve, name=f"rindle-writer-{self.using}", daemon=True
        )
        self._thread.start()

    @property
    def closed(self):
        return self._closed

    @property
    def queue_depth(self):
        return self._queue.qsize()

    def close(self, timeout=None):
        """Refuse new requests, finish the queued ones, stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout)

    # --- requests -------------------------------------------------------------------------

    def write(self, fn, fallback=None, alone=False):
        """
        Run ``fn(tx)`` in one transaction and return its ``Commit``; ``alone``: in a
        transaction of its own, never grouped with other requests.
        """
        req = Request(fn, fallback, alone)
        if self._holder == threading.get_ident():
            raise InvalidInput("a write request cannot start another write", code=NESTED_WRITE)
        if self._closed or self._thread is None:
            raise EngineClosed("the rindle engine is not running")
        if self.vendor == "sqlite":
            self._refuse_if_caller_holds_the_lock()
        if self._queue.qsize() == 0 and not _in_event_loop() and self._lock.acquire(False):
            self._holder = threading.get_ident()
            try:
                if self._closed:
                    raise EngineClosed("the rindle engine is not running")
                with self._borrowed():
                    self._run_guarded([req])
            finally:
                self._release()
            return self._result(req)
        self._enqueue(req)
        return self.wait(req)

    def _refuse_if_caller_holds_the_lock(self):
        # SQLite has one write lock per file. A caller inside its own IMMEDIATE
        # transaction holds it, so the writer could only wait for the busy timeout.
        own = next(
            (c for c in connections.all(initialized_only=True) if c.alias == self.using), None
        )
        if own is not None and own.in_atomic_block and own.transaction_mode == "IMMEDIATE":
            raise InvalidInput(
                "this thread holds SQLite's write lock in its own transaction.atomic(); "
                "call the engine outside it (e.g. not under ATOMIC_REQUESTS)",
                code=CALLER_HOLDS_WRITE_LOCK,
            )

    def submit(self, fn, fallback=None):
        """Queue ``fn(tx)`` for the writer thread; ``wait()`` on the returned request."""
        if self._closed or self._thread is None:
            raise EngineClosed("the rindle engine is not running")
        req = Request(fn, fallback)
        self._enqueue(req)
        return req

    def wait(self, req):
        if not req.wait(self._timeout):
            raise Unavailable("the write did not complete in time; retry later", code=TIMEOUT)
        return self._result(req)

    def _enqueue(self, req):
        if self._queue.qsize() >= self._queue_max:
            raise Overloaded("the writer queue is full; retry later")
        self._queue.put(req)

    @staticmethod
    def _result(req):
        if req.error is not None:
            raise req.error
        return Commit(req.cv, req.value)

    # --- the lock and the connection ---------------------------------------------------

    def _acquire(self):
        self._lock.acquire()
        self._holder = threading.get_ident()

    def _release(self):
        self._holder = None
        self._lock.release()

    @contextmanager
    def _borrowed(self):
        """Make the writer connection this thread's, so ORM calls in ``fn`` use it."""
        alias = self.using
        own = next((c for c in connections.all(initialized_only=True) if c.alias == alias), None)
        connections[alias] = self._conn
        try:
            yield
        finally:
            if own is None:
                del connections[alias]
            else:
                connections[alias] = own

    def _prepare(self):
        conn = self._conn
        if conn.connection is not None and self._prepared is conn.connection:
            return
        conn.ensure_connection()
        if self.vendor == "sqlite":
            # The writer must hold the write lock from BEGIN: a deferred transaction
            # that reads, then writes, fails outright if another process wrote between.
            conn.transaction_mode = "IMMEDIATE"
        self._on_connect(conn)
        self._prepared = conn.connection
        self._raw = conn.connection.cursor()

    # --- the writer thread -------------------------------------------------------------

    def _serve(self):
        connections[self.using] = self._conn
        try:
            while True:
                first, self._held = self._held or self._queue.get(), None
                if first is _STOP:
                    return
                batch, stop = [first], False
                while not first.alone and len(batch) < self._group_max:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is _STOP:
                        stop = True
                        break
                    if nxt.alone:
                        self._held = nxt
                        break
                    batch.append(nxt)
                self._acquire()
                try:
                    self._run_guarded(batch)
                finally:
                    self._release()
                if stop:
                    return
        finally:
            self._closed = True
            if self._held is not None:
                self._held.finish(error=EngineClosed("the rindle engine closed"))
            while True:  # fail anything that slipped in after the stop marker
                try:
                    req = self._queue.get_nowait()
                except queue.Empty:
                    break
                if req is not _STOP:
                    req.finish(error=EngineClosed("the rindle engine closed"))
            with self._lock:
                self._conn.close()

    def _run_guarded(self, batch):
        try:
            pending = batch
            while pending:
                pending = self._attempt(pending)
        except Exception as exc:  # a bug here must not take the writer down
            logger.exception("rindle writer: unexpected failure")
            for req in batch:
                if not req.finished:
                    req.finish(error=exc)

    def _attempt(self, pending):
        """One transaction over ``pending``; returns the requests still to run."""
        outcomes = []
        culprit = None
        solo = len(pending) == 1
        try:
            self._prepare()
            with transaction.atomic(using=self.using):
                tx = Tx(self._conn, self._raw, self._tables, solo, self._savepoint_ids)
                for req in pending:
                    try:
                        if solo:  # the transaction itself is the request's atomic unit
                            outcomes.append((req, req.fn(tx), None))
                        else:
                            with tx.savepoint():
                                outcomes.append((req, req.fn(tx), None))
                    except Exception as exc:
                        if solo or is_infrastructure_error(exc):
                            culprit = req
                            raise
                        outcomes.append((req, None, exc))
                feed = self._read_feed(tx) if self._change_listeners else None
                if feed is not None:
                    cv = feed[1][-1][0] if feed[1] else feed[0]
                else:
                    cv = tx.cv if solo and tx.cv is not None else self._high_water(tx)
        except Exception as exc:
            return self._recover(pending, culprit, exc)
        if feed is not None:
            for _since, deliver in tuple(self._change_listeners):
                try:
                    deliver(*feed)
                except Exception:  # a reader's bug must not fail a committed write
                    logger.exception("rindle writer: change listener failed")
        for req, value, exc in outcomes:
            req.finish(value=value, error=exc, cv=cv)
        for listener in tuple(self._listeners):
            try:
                listener(cv)
            except Exception:  # a listener's bug must not fail a committed write
                logger.exception("rindle writer: commit listener failed")
        return []

    def _read_feed(self, tx):
        start = min(since() for since, _deliver in self._change_listeners)
        return start, tx.fetchall(
            f'SELECT seq, "table", old, new FROM {capture.OUTBOX} WHERE seq > %s ORDER BY seq',
            [start],
        )

    @staticmethod
    def _high_water(tx):
        return tx.scalar(f"SELECT COALESCE(MAX(seq), 0) FROM {capture.OUTBOX}")

    def _recover(self, pending, culprit, exc):
        if is_infrastructure_error(exc):
            logger.warning("rindle writer: database error: %s", exc)
            self._conn.close_if_unusable_or_obsolete()
            error = Unavailable(f"database unavailable: {exc}")
            if culprit is None:  # the commit itself failed: nothing landed
                for req in pending:
                    req.finish(error=error)
                return []
            culprit.finish(error=error)
            return [r for r in pending if r is not culprit]
        if len(pending) > 1:
            # The commit failed for a reason of the requests' own (SQLite and Postgres
            # check deferred foreign keys at COMMIT): run each alone to find whose.
            for req in pending:
                self._run_guarded([req])
            return []
        (req,) = pending
        fallback = req.fallback(exc) if req.fallback is not None else None
        if fallback is None:
            req.finish(error=exc)
            return []
        req.fn, req.fallback = fallback, None
        return [req]


def _in_event_loop():
    # Django refuses database calls from a thread running an event loop; such a
    # caller waits for the writer thread instead.
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
