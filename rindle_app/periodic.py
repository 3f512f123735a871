"""
A daemon thread that runs one step at intervals until stopped: the loop the flush
tick (``flow/tick.py``, ``FlushTick``) and the embedded retention timer
(``stream/retention.py``, ``RetentionTimer``) share.

A subclass gives the thread's ``name``, ``step()`` and ``delays()``, and may give
``prepare()``. A failing step is logged (``failure``, on ``log``) and retried at the
next one; every step, failed or not, counts in ``runs`` and ends with
``close_old_connections()``, and the thread closes its connections when it ends.

Threading model: ``start``, ``stop`` and ``alive`` may be called from any thread;
``prepare`` and ``step`` run only on the loop's own thread. ``stop`` sets an event
the loop waits on, so a stop interrupts a wait but never a step, and it joins the
thread (for at most ``timeout``) unless called from the loop itself.
"""

import logging
import threading

from django.db import close_old_connections, connections

logger = logging.getLogger("rindle")


class Periodic:
    name = "rindle-periodic"
    log = logger
    failure = "rindle: a periodic step failed; the next one retries"

    def __init__(self):
        self._stop = threading.Event()
        self._thread = None
        self.runs = 0

    def prepare(self):
        """Runs once on the thread before the first wait."""

    def delays(self):
        """The seconds to wait before each step, in order (an endless iterable)."""
        raise NotImplementedError

    def step(self):
        raise NotImplementedError

    def start(self):
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout=5.0):
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def alive(self):
        return self._thread is not None and self._thread.is_alive()

    def _run(self):
        try:
            self.prepare()
            for delay in self.delays():
                if self._stop.wait(delay):
                    break
                try:
                    self.step()
                except Exception:
                    self.log.exception(self.failure)
                finally:
                    self.runs += 1
                    close_old_connections()
        finally:
            connections.close_all()
