"""
Garbage collector settings for a server process that holds many sockets.

A Daphne process with a thousand subscribers holds a few hundred thousand
long-lived objects (Django's own, then every socket's protocol, consumer and
scope), and each commit's fan-out allocates a few container objects per frame.
With CPython's default thresholds that allocation runs a young collection every
700 objects, promotes the writes still waiting for their sockets, and so
triggers a full collection every few seconds, which walks every long-lived
object, a pause during which no socket is written (``docs/benchmarks.md``, W3).

``tune_gc()`` moves what the process has loaded so far out of the collector's
reach (``gc.freeze``) and raises the young threshold, so short-lived frames die
young and full collections stay rare and small. Call it once, at the end of the
ASGI module, after the application is built. It changes nothing else: cycles
are still collected.
"""

import gc

SERVER_THRESHOLD0 = 10_000


def tune_gc(threshold0=SERVER_THRESHOLD0):
    """Freeze the objects loaded so far and raise the young-generation threshold."""
    if threshold0 < 1:
        raise ValueError("threshold0 must be a positive number of allocations")
    gc.collect()  # what is garbage now should not be frozen
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(threshold0, middle, old)


__all__ = ["SERVER_THRESHOLD0", "tune_gc"]
