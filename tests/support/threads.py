"""
Work on other threads, written once: a transaction another session holds open (the
outbox-fence tests' writer that took its seq and commits late, in every folder), and
callables run at once, each on a thread of its own.
"""

import threading

from django.db import connections, transaction


class OpenTransaction:
    """
    ``with OpenTransaction(write) as held:`` a thread of its own opens a transaction,
    runs ``write()`` in it (``held.result`` is what it returned) and holds it open
    until the block ends; then it commits. Entering waits ``timeout`` seconds for
    ``write`` to have run; leaving releases the transaction (it also ends by itself
    after ``hold`` seconds) and joins the thread. An error in the thread fails the
    test, on entering or on leaving.
    """

    def __init__(self, write, *, timeout=10, hold=30):
        self.write = write
        self.timeout, self.hold = timeout, hold
        self.result = self.error = None
        self._written, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            with transaction.atomic():
                self.result = self.write()
                self._written.set()
                self._release.wait(self.hold)
        except Exception as exc:  # reported by the test's thread
            self.error = exc
            self._written.set()
        finally:
            connections.close_all()

    def __enter__(self):
        self._thread.start()
        assert self._written.wait(self.timeout), "the open transaction did not start"
        assert self.error is None, self.error
        return self

    def __exit__(self, *exc):
        self._release.set()
        self._thread.join(self.timeout)
        assert self.error is None, self.error


def run_at_once(targets, timeout=60):
    """Start a thread for each callable of ``targets``, then join each (for at most
    ``timeout`` seconds; None: until it ends)."""
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
