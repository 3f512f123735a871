"""
Commit and watermark notifications from other processes.

On PostgreSQL the capture trigger calls ``pg_notify`` on ``rindle_outbox`` with its
transaction id, so each committed transaction that wrote captured rows sends one
notification (ids, never rows); the watermarker sends one on ``rindle_watermark``
(payload: the new safe_seq) in the transaction that advances it, so readers,
which tail only up to the published safe_seq, wake when there is more to read.
``Listener`` holds a dedicated LISTEN connection on its channels and calls
``on_commit()`` for each notification (or ``on_notify(notification)``, with its
payload, when given; ``on_commit()`` still marks each (re)connection, after which
anything may have been missed); the reader still reads the outbox, so a
lost notification only delays a change until the next poll. SQLite has no
notifications: readers poll.
"""

import logging
import threading

from django.db import connections

from ..engine.capture import NOTIFY_CHANNEL

logger = logging.getLogger("rindle.stream")

WATERMARK_CHANNEL = "rindle_watermark"  # the watermarker's: payload the new safe_seq


class Listener:
    """Calls ``on_commit()`` for each notification on ``channels`` (see the module)."""

    def __init__(self, using, on_commit, channels=(NOTIFY_CHANNEL,), on_notify=None):
        self.using = using
        self.on_commit = on_commit
        self.on_notify = on_notify
        self.channels = tuple(channels)
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
                for channel in self.channels:  # constants, never input
                    raw.execute(f"LISTEN {channel}")
                self.listening.set()
                self.on_commit()  # anything committed before LISTEN took effect
                while not self._stop.is_set():
                    for notify in raw.notifies(timeout=0.1, stop_after=64):
                        if self.on_notify is None:
                            self.on_commit()
                        else:
                            self.on_notify(notify)
            except Exception:
                self.listening.clear()
                logger.exception("rindle listener: connection lost; reconnecting")
                self._stop.wait(0.5)
            finally:
                try:
                    conn.close()
                except Exception:
                    pass
