"""
The engine: one per process (per database alias), owning the single writer and
the table map. Every write plane goes through it, so admission, dedup and
compare-and-swap decisions are race-free.

Threading model. Any thread may call ``write``, ``submit``/``wait`` and the planes
built on them; each blocks its caller until the writer has committed (up to
``WRITE_TIMEOUT``), so an event loop's thread may not call them: they raise
``SynchronousOnlyOperation`` there, as Django's ORM does, instead of stalling every
socket of the loop (call them through ``sync_to_async``/``database_sync_to_async``;
``DJANGO_ALLOW_ASYNC_UNSAFE`` lifts the refusal, as for the ORM). The writer thread
(``writer.py``) owns the write connection; commit listeners run on the committing
thread. The table map is replaced under its own lock and read without one.
``get_engine()`` is a delegate of the runtime (``rindle_app/runtime.py``), which
starts and stops the engine.
"""

import asyncio
import os
import threading
import uuid

from django.core.exceptions import SynchronousOnlyOperation

from ..conf import rindle_settings
from . import capture
from .census import PRODUCER_OFFSETS, ProducerCensus
from .rooms import ANY_EPOCH, lifecycle_tables
from .tables import TableMap, create_table_sql, introspect
from .writer import Commit, Writer, is_infrastructure_error

__all__ = ["Commit", "Engine", "get_engine", "is_infrastructure_error", "running_engine"]


class Engine:
    """
    The single writer of one database alias, and its table map.

    Start it with ``start()`` (``get_engine()`` does so lazily); ``close()`` drains
    every queued request, then stops the writer and closes its connection.
    """

    def __init__(self, using=None):
        self.using = using or rindle_settings.DATABASE
        self.boot_id = uuid.uuid4().hex
        self.tables = TableMap()
        self._writer = Writer(
            self.using,
            self.tables,
            queue_max=int(rindle_settings.WRITER_QUEUE_SIZE),
            group_max=int(rindle_settings.GROUP_COMMIT_MAX),
            timeout=float(rindle_settings.WRITE_TIMEOUT),
            on_connect=_configure_connection,
        )
        self.vendor = self._writer.vendor
        self._state_lock = threading.Lock()
        self._started = False
        self._schema_listeners = []
        self._ddl_seen = None  # the outbox version follow_schema has looked up to
        self._ddl_checked = 0.0  # when it last looked (monotonic)
        # table -> the model it was registered with, beyond the synced ones: a re-read
        # (reload_tables) keeps typing its columns from it (engine.values).
        self._models = {}
        self._attachments = {}
        # Distinct foreign producers; seeded at start, read lock-free by /metrics.
        self.producer_census = ProducerCensus()

    # --- lifecycle -----------------------------------------------------------------

    @property
    def closed(self):
        return self._writer.closed

    @property
    def queue_depth(self):
        """Requests waiting for the writer thread right now."""
        return self._writer.queue_depth

    def start(self):
        """Start the writer and register the bookkeeping and synced tables."""
        with self._state_lock:
            if self._started:
                return self
            self._started = True
            self._writer.start()
        try:
            self._ddl_seen = self._outbox_version()  # before the table map is read
            self.refresh()
            self.producer_census.seed(self.using)
        except BaseException:
            self.close()
            raise
        return self

    def refresh(self):
        """(Re-)register the client-mutation ledger and every synced model's table."""
        from .mutations import LEDGER, OWNER_COLUMN, install_ledger_functions
        from .registry import synced_models

        self.write(install_ledger_functions)
        self.register_existing_table(LEDGER, private=(OWNER_COLUMN,))
        self.register_existing_table(PRODUCER_OFFSETS)  # replicated data: captured
        for table in lifecycle_tables():  # subscribable through leases, never in /schema
            self.register_existing_table(table)
        for model in synced_models():
            self.register_existing_table(model._meta.db_table, model=model)

        # Tables created by journaled migrations stay registered across restarts.
        from .journal import restore_tables

        restore_tables(self)

    def follow_schema(self):
        """
        Re-read the tables another process's migration changed, in a process whose
        live queries do not follow the outbox (no schema listener: no hub yet, say a
        process serving HTTP only): its ``/schema`` and SSR reads call it, so they
        learn of a committed migration within ``WAKE_POLL_INTERVAL``. It looks at most
        once per interval, at the DDL markers past what it saw (``stream.reader``). A
        process with live queries is left alone: its tail meets each marker in order
        with the changes around it, and bounces the subscriptions it affects.
        """
        import time

        if self._schema_listeners:
            return
        now = time.monotonic()
        if now - self._ddl_checked < float(rindle_settings.WAKE_POLL_INTERVAL):
            return
        self._ddl_checked = now
        from ..stream.reader import ddl_since

        if self._ddl_seen is None:  # the outbox could not be read at start: re-read all
            version = self._outbox_version()
            if version is not None and not self._schema_listeners:
                self.reload_tables([t.name for t in self.tables])
                self._ddl_seen = version
            return
        names, version = ddl_since(self.using, self._ddl_seen)
        if names and not self._schema_listeners:
            self.reload_tables(names)
        self._ddl_seen = max(self._ddl_seen, version)

    def _outbox_version(self):
        """The published safe_seq now, or None when it cannot be read (no migrate yet)."""
        from django.db import DatabaseError

        from ..stream.reader import consistent_read

        try:  # (a flushed database has no state row: consistent_read makes it)
            return consistent_read(self.using, lambda cursor, state: None, fresh=True)[0].safe_seq
        except DatabaseError:
            return None

    def add_schema_listener(self, fn):
        """Call ``fn(table name)`` when a registered table's definition changes."""
        self._schema_listeners.append(fn)

    def remove_schema_listener(self, fn):
        if fn in self._schema_listeners:
            self._schema_listeners.remove(fn)

    def close(self, timeout=None):
        """Refuse new requests, finish the queued ones, stop the writer."""
        self._writer.close(timeout)

    def attachment(self, key, factory):
        """
        The object ``factory(engine)`` kept under ``key`` for this engine's lifetime,
        made on first use (the interactive SQL transactions: they end with it).
        """
        found = self._attachments.get(key)
        if found is None:
            with self._state_lock:
                found = self._attachments.get(key)
                if found is None:
                    found = self._attachments[key] = factory(self)
        return found

    # --- requests ------------------------------------------------------------------

    def write(self, fn, fallback=None, alone=False):
        """
        Run ``fn(tx)`` in one transaction on the writer; return ``Commit(cv, value)``.

        An exception raised by ``fn`` rolls back its effects and is re-raised here.
        A database failure raises ``Unavailable`` (retryable; nothing was written;
        see ``Unavailable`` for the one exception, a timeout). ``fallback(exc)``, if
        given, may return a replacement for ``fn`` when ``fn`` failed on its own.
        ``alone``: in a transaction of its own, never grouped with other requests.
        Raises ``SynchronousOnlyOperation`` on an event loop's thread.
        """
        _refuse_on_event_loop("write")
        return self._writer.write(fn, fallback, alone)

    def add_commit_listener(self, fn):
        """Call ``fn(cv)`` right after each commit of this engine (keep it cheap)."""
        self._writer.add_commit_listener(fn)

    def remove_commit_listener(self, fn):
        self._writer.remove_commit_listener(fn)

    def add_change_listener(self, since, deliver):
        """Hand each commit's outbox rows to an in-process reader (see ``Writer``)."""
        self._writer.add_change_listener(since, deliver)

    def remove_change_listener(self, deliver):
        self._writer.remove_change_listener(deliver)

    def submit(self, fn, fallback=None):
        """Queue ``fn(tx)`` for the writer thread; ``wait()`` on the result."""
        return self._writer.submit(fn, fallback)

    def wait(self, request):
        """The ``Commit`` of a submitted request (raises what it raised)."""
        _refuse_on_event_loop("wait")
        return self._writer.wait(request)

    # --- the table map ----------------------------------------------------------

    def register_table(self, table, columns, pk, col_types):
        """Create ``table`` if absent (pk: column indexes) and register it. Idempotent."""
        sql = create_table_sql(table, list(columns), list(pk), list(col_types))
        self.write(lambda tx: tx.execute(sql))
        return self.register_existing_table(table)

    def register_existing_table(self, table, *, model=None, private=()):
        """
        Register a table that exists: introspect it and (re)install its capture.
        ``private`` columns stay in the table map (live queries may filter on them)
        but are never sent to a client.
        """

        def register(tx):
            t = introspect(tx.connection, tx.cursor, table, model=model, private=private)
            capture.install(tx.cursor, self.vendor, t)
            return t

        t = self.write(register).value
        if model is not None:
            self._models[table] = model
        before = self.tables.put(t)
        if before is not None and before != t:
            for listener in tuple(self._schema_listeners):
                listener(t.name)
        return t

    def reload_tables(self, names):
        """
        Re-read the definitions of tables ``names`` from the database, on one
        connection of its own and without the writer (a reader that met a DDL marker
        calls it, possibly on the writer's thread: ``engine.schema_changes``; the live
        queries call it for every table when they hydrate). A changed definition
        replaces the registered one and the schema listeners are told, so only the
        subscriptions on it are bounced; a table that is gone is forgotten. A table
        this engine neither registers nor syncs is left alone (another deployment's,
        or not synced here).
        """
        from django.db import connections

        from .errors import UnknownTable
        from .journal import journaled_tables
        from .schema_changes import synced_tables

        synced = synced_tables()
        read, gone = [], []
        conn = connections.create_connection(self.using)
        try:
            with conn.cursor() as cursor:
                journaled = None
                for name in dict.fromkeys(names):
                    current = self.tables.by_name().get(name)
                    model = synced.get(name) or self._models.get(name)
                    if current is None and model is None:
                        if journaled is None:
                            journaled = set(journaled_tables(conn, cursor))
                        if name not in journaled:
                            continue
                    private = () if current is None else current.private
                    try:
                        read.append(introspect(conn, cursor, name, model=model, private=private))
                    except UnknownTable:
                        gone.append(name)
        finally:
            conn.close()
        for t in read:
            before = self.tables.put(t)
            if before != t:
                for listener in tuple(self._schema_listeners):
                    listener(t.name)
        for name in gone:
            self.forget_table(name)

    def forget_table(self, table):
        """Unregister a table that was dropped; its subscriptions are bounced."""
        self._models.pop(table, None)
        if self.tables.discard(table) is not None:
            for listener in tuple(self._schema_listeners):
                listener(table)

    def base_table_schemas(self):
        """Registered client-visible tables (sorted; no ``_rindle_*``/``__*``/``sqlite_*``)."""
        return self.tables.base_table_schemas()

    def foreign_key_audit(self, max_rows=1000):
        """Report rows violating any declared foreign key of a registered table."""
        from .audit import foreign_key_audit

        return foreign_key_audit(self, max_rows)

    # --- client mutations ------------------------------------------------------------

    def mutate(self, client_id, mid, name, args, user=None, *, owner=None, request=None):
        """Apply one client mutation exactly once; see ``engine.mutations``."""
        from .mutations import mutate

        return mutate(self, client_id, mid, name, args, user, owner=owner, request=request)

    def check_owner(self, client_id, owner):
        """Raise ``ClientIdTaken`` if ``client_id`` belongs to another principal."""
        from .mutations import check_owner

        check_owner(self.using, client_id, owner)

    # --- foreign producers and change sources ------------------------------------------

    def producer_write(self, producer, seq, changes, owner=None):
        """Apply a producer's sequenced write exactly once; see ``engine.producers``."""
        from .producers import producer_write

        return producer_write(self, producer, seq, changes, owner)

    def producer_seq(self, producer, owner=None):
        """The durable last seq ``producer`` wrote (0 if new)."""
        from .producers import producer_seq

        return producer_seq(self.using, producer, owner)

    def seed_producer_census(self):
        """Re-read the distinct-producer count from the table (after a restore)."""
        self.producer_census.seed(self.using)

    def apply_source_batch(self, source, offset, changes, **position):
        """Apply a change-source batch with its cursor in one transaction; see ``sources``."""
        from .sources import apply_source_batch

        return apply_source_batch(self, source, offset, changes, **position)

    def commit_follower_txn(self, source, offset, chunks, **position):
        """Apply streamed chunks and the cursor in one open transaction; see ``sources``."""
        from .sources import commit_follower_txn

        return commit_follower_txn(self, source, offset, chunks, **position)

    def refresh_follower_run_id(self, source, offset, previous_run_id, next_run_id):
        """Compare-and-swap a source's run id at an unchanged cursor."""
        from .sources import refresh_run_id

        return refresh_run_id(self, source, offset, previous_run_id, next_run_id)

    def claim_room_epoch(self, doc, host=None, expect=ANY_EPOCH):
        """
        Bump ``doc``'s placement epoch once and return it; with ``expect``, only from
        that epoch (None: never claimed), else None. See ``engine.rooms``.
        """
        from .rooms import claim_room_epoch

        return claim_room_epoch(self, doc, host, expect)

    def room_placement(self, doc):
        """``(epoch, host)`` of ``doc`` (``(None, None)``: never claimed)."""
        from .rooms import room_placement

        return room_placement(self.using, doc)

    def room_epoch(self, doc):
        """``doc``'s committed placement epoch (None: never claimed)."""
        from .rooms import room_epoch

        return room_epoch(self.using, doc)

    def room_lmids(self, doc, clients):
        """The room ledger's lmid per client under ``doc`` (absent: 0)."""
        from .rooms import room_lmids

        return room_lmids(self.using, doc, clients)

    def commit_room_flush(self, changes, source, offset, **room):
        """Apply a room flush (fence, identity, CAS, ledger) in one transaction."""
        from .rooms import commit_room_flush

        return commit_room_flush(self, changes, source, offset, **room)

    def source_checkpoint(self, source):
        """The stored checkpoint of ``source`` (None if it never applied)."""
        from .sources import source_checkpoint

        return source_checkpoint(self.using, source)

    def client_lmid(self, client_id):
        """The durably stored last mutation id of ``client_id`` (0 if new)."""
        from .mutations import client_lmid

        return client_lmid(self.using, client_id)


def _refuse_on_event_loop(method):
    """Raise ``SynchronousOnlyOperation`` on an event loop's thread (see the module)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    if os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    raise SynchronousOnlyOperation(
        f"Engine.{method}() waits for the writer (up to WRITE_TIMEOUT) and would block "
        "this event loop: call it from a thread, e.g. through sync_to_async()"
    )


def _configure_connection(conn):
    if conn.vendor != "sqlite":
        return
    synchronous = str(rindle_settings.SQLITE_SYNCHRONOUS).upper()
    if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
        raise ValueError(f"invalid RINDLE['SQLITE_SYNCHRONOUS']: {synchronous!r}")
    with conn.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={synchronous}")
        cursor.execute(f"PRAGMA busy_timeout={int(rindle_settings.SQLITE_BUSY_TIMEOUT_MS)}")


# --- the process's engines: delegates to its runtimes (rindle_app/runtime.py) -------------


def get_engine(using=None):
    """The running engine of ``using`` in this process, started on first use."""
    from ..runtime import get_runtime

    return get_runtime(using).engine


def running_engine(using=None):
    """The engine of ``using`` if one is running in this process, else None."""
    from ..runtime import running

    runtime = running(using)
    return None if runtime is None else runtime.running_engine


def shutdown(timeout=None):
    """Close every engine of this process (and the hub on it), draining their queues."""
    from ..runtime import runtimes

    for runtime in runtimes():
        runtime.stop_engine(timeout)
