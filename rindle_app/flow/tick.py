"""
The flush tick: how each process's usage ledger reaches the store.

The live counters are in the memory of the process that served the traffic, so
only that process can flush them; a Celery worker cannot flush a web process's
counters. Every serving process therefore runs its own tick: ``serving_ledger()``
(what the websocket consumer and the HTTP views count through) starts the ledger
and, with it, a daemon thread that flushes every ``FLOW_FLUSH_SECONDS``, one per
runtime (``rindle_app/runtime.py`` owns the ledger and the tick); and the runtime
flushes once more when the process stops, from ``atexit`` (Daphne and
uvicorn exit normally on SIGTERM and SIGINT) or from an ASGI lifespan shutdown
(``lifespan``, for servers that speak it). A SIGKILL loses at most one tick.

The Celery beat task ``rindle_app.tasks.flow_tick`` runs ``beat()`` in a worker:
it flushes the worker's own ledger (what tasks recorded), the flush drops the rows
that aged out of the kept window, and it computes ``fleet()`` once for the operator's
band and caches it in Django's cache (``cached_fleet()``). A web process reads the
worker's figure only through a shared cache backend (Redis, Memcached, the
database); with the default per-process memory cache it finds nothing and computes
the fleet itself.

No tick starts and nothing is flushed at exit inside Django's test environment
(``setup_test_environment``, as pytest-django and ``manage.py test`` set it up): a
background writer would race the tests' own use of the store. Tests flush
explicitly, or start a ``FlushTick``.
"""

import dataclasses
import itertools
import logging

from ..periodic import Periodic
from . import Fleet, get_ledger, now_ms

logger = logging.getLogger("rindle.flow")

FLEET_CACHE_KEY = "rindle:flow:fleet:{using}"


class FlushTick(Periodic):
    """
    A daemon thread calling ``flush()`` every ``interval`` seconds until ``stop()``.

    A failing flush is logged and retried at the next tick (the ledger keeps what it
    could not write).
    """

    name = "rindle-flow-tick"
    log = logger
    failure = "rindle flow: the flush tick failed; the next one retries"

    def __init__(self, interval, flush=None):
        if not interval or interval <= 0:
            raise ValueError(f"a flush tick needs a positive interval, not {interval!r}")
        super().__init__()
        self.interval = float(interval)
        self._flush = flush or flush_all

    def delays(self):
        return itertools.repeat(self.interval)

    def step(self):
        self._flush()


def flush_all(now=None):
    """Flush every ledger of this process (those on their own database); rows written."""
    from ..runtime import runtimes

    written = 0
    for runtime in runtimes():
        try:
            written += runtime.flush(now)
        except Exception:
            logger.exception("rindle flow: flushing %r failed; the next flush retries", runtime)
    return written


# --- the serving process: delegates to its runtimes (rindle_app/runtime.py) -------------


def serving_ledger(using=None):
    """
    This process's ledger of ``using`` (``flow.get_ledger``), with the flush tick and
    the exit flush started on first use. The first call reads the store: make it
    off the event loop.
    """
    from ..runtime import get_runtime

    return get_runtime(using).serving_ledger()


def start(using=None):
    """Start this process's flush tick and exit flush (idempotent); the tick or None."""
    from ..runtime import get_runtime

    return get_runtime(using).start_tick()


def shutdown(now=None):
    """
    Stop the tick and flush every ledger of this process one last time (then drop
    them): on a graceful stop. Safe to call more than once.
    """
    from ..runtime import runtimes

    for runtime in runtimes():
        runtime.stop_flow(now)


def reset():
    """
    Stop the tick and drop this process's ledgers WITHOUT flushing them, and the
    quota cache (``rindle_app.testing.fresh_runtime`` does this and more for tests).
    """
    from ..runtime import runtimes

    for runtime in runtimes():
        runtime.stop_flow(flush=False)


async def lifespan(scope, receive, send):
    """
    An ASGI lifespan application: at the server's shutdown, shuts every runtime
    down (``rindle_app.runtime``: the exit flush, then the hub and the engine). Route it with
    ``ProtocolTypeRouter({..., "lifespan": lifespan})`` under servers that send
    lifespan events (uvicorn, hypercorn); Daphne sends none and exits through
    ``atexit``.
    """
    from asgiref.sync import sync_to_async

    from ..runtime import shutdown as runtime_shutdown

    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await sync_to_async(runtime_shutdown, thread_sensitive=False)()
            await send({"type": "lifespan.shutdown.complete"})
            return


def _in_test_environment():
    # setup_test_environment installs mail.outbox; teardown removes it.
    from django.core import mail

    return hasattr(mail, "outbox")


# --- the beat (Celery) ------------------------------------------------------------------


def beat(now=None, using=None):
    """
    The periodic job of a Celery worker: flush this process's ledger (which drops
    the rows past the kept window), compute ``fleet()`` once and cache it for the
    operator's band. Returns a summary for the task's log.
    """
    from django.core.cache import cache

    from ..conf import rindle_settings

    using = using or rindle_settings.DATABASE
    now = now_ms() if now is None else now
    ledger = get_ledger(using)
    written = ledger.flush(now)
    fleet = ledger.fleet(now, rindle_settings.FLOW_SILENT_AFTER_DAYS)
    seconds = max(300, 5 * float(rindle_settings.FLOW_FLUSH_SECONDS or 60))
    cache.set(
        FLEET_CACHE_KEY.format(using=using),
        {"at_ms": now, "fleet": dataclasses.asdict(fleet)},
        timeout=seconds,
    )
    return {
        "written": written,
        "namespaces": fleet.namespaces,
        "active": fleet.active,
        "silent": fleet.silent,
    }


def cached_fleet(using=None):
    """``(Fleet, computed_at_ms)`` as the last beat cached it, or None."""
    from django.core.cache import cache

    from ..conf import rindle_settings

    cached = cache.get(FLEET_CACHE_KEY.format(using=using or rindle_settings.DATABASE))
    if not isinstance(cached, dict):
        return None
    return Fleet(**cached["fleet"]), cached["at_ms"]
