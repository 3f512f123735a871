"""
The threads a socket's blocking calls run on: never the event loop, and never
asgiref's one thread-sensitive thread.

``channels.db.database_sync_to_async`` (and ``sync_to_async`` with its default
``thread_sensitive=True``) runs every call of every socket of the process on ONE
thread, in order. A call that waits there (a subscribe building a new query under
the hub's lock, a hub that is still hydrating) makes every other socket's call wait
behind it, even one that needs nothing (issue 16 measured an unknown frame's error
reply waiting 1.36 s behind another socket's first query). And ``sync_to_async`` with
``thread_sensitive=False`` runs on the loop's default executor, ``min(32, cpu + 4)``
threads shared with everything else in the process: six calls blocked on the hub
fill it on a 2-core machine.

So the consumer runs its calls in two pools of its own:

- ``run_db``: calls that read or write the database (a bearer token, the quota
  seed, a lease, a named query's resolution and read rules, a client id's owner, a
  mutation, the credential re-check): ``WS_DB_THREADS`` threads. Django's database
  connections are per thread; each call starts and ends with
  ``close_old_connections()``, as ``database_sync_to_async`` does, so a worker keeps
  no connection past ``CONN_MAX_AGE``.
- ``run_hub``: calls that take the hub's lock (connect, subscribe, unsubscribe,
  hold, release, disconnect): ``WS_HUB_THREADS`` threads. They wait for the lock and
  for nothing else, so however many of them wait (say behind a new query's build),
  the database calls of other sockets still run.

A call is awaited on the socket's event loop; cancelling the awaiting task does not
stop a call that already runs (a thread cannot be stopped), so a caller that must
undo what a call did checks afterwards (``RindleConsumer._register``). ``submit_hub``
queues a call nobody awaits (the disconnect of a socket whose consumer was
cancelled). The pools are made on first use, with the sizes the settings have then,
and made again in a forked child (threads do not survive a fork).
"""

import asyncio
import contextvars
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

from ..conf import rindle_settings

_pools = {}  # name -> ThreadPoolExecutor
_lock = threading.Lock()
_SIZES = {"db": "WS_DB_THREADS", "hub": "WS_HUB_THREADS"}


def pool(name):
    """The executor ``name`` ("db" or "hub"), made on first use."""
    executor = _pools.get(name)
    if executor is not None:
        return executor
    with _lock:
        executor = _pools.get(name)
        if executor is None:
            size = int(getattr(rindle_settings, _SIZES[name]))
            if size < 1:
                raise ValueError(f"{_SIZES[name]} must be at least 1, not {size}")
            executor = _pools[name] = ThreadPoolExecutor(size, f"rindle-ws-{name}")
        return executor


def _call(fn, args, kwargs):
    close_old_connections()
    try:
        return fn(*args, **kwargs)
    finally:
        close_old_connections()


def _run(name, fn, args, kwargs):
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()
    call = functools.partial(context.run, _call, fn, args, kwargs)
    return loop.run_in_executor(pool(name), call)


def run_db(fn, *args, **kwargs):
    """Await ``fn(*args, **kwargs)`` on a database worker thread."""
    return _run("db", fn, args, kwargs)


def run_hub(fn, *args, **kwargs):
    """Await ``fn(*args, **kwargs)`` (a call that takes the hub's lock) on a hub worker thread."""
    return _run("hub", fn, args, kwargs)


def submit_db(fn, *args):
    """Queue ``fn(*args)`` on a database worker thread; a ``concurrent.futures.Future``."""
    return pool("db").submit(_call, fn, args, {})


def submit_hub(fn, *args):
    """Queue ``fn(*args)`` on a hub worker thread; a ``concurrent.futures.Future``."""
    return pool("hub").submit(_call, fn, args, {})


def _forget_after_fork():
    global _lock
    _pools.clear()
    _lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_forget_after_fork)


__all__ = ["pool", "run_db", "run_hub", "submit_hub"]
