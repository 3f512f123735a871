"""
The usage ledger of this process: per-namespace, per-UTC-day transfer counters,
and the flush that copies them into the database.

Every transfer path calls ``record``/``refuse``/``auth_failure`` (the live
counters, ``flow/counters.py``); a tick calls ``flush``, which COPIES every
changed figure into the kept half (``FlowStore``, ``flow/store.py``). Readers
(``today``, ``glance``, ``moved``, ``fleet``) combine this process's live
figures with the copies every other process flushed. The figures themselves
(``Transfer``, ``Row``, ``FlowDay``, ``Glance``, ``Fleet``, ``Refusal``) live in
``flow/figures.py`` and are importable from here and from ``rindle_app.flow``.

Threading model. The counting points run on any thread and any event loop, each
behind its namespace's slot lock only, never behind I/O: ``flow/counters.py``
says which lock guards what. What this module adds is what touches the database:
``start``, ``flush``, ``forget`` and the readers run on their caller's thread
(the flush tick's, a request's, the admin's), outside every slot lock, taking
each slot's lock only to copy its figure. ``start`` and the flushes of one ledger
are serialized under one lock, so two flushes never interleave their copies.
"""

import os
import socket
import threading
import uuid

from ..engine.errors import InvalidInput
from ..exceptions import FLOW_INVALID_NODE, FLOW_INVALID_WINDOW
from . import figures
from .counters import LiveCounters
from .figures import *  # noqa: F403 (the figures stay importable from here: figures.__all__)
from .figures import (
    DAY_MS,
    REASONS,
    Fleet,
    FlowDay,
    Glance,
    check_days,
    check_namespace,
    check_time,
    merge_rows,
    utc_day,
)

__all__ = ["FlowLedger", "default_node_id", *figures.__all__]


def default_node_id():
    """A node id no other live process holds: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class FlowLedger(LiveCounters):
    """
    The usage ledger of this process: the live counters (``LiveCounters``) over a
    ``FlowStore`` (the kept half).

    ``node`` names this ledger's rows in the store; it must not be shared by two
    live ledgers. The default is unique per instance; a node id that is stable
    across restarts (``RINDLE["FLOW_NODE_ID"]``) makes a restarted process seed
    today's slots from its own rows instead of starting new rows (see ``start``).
    """

    def __init__(self, store=None, node=None, retention_days=None):
        if store is None:
            from .store import FlowStore

            store = FlowStore()
        if retention_days is None:
            from ..conf import rindle_settings

            retention_days = rindle_settings.FLOW_RETENTION_DAYS
        if type(retention_days) is not int or retention_days < 1:
            raise InvalidInput(
                f"the flow retention must be a positive number of days, not {retention_days!r}",
                code=FLOW_INVALID_WINDOW,
            )
        if node is not None and (type(node) is not str or not 0 < len(node) <= 200):
            raise InvalidInput("a flow node id must be a non-empty string", code=FLOW_INVALID_NODE)
        super().__init__(node or default_node_id())
        self._store = store
        self.retention_days = retention_days
        self._flush_lock = threading.RLock()
        self._started = False
        # The store's tombstone sequence read so far (see FlowStore.tombstones).
        self._tomb_cursor = 0

    def __repr__(self):
        return f"<FlowLedger node={self.node!r} namespaces={len(self._slots)}>"

    @property
    def store(self):
        """The kept half, for the readers that want a series rather than today."""
        return self._store

    # --- lifecycle -------------------------------------------------------------------

    def start(self, now_unix_ms):
        """
        Learn every forget and seed today's slots from this node's stored rows.

        Call it once, before the first record (``get_ledger()`` does). A restarted
        process with the same node id then continues its own rows: each seeded slot
        holds the stored figure, later records add on top, and the next flush
        copies the sum over the row it came from, so figures after a restart equal
        those before and nothing is counted twice. With a fresh node id (the
        default) there is nothing to seed: the old process's rows stay as they
        were and every read sums them with the new ones, to the same figures.
        """
        day = utc_day(check_time(now_unix_ms, "now"))
        with self._flush_lock:
            if self._started:
                return self
            self._learn(self._store.tombstones(self._tomb_cursor))
            for row in self._store.node_rows(self.node, day):
                slot = self._slot(row.namespace, day)
                with slot.lock:
                    if slot.day == day and slot.gen == self._gens.get(row.namespace, 0):
                        slot.seed(row)
            self._started = True
        return self

    # --- the flush -----------------------------------------------------------------------

    def flush(self, now_unix_ms):
        """
        Copy every changed live slot and every parked day into the store, in ONE
        transaction, and delete the rows that aged out of the kept window.

        It COPIES rather than adds (a row is set to the figure, never incremented),
        so running it twice writes the same rows: safe to run again on shutdown and
        safe to seed a restart from. A namespace forgotten meanwhile (here or by
        another process) is not written, and its slot starts over. Returns how many
        rows it wrote. On a database failure nothing is lost: the figures are
        flushed by the next call.
        """
        floor = utc_day(check_time(now_unix_ms, "now")) - self.retention_days + 1
        with self._flush_lock:
            taken, rows = [], []
            for namespace, slot in list(self._slots.items()):
                with slot.lock:
                    if not slot.dirty:
                        continue
                    slot.dirty = False
                    if slot.day < floor:
                        continue
                    row = slot.row(namespace, self.node)
                taken.append((slot, row))
                rows.append(row)
            with self._parked_lock:
                parked, self._parked = self._parked, {}
            rows.extend(row for row in parked.values() if row.day >= floor)
            try:
                result = self._store.write(rows, floor_day=floor, since=self._tomb_cursor)
            except BaseException:
                self._put_back(taken, parked)
                raise
            self._learn(result.tombstones)
            return result.written

    def _put_back(self, taken, parked):
        """After a failed flush: what it took is flushed by the next one."""
        for slot, row in taken:
            with slot.lock:
                if slot.day == row.day and slot.gen == row.gen:
                    slot.dirty = True
                    continue
            parked[(row.namespace, row.day)] = row
        with self._parked_lock:
            for key, row in parked.items():
                self._parked.setdefault(key, row)

    def _learn(self, tombstones):
        """Take in forgets ``(namespace, generation, seq)``: their old figures go."""
        for namespace, gen, seq in tombstones:
            self._tomb_cursor = max(self._tomb_cursor, seq)
            self._adopt_generation(namespace, gen)

    # --- forget ------------------------------------------------------------------------

    def forget(self, namespace, now_unix_ms=None):
        """
        Drop a namespace's live slot, its parked days and its whole kept series (every
        node's rows): the flow half of deleting a namespace. Returns whether there
        was anything to drop.

        A tombstone (a bumped generation) is committed with the deletion, so a flush
        racing with it, in this process or any other, cannot bring the rows back:
        flushes check the generation in their own transaction, and a process that
        learns of the forget drops its figures of the namespace (what it counted
        between the forget and its next flush goes with them: at most one tick).
        """
        check_namespace(namespace)
        if now_unix_ms is not None:
            check_time(now_unix_ms, "now")
        deleted, gen, _seq = self._store.forget(namespace, now_unix_ms)
        had_figures = self._adopt_generation(namespace, gen, drop_slot=True)
        return bool(deleted or had_figures)

    # --- the readers -----------------------------------------------------------------------

    def today(self, namespace, now_unix_ms):
        """
        Today's figure of ``namespace``: this process's live slot (exact, whether or
        not flushed) plus every other process's copy as of its last flush.

        None when nothing happened today: no slot here and no stored row.
        """
        check_namespace(namespace)
        day = utc_day(check_time(now_unix_ms, "now"))
        merged = self.series(namespace, day, day)
        return merged.get(day)

    def glance(self, namespace, now_unix_ms):
        """Today's flow, and when the namespace was last seen over the whole kept window."""
        check_namespace(namespace)
        day = utc_day(check_time(now_unix_ms, "now"))
        today = self.series(namespace, day, day).get(day) or FlowDay(namespace, day)
        floor = day - self.retention_days + 1
        stored = self._store.last_seen(namespace, floor)
        last = max(stored, *self._local_last_seen(namespace, floor))
        return Glance(namespace, today, last or None)

    def moved(self, namespace, now_unix_ms, days):
        """
        Bytes moved (wire bytes in + out) per UTC day over the last ``days`` days,
        today included: ``[(day, bytes)]`` for each day that moved anything, oldest
        first. Bulk bytes are inside the wire bytes and not added again.

        Today is the live slot (plus other processes' copies); a closed day is the
        store's rows, where this process's parked final figure REPLACES its own
        last-tick copy, never adds to it. A slot still holding yesterday is rolled
        first, so a read just after midnight does not take yesterday's bytes for
        today's. The window never reaches past the kept window. It reads the
        store: call it once per namespace per process, never per transfer.
        """
        check_namespace(namespace)
        day = utc_day(check_time(now_unix_ms, "now"))
        days = min(check_days(days), self.retention_days)
        if days == 0:
            return []
        merged = self.series(namespace, day - days + 1, day)
        return [(d, merged[d].moved) for d in sorted(merged) if merged[d].moved]

    def window_bytes(self, namespace, now_unix_ms, days):
        """``moved`` summed: bytes in + out over the window."""
        return sum(n for _day, n in self.moved(namespace, now_unix_ms, days))

    def fleet(self, now_unix_ms, silent_after_days):
        """
        The whole fleet's flow today, folded, and how many tenants have gone quiet.

        O(namespaces) and it reads the store: for a tick that computes it once a
        minute and for an operator's page, never for a transfer.
        ``silent_after_days`` (at least 1) is the caller's policy.
        """
        day = utc_day(check_time(now_unix_ms, "now"))
        if type(silent_after_days) is not int or silent_after_days < 1:
            raise InvalidInput(
                f"silent_after_days must be a positive integer, not {silent_after_days!r:.80}",
                code=FLOW_INVALID_WINDOW,
            )
        floor = day - self.retention_days + 1
        stored_today, last_seen = self._store.fleet_rows(day, floor)
        local = self.local_rows(None, floor, day)
        today_rows = {}
        for row in stored_today:
            if row.node != self.node or (row.namespace, row.day) not in local:
                today_rows.setdefault(row.namespace, []).append(row)
        for (namespace, d), row in local.items():
            last_seen[namespace] = max(last_seen.get(namespace, 0), row.last_seen_ms)
            if d == day:
                today_rows.setdefault(namespace, []).append(row)
        totals = {
            "bytes_in": 0,
            "bytes_out": 0,
            "bulk_bytes_in": 0,
            "bulk_bytes_out": 0,
            "transfers": 0,
            "auth_failures": 0,
            "sessions": 0,
        }
        refusals = dict.fromkeys(REASONS, 0)
        for namespace, rows in today_rows.items():
            figure = merge_rows(namespace, day, rows)
            for name in totals:
                totals[name] += getattr(figure, name)
            for reason, n in figure.refusals.items():
                refusals[reason] += n
        quiet_before = (day - silent_after_days + 1) * DAY_MS
        return Fleet(
            day=day,
            silent_after_days=silent_after_days,
            namespaces=len(last_seen),
            active=sum(1 for ms in last_seen.values() if ms >= day * DAY_MS),
            silent=sum(1 for ms in last_seen.values() if ms < quiet_before),
            refusals=refusals,
            **totals,
        )

    # --- reading helpers (public: the admin's pages merge figures as these do) --------

    def series(self, namespace, first_day, last_day):
        """``{day: FlowDay}`` of one namespace over the day range, every node summed."""
        local = self.local_rows(namespace, first_day, last_day)
        by_day = {}
        for row in self._store.rows(namespace, first_day, last_day):
            if row.node == self.node and (namespace, row.day) in local:
                continue  # the local figure replaces this process's stored copy
            by_day.setdefault(row.day, []).append(row)
        for (_ns, d), row in local.items():
            by_day.setdefault(d, []).append(row)
        return {d: merge_rows(namespace, d, rows) for d, rows in by_day.items()}
