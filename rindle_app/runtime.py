"""
The runtime: everything rindle runs in a process for one database alias.

``get_runtime(using)`` is the one accessor. ``get_engine()``, ``get_hub()``,
``flow.get_ledger()``, ``flow.tick.serving_ledger()`` and ``quota.meter()`` are thin
delegates to it, so whichever of them runs first starts what it needs, in this order:

1. the engine: its writer thread and table map (``Engine.start`` reads the schema);
2. the hub (needs 1): the live-query catalog, the hub thread and, on PostgreSQL,
   the listener thread; then, on PostgreSQL with ``STREAM_WATERMARKER`` "embedded"
   (the default, also under Django's test runner: live tests need safe_seq to
   move), the watermarker thread, which competes for the fleet's lease and
   publishes safe_seq while it holds it (``stream/watermark.py``). A
   ``STREAM_WATERMARKER`` other than "embedded" or "external" refuses to start
   the hub (``ImproperlyConfigured``, check rindle.E033), never silently runs none;
3. the usage ledger: ``FlowLedger.start`` reads the store once;
4. the flush tick (needs 3): a thread flushing 3 every ``FLOW_FLUSH_SECONDS``,
   started by the serving path only and never inside Django's test environment;
5. the quota cache (needs 3 and 4): the quotas over the serving ledger;
6. the public SQL sandbox's grant cache: plain data, filled as grants are made;
7. the retention timer (needs only the database): a thread pruning the outbox
   every ``STREAM_RETENTION_PERIOD_SECONDS`` (``stream/retention.py``), started
   with the hub (2) by the serving path in the embedded mode
   (``STREAM_WATERMARKER == "embedded"``), never inside Django's test environment
   (a test calls ``start_retention()``). Its counters (``retention_stats``, plain
   data) also count the Celery beat task's runs in a worker;
8. the stream's doorbell (needs only the database): what waiting ``GET /v1/stream``
   long-polls and event streams block on until safe_seq moves, with its source
   thread (``stream/bell.py``: a LISTEN on the watermarker's channel on PostgreSQL,
   the inotify commit watcher on SQLite), started by the first waiting request.

Each part starts on first use, after the parts it needs, and never twice.
``shutdown()`` stops them in the reverse order: it closes 8 (waking its waiters),
stops 7, drops 6 and 5, stops 4,
flushes 3 one last time (never into another database than the one it started on),
closes 2 (the watermarker first, which releases its lease, then the hub), then
drains and closes 1.

Where it starts and stops. Daphne sends no ASGI lifespan events, so under Daphne
first use through the accessor is the start; a server that speaks lifespan can
route ``rindle_app.flow.tick.lifespan``, which shuts every runtime down at its
stop. Otherwise one ``atexit`` hook shuts every runtime down when the interpreter
exits (Daphne and uvicorn exit normally on SIGTERM and SIGINT); the exit flush
happens only when a serving ledger started outside Django's test environment.
One ``os.register_at_fork`` hook makes a forked child forget every runtime without
stopping anything: the parent's threads do not survive a fork, and the child must
not write through the parent's connections or under its ledger's node id.

Starting without waiting. ``hub_ready()`` starts 1 and 2 in a thread of their own
(``rindle-start-<alias>``) and returns a ``concurrent.futures.Future`` of the hub:
every caller shares the one start, so a socket that arrives while the hub hydrates
waits on that future (``asyncio.wrap_future``) and holds no thread of its own. A
failed start leaves its exception in the future; the next ``hub_ready()`` tries
again. ``sockets`` (the open sockets per principal, ``realtime.limits.Sockets``) is
plain data, there before anything starts, so a handshake is admitted or refused
without waiting for the hub.

Threading model. ``get_runtime`` and every part's accessor may be called from any
thread, never from an event loop thread when the part still has to start (starting
reads the database: call them through ``sync_to_async`` there, or wait on
``hub_ready()``). The runtime map is a plain dict read without a lock (atomic under
the GIL) and changed under a module lock. Each runtime has two locks, held only
while a part starts or stops: one for the engine and the hub, one for the ledger,
the tick and the quotas, so a ledger reading the store never holds up an engine
start and the reverse (a third, ``hub_ready``'s, only guards its future). Once started, a
part is read without a lock (one attribute load and a liveness check): the hot
paths (a request's ``get_engine()``, a socket's ``quota.meter()``) take no lock.
The threads the parts run are documented where they are: the writer
(``engine/writer.py``), the hub (``realtime/hub.py``), the listener
(``stream/notify.py``), the watermarker (``stream/watermark.py``: one thread with
its own connection, stepping every ``STREAM_REFRESH_SECONDS`` while commits come
and woken by LISTEN on ``rindle_outbox`` when it sleeps), the flush tick
(``flow/tick.py``), the retention timer (``stream/retention.py``) and the doorbell's source
(``stream/notify.py`` or ``stream/wake.py``).
"""

import atexit
import concurrent.futures
import logging
import os
import threading

from django.db import connections

from .daemon import Materializations

__all__ = ["Runtime", "get_runtime", "running", "runtimes", "shutdown"]

logger = logging.getLogger("rindle")


class Runtime:
    """
    Everything rindle runs in this process for the database alias ``using``.

    Create it through ``get_runtime(using)``; a runtime made by hand is not the one
    the views, the consumer and the ledger delegates use. ``shutdown()`` stops every
    part it started (see the module docstring for the order); a runtime is not
    restarted after it: ``get_runtime`` makes a new one.
    """

    def __init__(self, using):
        self.using = using
        self.closed = False
        self._engine_lock = threading.RLock()
        self._flow_lock = threading.RLock()
        self._engine = None
        self._hub = None
        self._watermarker = None
        self._ledger = None
        self._tick = None
        self._tick_decided = False
        self._quotas = None
        # The database NAME the ledger started on: never flushed into another one (a
        # test run's teardown points the alias elsewhere).
        self.ledger_database = None
        # Set by the serving path outside Django's test environment: the exit hook flushes.
        self.flushes_at_exit = False
        # The public SQL sandbox's cache: (host, port, database, role) -> the
        # fingerprint of the tables its grants were made for.
        self.sandbox_grants = {}
        self.sandbox_grants_lock = threading.Lock()
        # What the daemon plane's /materialize handed out (rindle_app.daemon): its
        # pins are kept warm by this runtime's hub, so the record lives and ends with it.
        self.materializations = Materializations()
        self._retention_lock = threading.Lock()
        self._retention_timer = None
        self._retention_decided = False
        from .stream.retention import RetentionStats

        self.retention_stats = RetentionStats()
        self._bell_lock = threading.Lock()
        self._bell = None
        self._rooms_lock = threading.Lock()
        self._rooms = None
        # The one start of the hub in the background (``hub_ready``) and its thread.
        self._start_lock = threading.Lock()
        self._hub_future = None
        self._start_thread = None
        from .realtime.limits import Sockets  # plain data; imports nothing that starts

        # Open sockets per principal in this process (WS_MAX_SOCKETS_PER_PRINCIPAL).
        self.sockets = Sockets()

    def __repr__(self):
        return f"<Runtime {self.using!r}{' closed' if self.closed else ''}>"

    # --- 1. the engine -------------------------------------------------------------

    @property
    def engine(self):
        """The running engine, started on first use (and again if it was closed)."""
        engine = self._engine
        if engine is not None and not engine.closed:
            return engine
        with self._engine_lock:
            engine = self._engine
            if engine is None or engine.closed:
                self._check_open()
                from .engine.engine import Engine

                engine = self._engine = Engine(self.using).start()
            return engine

    @property
    def running_engine(self):
        """The engine if it runs, else None (starts nothing)."""
        engine = self._engine
        return engine if engine is not None and not engine.closed else None

    def stop_engine(self, timeout=None):
        """Flush the rooms, close the hub, then drain and close the engine."""
        self.stop_rooms()
        with self._engine_lock:
            self.stop_hub()
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close(timeout)

    # --- 2. the hub ----------------------------------------------------------------

    @property
    def hub(self):
        """The hub of the running engine, started (with the engine) on first use."""
        return self.hub_for(self.engine)

    def hub_for(self, engine):
        """The hub of ``engine``; a hub of an engine it replaced is closed first."""
        hub = self._hub
        if hub is None or hub.engine is not engine:
            with self._engine_lock:
                hub = self._hub
                if hub is None or hub.engine is not engine:
                    if hub is not None:
                        hub.close()
                    from .realtime.hub import Hub  # the transport; core modules never import it
                    from .stream.watermark import placement

                    placement()  # a bad STREAM_WATERMARKER refuses the start (rindle.E033)
                    hub = self._hub = Hub(engine)
                    hub.linger_of = self.materializations.idle_ttl
                    self._start_watermarker()
        hub = hub.start()
        if not self._retention_decided:
            self._serve_retention()
        return hub

    def hub_ready(self):
        """
        A ``concurrent.futures.Future`` of the running hub (see the module docstring).

        The hub already runs: a done future. Otherwise the first caller starts the
        engine and the hub in the thread ``rindle-start-<alias>`` and every caller
        gets that start's future; it holds the start's exception if it failed, and
        the next call starts again. It never blocks: call it from an event loop.
        """
        with self._start_lock:
            future = self._hub_future
            if future is not None and (not future.done() or self._serves(future)):
                return future
            self._check_open()
            future = self._hub_future = concurrent.futures.Future()
            future.set_running_or_notify_cancel()  # a waiter going away never cancels it
            hub = self._hub
            if hub is not None and hub.started and hub.engine is self.running_engine:
                future.set_result(hub)
                return future
            self._start_thread = threading.Thread(
                target=self._start_hub,
                args=(future,),
                name=f"rindle-start-{self.using}",
                daemon=True,
            )
            self._start_thread.start()
            return future

    def _serves(self, future):
        """True when ``future`` holds the hub that runs now (not an error, not a stopped hub)."""
        if future.exception() is not None:
            return False
        hub = future.result()
        return hub is self._hub and hub.started and hub.engine is self.running_engine

    def _start_hub(self, future):
        try:
            hub = self.hub
            if self.closed:  # shut down while it started: stop what this thread started
                self.stop_hub()
                raise RuntimeError(f"{self!r} was shut down while its hub started")
        except BaseException as exc:
            logger.exception("rindle: the hub of %r did not start", self.using)
            future.set_exception(exc)
        else:
            future.set_result(hub)
        finally:
            connections.close_all()

    @property
    def watermarker(self):
        """The watermarker this process runs beside its hub, or None (starts nothing)."""
        return self._watermarker

    def _start_watermarker(self):
        if self._watermarker is not None or connections[self.using].vendor != "postgresql":
            return
        from .stream.watermark import Watermarker, placement

        if placement() != "embedded":
            return

        watermarker = Watermarker(self.using)
        if not connections[self.using].in_atomic_block:
            # One step before the hub hydrates, so it starts at a current watermark
            # rather than at whatever was published last (it would be right, but behind).
            try:
                watermarker.step()
            except Exception:  # another process leads, or the fence is busy: the loop goes on
                pass
        self._watermarker = watermarker.start()

    @property
    def running_hub(self):
        """The hub if it started, else None (starts nothing)."""
        return self._hub

    def stop_hub(self):
        """Close the watermarker and the hub (``shutdown_hubs()``); the engine keeps running."""
        with self._engine_lock:
            hub, self._hub = self._hub, None
            watermarker, self._watermarker = self._watermarker, None
        with self._start_lock:
            if self._hub_future is not None and self._hub_future.done():
                self._hub_future = None  # the next hub_ready() starts a new hub
        if watermarker is not None:
            watermarker.close()
        if hub is not None:
            hub.close()

    # --- 3. the ledger, 4. the tick, 5. the quotas ------------------------------------

    @property
    def ledger(self):
        """The usage ledger, started on first use (which reads the store)."""
        ledger = self._ledger
        if ledger is not None:
            return ledger
        with self._flow_lock:
            if self._ledger is None:
                self._check_open()
                from .conf import rindle_settings
                from .flow import FlowLedger, FlowStore, now_ms

                node = rindle_settings.FLOW_NODE_ID or None
                ledger = FlowLedger(FlowStore(self.using), node=node).start(now_ms())
                self.ledger_database = self._database_name()
                self._ledger = ledger
            return self._ledger

    @property
    def running_ledger(self):
        """The ledger if it started, else None (starts nothing)."""
        return self._ledger

    def serving_ledger(self):
        """The ledger with the flush tick and the exit flush (``tick.serving_ledger``)."""
        ledger = self.ledger
        if not self._tick_decided:
            self.start_tick()
        return ledger

    @property
    def tick(self):
        """The running flush tick, or None."""
        return self._tick

    def start_tick(self):
        """Start the flush tick and the exit flush (idempotent); the tick or None."""
        from .flow import tick

        with self._flow_lock:
            if self._tick_decided:
                return self._tick
            self._tick_decided = True
            if tick._in_test_environment():
                return None
            self.flushes_at_exit = True
            from .conf import rindle_settings

            interval = rindle_settings.FLOW_FLUSH_SECONDS
            if interval:
                self._tick = tick.FlushTick(interval, flush=self.flush).start()
            return self._tick

    @property
    def quotas(self):
        """The quotas over the serving ledger, rebuilt when the ledger was replaced."""
        quotas = self._quotas
        if quotas is not None and quotas.ledger is self._ledger and self._tick_decided:
            return quotas
        ledger = self.serving_ledger()
        with self._flow_lock:
            if self._quotas is None or self._quotas.ledger is not ledger:
                from .flow.quota import Quotas

                self._quotas = Quotas.from_settings(ledger)
            return self._quotas

    def drop_quotas(self):
        """Forget the quota cache (the next check reads the store again)."""
        self._quotas = None

    def flush(self, now=None):
        """Flush the ledger into the database it started on; rows written (0: none)."""
        ledger = self._ledger
        if ledger is None or self.moved_database():
            return 0
        from .flow import now_ms

        return ledger.flush(now_ms() if now is None else now)

    def moved_database(self):
        """True when the alias points at another database than the ledger started on."""
        return self.ledger_database is not None and self.ledger_database != self._database_name()

    def stop_flow(self, now=None, flush=True):
        """
        Drop the quotas, stop the tick, flush the ledger a last time (``flush``) and
        drop it. A failed flush is logged: what it held is lost, as in a crash.
        """
        with self._flow_lock:
            tick, self._tick, self._tick_decided = self._tick, None, False
            ledger, self._ledger, self._quotas = self._ledger, None, None
            moved = self.moved_database()
            self.ledger_database = None
        if tick is not None:
            tick.stop()
        if ledger is None or not flush:
            return
        if moved:
            message = "rindle flow: %r's database changed since it started; not flushed"
            logger.warning(message, ledger)
            return
        from .flow import now_ms

        try:
            ledger.flush(now_ms() if now is None else now)
        except Exception:
            logger.exception("the final flush of %r failed; its unflushed flow is lost", ledger)

    def drop_ledger(self, now=None, flush=True):
        """Flush (``flush``) and drop the ledger only; the tick goes on (``flow.shutdown``)."""
        with self._flow_lock:
            ledger, self._ledger = self._ledger, None
            moved = self.moved_database()
            self.ledger_database = None
        if ledger is None or not flush or moved:
            return
        from .flow import now_ms

        try:
            ledger.flush(now_ms() if now is None else now)
        except Exception:
            logger.exception("the final flush of %r failed; its unflushed flow is lost", ledger)

    def _check_open(self):
        if self.closed:
            raise RuntimeError(f"{self!r} was shut down: get_runtime() gives the running one")

    def _database_name(self):
        return connections[self.using].settings_dict.get("NAME")

    # --- 6. the sandbox's grant cache ------------------------------------------------

    def forget_sandbox_grants(self):
        with self.sandbox_grants_lock:
            self.sandbox_grants.clear()

    # --- 7. the retention timer ------------------------------------------------------

    @property
    def retention_timer(self):
        """The running retention timer, or None."""
        return self._retention_timer

    def retention(self, **options):
        """A ``Retention`` of this alias from the settings, counting into ``retention_stats``."""
        from .stream.retention import Retention

        return Retention(self.using, stats=self.retention_stats, **options)

    def start_retention(self):
        """
        Start the retention timer in the embedded mode (idempotent); the timer, or
        None when ``STREAM_WATERMARKER`` is not "embedded" (the beat task prunes).
        """
        from .stream.retention import RetentionTimer
        from .stream.watermark import placement

        with self._retention_lock:
            self._check_open()
            self._retention_decided = True
            timer = self._retention_timer
            if timer is not None and timer.alive:
                return timer
            if placement() != "embedded":
                return None
            self._retention_timer = RetentionTimer(self.retention()).start()
            return self._retention_timer

    def _serve_retention(self):
        from .flow import tick

        with self._retention_lock:
            if self._retention_decided:
                return
            self._retention_decided = True
        if not tick._in_test_environment():
            self.start_retention()

    def stop_retention(self):
        """Stop the retention timer (a run in progress stops after its batch)."""
        with self._retention_lock:
            timer, self._retention_timer = self._retention_timer, None
            self._retention_decided = False
        if timer is not None:
            timer.stop()

    # --- 8. the stream's doorbell ---------------------------------------------------

    @property
    def bell(self):
        """The stream's doorbell (``stream.bell.Bell``), started on first use."""
        bell = self._bell
        if bell is not None:
            return bell
        with self._bell_lock:
            if self._bell is None:
                self._check_open()
                from .stream.bell import Bell

                self._bell = Bell(self.using).start()
            return self._bell

    @property
    def running_bell(self):
        """The doorbell if it started, else None (starts nothing)."""
        return self._bell

    def stop_bell(self):
        """Close the doorbell's source; its waiters wake, read once more and end."""
        with self._bell_lock:
            bell, self._bell = self._bell, None
        if bell is not None:
            bell.close()

    # --- all of it -----------------------------------------------------------------

    # --- 9. the live rooms -------------------------------------------------------------

    @property
    def rooms(self):
        """The live rooms of this process (``realtime.room_server.RoomRegistry``)."""
        rooms = self._rooms
        if rooms is not None:
            return rooms
        with self._rooms_lock:
            if self._rooms is None:
                self._check_open()
                from .realtime.room_server import RoomRegistry

                self._rooms = RoomRegistry(self.engine)
            return self._rooms

    @property
    def running_rooms(self):
        """The live rooms if any room was asked for, else None (starts nothing)."""
        return self._rooms

    def stop_rooms(self):
        """Flush every live room and drop it (their sockets are closed to retry)."""
        with self._rooms_lock:
            rooms, self._rooms = self._rooms, None
        if rooms is not None:
            rooms.close()

    def shutdown(self, timeout=None, flush=True):
        """
        Stop every part in the reverse start order: the doorbell, the retention timer, the caches,
        the tick, the ledger (flushed when ``flush``), the hub, the engine (drained
        within ``timeout``). Safe to call more than once.
        """
        self.closed = True
        self.stop_bell()
        self.stop_retention()
        self.forget_sandbox_grants()
        self.stop_flow(flush=flush)
        self.stop_engine(timeout)


# --- the process's runtimes -------------------------------------------------------------

_runtimes = {}  # alias -> Runtime
_lock = threading.Lock()


def _alias(using):
    if using:
        return using
    from .conf import rindle_settings

    return rindle_settings.DATABASE


def get_runtime(using="default"):
    """
    The runtime of the database alias ``using`` in this process (made on first use);
    ``None`` is ``RINDLE["DATABASE"]``, the alias the delegates default to.
    """
    using = _alias(using)
    runtime = _runtimes.get(using)
    if runtime is not None and not runtime.closed:
        return runtime
    with _lock:
        runtime = _runtimes.get(using)
        if runtime is None or runtime.closed:
            runtime = _runtimes[using] = Runtime(using)
        return runtime


def running(using="default"):
    """The runtime of ``using`` if this process has one, else None (makes none)."""
    runtime = _runtimes.get(_alias(using))
    return runtime if runtime is not None and not runtime.closed else None


def runtimes():
    """This process's open runtimes, sorted by alias."""
    return [rt for _using, rt in sorted(_runtimes.items()) if not rt.closed]


def shutdown(timeout=None, flush=True):
    """Shut every runtime of this process down and forget them."""
    with _lock:
        every = list(_runtimes.values())
        _runtimes.clear()
    for runtime in every:
        runtime.shutdown(timeout, flush=flush)


def _at_exit():
    # The exit flush is the serving processes' (see start_tick); the rest only stops.
    shutdown(flush=any(rt.flushes_at_exit for rt in runtimes()))


def _after_fork_in_child():
    # Threads do not survive fork(); the child starts its own runtimes lazily.
    _runtimes.clear()


atexit.register(_at_exit)
os.register_at_fork(after_in_child=_after_fork_in_child)
