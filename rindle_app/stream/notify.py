"""
Commit notifications from other processes.

On PostgreSQL the capture trigger calls ``pg_notify`` with its transaction id, so
each committed transaction that wrote captured rows sends one notification (ids,
never rows). ``Listener`` holds a dedicated LISTEN connection and calls
``on_commit()`` for each; the reader still reads the outbox, so a lost notification
only delays a change until the next poll. SQLite has no notifications: readers
poll.
"""

import logging
import threading

from django.db import connections

from ..engine.capture import NOTIFY_CHANNEL

logger = logging.getLogger("rindle.stream")


class Listener:
    def __init__(self, using, on_commit):
        self.using = using
        self.on_commit = on_commit
        self._stop = threading.Event()
        self._thread = None
        self.listening = threading.Event()

    def start(self):
        self._thread = threading.Thread(target=self._run, name="rindle-listen", daemon=True)
        self._thread.start()
        return self

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self):
        while not self._stop.is_set():
            conn = connections.create_connection(self.using)
            try:
                conn.ensure_connection()
                raw = conn.connection
                raw.autocommit = True
                raw.execute(f"LISTEN {NOTIFY_CHANNEL}")
                self.listening.set()
                self.on_commit()  # anything committed before LISTEN took effect
                while not self._stop.is_set():
                    for _ in raw.notifies(timeout=0.1, stop_after=64):
                        self.on_commit()
            except Exception:
                self.listening.clear()
                logger.exception("rindle listener: connection lost; reconnecting")
                self._stop.wait(0.5)
            finally:
                try:
                    conn.close()
                except Exception:
                    pass
