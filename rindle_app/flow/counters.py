"""
The live counters of the usage ledger: per namespace, this process's figure of
the current UTC day (a slot), and the finished days not yet flushed (parked).

``LiveCounters`` is the in-memory half of ``FlowLedger`` (``flow/ledger.py``),
which adds the store: the start, the flush, forgetting and the readers. Here are
the counting points every transfer path calls (``record``, ``refuse``,
``auth_failure``), the roll of a slot to a new day, the forget generations slots
carry, and ``local_rows``: what this process counted, for the readers to merge.

Threading model. The counting points may be called from any number of threads
and from asyncio event loops. Each namespace has a slot with its own
``threading.Lock``, held only for a few integer increments (and, once per
namespace per day, for parking the finished day): a caller can wait only behind
another caller counting the same namespace, never behind I/O or the database. The
slot map is a plain dict read without a lock (atomic under the GIL); slots are
created, and generations changed, under ``_slots_lock``; the parked days under
``_parked_lock``. Nothing here does I/O.

What a record costs once the namespace has a slot: one dict lookup, one lock,
integer increments on preallocated attributes, and a set insertion when the
transfer carries a session id. It allocates nothing Python can avoid (integers
above 256 are objects in CPython, and a first-seen session id grows a set). The
three counting points write out their few lines of slot lookup, day check and
observer call each, on purpose: a shared helper would cost a call per transfer.
"""

import logging
import threading

from ..engine.errors import InvalidInput
from ..exceptions import FLOW_INVALID_TRANSFER, FLOW_UNKNOWN_REASON
from . import sessions as sketches
from .figures import (
    DAY_MS,
    REASON_INDEX,
    REASONS,
    Row,
    Transfer,
    check_namespace,
    check_time,
    utc_day,
)

logger = logging.getLogger("rindle.flow")

# Session ids kept raw in a slot before they are folded into the slot's sketch.
_FOLD_AT = 2 * sketches.K

# --- the live slot -----------------------------------------------------------------------


class _Slot:
    """One namespace's counters for one UTC day, in this process."""

    __slots__ = (
        "lock",
        "day",
        "gen",
        "bytes_in",
        "bytes_out",
        "bulk_in",
        "bulk_out",
        "transfers",
        "refusals",
        "auth_failures",
        "ids",
        "sketch",
        "last_seen",
        "dirty",
    )

    def __init__(self, day, gen):
        self.lock = threading.Lock()
        self.gen = gen
        self.refusals = [0] * len(REASONS)
        self.ids = set()
        self.reset(day)

    def reset(self, day):
        """Start ``day`` from zero (the slot's lock held, or the slot unpublished)."""
        self.day = day
        self.bytes_in = self.bytes_out = self.bulk_in = self.bulk_out = 0
        self.transfers = self.auth_failures = self.last_seen = 0
        refusals = self.refusals
        for i in range(len(refusals)):
            refusals[i] = 0
        self.ids.clear()
        self.sketch = ()
        self.dirty = False

    def fold(self):
        """Move the raw session ids into the sketch (bounds the slot's memory)."""
        if self.ids:
            self.sketch = tuple(sketches.add_ids(self.sketch, self.ids))
            self.ids.clear()

    def row(self, namespace, node):
        """A copy of the slot's figure (the slot's lock held)."""
        self.fold()
        return Row(
            namespace,
            self.day,
            node,
            self.bytes_in,
            self.bytes_out,
            self.bulk_in,
            self.bulk_out,
            self.transfers,
            tuple(self.refusals),
            self.auth_failures,
            self.sketch,
            self.last_seen,
            self.gen,
        )

    def is_empty(self):
        return not (self.transfers or self.auth_failures or self.last_seen or any(self.refusals))

    def seed(self, row):
        """Add a stored figure of the same day to the slot (restart seeding)."""
        had_flow = self.dirty
        self.bytes_in += row.bytes_in
        self.bytes_out += row.bytes_out
        self.bulk_in += row.bulk_bytes_in
        self.bulk_out += row.bulk_bytes_out
        self.transfers += row.transfers
        for i, n in enumerate(row.refusals):
            self.refusals[i] += n
        self.auth_failures += row.auth_failures
        self.sketch = tuple(sketches.merge(self.sketch, row.sessions))
        self.last_seen = max(self.last_seen, row.last_seen_ms)
        # Seeded alone, the slot equals the stored copy: nothing to flush yet.
        self.dirty = had_flow


# --- the counters ------------------------------------------------------------------------


class LiveCounters:
    """
    This process's figures per namespace: today's slot and the parked closed days.

    Complete on its own (it counts, rolls days and reports ``local_rows``), it
    never reads or writes the store: ``FlowLedger`` adds that. ``node`` names the
    rows it makes.
    """

    def __init__(self, node):
        self.node = node
        self._slots = {}
        self._slots_lock = threading.Lock()
        self._parked = {}
        self._parked_lock = threading.Lock()
        self._observer = None
        # The forget generation of every namespace ever forgotten.
        self._gens = {}
        # Records dated before their slot's day (a clock stepped back, a late
        # transfer): counted into the slot's day, never into a closed one.
        self.late_records = 0

    def observe(self, observer):
        """
        Call ``observer(namespace)`` for every recorded transfer, refusal and auth
        failure; replaces any earlier observer (None removes it). Called on the
        transfer path: it must be cheap and must not block (add to a set, return).
        """
        self._observer = observer

    # --- the counting points: the transfer path ------------------------------------------

    def record(self, namespace, at, transfer):
        """The counting point for a finished transfer. One call, one day."""
        slot = self._slots.get(namespace)
        if slot is None:
            slot = self._first_sight(namespace, at)
        if type(at) is not int or type(transfer) is not Transfer:
            check_time(at)
            raise InvalidInput(
                f"a transfer must be a Transfer, not {type(transfer).__name__}",
                code=FLOW_INVALID_TRANSFER,
            )
        day = at // DAY_MS
        with slot.lock:
            if day != slot.day:
                self._turn(namespace, slot, at)
            slot.bytes_in += transfer.bytes_in
            slot.bytes_out += transfer.bytes_out
            slot.bulk_in += transfer.bulk_bytes_in
            slot.bulk_out += transfer.bulk_bytes_out
            slot.transfers += 1
            if at > slot.last_seen:
                slot.last_seen = at
            session = transfer.session
            if session is not None:
                ids = slot.ids
                ids.add(session)
                if len(ids) > _FOLD_AT:
                    slot.fold()
            slot.dirty = True
        observer = self._observer
        if observer is not None:
            _notify(observer, namespace)

    def refuse(self, namespace, at, reason):
        """The counting point for a refusal: no bytes moved; the tenant met a door."""
        slot = self._slots.get(namespace)
        if slot is None:
            slot = self._first_sight(namespace, at)
        try:
            index = REASON_INDEX.get(reason)
        except TypeError:  # an unhashable reason
            index = None
        if index is None or type(at) is not int:
            check_time(at)
            raise InvalidInput(
                f"unknown refusal reason {reason!r:.80}; one of {', '.join(REASONS)}",
                code=FLOW_UNKNOWN_REASON,
            )
        day = at // DAY_MS
        with slot.lock:
            if day != slot.day:
                self._turn(namespace, slot, at)
            slot.refusals[index] += 1
            if at > slot.last_seen:
                slot.last_seen = at
            slot.dirty = True
        observer = self._observer
        if observer is not None:
            _notify(observer, namespace)

    def auth_failure(self, namespace, at):
        """
        The counting point for a principal with no grant in ``namespace``.

        Counted, but it does not make the namespace "seen": a principal without a
        grant is not the tenant, and a dead tenant must not look alive because
        someone knocks on its door.
        """
        slot = self._slots.get(namespace)
        if slot is None:
            slot = self._first_sight(namespace, at)
        if type(at) is not int:
            check_time(at)
        day = at // DAY_MS
        with slot.lock:
            if day != slot.day:
                self._turn(namespace, slot, at)
            slot.auth_failures += 1
            slot.dirty = True
        observer = self._observer
        if observer is not None:
            _notify(observer, namespace)

    # --- slow paths of the counting points ----------------------------------------------

    def _first_sight(self, namespace, at):
        check_namespace(namespace)
        return self._slot(namespace, utc_day(check_time(at)))

    def _slot(self, namespace, day):
        with self._slots_lock:
            slot = self._slots.get(namespace)
            if slot is None:
                slot = self._slots[namespace] = _Slot(day, self._gens.get(namespace, 0))
            return slot

    def _turn(self, namespace, slot, at):
        """The slot holds another day than ``at`` (the slot's lock held)."""
        check_time(at)
        day = at // DAY_MS
        if day < slot.day:
            # A closed day's figure is final once parked: a late record counts today.
            self.late_records += 1
            return
        if slot.dirty:
            row = slot.row(namespace, self.node)
            with self._parked_lock:
                self._parked[(namespace, row.day)] = row
        slot.reset(day)

    # --- forget generations ------------------------------------------------------------

    def _adopt_generation(self, namespace, gen, drop_slot=False):
        """
        Make ``gen`` the namespace's generation (never lowering it): figures of an
        older generation go, and slots made from now on carry ``gen``. Returns
        whether a slot was dropped (``drop_slot``) or reset.
        """
        with self._slots_lock:  # slot creation reads the generation under it
            if gen > self._gens.get(namespace, 0):
                self._gens[namespace] = gen
            gen = self._gens.get(namespace, 0)
            slot = self._slots.pop(namespace, None) if drop_slot else None
            had_slot = slot is not None
            if slot is None:
                slot = self._slots.get(namespace)
                if slot is not None:
                    with slot.lock:
                        if slot.gen != gen:
                            slot.reset(slot.day)
                            slot.gen = gen
        with self._parked_lock:
            for key in [k for k, row in self._parked.items() if k[0] == namespace]:
                if drop_slot or self._parked[key].gen != gen:
                    del self._parked[key]
                    had_slot = True
        return had_slot

    # --- what this process counted (public: readers merge it with the store's copies) --

    def local_rows(self, namespace, first_day, last_day):
        """
        This process's figures ``{(namespace, day): Row}`` in the day range, for one
        namespace or (None) all: the live slots, each rolled first when it still
        holds a day before ``last_day`` (today), and the parked final figures.
        """
        if namespace is None:
            slots = list(self._slots.items())
        else:
            slot = self._slots.get(namespace)
            slots = [] if slot is None else [(namespace, slot)]
        found = {}
        for ns, slot in slots:
            with slot.lock:
                if slot.day < last_day:
                    self._turn(ns, slot, last_day * DAY_MS)
                if first_day <= slot.day <= last_day and not slot.is_empty():
                    found[(ns, slot.day)] = slot.row(ns, self.node)
        with self._parked_lock:
            for (ns, d), row in self._parked.items():
                if (namespace is None or ns == namespace) and first_day <= d <= last_day:
                    found.setdefault((ns, d), row)
        return found

    def live_totals(self, day):
        """
        The live figures of UTC ``day`` summed over every namespace, from memory (for
        the metrics scrape).

        It reads the slots without rolling them (a slot still holding another day
        counts nothing for ``day``) and without folding session ids, so a scrape
        changes no state and costs a few integer additions per namespace.
        """
        totals = dict.fromkeys(
            ("bytes_in", "bytes_out", "bulk_in", "bulk_out", "transfers", "auth_failures", "seen"),
            0,
        )
        refusals = [0] * len(REASONS)
        for slot in list(self._slots.values()):
            with slot.lock:
                if slot.day != day:
                    continue
                totals["bytes_in"] += slot.bytes_in
                totals["bytes_out"] += slot.bytes_out
                totals["bulk_in"] += slot.bulk_in
                totals["bulk_out"] += slot.bulk_out
                totals["transfers"] += slot.transfers
                totals["auth_failures"] += slot.auth_failures
                totals["seen"] += slot.last_seen > 0
                for i, n in enumerate(slot.refusals):
                    refusals[i] += n
        totals["refusals"] = refusals
        return totals

    def _local_last_seen(self, namespace, floor):
        seen = [0]
        slot = self._slots.get(namespace)
        if slot is not None and slot.day >= floor:
            seen.append(slot.last_seen)
        with self._parked_lock:
            seen.extend(
                row.last_seen_ms
                for (ns, d), row in self._parked.items()
                if ns == namespace and d >= floor
            )
        return seen


def _notify(observer, namespace):
    try:
        observer(namespace)
    except Exception:
        logger.exception("the flow observer failed on namespace %r", namespace)
