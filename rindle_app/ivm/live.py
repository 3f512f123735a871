"""
The live queries of one process: a catalog hydrated from the database at a
version, then kept current by applying only the commits after that version.
"""

import threading
import time
from collections import deque

from ..stream.fence import safe_seq
from ..stream.reader import changes_after, decode, snapshot
from .catalog import Catalog

FENCE_TIMEOUT = 0.05  # seconds the exclusive side of the outbox fence may wait
FENCE_BACKOFF = 0.1  # seconds before trying again after it timed out


class LiveQueries:
    """
    Hydrates a ``Catalog`` over the engine's registered tables and advances it.

    The snapshot and its version are read in one transaction, so the next step
    continues exactly where the snapshot ends: no change is lost or applied twice
    in between. Each step applies every commit after the catalog's version: those
    the engine's writer handed over in process (``handoff=True``: it reads its own
    transaction's outbox rows before committing, so no read is needed here) when
    they continue the catalog's version, and otherwise the outbox, read.
    """

    def __init__(self, engine, *, handoff=False):
        self.engine = engine
        self.catalog = None
        self._handoff = handoff
        self._handed = deque()
        self._lock = threading.Lock()
        self._fence_retry_at = 0.0
        # table -> version: a table reloaded at that version skips its changes up to it.
        self._floors = {}

    def start(self):
        tables = list(self.engine.tables)
        version, rows = snapshot(self.engine.using, tables)
        self.catalog = Catalog(self.engine.tables)
        self.catalog.load(version, rows)
        if self._handoff:
            self.engine.add_change_listener(self._since, self._deliver)
        return self

    def stop(self):
        if self._handoff:
            self.engine.remove_change_listener(self._deliver)

    @property
    def version(self):
        return self.catalog.version

    def _since(self):
        with self._lock:
            return (
                self._handed[-1][1][-1][0]
                if self._handed and self._handed[-1][1]
                else (self.catalog.version)
            )

    def _deliver(self, start, rows):
        with self._lock:
            self._handed.append((start, rows))

    def poll(self):
        """
        Apply every commit after the current version as one step; returns
        (version, {query key: ops}, [Fault]).
        """
        tables = self.engine.tables.by_name()
        events = self._take_handed(tables)
        if events is None:
            events = self._read(tables)
        if not events:
            return self.catalog.version, {}, []
        version = events[-1][0]
        floors = self._floors
        if floors:
            changes = [
                (name, old, new)
                for seq, name, old, new in events
                if name in tables and seq > floors.get(name, 0)
            ]
            self._floors = {t: v for t, v in floors.items() if v > version}
        else:
            changes = [(name, old, new) for _seq, name, old, new in events if name in tables]
        outputs, faults = self.catalog.commit(version, changes)
        return version, outputs, faults

    def reload_table(self, name):
        """
        Re-read one table whose definition changed (or drop it, if it is gone) while
        every other table keeps its state: its rows are read at a version H of their
        own, and its changes up to H, already in those rows, are skipped when the
        catalog catches up. The queries reading it must be destroyed first.
        """
        table = self.engine.tables.by_name().get(name)
        if table is None:
            self._floors.pop(name, None)
            self.catalog.replace_table(name, None)
            return
        version, rows = snapshot(self.engine.using, [table])
        self.catalog.replace_table(name, rows[name])
        if version > self.catalog.version:
            self._floors[name] = version

    def _read(self, tables):
        using = self.engine.using
        if self.engine.vendor != "postgresql":
            return changes_after(using, self.catalog.version, tables)
        # Only up to the fence: a seq above a still-open transaction's must wait for it.
        # While the fence times out (a long transaction writes captured rows), writers
        # queue behind its exclusive request, so it backs off before trying again.
        if time.monotonic() < self._fence_retry_at:
            return []
        safe = safe_seq(using, timeout=FENCE_TIMEOUT)
        if safe is None:
            self._fence_retry_at = time.monotonic() + FENCE_BACKOFF
            return []
        if safe <= self.catalog.version:
            return []
        return [e for e in changes_after(using, self.catalog.version, tables) if e[0] <= safe]

    def _take_handed(self, tables):
        """The handed-over rows after the catalog's version, or None if they leave a gap."""
        with self._lock:
            handed, self._handed = self._handed, deque()
        if not handed:
            return None
        version = self.catalog.version
        events = []
        for start, rows in handed:
            if start > version:
                return None  # something committed between: read the outbox instead
            for seq, name, old, new in rows:
                if seq > version:
                    table = tables.get(name)
                    events.append((seq, name, decode(table, old), decode(table, new)))
                    version = seq
        return events
