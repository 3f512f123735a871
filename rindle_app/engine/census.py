"""
ProducerCensus: how many distinct foreign producers hold a durable watermark row.

``_rindle_producer_offsets`` grows with distinct producer ids, not with writes,
so it needs no reclamation as long as callers keep their ids stable and few. A
caller minting a fresh id per run grows it without bound, and nothing on the
server can refuse that; this gauge is the signal. It is counted incrementally,
never scraped with ``COUNT(*)``: a scrape must not wait on the database, least of
all on a scan of the very table whose growth it watches.

The count is exact. Admission applies a producer write only at ``stored + 1``, so
``seq == 1`` holds exactly when the producer had no row; later writes overwrite
that row, replays are absorbed and gaps refused before any commit. ``note_committed``
runs only after the commit returns, so a rolled-back attempt is never counted.
"""

import threading

from django.db import connections

PRODUCER_OFFSETS = "_rindle_producer_offsets"


class ProducerCensus:
    """The distinct-producer count of one engine; read lock-free with ``get()``."""

    def __init__(self):
        self._count = 0
        self._lock = threading.Lock()  # increments only; reads take no lock

    def seed(self, using):
        """
        Read the count off the table: at engine open, and after a restore or any
        path that lands producer rows without admission (a source replaying a
        master's captured watermark rows counts its adds with ``note_rows``).
        """
        with connections[using].cursor() as cursor:
            cursor.execute(f"SELECT COUNT(*) FROM {PRODUCER_OFFSETS}")
            (count,) = cursor.fetchone()
        with self._lock:
            self._count = int(count)

    def note_committed(self, seq):
        """Count a producer write after its commit returned: only ``seq == 1`` is new."""
        if seq == 1:
            with self._lock:
                self._count += 1

    def note_rows(self, added):
        """Count ``added`` producer rows that a committed batch inserted directly."""
        if added:
            with self._lock:
                self._count += added

    def get(self):
        return self._count

    def __repr__(self):
        return f"ProducerCensus({self._count})"
