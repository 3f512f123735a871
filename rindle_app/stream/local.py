"""
Commit notifications for this process's own SQLite connections: right after a
transaction that captured changes commits, its thread calls the listeners of the
database alias.

The engine hands its commits to readers in process; a plain ORM ``save()`` of this
process is a commit like another process's, and used to be noticed only when the
``-wal`` file reported it (``stream/wake.py``). It is noticed here instead, where it
happens: every SQLite connection Django opens (``connection_created``) gets an
execute wrapper that compares the connection's ``total_changes`` before and after
each statement. SQLite counts a trigger program's rows in it and not in the
statement's ``rowcount``, so more changes than the statement's own rows means a
trigger wrote, which for a synced table is the capture trigger appending to the
outbox. Another trigger of the host's is a false alarm, and costs only a listener
call and an outbox read that finds nothing; no capture is ever missed this way.

- Outside a transaction (autocommit) the statement has committed when it returns:
  the listeners are called at once.
- Inside ``transaction.atomic()`` the call is left to Django's ``on_commit``, once
  per transaction, so a rollback calls nobody and a savepoint rolled back takes its
  registration with it (the next capturing statement registers again).
- A transaction managed by hand (``set_autocommit(False)``, a raw ``BEGIN``) is left
  to the ``-wal`` watcher, as another process's commit is.

The engine's writer connection is ``exempt``: its commits reach readers through the
engine's own listeners. Listeners run on the committing thread, after the commit;
one that fails is logged and never fails the write. Nothing here keeps a thread or
a loop.
"""

import logging
import threading

from django.db import connections
from django.db.backends.signals import connection_created

logger = logging.getLogger("rindle.stream")

_EXEMPT = "_rindle_local_exempt"
_lock = threading.Lock()
_listeners = {}  # alias -> tuple of callables (replaced, never mutated: read without the lock)


def install():
    """Watch every SQLite connection opened from now on (the app's ``ready()``)."""
    connection_created.connect(_connected, dispatch_uid="rindle.stream.local")


def add_listener(using, fn):
    """Call ``fn()`` after each capturing commit of this process on alias ``using``."""
    with _lock:
        _listeners[using] = (*_listeners.get(using, ()), fn)


def remove_listener(using, fn):
    # ``!=``, not ``is not``: each ``obj.method`` access is a new bound method object.
    with _lock:
        kept = tuple(f for f in _listeners.get(using, ()) if f != fn)
        if kept:
            _listeners[using] = kept
        else:
            _listeners.pop(using, None)


def exempt(connection):
    """Never notify for ``connection`` (a Django ``DatabaseWrapper``): the engine's writer."""
    setattr(connection, _EXEMPT, True)
    connection.execute_wrappers[:] = [
        w for w in connection.execute_wrappers if not isinstance(w, _Watch)
    ]


def data_version(using):
    """
    SQLite's ``PRAGMA data_version`` on this thread's connection to ``using``: it
    changes when another connection commits, so a reader that took it before a read
    and finds it unchanged after knows that read saw every commit. None elsewhere.
    """
    conn = connections[using]
    if conn.vendor != "sqlite":
        return None
    conn.ensure_connection()
    return conn.connection.execute("PRAGMA data_version").fetchone()[0]


def _connected(sender, connection, **kwargs):
    if connection.vendor != "sqlite" or getattr(connection, _EXEMPT, False):
        return
    if any(isinstance(w, _Watch) for w in connection.execute_wrappers):
        return  # a reconnection: the wrapper reads the new connection's counter itself
    # First, so it is the outermost wrapper: ``execute_wrapper()`` blocks pop the last.
    connection.execute_wrappers.insert(0, _Watch(connection))


class _Watch:
    """The execute wrapper of one connection (see the module)."""

    __slots__ = ("connection", "notify")

    def __init__(self, connection):
        self.connection = connection
        self.notify = self._notify  # one bound method, found again in ``run_on_commit``

    def __call__(self, execute, sql, params, many, context):
        raw = self.connection.connection
        before = raw.total_changes
        result = execute(sql, params, many, context)
        if raw.total_changes - before > max(context["cursor"].cursor.rowcount, 0):
            self._captured(raw)
        return result

    def _captured(self, raw):
        conn = self.connection
        if conn.in_atomic_block:
            notify = self.notify
            if not any(fn is notify for _sids, fn, _robust in conn.run_on_commit):
                conn.on_commit(notify, robust=True)
        elif not raw.in_transaction:  # autocommit: the statement committed
            self._notify()

    def _notify(self):
        for fn in _listeners.get(self.connection.alias, ()):
            try:
                fn()
            except Exception:  # a listener's bug must not fail a committed write
                logger.exception("rindle: a local commit listener failed")
