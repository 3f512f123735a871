"""
The live half of the usage ledger: per-namespace, per-UTC-day transfer counters.

Every transfer path calls ``record``/``refuse``/``auth_failure``; a tick calls
``flush``, which COPIES every changed figure into the kept half (``FlowStore``).
Readers (``today``, ``glance``, ``moved``, ``fleet``) combine this process's live
figures with the copies every other process flushed.

Threading model. ``record``, ``refuse`` and ``auth_failure`` may be called from any
number of threads and from asyncio event loops. Each namespace has a slot with its
own ``threading.Lock``, held only for a few integer increments (and, once per
namespace per day, for parking the finished day): a caller can wait only behind
another caller counting the same namespace, never behind I/O or the database. The
slot map is a plain dict read without a lock (atomic under the GIL); slots are
created under a ledger lock. ``flush``, ``forget`` and the readers touch the
database outside every slot lock; flushes of one ledger are serialized.

What a record costs once the namespace has a slot: one dict lookup, one lock,
integer increments on preallocated attributes, and a set insertion when the
transfer carries a session id. It allocates nothing Python can avoid (integers
above 256 are objects in CPython, and a first-seen session id grows a set).
"""

import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, field
from datetime import date, timedelta
from enum import StrEnum
from typing import NamedTuple

from ..engine.errors import InvalidInput
from ..exceptions import (
    FLOW_INVALID_NAMESPACE,
    FLOW_INVALID_NODE,
    FLOW_INVALID_TIME,
    FLOW_INVALID_TRANSFER,
    FLOW_INVALID_WINDOW,
    FLOW_UNKNOWN_REASON,
)
from . import sessions as sketches

logger = logging.getLogger("rindle.flow")

DAY_MS = 86_400_000
_EPOCH = date(1970, 1, 1)
# Largest byte count one transfer may report (8 PiB): anything larger is a bug in
# the caller, and refusing it keeps every stored counter far from BIGINT overflow.
MAX_TRANSFER_BYTES = 2**53
MAX_NAMESPACE_LENGTH = 200
MAX_SESSION_LENGTH = 256
# Session ids kept raw in a slot before they are folded into the slot's sketch.
_FOLD_AT = 2 * sketches.K


class Refusal(StrEnum):
    """Why a tenant was refused: the closed set of reasons the ledger counts."""

    RATE_LIMIT = "rate_limit"
    QUOTA = "quota"
    PERMISSION = "permission"
    FENCED = "fenced"
    TOO_LARGE = "too_large"
    BAD_REQUEST = "bad_request"
    UNAVAILABLE = "unavailable"
    OTHER = "other"


REASONS = tuple(reason.value for reason in Refusal)
# A StrEnum member hashes and compares as its value: both spellings look up here.
_REASON_INDEX = {reason: i for i, reason in enumerate(REASONS)}


def utc_day(unix_ms):
    """The UTC day number (days since 1970-01-01) of a Unix time in milliseconds."""
    return unix_ms // DAY_MS


def day_date(day):
    """The ``datetime.date`` of a UTC day number."""
    return _EPOCH + timedelta(days=day)


@dataclass(frozen=True, slots=True)
class Transfer:
    """
    One finished transfer, as the transport counts it.

    ``bytes_in``/``bytes_out`` are the wire bytes; ``bulk_bytes_in``/``bulk_bytes_out``
    are the part of them that was bulk payload (snapshots, large blobs): they are
    INSIDE the wire bytes, never added to them. ``session`` is the id of the
    session the transfer belongs to, for the distinct-sessions count (optional).
    Construction validates every field, so the record path does not.
    """

    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    session: str | None = None

    def __post_init__(self):
        for name in ("bytes_in", "bytes_out", "bulk_bytes_in", "bulk_bytes_out"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_TRANSFER_BYTES:
                raise InvalidInput(
                    f"Transfer.{name} must be an integer in 0..{MAX_TRANSFER_BYTES}, not {value!r}",
                    code=FLOW_INVALID_TRANSFER,
                    field=name,
                )
        for bulk, wire in (("bulk_bytes_in", "bytes_in"), ("bulk_bytes_out", "bytes_out")):
            if getattr(self, bulk) > getattr(self, wire):
                raise InvalidInput(
                    f"Transfer.{bulk} is part of {wire} and cannot exceed it",
                    code=FLOW_INVALID_TRANSFER,
                    field=bulk,
                )
        session = self.session
        if session is not None and (
            type(session) is not str or not 0 < len(session) <= MAX_SESSION_LENGTH
        ):
            raise InvalidInput(
                f"Transfer.session must be a non-empty string of at most "
                f"{MAX_SESSION_LENGTH} characters, or None",
                code=FLOW_INVALID_TRANSFER,
                field="session",
            )


class Row(NamedTuple):
    """
    One node's figure for one namespace and UTC day: what a flush copies and the
    store keeps. ``refusals`` is aligned with ``REASONS``; ``sessions`` is a sketch
    (see ``rindle_app.flow.sessions``); ``last_seen_ms`` is 0 when never seen;
    ``gen`` is the namespace's forget generation the figure belongs to.
    """

    namespace: str
    day: int
    node: str
    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    transfers: int = 0
    refusals: tuple = (0,) * len(REASONS)
    auth_failures: int = 0
    sessions: tuple = ()
    last_seen_ms: int = 0
    gen: int = 0


@dataclass(frozen=True)
class FlowDay:
    """
    One namespace's flow over one UTC day, summed over every process.

    ``moved`` (wire bytes in + out) is what quotas count: the bulk bytes are already
    inside it. ``sessions`` is the distinct session count (exact for small counts,
    see ``rindle_app.flow.sessions``). ``last_seen_ms`` is the latest transfer or
    refusal of the day (None if there was none: a day of auth failures only).
    """

    namespace: str
    day: int
    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    transfers: int = 0
    refusals: dict = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    auth_failures: int = 0
    sessions: int = 0
    last_seen_ms: int | None = None

    @property
    def moved(self):
        return self.bytes_in + self.bytes_out

    @property
    def refused(self):
        return sum(self.refusals.values())

    @property
    def date(self):
        return day_date(self.day)


@dataclass(frozen=True)
class Glance:
    """
    Today's flow beside when the namespace was last seen over the WHOLE kept window.

    The two answer different questions and are never derived from each other: a
    tenant idle for six weeks has a ``today`` of zeroes and a ``last_seen_ms`` six
    weeks ago (None if not seen within the kept window).
    """

    namespace: str
    today: FlowDay
    last_seen_ms: int | None


@dataclass(frozen=True)
class Fleet:
    """
    Every namespace's flow today, folded, and how many tenants have gone quiet.

    ``namespaces`` counts the namespaces with any figure in the kept window;
    ``active`` those seen (a transfer or a refusal) today; ``silent`` those not seen
    on any of the last ``silent_after_days`` UTC days, today included (a namespace
    with only auth failures in the window is silent). ``sessions`` sums each
    namespace's distinct sessions.
    """

    day: int
    silent_after_days: int
    namespaces: int = 0
    active: int = 0
    silent: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    transfers: int = 0
    refusals: dict = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    auth_failures: int = 0
    sessions: int = 0

    @property
    def moved(self):
        return self.bytes_in + self.bytes_out

    @property
    def date(self):
        return day_date(self.day)


# --- validation (edges and slow paths only) ---------------------------------------------


def check_namespace(namespace):
    """Refuse a namespace that is not a short printable string."""
    if (
        type(namespace) is not str
        or not 0 < len(namespace) <= MAX_NAMESPACE_LENGTH
        or not namespace.isprintable()
    ):
        raise InvalidInput(
            f"a namespace must be a non-empty printable string of at most "
            f"{MAX_NAMESPACE_LENGTH} characters, not {namespace!r:.80}",
            code=FLOW_INVALID_NAMESPACE,
        )
    try:
        namespace.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            "a namespace must be valid Unicode text (no lone surrogates)",
            code=FLOW_INVALID_NAMESPACE,
        ) from None
    return namespace


def check_time(unix_ms, name="at"):
    """Refuse a time that is not a non-negative integer of milliseconds."""
    if type(unix_ms) is not int or not 0 <= unix_ms < 2**53:
        raise InvalidInput(
            f"{name} must be a Unix time in integer milliseconds, not {unix_ms!r:.80}",
            code=FLOW_INVALID_TIME,
        )
    return unix_ms


def _check_days(days, name="days"):
    if type(days) is not int or days < 0:
        raise InvalidInput(
            f"{name} must be a non-negative integer, not {days!r:.80}",
            code=FLOW_INVALID_WINDOW,
        )
    return days


def default_node_id():
    """A node id no other live process holds: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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


# --- the ledger ------------------------------------------------------------------------


class FlowLedger:
    """
    The live half of the usage ledger, over a ``FlowStore`` (the kept half).

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
        self._store = store
        self.node = node or default_node_id()
        self.retention_days = retention_days
        self._slots = {}
        self._slots_lock = threading.Lock()
        self._parked = {}
        self._parked_lock = threading.Lock()
        self._flush_lock = threading.RLock()
        self._observer = None
        self._started = False
        # The forget generation of every namespace ever forgotten, and the store's
        # tombstone sequence read so far (see FlowStore.tombstones).
        self._gens = {}
        self._tomb_cursor = 0
        # Records dated before their slot's day (a clock stepped back, a late
        # transfer): counted into the slot's day, never into a closed one.
        self.late_records = 0

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
            index = _REASON_INDEX.get(reason)
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
        days = min(_check_days(days), self.retention_days)
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
            figure = _merge(namespace, day, rows)
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

    # --- reading helpers (public: the admin's fleet page merges figures as these do) -----

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
        return {d: _merge(namespace, d, rows) for d, rows in by_day.items()}

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


def _merge(namespace, day, rows):
    """One FlowDay from several nodes' rows of the same namespace and day."""
    refusals = [0] * len(REASONS)
    bytes_in = bytes_out = bulk_in = bulk_out = transfers = auth = last = 0
    sketch_parts = []
    for row in rows:
        bytes_in += row.bytes_in
        bytes_out += row.bytes_out
        bulk_in += row.bulk_bytes_in
        bulk_out += row.bulk_bytes_out
        transfers += row.transfers
        auth += row.auth_failures
        last = max(last, row.last_seen_ms)
        for i, n in enumerate(row.refusals):
            refusals[i] += n
        sketch_parts.append(row.sessions)
    return FlowDay(
        namespace=namespace,
        day=day,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        bulk_bytes_in=bulk_in,
        bulk_bytes_out=bulk_out,
        transfers=transfers,
        refusals=dict(zip(REASONS, refusals)),
        auth_failures=auth,
        sessions=sketches.estimate(sketches.merge(*sketch_parts)),
        last_seen_ms=last or None,
    )
