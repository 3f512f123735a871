"""
The live queries of one process: a catalog started at a version of the
database, then kept current by applying only the commits after that version.
"""

import logging
import threading
from collections import Counter, deque

from ..conf import rindle_settings
from ..engine.schema_changes import is_marker
from ..exceptions import ResnapshotRequired
from ..stream import reader
from ..stream.partitions import PartitionSource
from ..stream.reader import decode, tail
from .catalog import Catalog
from .partitions import PartitionStore

logger = logging.getLogger("rindle.ivm")


class LiveQueries:
    """
    Starts a ``Catalog`` over the engine's registered tables and advances it.

    Starting reads no table: the catalog stands at the published ``safe_seq`` S and
    its store (``ivm.partitions.PartitionStore``) reads the partitions its queries
    touch when they touch them, each corrected to the catalog's version from the
    outbox, so the store holds what is watched and a start serves at once. Each
    step applies every commit after the catalog's version: those the engine's writer
    handed over in process (``handoff=True``, SQLite: it reads its own transaction's
    outbox rows before committing, so no read is needed here) when they continue the
    catalog's version, and otherwise the outbox, read up to the published safe_seq.

    A tail that cannot go on raises ``ResnapshotRequired`` from ``poll``: its next
    seq is below the horizon (retention pruned changes it has not applied), or the
    stream's epoch changed since hydration (a restored database numbers its seqs
    anew). Going on would skip changes silently, so the caller tears the queries
    down and calls ``rehydrate`` (the hub: ``realtime.hub.Hub.step``); each one is
    logged and counted in ``resnapshots`` (exported on /metrics).
    """

    def __init__(self, engine, *, handoff=False):
        self.engine = engine
        self.catalog = None
        self.epoch = None  # the stream epoch the catalog's version counts in
        self._handoff = handoff
        self._handed = deque()
        self._lock = threading.Lock()
        self.resnapshots = Counter()  # reason -> re-hydrations

    def start(self):
        self._hydrate()
        if self._handoff:
            self.engine.add_change_listener(self._since, self._deliver)
        return self

    def stop(self):
        if self._handoff:
            self.engine.remove_change_listener(self._deliver)

    def _hydrate(self):
        using, tables = self.engine.using, self.engine.tables
        state, _nothing = reader.consistent_read(using, lambda cursor, state: None, fresh=True)
        # The table map may predate a migration whose DDL marker is at or below the
        # version the catalog starts at, so the tail would never meet it: every
        # table is read again now, after the state (listeners of a changed one are
        # told; nothing subscribes to this catalog yet).
        self.engine.reload_tables([t.name for t in tables])
        store = PartitionStore(
            tables,
            PartitionSource(using, state.epoch),
            max_rows=int(rindle_settings.STORE_MAX_ROWS),
            vendor=self.engine.vendor,
        )
        store.start(state.safe_seq)
        self.catalog = Catalog(tables, store, version=state.safe_seq)
        self.epoch = state.epoch

    def rehydrate(self, reason):
        """
        Replace the catalog by a fresh one hydrated now (its queries are gone: the
        caller re-registers them), after a ``ResnapshotRequired`` of ``reason``.
        """
        logger.warning(
            "rindle live queries of %r: re-hydrating (%s) from version %s",
            self.engine.using,
            reason,
            self.catalog.version if self.catalog is not None else None,
        )
        self.resnapshots[reason] += 1
        self._hydrate()

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
        (version, {query key: ops}, [Fault]). Raises ``ResnapshotRequired`` when the
        tail cannot go on (see the class).
        """
        tables = self.engine.tables.by_name()
        events = self._take_handed(tables)
        version = None
        if events is None:
            events, version = self._read(tables)
        if events:
            version = max(version or 0, events[-1][0])
        if version is None or version <= self.catalog.version:
            return self.catalog.version, {}, []
        marked = [name for _seq, name, old, new in events if is_marker(old, new)]
        if marked:
            # A DDL marker (engine.schema_changes): the table is read again in its new
            # shape and its queries bounced (the engine's schema listeners) before
            # any change is applied. Changes to it before the marker then matter to
            # nobody (its partitions and queries are gone), and those after it land
            # on the new definition.
            self.engine.reload_tables(marked)
            tables = self.engine.tables.by_name()
        changes = [
            (name, old, new)
            for _seq, name, old, new in events
            if name in tables and not is_marker(old, new)
        ]
        outputs, faults = self.catalog.commit(version, changes)
        return version, outputs, faults

    def reload_table(self, name):
        """
        Forget one table whose definition changed (or that is gone) while every other
        table keeps its state: its partitions are read again, in the new shape, when a
        query next touches them. The queries reading it must be destroyed first.
        """
        self.catalog.replace_table(name, None)

    def _read(self, tables):
        """(events after the version, the version they end at) read from the outbox."""
        current = self.catalog.version
        read = tail(self.engine.using, current, tables)
        if read is None:  # the state row was missing (a flushed database): a new epoch
            raise ResnapshotRequired(
                ResnapshotRequired.EPOCH_MISMATCH, "the stream's state row was recreated"
            )
        state = read.state
        if state.epoch != self.epoch:
            raise ResnapshotRequired(
                ResnapshotRequired.EPOCH_MISMATCH,
                f"the stream's epoch changed from {self.epoch} to {state.epoch}",
            )
        if current + 1 < state.horizon:
            raise ResnapshotRequired(
                ResnapshotRequired.BELOW_HORIZON,
                f"the next seq {current + 1} is below the horizon {state.horizon}",
            )
        # On PostgreSQL every seq up to safe_seq is final: the step ends there even when
        # the last ones were rolled back, so a horizon at safe_seq + 1 is no gap.
        end = state.safe_seq if self.engine.vendor == "postgresql" else None
        return read.events, end

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
