"""
The engine: one per process (per database alias), owning the single writer.

One thread holds the one write connection and serves a queue of requests. Each
request runs in its own savepoint; the requests queued together commit in one
transaction (group commit), so every request stays all-or-nothing while a burst
of writers shares one commit. The caller receives the commit version (cv): the
outbox high-water mark once its transaction is visible.
"""

import atexit
import logging
import os
import queue
import threading
import uuid
from dataclasses import dataclass

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction

from ..conf import rindle_settings
from . import capture
from .errors import EngineClosed, Overloaded, Unavailable
from .tables import TableMap, create_table_sql, introspect
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


class _Request:
    """One queued write. ``_done`` is held until the writer finishes the request."""

    __slots__ = ("fn", "fallback", "_done", "value", "error", "cv")

    def __init__(self, fn, fallback=None):
        self.fn = fn
        # fallback(exc) -> a replacement fn, for when fn's own commit fails.
        self.fallback = fallback
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


class Engine:
    """
    The single writer of one database alias, and its table map.

    Start it with ``start()`` (``get_engine()`` does so lazily); ``close()`` drains
    every queued request, then stops the thread and closes its connection.
    """

    def __init__(self, using=None):
        self.using = using or rindle_settings.DATABASE
        self.vendor = connections[self.using].vendor
        self.boot_id = uuid.uuid4().hex
        self.tables = TableMap()
        self._queue = queue.SimpleQueue()
        self._queue_max = int(rindle_settings.WRITER_QUEUE_SIZE)
        self._group_max = max(1, int(rindle_settings.GROUP_COMMIT_MAX))
        self._timeout = float(rindle_settings.WRITE_TIMEOUT)
        self._thread = None
        self._state_lock = threading.Lock()
        self._closed = False
        self._prepared = None
        self._raw = None

    # --- lifecycle -----------------------------------------------------------------

    @property
    def closed(self):
        return self._closed

    def start(self):
        """Start the writer thread and register the bookkeeping and synced tables."""
        with self._state_lock:
            if self._thread is not None:
                return self
            self._thread = threading.Thread(
                target=self._loop, name=f"rindle-writer-{self.using}", daemon=True
            )
            self._thread.start()
        try:
            self.refresh()
        except BaseException:
            self.close()
            raise
        return self

    def refresh(self):
        """(Re-)register the client-mutation ledger and every synced model's table."""
        from .registry import synced_models

        self.register_existing_table("_rindle_client_mutations")
        for model in synced_models():
            self.register_existing_table(model._meta.db_table, model=model)

    def close(self, timeout=None):
        """Refuse new requests, finish the queued ones, stop the writer."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is not None:
            self._queue.put(_STOP)
            thread.join(timeout)

    # --- requests ------------------------------------------------------------------

    def write(self, fn):
        """
        Run ``fn(tx)`` in one transaction on the writer; return ``Commit(cv, value)``.

        An exception raised by ``fn`` rolls back its effects and is re-raised here.
        A database failure raises ``Unavailable`` (retryable; nothing was written;
        see ``Unavailable`` for the one exception, a timeout).
        """
        return self.wait(self.submit(fn))

    def submit(self, fn, fallback=None):
        """
        Queue ``fn(tx)``; ``wait()`` on the returned request for its ``Commit``.

        ``fallback(exc)``, if given, is asked for a replacement of ``fn`` when the
        commit of ``fn``'s transaction fails on its own account (not the database's).
        """
        if self._closed or self._thread is None:
            raise EngineClosed("the rindle engine is not running")
        if self._queue.qsize() >= self._queue_max:
            raise Overloaded("the writer queue is full; retry later")
        req = _Request(fn, fallback)
        self._queue.put(req)
        return req

    def wait(self, req):
        if not req.wait(self._timeout):
            raise Unavailable("the write did not complete in time; retry later", code="timeout")
        if req.error is not None:
            raise req.error
        return Commit(req.cv, req.value)

    # --- the table map ----------------------------------------------------------

    def register_table(self, table, columns, pk, col_types):
        """Create ``table`` if absent (pk: column indexes) and register it. Idempotent."""
        sql = create_table_sql(table, list(columns), list(pk), list(col_types))

        def create(tx):
            tx.execute(sql)

        self.write(create)
        return self.register_existing_table(table)

    def register_existing_table(self, table, *, model=None):
        """Register a table that exists: introspect it and (re)install its capture."""

        def register(tx):
            conn = connections[self.using]
            t = introspect(conn, tx.cursor, table, model=model)
            capture.install(tx.cursor, self.vendor, t)
            return t

        t = self.write(register).value
        self.tables.put(t)
        return t

    def base_table_schemas(self):
        """Registered client-visible tables (sorted; no ``_rindle_*``/``__*``/``sqlite_*``)."""
        return self.tables.base_table_schemas()

    def foreign_key_audit(self, max_rows=1000):
        """Report rows violating any declared foreign key of a registered table."""
        from .audit import foreign_key_audit

        return foreign_key_audit(self, max_rows)

    # --- client mutations ------------------------------------------------------------

    def mutate(self, client_id, mid, name, args, user=None):
        """Apply one client mutation exactly once; see ``engine.mutations``."""
        from .mutations import mutate

        return mutate(self, client_id, mid, name, args, user)

    def client_lmid(self, client_id):
        """The durably stored last mutation id of ``client_id`` (0 if new)."""
        from .mutations import client_lmid

        return client_lmid(self.using, client_id)

    # --- the writer thread -------------------------------------------------------------

    def _loop(self):
        conn = connections[self.using]
        try:
            while True:
                first = self._queue.get()
                if first is _STOP:
                    return
                batch, stop = [first], False
                while len(batch) < self._group_max:
                    try:
                        nxt = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if nxt is _STOP:
                        stop = True
                        break
                    batch.append(nxt)
                try:
                    self._run_group(conn, batch)
                except Exception as exc:  # a bug here must not take the writer down
                    logger.exception("rindle writer: unexpected failure")
                    for req in batch:
                        if not req.finished:
                            req.finish(error=exc)
                if stop:
                    return
        finally:
            self._closed = True
            while True:  # fail anything that slipped in after the stop marker
                try:
                    req = self._queue.get_nowait()
                except queue.Empty:
                    break
                if req is not _STOP:
                    req.finish(error=EngineClosed("the rindle engine closed"))
            conn.close()

    def _prepare(self, conn):
        if conn.connection is not None and self._prepared is conn.connection:
            return
        conn.ensure_connection()
        if self.vendor == "sqlite":
            # The writer must hold the write lock from BEGIN: a deferred transaction
            # that reads, then writes, fails outright if another process wrote between.
            conn.transaction_mode = "IMMEDIATE"
            with conn.cursor() as cur:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute(f"PRAGMA synchronous={_sqlite_sync()}")
                cur.execute(f"PRAGMA busy_timeout={int(rindle_settings.SQLITE_BUSY_TIMEOUT_MS)}")
        self._prepared = conn.connection
        self._raw = conn.connection.cursor()

    def _run_group(self, conn, batch):
        """Commit ``batch`` together; isolate any request whose failure sinks the commit."""
        pending = batch
        while pending:
            pending = self._attempt(conn, pending)

    def _attempt(self, conn, pending):
        """One transaction over ``pending``; returns the requests still to run."""
        outcomes = []
        culprit = None
        solo = len(pending) == 1
        try:
            self._prepare(conn)
            with transaction.atomic(using=self.using):
                tx = Tx(conn, self._raw, self.tables)
                if self.vendor == "postgresql":
                    # Django declares foreign keys DEFERRABLE INITIALLY DEFERRED; checked
                    # per statement, a violation fails inside its own request.
                    tx.run("SET CONSTRAINTS ALL IMMEDIATE")
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
                cv = tx.scalar(f"SELECT COALESCE(MAX(seq), 0) FROM {capture.OUTBOX}")
        except Exception as exc:
            return self._recover(conn, pending, culprit, exc)
        for req, value, exc in outcomes:
            req.finish(value=value, error=exc, cv=cv)
        return []

    def _recover(self, conn, pending, culprit, exc):
        if is_infrastructure_error(exc):
            logger.warning("rindle writer: database error: %s", exc)
            conn.close_if_unusable_or_obsolete()
            error = Unavailable(f"database unavailable: {exc}")
            if culprit is None:  # the commit itself failed: nothing landed
                for req in pending:
                    req.finish(error=error)
                return []
            culprit.finish(error=error)
            return [r for r in pending if r is not culprit]
        if culprit is not None:  # a lone request raised: its rollback was the txn's
            culprit.finish(error=exc)
            return []
        # The commit failed for a reason of the requests' own (SQLite checks deferred
        # foreign keys at COMMIT): run each alone to find out whose it is.
        if len(pending) > 1:
            for req in pending:
                self._run_group(conn, [req])
            return []
        (req,) = pending
        fallback = req.fallback(exc) if req.fallback is not None else None
        if fallback is None:
            req.finish(error=exc)
            return []
        req.fn, req.fallback = fallback, None
        return [req]


def _sqlite_sync():
    value = str(rindle_settings.SQLITE_SYNCHRONOUS).upper()
    if value not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"invalid RINDLE['SQLITE_SYNCHRONOUS']: {value!r}")
    return value


# --- the process's engines ---------------------------------------------------------------

_engines = {}
_engines_lock = threading.Lock()


def get_engine(using=None):
    """The running engine of ``using`` in this process, started on first use."""
    using = using or rindle_settings.DATABASE
    engine = _engines.get(using)
    if engine is not None and not engine.closed:
        return engine
    with _engines_lock:
        engine = _engines.get(using)
        if engine is None or engine.closed:
            engine = Engine(using).start()
            _engines[using] = engine
        return engine


def running_engine(using=None):
    """The engine of ``using`` if one is running in this process, else None."""
    engine = _engines.get(using or rindle_settings.DATABASE)
    return engine if engine is not None and not engine.closed else None


def shutdown(timeout=None):
    """Close every engine of this process, draining their queues."""
    with _engines_lock:
        engines = list(_engines.values())
        _engines.clear()
    for engine in engines:
        engine.close(timeout)


def _after_fork_in_child():
    # The writer thread does not survive fork(); the child starts its own lazily.
    _engines.clear()


atexit.register(shutdown)
os.register_at_fork(after_in_child=_after_fork_in_child)
