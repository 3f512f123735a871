"""
The live queries of one process: a catalog hydrated from the database at a
version, then kept current by applying only the commits after that version.
"""

import threading
from collections import deque

from ..stream.reader import changes_after, decode, snapshot
from .catalog import Catalog


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
        tables = {t.name: t for t in self.engine.tables}
        events = self._take_handed(tables)
        if events is None:
            events = changes_after(self.engine.using, self.catalog.version, tables)
        if not events:
            return self.catalog.version, {}, []
        version = events[-1][0]
        changes = [(name, old, new) for _seq, name, old, new in events if name in tables]
        outputs, faults = self.catalog.commit(version, changes)
        return version, outputs, faults

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
