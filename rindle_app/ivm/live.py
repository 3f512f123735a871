"""
The live queries of one process: a catalog hydrated from the database at a
version, then kept current by applying only the commits after that version.
"""

from ..stream.reader import changes_after, snapshot
from .catalog import Catalog


class LiveQueries:
    """
    Hydrates a ``Catalog`` over the engine's registered tables and advances it by
    polling the outbox. The snapshot and its version are read in one transaction,
    so the first poll continues exactly where the snapshot ends: no change is lost
    or applied twice in between.
    """

    def __init__(self, engine):
        self.engine = engine
        self.catalog = None

    def start(self):
        tables = list(self.engine.tables)
        version, rows = snapshot(self.engine.using, tables)
        self.catalog = Catalog(self.engine.tables)
        self.catalog.load(version, rows)
        return self

    @property
    def version(self):
        return self.catalog.version

    def poll(self):
        """
        Apply every commit after the current version as one step; returns
        (version, {query key: ops}, [Fault]).
        """
        tables = {t.name: t for t in self.engine.tables}
        events = changes_after(self.engine.using, self.catalog.version, tables)
        if not events:
            return self.catalog.version, {}, []
        version = events[-1][0]
        changes = [(name, old, new) for _seq, name, old, new in events if name in tables]
        outputs, faults = self.catalog.commit(version, changes)
        return version, outputs, faults
