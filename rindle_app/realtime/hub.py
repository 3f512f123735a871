"""
The drain: live queries of this process → per-connection frames.

One ``Hub`` per engine keeps the catalog (``LiveQueries``) current and owns every
websocket subscription of the process. A thread advances the catalog: it wakes on
each commit of this process's engine (which hands its outbox rows over in
process) and, for every other commit, on SQLite when the database's ``-wal`` file
reports the write (``stream/wake.py``, while anything is subscribed), on Postgres
on a notification, and otherwise every ``POLL_INTERVAL``; where a wake-up runs, the
poll is its safety net (every ``WAKE_POLL_INTERVAL``). On SQLite a plain ORM write
of this process does not wait for the file: its committing thread says so right
after the commit (``stream/local.py``, ``_on_local_commit``). A read that a write
notification caused is followed by reads until one finds nothing (``_catch_up``),
so the last commit of a burst that landed meanwhile is not left for the next
wake-up. On Postgres the tail reads only up to the
published watermark (``stream.reader``), so the notification that matters is the watermarker's
(``rindle_watermark``: safe_seq moved); a tail that cannot go on (below the
retention horizon, another epoch) re-hydrates and every subscriber is told to
re-subscribe (``_resnapshot``), as on a schema change. On SQLite a commit of this
process, the engine's or a plain ORM write's, is usually applied by the
committing thread itself, right after the commit, when the hub is free
(``_on_commit``, ``_on_local_commit``). For each commit it encodes each
changed query's ops once, wraps them per subscriber (queryId, epoch, seq), appends
one ``progress`` per connection that received data, and hands every connection
its frames.

Frames go straight to the connections of this process, through one call per
event loop and commit into each connection's queue (its consumer's sender task
writes them to the socket), not through the channel layer: the hub serves only
its own process's sockets, and Channels' in-memory layer costs O(connections)
per received message, O(N²) per fan-out (bench/ws.py measures it; the figures
are in docs/benchmarks.md).

Order: frames reach a connection's queue under the hub's lock, in
catalog-version order, so a subscription's seq 0 and the increments after it
cannot overtake each other and a ``progress`` never precedes the data it
releases. While the connection's own mutation is in flight its frames are held,
so a ``mutationOutcome`` precedes the lmid row that confirms it.

Rules kept here (DESIGN §5): seq 0 is always sent and followed by a progress; an
empty commit sends nothing and consumes no seq; re-subscribing a queryId bumps its
epoch; only connections whose data changed get a progress (lmid is data, through
the connection's ``_rindle/clientLmid`` query). A connection with more than
``WS_MAX_QUEUED_MESSAGES`` undelivered batches is shed: its subscriptions are
dropped and each is told ``shed`` (retryable), so it re-subscribes later; nobody
else waits for it.

Pins: a pinned materialization of the daemon plane (``pin``, ``rindle_app.daemon``)
keeps its shared query registered and maintained with no subscriber, so the last
subscriber leaving does not tear it down; a schema change or a resnapshot rebuilds
it, and a fault unpins it. A ``whileSubscribed`` one with an ``idleTtlMs`` lingers:
its query stays that long after its last subscriber left (``linger_of``), at most
DAEMON_MAX_PINS of them at once, and the hub thread tears it down once it is due.

Feeds: a room (``realtime.room_server``) follows its footprint through ``follow``:
the footprint's shared query is kept registered like a pin, its rows at the
catalog's version are the room's load, and every later step hands the feed the
query's net row changes with their version, under the lock (a feed only queues
them). A schema change, a resnapshot or a fault ends a feed: it is called once
with ``None`` and forgotten, and its query goes unless something else keeps it.

Threading model. The hub's state (the catalog, ``conns``, every ``Conn`` field the
hub writes, the encodings, the outgoing hand-overs) is touched only under
``Hub.lock``, by whichever thread holds it: the hub thread (``_run``: woken by a
commit, a notification, the watcher or the poll), the committing thread on SQLite
(``_on_commit``, ``_on_local_commit``, which step only when the lock is free and this
thread does not already hold it, as a thread-local flag says), and the worker
threads the consumer calls through (``connect``, ``subscribe``, ``hold``/``release``,
``disconnect``). Frames leave the lock only through ``loop.call_soon_threadsafe``, so
a connection's event loop is the only thread that writes to its socket and to
``Conn.sent``. A new shape's database reads are the one thing ``subscribe`` does
before taking the lock (``Catalog.read_ahead``, on a scratch store: nothing of the
hub's state is written there); what they read is installed under the lock,
corrected to the catalog's version of that moment (``PartitionStore.install_ahead``).
The listener thread
(``stream/notify.py``, PostgreSQL) and the watcher thread (``stream/wake.py``,
SQLite; armed under the lock while anything is subscribed, held after each commit
of this process) only set the wake event. On SQLite the step and the JSON encoding
stay on the committing thread, right after its commit, while it still holds the
writer: handing them to the hub thread was measured and is slower (bench/README.md,
"2026-11-30: the hub thread is slower than polling inline": about two thirds of the
inline commit rate), because a wake-up and the GIL passing back and forth between
the two threads cost more than the statement time they could overlap. So they stay
there, by measurement, not by accident. The hub is one per runtime
(``rindle_app/runtime.py``), which starts and stops it.
"""

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from django.db import close_old_connections, connections

from ..conf import rindle_settings
from ..exceptions import (
    BATCH_TOO_LARGE,
    FAULTED,
    RESNAPSHOT_REQUIRED,
    SCHEMA_CHANGED,
    SHED,
    ResnapshotRequired,
    TooManyPins,
)
from ..ivm.ast import QueryError
from ..ivm.live import LiveQueries
from ..stream import local, wake
from ..stream.notify import WATERMARK_CHANNEL, Listener
from . import limits, wire

logger = logging.getLogger("rindle.realtime")

# After a read that a write notification caused, the hub reads again until a read
# finds nothing new, so a commit that landed during the read is applied with it
# rather than on the next wake-up; past this many reads in a row the hub thread
# goes on (a steady stream of commits is a busy hub, not a burst).
CATCH_UP_READS = 8


@dataclass(eq=False)
class Sub:
    """One subscription: a connection's queryId on a shared query."""

    conn: object
    query_id: int
    epoch: int
    mode: str
    key: str
    seq: int = 0


@dataclass(eq=False)
class Conn:
    channel: str
    loop: object
    user: object = None
    client_id: str = None
    subs: dict = field(default_factory=dict)  # queryId -> Sub
    epochs: dict = field(default_factory=dict)  # queryId -> last epoch
    push: object = None  # push(frames), called on ``loop``: the consumer writes them
    handed: int = 0  # batches handed to the connection (written by the hub only)
    sent: int = 0  # batches its sender wrote to the socket (written by the consumer only)
    hold: int = 0  # >0 while the connection's own mutation is in flight
    held: list = field(default_factory=list)
    shed_ids: list = field(default_factory=list)  # queryIds to tell "shed"
    closed: bool = False


@dataclass(eq=False)
class _Encoded:
    """One shared query's wire form: its hello shape, and the flat encoder if used."""

    shape: object
    flat: object = None
    flat_tree: object = None


class HubLock:
    """
    A reentrant lock that knows whether the calling thread holds it (a thread-local
    depth), so the committing thread can tell "free" from "mine" without reaching
    into ``RLock``'s private ``_is_owned``.
    """

    __slots__ = ("_lock", "_local")

    def __init__(self):
        self._lock = threading.RLock()
        self._local = threading.local()

    def held(self):
        """True when the calling thread holds the lock."""
        return getattr(self._local, "depth", 0) > 0

    def acquire(self, blocking=True):
        if not self._lock.acquire(blocking):
            return False
        self._local.depth = getattr(self._local, "depth", 0) + 1
        return True

    def release(self):
        self._local.depth -= 1
        self._lock.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class Hub:
    """
    The drain of one engine (see the module): ``start()`` it once, ``connect()`` a
    socket's loop and push callback, ``subscribe()`` its queries; ``close()`` stops
    the hub thread and the listener.
    """

    def __init__(self, engine):
        self.engine = engine
        self.lock = HubLock()
        self.live = None
        self.conns = {}
        self._encoded = {}  # query key -> _Encoded
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        self._listener = None
        self._watcher = None  # stream.wake.CommitWatcher (SQLite), armed while subscribed
        self.max_queued = int(rindle_settings.WS_MAX_QUEUED_MESSAGES)
        self._outgoing = {}  # event loop -> [(conn, frames)] not yet handed over
        self._pins = {}  # query key -> AST: kept registered without subscribers (``pin``)
        self._lingering = {}  # query key -> monotonic deadline: no subscriber, kept until then
        self._feeds = {}  # query key -> [feed(ops, version)]: kept registered (``follow``)
        # Seconds a query lingers after its last subscriber left (a callable of its key;
        # the runtime gives the daemon plane's records), or None: never.
        self.linger_of = None
        self.poll_interval = float(rindle_settings.POLL_INTERVAL)
        self._step_inline = engine.vendor == "sqlite"

    # --- lifecycle -----------------------------------------------------------------

    def start(self):
        with self.lock:
            if self._stop.is_set():
                raise RuntimeError("rindle hub: closed before it started")
            if self.live is not None:
                return self
            self.live = LiveQueries(self.engine, handoff=True).start()
            self.engine.add_commit_listener(self._on_commit)
            self.engine.add_schema_listener(self._on_schema_change)
            if self.engine.vendor == "postgresql":
                # The tail reads up to the published safe_seq: the watermarker's
                # notification says it moved. The poll is a safety net.
                channels = [WATERMARK_CHANNEL]
                self._listener = Listener(self.engine.using, self._wake.set, channels).start()
            else:
                # Commits the engine did not make wake the hub as they are written,
                # while anything is subscribed (``_watch``); the poll is a safety net.
                self._watcher = wake.watch(self.engine.using, self._since, self._wake.set)
                # This process's own commits (a plain ORM save) are applied by the
                # committing thread right after they commit; the watcher stays for
                # other processes and as the safety net.
                local.add_listener(self.engine.using, self._on_local_commit)
            if self._listener is not None or self._watcher is not None:
                safety = float(rindle_settings.WAKE_POLL_INTERVAL)
                self.poll_interval = max(self.poll_interval, safety)
            self._thread = threading.Thread(target=self._run, name="rindle-hub", daemon=True)
            self._thread.start()
        return self

    @property
    def started(self):
        """True once ``start()`` hydrated the catalog (read without the lock)."""
        return self.live is not None

    def close(self):
        """
        Stop the hub. The teardown runs under the hub lock, so it never interleaves
        with a ``start()`` on another thread (which would leave a thread created but
        not started, or a listener opened after its close), and once it returns no
        committing thread is in a step of this hub or starts one (``stream.local``'s
        listener is gone); the join happens outside the lock, since the hub thread
        may be waiting for it to finish its step.
        """
        self._stop.set()
        self._wake.set()
        with self.lock:
            local.remove_listener(self.engine.using, self._on_local_commit)
            self.engine.remove_commit_listener(self._on_commit)
            self.engine.remove_schema_listener(self._on_schema_change)
            if self.live is not None:
                self.live.stop()
            if self._listener is not None:
                self._listener.close()
            if self._watcher is not None:
                self._watcher.close()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    @property
    def catalog(self):
        return self.live.catalog

    def _on_commit(self, cv):
        """
        A commit of this process's engine, on the committing thread. On SQLite the
        writer handed its rows over, so a step reads nothing: when the hub is free it
        runs right here. That spares a wake-up of the hub thread and the GIL passing
        back and forth between the two threads, which cost more than the step itself
        (bench/ivm.py measures both ways: docs/benchmarks.md). When
        the hub is busy, this thread already holds it, or on Postgres (no handover:
        the step would read on the writer's connection), the hub thread is woken.
        """
        if self._watcher is not None:  # its page writes need not wake the watcher
            self._watcher.hold()
        if not (self._step_inline and self._step_here(self.step)):
            self._wake.set()

    def _on_local_commit(self):
        """
        A transaction of this process that captured changes committed (a plain ORM
        write, not the engine's: ``stream/local.py``), on the committing thread, right
        after the commit. As for the engine's commits, the step runs right here when
        the hub is free, and otherwise the hub thread is woken; unlike them it reads
        the outbox (above the catalog's version, so nothing is applied twice), then
        reads again until a read finds nothing (``_catch_up``). With nothing
        subscribed nothing is read: a subscription catches up first (``_watch``).
        """
        live = self.live
        if self._stop.is_set() or live is None or not live.catalog.queries:
            return
        if self._watcher is not None:  # its page writes need not wake the watcher
            self._watcher.hold()
        if not self._step_here(self._catch_up):
            self._wake.set()

    def _step_here(self, step):
        """
        Run ``step`` on this thread if the hub is free and this thread does not hold
        it already; True when it ran (else the caller wakes the hub thread).
        """
        lock = self.lock
        if lock.held() or not lock.acquire(blocking=False):
            return False
        try:
            if not self._stop.is_set():
                step()
            return True
        except Exception:  # the hub thread retries from the same version
            logger.exception("rindle hub: step on the committing thread failed")
            return False
        finally:
            lock.release()

    def _catch_up(self):
        """
        ``step()`` until a read finds nothing new: commits that landed while the
        previous one read are applied now, not on the next wake-up. On SQLite a read
        after which ``PRAGMA data_version`` has not moved saw every commit, so the
        read that would find nothing is spared. At most ``CATCH_UP_READS`` reads;
        past them the hub thread is woken to go on.
        """
        using = self.engine.using
        with self.lock:
            for _ in range(CATCH_UP_READS):
                before = self.catalog.version
                mark = local.data_version(using)
                self.step()
                if self.catalog.version == before:
                    return
                if mark is not None and local.data_version(using) == mark:
                    return  # SQLite: nothing committed since the read began, so it saw all
            self._wake.set()

    def _on_schema_change(self, table):
        """
        A registered table's definition changed (a migration), or it was created or
        dropped: only the subscriptions whose queries read it are told
        ``schema_changed`` (retryable) and dropped, so their clients re-subscribe and
        get hellos of the new shape. The table alone is re-read into the store; every
        other query keeps running from the same state.
        """
        with self.lock:
            if self.live is None:
                return
            affected = set(self.catalog.reading(table))
            message = f"the schema of {table!r} changed; re-subscribe"
            for conn in list(self.conns.values()):
                frames = []
                for qid, sub in sorted(conn.subs.items()):
                    if sub.key in affected:
                        frames.append(
                            wire.query_error(qid, message, SCHEMA_CHANGED, True, retry_after_ms=0)
                        )
                        del conn.subs[qid]
                        self._drop(sub)
                self._deliver(conn, frames)
            self._end_feeds(affected)
            for key in affected:  # a query nobody subscribes to (a pinned one) goes too
                self._forget(key)
            self._dispatch()
            self.live.reload_table(table)
            self._repin(affected)  # built again on the new definition

    def _run(self):
        try:
            while not self._stop.is_set():
                woken = self._wake.wait(self.poll_interval)
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    if woken:  # a write notification: its burst may still be landing
                        self._catch_up()
                    else:
                        self.step()
                    self._expire_lingering()
                    self._unwatch_if_idle()
                except Exception:  # keep serving; the next step retries from the same version
                    logger.exception("rindle hub: step failed")
                    close_old_connections()
                    time.sleep(self.poll_interval)
        finally:
            connections.close_all()

    # --- the wake-up for commits the engine did not make (SQLite) ------------------

    def _since(self):
        """The catalog's version (the watcher's thread: one attribute read, no lock)."""
        live = self.live
        return live.catalog.version if live is not None else 0

    def _watch(self):
        """
        Under the lock, before a subscription is made: if the watcher is disarmed
        (nothing was subscribed, so commits the engine did not make were left to the
        safety poll), step first, so the new subscription starts current, then arm it
        (its first read finds whatever committed in between).
        """
        if self._watcher is None or self._watcher.armed:
            return
        try:
            self.step()
        except Exception:  # the hub thread catches up instead
            logger.exception("rindle hub: catching up before a subscription failed")
            self._wake.set()
        self._watcher.arm()

    def _unwatch_if_idle(self):
        """After a step of the hub thread: nothing subscribed, so stop the wake-ups."""
        if self._watcher is not None and self._watcher.armed:
            with self.lock:
                if not self.catalog.queries:
                    self._watcher.disarm()

    # --- connections ---------------------------------------------------------------

    def connect(self, channel, loop, push, user=None):
        """Register a connection; ``push(frames)`` is called on ``loop`` for each batch."""
        self.start()
        with self.lock:
            conn = Conn(channel, loop, user, push=push)
            self.conns[channel] = conn
            return conn

    def disconnect(self, channel):
        with self.lock:
            conn = self.conns.pop(channel, None)
            if conn is None:
                return
            conn.closed = True
            for sub in list(conn.subs.values()):
                self._drop(sub)
            conn.subs.clear()

    def subscribe(self, conn, query_id, ast, mode):
        """
        Attach ``conn``'s ``query_id`` to the shared query of ``ast`` and queue its
        hello, seq 0 and a releasing progress. A re-subscribe of the same queryId
        replaces the old subscription under the next epoch. Raises ``QueryError``.

        A new shape's database reads (and the sorts of its windows' partitions) run
        first, WITHOUT the lock (``_read_ahead``), so other sockets' frames and the
        commits wait only for installing them and building the view from memory.
        """
        tables = self.engine.tables.by_name()
        ahead = self._read_ahead(conn, ast)
        with self.lock:
            if conn.closed:
                return None
            self._watch()
            if self.engine.tables.by_name() is not tables:
                # A table was re-read meanwhile (a DDL marker, possibly met by the
                # step just above): what was read ahead may have its old columns.
                ahead = None
            limits.check_subscriptions(conn, query_id)
            limits.check_footprint(self.catalog, conn, replacing=query_id)
            old = conn.subs.pop(query_id, None)
            if old is not None:
                self._drop(old)
            epoch = conn.epochs.get(query_id, 0) + 1
            conn.epochs[query_id] = epoch
            budget = limits.footprint_budget(self.catalog, conn, query_id)
            # What was read ahead, corrected to the version reached meanwhile (or
            # refused at once, when it was read past the budget).
            self.catalog.install_ahead(ahead, budget)
            shared = self._register(ast, budget)
            self._lingering.pop(shared.key, None)  # subscribed again
            encoded = self._encoding(shared)
            sub = Sub(conn, query_id, epoch, mode, shared.key)
            ops = self.catalog.attach(shared.key, sub)
            conn.subs[query_id] = sub
            with self._refusing(sub):
                limits.check_footprint(self.catalog, conn)
            cv = self.catalog.version
            boot = self.engine.boot_id
            if mode == "flat":
                flat = self._flat(shared, encoded)
                hello = wire.hello(query_id, wire.dumps(flat.hello(epoch)), boot)
                events = flat.snapshot_events(encoded.flat_tree)
                data = wire.batch(query_id, epoch, 0, flat.schema_fp, wire.dumps(events), cv)
            else:
                hello = wire.nhello(query_id, epoch, encoded.shape, boot)
                ops_json = wire.dumps(encoded.shape.ops(ops))
                data = wire.nbatch(query_id, epoch, 0, encoded.shape.fp, ops_json, cv)
            with self._refusing(sub):
                limits.check_snapshot(data, query_id)
            self._deliver(conn, [hello, data, wire.progress(cv)])
            self._dispatch()
            return sub

    def _read_ahead(self, conn, ast):
        """
        Outside the lock: read what registering ``ast`` will read, at the catalog's
        version of this moment (``Catalog.read_ahead``); ``subscribe`` installs it
        under the lock, corrected to the version the catalog has reached by then.
        Nothing here is needed for correctness: on any failure the locked build
        reads for itself, and reports what went wrong.
        """
        live = self.live
        if live is None or conn.closed:
            return None
        try:
            return live.catalog.read_ahead(ast, limits.footprint_cap())
        except Exception:  # the locked build meets the same error and answers it
            logger.debug("rindle hub: reading ahead of a subscription failed", exc_info=True)
            return None

    @contextlib.contextmanager
    def _refusing(self, sub):
        """Drop ``sub`` again if the block raises (a limit refused it; under the lock)."""
        try:
            yield
        except Exception:
            if sub.conn.subs.get(sub.query_id) is sub:
                del sub.conn.subs[sub.query_id]
            self._drop(sub)
            raise

    def unsubscribe(self, conn, query_id):
        with self.lock:
            sub = conn.subs.pop(query_id, None)
            if sub is not None:
                self._drop(sub)
            return sub is not None

    def hold(self, conn):
        """Hold ``conn``'s frames (its mutation is in flight) until ``release``."""
        with self.lock:
            conn.hold += 1

    def release(self, conn, first=()):
        """Deliver ``first`` (say a mutationOutcome), then what was held meanwhile."""
        with self.lock:
            conn.hold -= 1
            if first:
                conn.held.insert(0, list(first))
            if conn.hold == 0 and conn.held:
                batches, conn.held = conn.held, []
                for frames in batches:
                    self._deliver(conn, frames)
                self._dispatch()

    # --- pins ----------------------------------------------------------------------

    def pin(self, key, ast):
        """
        Keep the shared query of ``ast`` (whose key is ``key``) registered and
        maintained with no subscriber: a pinned materialization of the daemon plane
        (``rindle_app.daemon``), so a later subscriber's seq 0 is the view as it
        stands. Idempotent. ``TooManyPins`` when ``key`` is new and the hub already
        keeps DAEMON_MAX_PINS; the view is refused (``LimitExceeded``) past
        ``WS_MAX_FOOTPRINT_ROWS`` as a subscription's is. Nothing changes on a refusal.
        """
        limit = int(rindle_settings.DAEMON_MAX_PINS)
        with self.lock:
            if key in self._pins and key in self.catalog.queries:
                return key  # a re-assert of a warm pin: nothing to build
            if key not in self._pins and len(self._pins) >= limit:
                raise TooManyPins(
                    f"this process keeps {limit} pinned materializations (DAEMON_MAX_PINS); "
                    "dematerialize one first"
                )
            self._watch()
            shared = self._register(ast, limits.footprint_cap())
            self._pins[shared.key] = ast
            self._lingering.pop(shared.key, None)
            return shared.key

    def _register(self, ast, budget):
        """Under the lock: the shared query of ``ast``, re-hydrating first if it must."""
        try:
            return self.catalog.register(ast, budget)
        except ResnapshotRequired as exc:  # its partitions are below the horizon
            self._resnapshot(exc)
            return self.catalog.register(ast, budget)

    def unpin(self, key):
        """Stop keeping ``key`` warm; its query goes unless subscribed. True if it was pinned."""
        with self.lock:
            if self._pins.pop(key, None) is None:
                return False
            shared = self.catalog.queries.get(key)
            if shared is not None and not shared.subscribers and not self._kept(key):
                self._forget(key)
            return True

    @property
    def pinned(self):
        """The keys of the pinned queries (a copy; read without the lock)."""
        return set(self._pins)

    @property
    def materialized(self):
        """How many shared queries are kept (subscribed, pinned or lingering); no lock."""
        live = self.live
        return len(live.catalog.queries) if live is not None else 0

    def _repin(self, keys):
        """
        Under the lock, after their queries were destroyed (a schema change, a
        resnapshot): register the pinned queries among ``keys`` again. A pin whose
        AST no longer builds is dropped, and logged.
        """
        budget = limits.footprint_cap()
        for key in keys:
            ast = self._pins.get(key)
            if ast is None or key in self.catalog.queries:
                continue
            try:
                shared = self.catalog.register(ast, budget)
            except Exception:
                del self._pins[key]
                logger.warning("rindle hub: pinned query %s cannot be rebuilt; unpinned", key)
                continue
            if shared.key != key:
                self._pins[shared.key] = self._pins.pop(key)

    # --- feeds ---------------------------------------------------------------------

    def follow(self, ast, feed):
        """
        Keep the shared query of ``ast`` registered and call ``feed(ops, version)``
        with its net row changes after every step that changed it (under the lock:
        ``feed`` must only queue them), and ``feed(None, version)`` once if the query
        goes (a schema change, a resnapshot, a fault). Returns ``(key, rows,
        version)``: the query's key, its footprint as ``[(table, row)]`` and the
        catalog version they stand at; every change after it reaches ``feed``. Past
        ``WS_MAX_FOOTPRINT_ROWS`` rows it is refused (``LimitExceeded``).
        """
        with self.lock:
            self._watch()
            shared = self._register(ast, limits.footprint_cap())
            self._feeds.setdefault(shared.key, []).append(feed)
            self._lingering.pop(shared.key, None)
            return shared.key, shared.view.footprint_rows(), self.catalog.version

    def unfollow(self, key, feed):
        """Stop calling ``feed``; its query goes unless something else keeps it."""
        with self.lock:
            feeds = self._feeds.get(key)
            if feeds is None or feed not in feeds:
                return
            feeds.remove(feed)
            if not feeds:
                del self._feeds[key]
            shared = self.live.catalog.queries.get(key) if self.live is not None else None
            if shared is not None and not shared.subscribers and not self._kept(key):
                self._forget(key)

    def _end_feeds(self, keys):
        """Under the lock: the feeds of ``keys`` are told their query goes, and dropped."""
        version = self.catalog.version
        for key in keys:
            for feed in self._feeds.pop(key, ()):
                _call(feed, None, version)

    def _kept(self, key):
        """True while a pin or a feed keeps ``key`` registered without a subscriber."""
        return key in self._pins or key in self._feeds

    # --- commits -------------------------------------------------------------------

    def step(self):
        """Apply every commit after the catalog's version; deliver the frames it makes."""
        with self.lock:
            try:
                version, outputs, faults = self.live.poll()
            except ResnapshotRequired as exc:
                self._resnapshot(exc)
                return self.catalog.version
            if not outputs and not faults:
                return version
            per_conn = {}
            for key, ops in outputs.items():
                for feed in self._feeds.get(key, ()):
                    _call(feed, ops, version)
                shared = self.catalog.queries.get(key)
                if shared is None or not shared.subscribers:
                    continue
                self._fan_out(shared, ops, version, per_conn)
            for fault in faults:
                self._encoded.pop(fault.key, None)
                self._lingering.pop(fault.key, None)
                self._end_feeds([fault.key])
                if self._pins.pop(fault.key, None) is not None:
                    logger.warning("rindle hub: pinned query %s faulted; unpinned", fault.key)
                for sub in fault.subscribers:
                    conn = sub.conn
                    if conn.subs.get(sub.query_id) is sub:
                        del conn.subs[sub.query_id]
                        frame = wire.query_error(
                            sub.query_id, fault.message, FAULTED, True, retry_after_ms=500
                        )
                        per_conn.setdefault(conn, []).append(frame)
            for conn, frames in per_conn.items():
                frames.append(wire.progress(version))
                self._deliver(conn, frames)
            self._dispatch()
            return version

    def _resnapshot(self, exc):
        """
        The tail cannot go on (``ResnapshotRequired``: below the horizon, or another
        epoch): as on a schema change, every subscription is told (retryable, at once)
        and dropped, so its client re-subscribes and gets a seq 0 of the catalog
        hydrated afresh here; every query (an SSR one too) goes with the old catalog.
        Never a silent skip. Under the lock.
        """
        message = f"the server re-read the database ({exc.reason}); re-subscribe"
        for conn in list(self.conns.values()):
            frames = []
            for qid, sub in sorted(conn.subs.items()):
                frames.append(
                    wire.query_error(qid, message, RESNAPSHOT_REQUIRED, True, retry_after_ms=0)
                )
                self._drop(sub)
            conn.subs.clear()
            self._deliver(conn, frames)
        self._encoded.clear()
        self._lingering.clear()  # gone with the old catalog
        self._end_feeds(list(self._feeds))
        self.live.rehydrate(exc.reason)
        self._repin(list(self._pins))
        self._dispatch()

    def _fan_out(self, shared, ops, version, per_conn):
        encoded = self._encoding(shared)
        payloads = {}  # mode -> (fingerprint, JSON body, refusal) or None: nothing to send
        too_large = []
        for sub in shared.subscribers:
            if sub.mode not in payloads:
                payloads[sub.mode] = self._payload(shared, encoded, sub.mode, ops)
            payload = payloads[sub.mode]
            if payload is None:
                continue  # nothing this mode shows changed: no batch, no seq
            fp, body, refusal = payload
            if refusal is not None:
                too_large.append(sub)
                frame = wire.query_error(sub.query_id, refusal, BATCH_TOO_LARGE, True, 0)
                per_conn.setdefault(sub.conn, []).append(frame)
                continue
            sub.seq += 1
            make = wire.batch if sub.mode == "flat" else wire.nbatch
            frame = make(sub.query_id, sub.epoch, sub.seq, fp, body, version)
            per_conn.setdefault(sub.conn, []).append(frame)
        for sub in too_large:  # after the loop: dropping changes shared.subscribers
            logger.warning(
                "rindle hub: dropped query %s of %s: %s",
                sub.query_id,
                sub.conn.channel,
                "increment over WS_MAX_SEND_BYTES",
            )
            del sub.conn.subs[sub.query_id]
            self._drop(sub)
        if "flat" not in payloads and encoded.flat is not None and shared.subscribers:
            # no flat subscriber took this commit: keep the tree current for later ones
            encoded.flat_tree = encoded.flat.render(shared.view, self.catalog.store)

    def _payload(self, shared, encoded, mode, ops):
        if mode != "flat":
            body = wire.dumps(encoded.shape.ops(ops))
            return encoded.shape.fp, body, limits.batch_too_large(body)
        flat = self._flat(shared, encoded)
        tree = flat.render(shared.view, self.catalog.store)
        events = flat.diff_events(encoded.flat_tree, tree)
        encoded.flat_tree = tree
        if not events:
            return None
        body = wire.dumps(events)
        return flat.schema_fp, body, limits.batch_too_large(body)

    # --- encodings -----------------------------------------------------------------

    def _encoding(self, shared):
        encoded = self._encoded.get(shared.key)
        if encoded is None:
            encoded = self._encoded[shared.key] = _Encoded(
                wire.NormalizedShape(shared.query, self.catalog.schema)
            )
        return encoded

    def _flat(self, shared, encoded):
        if encoded.flat is None:
            from .flat import FlatEncoder

            encoded.flat = FlatEncoder(shared.query, self.catalog.schema)
            encoded.flat_tree = encoded.flat.render(shared.view, self.catalog.store)
        return encoded.flat

    def _drop(self, sub):
        self.catalog.detach(sub)
        shared = self.catalog.queries.get(sub.key)
        if shared is not None and not shared.subscribers and not self._kept(sub.key):
            if not self._linger(sub.key):
                self._forget(sub.key)

    def _forget(self, key):
        self.catalog.destroy(key)
        self._encoded.pop(key, None)
        self._lingering.pop(key, None)

    def _linger(self, key):
        """Keep the query of ``key`` (just left by its last subscriber) for its idle TTL."""
        seconds = self.linger_of(key) if self.linger_of is not None else 0
        if not seconds > 0 or len(self._lingering) >= int(rindle_settings.DAEMON_MAX_PINS):
            return False
        self._lingering[key] = time.monotonic() + seconds
        return True

    def _expire_lingering(self):
        """Tear down the lingering queries that are due (the hub thread, each wake-up)."""
        if not self._lingering:
            return
        with self.lock:
            now = time.monotonic()
            for key, deadline in list(self._lingering.items()):
                if deadline > now:
                    continue
                del self._lingering[key]
                shared = self.catalog.queries.get(key)
                if shared is not None and not shared.subscribers and not self._kept(key):
                    self._forget(key)

    # --- delivery ------------------------------------------------------------------

    def _deliver(self, conn, frames):
        """Queue ``frames`` for ``conn`` (under the lock); ``_dispatch`` hands them over."""
        if conn.closed or not frames:
            return
        if conn.hold:
            conn.held.append(frames)
            return
        if conn.handed - conn.sent >= self.max_queued and conn.subs:
            self._shed(conn)
            errors = [f for f in frames if isinstance(f, wire.QueryErrorFrame)]
            frames = errors + self._shed_notices(conn)
        conn.handed += 1
        self._outgoing.setdefault(conn.loop, []).append((conn, frames))

    def _dispatch(self):
        """One hand-over per event loop for everything queued (under the lock)."""
        outgoing, self._outgoing = self._outgoing, {}
        for loop, items in outgoing.items():
            try:
                loop.call_soon_threadsafe(_push_all, items)
            except RuntimeError:  # the loop is gone: so are its connections
                for conn, _frames in items:
                    conn.closed = True

    def _shed(self, conn):
        """Drop every subscription of a connection that cannot keep up (under the lock)."""
        logger.warning("rindle hub: shedding slow connection %s", conn.channel)
        conn.shed_ids = sorted(conn.subs)
        for sub in list(conn.subs.values()):
            self._drop(sub)
        conn.subs.clear()

    def _shed_notices(self, conn):
        ids, conn.shed_ids = conn.shed_ids, []
        retry = int(rindle_settings.WS_SHED_RETRY_MS)
        message = "the connection fell behind; re-subscribe"
        return [wire.query_error(qid, message, SHED, True, retry_after_ms=retry) for qid in ids]


def _call(feed, ops, version):
    try:
        feed(ops, version)
    except Exception:  # a feed's bug must not stop the hub
        logger.exception("rindle hub: a feed failed")


def _push_all(items):
    for conn, frames in items:
        if not conn.closed:
            try:
                conn.push(frames)
            except Exception:  # one socket's failure must not starve the others
                logger.exception("rindle hub: a batch could not be handed to a socket")


def get_hub(engine=None):
    """The hub of ``engine`` (the default engine), started on first use (the runtime's)."""
    from ..runtime import get_runtime

    if engine is None:
        return get_runtime(None).hub  # None: RINDLE["DATABASE"], as get_engine()
    return get_runtime(engine.using).hub_for(engine)


def shutdown_hubs():
    """Close every hub of this process; the engines keep running."""
    from ..runtime import runtimes

    for runtime in runtimes():
        runtime.stop_hub()


__all__ = ["Hub", "HubLock", "QueryError", "get_hub", "shutdown_hubs"]
