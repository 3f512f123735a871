"""
A room host's core: one doc's mutations applied in memory in arrival order, and
flushed to the database in CAS batches under the host's placement epoch.

Transport-free: a Channels consumer drives it, and it imports nothing of Channels.

The rules, each one stated once here:

- **Boot.** ``boot()`` claims the doc's next epoch, THEN calls ``load(engine)``: every
  flush of an older host is either durable before the load reads or fenced after it.
  A client's room lmid is read (``room_lmids``) when the client first appears, so a
  rebooted room absorbs mutations already durable as replays.
- **Mids.** Per client they are contiguous: ``mid <= lmid`` is a replay (no effect, no
  broadcast), ``mid > lmid + 1`` is refused with ``MutationGap`` and changes nothing,
  ``mid == lmid + 1`` runs and consumes the mid whatever its verdict.
- **Verdicts.** A mutator is ``fn(tx, args)`` over a ``RoomTx``. It returns: applied.
  It raises ``RoomReject`` (or ``MutationRejected``): rejected with its reason. It
  raises anything else: rejected with the reason ``mutator_error`` (logged). No
  mutator has the name: ``deopt`` (the client sends it on the slow path). A
  mutation's writes apply all or none; only an applied one changes state.
- **Flush.** ``flush()`` sends everything since the last successful flush as ONE
  ``commit_room_flush(cas=True)``: per touched key the net change from the image the
  database held at the last flush (or the load) to the current one (an add and a
  remove of one key in one batch is no change; an edit's ``old`` is the whole base
  row, so any outside write to the row is a CAS miss, and a row touched but left as
  it was is a CAS-only edit of its key); one ledger co-edit per client the batch
  advanced; one outcome row per non-applied mid of the batch. The offset
  is ``epoch * 10**9 + n`` for the epoch's ``n``-th flush, as decimal text: unique
  across epochs and monotone, so the downgrade watermark only goes up and a newer
  host's offsets sort after every older one's. The batch hash is a SHA-256 of the
  batch's canonical JSON.
- **Conflict.** On ``RoomConflict`` the host rebases: the batch's keys go back to
  their base images, the conflicting keys take the database's images (which become
  their base), and the batch's mutations re-run in their original order (deopts stay
  deopts; a mutation that now raises is rejected, one that now succeeds is applied).
  It then flushes again, at most ``MAX_REBASES`` times per ``flush()``. What peers
  were shown and what the rebase left may differ: the difference is reported as
  ``corrections`` and the changed verdicts as ``verdicts``. Mutators must therefore
  be deterministic functions of the room state and their args.
- **Fence.** On ``RoomFenced`` the host drops its state and closes; every later call
  raises ``RoomClosed``. So does any flush failure whose outcome is unknown (a
  timeout, an unexpected error): a new host boots from what is durable. A failure
  that wrote nothing for sure (``Unavailable`` other than a timeout) keeps the batch
  pending for the next ``flush()``.
- **Bounds.** At ``ROOM_MAX_PENDING`` unflushed mutations, or when the batch would
  pass ``MAX_BATCH_CHANGES`` net row changes, ``mutate`` flushes first; if that
  cannot clear the buffer it refuses with ``RoomBusy`` and changes nothing. One
  mutation that alone passes ``MAX_BATCH_CHANGES`` is rejected.

Soundness: after a successful flush, for every mid the room lmid covers within
``ROOM_OUTCOME_RETENTION_LMIDS``, "no outcome row" holds exactly when the host's
final verdict for it was applied, because a mid's outcome row and the lmid that
covers it commit in the same flush, and a rebase re-derives both before it resends.

- **Outside writes.** ``absorb(ops, version)`` takes the database's images of
  footprint rows that other writers changed (the transport feeds it the net row
  changes of the footprint's live query, each step's with its version), between
  flushes only. The host keeps them as a mirror of the database (from the load on),
  and the room follows the mirror on every key except two kinds. A key this host
  flushed after ``version`` (the seq of the flush's last outbox row,
  ``SourceResult.seq``) waits for its echo: what is fed before it is older. A key a
  pending mutation wrote keeps its room image, but a mirror image other than its
  base becomes its base and the batch rebases at once, as on a CAS miss (a batch
  that adds and removes a key sends nothing for it, so no CAS would catch that
  later). Once a flushed key's echo is in, the key follows the mirror again, even
  when no change of it was fed: its echo and a later outside write may cancel out
  in one net batch. The differences are returned as corrections for the peers,
  with the verdicts the rebase changed.

Limits: rows a mutator only reads are not CAS-checked.

Threading model: a host is not thread-safe. One caller at a time (the transport
holds the room's lock) makes every call, off the event loop: ``boot``, ``mutate``
and ``flush`` block on the engine's writer. The one exception is a flush split in
three: ``begin_flush`` (under the caller's lock) takes the batch, ``send(flight)``
writes it and may run WITHOUT that lock while ``mutate`` goes on, and ``end_flush``
(under the lock again) settles it. Mutations that arrive meanwhile stay pending for
the next flush: the keys they touch keep, as their base, the image the flight wrote
once it is durable. On a CAS miss the rebase re-runs every pending mutation, the
ones that arrived during the flight included. So a peer's receipt never waits for
a flush's commit.
"""

import hashlib
import json
import logging
from dataclasses import dataclass, field

from ..conf import rindle_settings
from ..engine.errors import InvalidInput
from ..engine.mutations import validation_rejection
from ..engine.rooms import ANY_EPOCH
from ..exceptions import (
    ARGS_TOO_LARGE,
    INVALID_ARGS,
    INVALID_CLIENT_ID,
    INVALID_MID,
    INVALID_NAME,
    TIMEOUT,
    MutationGap,
    MutationRejected,
    RoomBusy,
    RoomClosed,
    RoomConflict,
    RoomFenced,
    RoomReject,
    Unavailable,
)
from ..ivm.compare import sort_key

logger = logging.getLogger(__name__)

APPLIED, REJECTED, DEOPT, REPLAY = "applied", "rejected", "deopt", "replay"
MUTATOR_ERROR_REASON = "mutator_error"
MAX_REBASES = 3  # resends per flush() after a CAS miss; past it the batch stays pending
OFFSET_SPAN = 10**9  # flushes per epoch in the offset space: epoch * OFFSET_SPAN + n
MAX_EPOCH = 2**53 // OFFSET_SPAN  # offsets stay exact as a JavaScript number
CLIENT_LEDGER = "_rindle_client_mutations"
ROOM_OUTCOMES = "_rindle_room_mutation_outcomes"
MAX_TEXT = 255


class ClaimLost(Exception):
    """``boot`` with an ``expect``: another host claimed the doc since its epoch was read."""


@dataclass
class MutationResult:
    """
    What one ``mutate`` did. ``verdict`` is applied, rejected, deopt or replay;
    ``changes`` the row ops peers must see, in order (empty unless applied), each
    ``{table, op: "add"|"remove", row}`` or ``{table, op: "edit", old, new}``;
    ``flush`` the result of a flush the full buffer forced first, or None.
    """

    client_id: str
    mid: int
    verdict: str
    reason: str = None
    changes: list = field(default_factory=list)
    flush: "FlushResult" = None
    details: dict = None  # a rejection's details (``RoomReject(..., details=)``), or None


@dataclass
class VerdictChange:
    """A mutation whose verdict a rebase changed (``before`` was broadcast)."""

    client_id: str
    mid: int
    before: str
    after: str
    reason: str = None
    details: dict = None


@dataclass
class FlushResult:
    """
    What one ``flush`` did. ``flushed``: the batch is durable (False for a no-op or
    when ``MAX_REBASES`` ran out; the batch then stays pending). ``corrections``: row
    ops (as ``MutationResult.changes``) taking peers from what they were shown to the
    rebased state; ``verdicts``: the ``VerdictChange`` of each re-judged mutation;
    ``lmids``: each client's room lmid the flush made durable; ``error``: the
    ``Unavailable`` that kept a batch pending (nothing was written).
    """

    flushed: bool
    offset: str = None
    cv: int = None
    mutations: int = 0
    rebases: int = 0
    corrections: list = field(default_factory=list)
    verdicts: list = field(default_factory=list)
    lmids: dict = field(default_factory=dict)
    error: Exception = None


@dataclass
class Flight:
    """
    A flush on its way to the database (``begin_flush``): the oldest ``count``
    pending mutations' net changes under ``offset``, and ``images``, what it writes
    per touched key. ``send`` fills in ``commit`` or ``error``.
    """

    changes: list
    lmids: dict
    offset: str
    digest: str
    count: int
    images: dict
    commit: object = None
    error: BaseException = None


@dataclass
class _Pending:
    client_id: str
    mid: int
    name: str
    args: str  # as JSON text
    verdict: str
    reason: str = None
    details: dict = None


def _json_details(details):
    """A rejection's details as the frame will carry them: a JSON object, or None (logged)."""
    if details is None:
        return None
    try:
        if isinstance(details, dict):
            json.loads(json.dumps(details))
            return details
    except (TypeError, ValueError):
        pass
    logger.warning("a room mutator rejected with details that are not a JSON object; dropped")
    return None


class _Tables:
    """Per-table key functions and row completion, from the engine's table map."""

    def __init__(self, engine):
        self._map = engine.tables
        self._known = {}

    def get(self, name):
        table = self._known.get(name)
        if table is None:
            table = self._known[name] = self._map.get(name)  # UnknownTable if absent
        return table

    def key(self, table, row):
        return tuple(sort_key(row[c]) for c in table.primary_key)

    def full(self, table, row):
        if not isinstance(row, dict) or not table.column_names.issuperset(row):
            raise InvalidInput(f"a {table.name} row must be an object of its columns")
        missing = [c for c in table.primary_key if row.get(c) is None]
        if missing:
            raise InvalidInput(f"a {table.name} row needs its primary key {missing}")
        return {c.name: row.get(c.name) for c in table.columns}


def _same(a, b):
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(sort_key(a[c]) == sort_key(b[c]) for c in a)


def _op(table, before, after):
    """The peer op from ``before`` to ``after`` (None for absent), or None if equal."""
    if _same(before, after):
        return None
    if before is None:
        return {"table": table, "op": "add", "row": dict(after)}
    if after is None:
        return {"table": table, "op": "remove", "row": dict(before)}
    return {"table": table, "op": "edit", "old": dict(before), "new": dict(after)}


class RoomTx:
    """
    A mutator's view of the room: reads see the mutation's own writes, and the writes
    reach the room only if the mutator returns. Keys are the table's primary-key
    values in order (a scalar for a one-column key). Rows are dicts by column name;
    an ``add`` fills absent columns with None, as the database would store them.
    Adding an existing key, or editing or removing an absent one, raises
    ``RoomReject``; an edit may not change the primary key.
    """

    def __init__(self, host):
        self._host = host
        self._overlay = {}  # (table, key) -> row or None
        self._ops = []

    def _slot(self, table, key):
        meta = self._host._tables.get(table)
        values = key if isinstance(key, (tuple, list)) else (key,)
        if len(values) != len(meta.primary_key):
            raise InvalidInput(f"a {table} key has {len(meta.primary_key)} values")
        return meta, (table, tuple(sort_key(v) for v in values))

    def _current(self, slot):
        if slot in self._overlay:
            return self._overlay[slot]
        return self._host._state.get(slot)

    def get(self, table, key):
        """The row under ``key`` (a copy), or None."""
        _, slot = self._slot(table, key)
        row = self._current(slot)
        return None if row is None else dict(row)

    def add(self, table, row):
        meta = self._host._tables.get(table)
        row = self._host._tables.full(meta, row)
        slot = (table, self._host._tables.key(meta, row))
        if self._current(slot) is not None:
            raise RoomReject(f"{table}: a row exists under {[row[c] for c in meta.primary_key]}")
        self._write(slot, None, row)

    def edit(self, table, key, fields):
        meta, slot = self._slot(table, key)
        before = self._current(slot)
        if before is None:
            raise RoomReject(f"{table}: no row under {key!r} to edit")
        if not isinstance(fields, dict) or not meta.column_names.issuperset(fields):
            raise InvalidInput(f"an edit of {table} names only its columns")
        after = {**before, **fields}
        if self._host._tables.key(meta, after) != slot[1]:
            raise InvalidInput(f"an edit of {table} may not change its primary key")
        self._write(slot, before, after)

    def remove(self, table, key):
        _, slot = self._slot(table, key)
        before = self._current(slot)
        if before is None:
            raise RoomReject(f"{table}: no row under {key!r} to remove")
        self._write(slot, before, None)

    def _write(self, slot, before, after):
        self._overlay[slot] = after
        op = _op(slot[0], before, after)
        if op is not None:
            self._ops.append(op)


class RoomHost:
    """
    The write authority of one doc while it holds the doc's placement epoch; see the
    module for the rules. ``mutators`` maps names to ``fn(tx, args)``; ``load(engine)``
    returns the footprint's rows ``{table: [row dicts]}``; ``source`` names the
    flushes' change source (``"room:" + doc`` by default).
    """

    def __init__(self, engine, doc, *, mutators, load, source=None, host=None, expect=ANY_EPOCH):
        if not isinstance(doc, str) or not doc or len(doc) > MAX_TEXT:
            raise InvalidInput(f"doc must be a non-empty string of at most {MAX_TEXT} characters")
        if not isinstance(mutators, dict) or not all(callable(f) for f in mutators.values()):
            raise InvalidInput("mutators must map names to callables")
        self.engine = engine
        self.doc = doc
        self.source = source or f"room:{doc}"
        self.host = host  # the channel its epoch's claim names (``engine.rooms``)
        # Given, the claim goes through only from the epoch ``expect`` (None: never
        # claimed); otherwise ``boot`` raises ``ClaimLost`` (another host came first).
        self.expect = expect
        self._mutators = dict(mutators)
        self._load = load
        self._tables = _Tables(engine)
        self.epoch = None
        self.footprint = ()  # the tables ``load`` returned rows for
        self.closed = None  # the reason, once closed
        self._drop()

    def _drop(self):
        self._state = {}  # (table, key) -> row: the room as peers see it
        self._base = {}  # (table, key) -> image at the last flush, for keys touched since
        self._lmids = {}  # client -> highest mid consumed (durable or pending)
        self._durable = {}  # client -> room lmid at the last flush (or as read)
        self._pending = []
        self._seq = 0
        self._shown = None  # during a rebase: (table, key) -> the row peers were shown
        self._judged = None  # during a rebase: (pending, the verdict its client was told)
        self._flight = None  # the flush between begin_flush and end_flush
        self._since = None  # the keys mutations wrote while it was in flight
        self._written = {}  # (table, key) -> seq of this host's last flush of it (``absorb``)
        self._mirror = {}  # (table, key) -> row: the database's as last fed (``absorb``)

    @property
    def pending(self):
        """Mutations consumed since the last successful flush."""
        return len(self._pending)

    @property
    def in_flight(self):
        """True between ``begin_flush`` and ``end_flush``."""
        return self._flight is not None

    def durable_lmid(self, client_id):
        """``client_id``'s room lmid as of the last flush (or as read); None if unseen."""
        return self._durable.get(client_id)

    def rows(self, table):
        """The host's current rows of ``table`` (copies), in no particular order."""
        return [dict(r) for (t, _), r in self._state.items() if t == table and r is not None]

    # --- boot -------------------------------------------------------------------------

    def boot(self):
        """Claim the doc's next epoch and load the footprint. Returns the epoch."""
        self._open()
        if self.epoch is not None:
            raise InvalidInput("a room host boots once")
        epoch = self.engine.claim_room_epoch(self.doc, self.host, self.expect)
        if epoch is None:
            self.closed = "another host claimed the doc first"
            raise ClaimLost(f"another host claimed {self.doc!r} past epoch {self.expect}")
        self.epoch = epoch
        if self.epoch >= MAX_EPOCH:
            self._close(f"epoch {self.epoch} is past the offset space")
        try:
            loaded = self._load(self.engine)
            if not isinstance(loaded, dict):
                raise InvalidInput("load must return {table: [rows]}")
            self.footprint = tuple(sorted(loaded))
            for name, rows in loaded.items():
                meta = self._tables.get(name)
                for row in rows:
                    row = self._tables.full(meta, row)
                    self._state[(name, self._tables.key(meta, row))] = row
            self._mirror = dict(self._state)
        except BaseException as exc:
            self.closed = f"its load failed ({type(exc).__name__}: {exc})"
            self._drop()
            raise
        return self.epoch

    def _open(self):
        if self.closed is not None:
            raise RoomClosed(f"the room host of {self.doc!r} is closed: {self.closed}")

    def _close(self, reason):
        self.closed = reason
        self._drop()
        raise RoomClosed(f"the room host of {self.doc!r} is closed: {reason}")

    # --- mutations --------------------------------------------------------------------

    def mutate(self, client_id, mid, name, args):
        """Apply one client mutation in memory; see the module. Returns a ``MutationResult``."""
        self._open()
        if self.epoch is None:
            raise InvalidInput("boot the room host before it takes mutations")
        text = _check_envelope(client_id, mid, name, args)
        lmid = self._lmid(client_id)
        if mid <= lmid:
            return MutationResult(client_id, mid, REPLAY)
        if mid > lmid + 1:
            raise MutationGap(client_id, mid, lmid)
        forced = None
        if self.pending >= int(rindle_settings.ROOM_MAX_PENDING) or self._batch_full(0):
            forced = self._flush_to_make_room()
        verdict, reason, details, tx = self._run(name, text)
        if tx is not None and self._batch_full(len(tx._overlay)):
            if self.pending:
                forced = self._flush_to_make_room()
                verdict, reason, details, tx = self._run(name, text)
            if tx is not None and self._batch_full(len(tx._overlay)):
                verdict, reason, tx = REJECTED, "too many row changes for one flush", None
        changes = self._commit(tx) if tx is not None else []
        self._lmids[client_id] = mid
        self._pending.append(_Pending(client_id, mid, name, text, verdict, reason, details))
        return MutationResult(client_id, mid, verdict, reason, changes, forced, details)

    def _lmid(self, client_id):
        lmid = self._lmids.get(client_id)
        if lmid is None:
            lmid = self.engine.room_lmids(self.doc, [client_id]).get(client_id, 0)
            self._lmids[client_id] = self._durable[client_id] = lmid
        return lmid

    def _batch_full(self, extra):
        return len(self._base) + extra > int(rindle_settings.MAX_BATCH_CHANGES)

    def _flush_to_make_room(self):
        if self._flight is not None:  # the flight in progress will make room
            busy = RoomBusy(
                f"the room host of {self.doc!r} has a full buffer and a flush in flight"
            )
            busy.flush = FlushResult(False)
            raise busy
        result = self.flush()
        if not result.flushed:
            busy = RoomBusy(f"the room host of {self.doc!r} cannot flush its full buffer now")
            busy.flush = result  # its corrections and verdicts still reach the peers
            raise busy
        return result

    def _run(self, name, text):
        """
        (verdict, reason, details, tx of an applied run or None), the room state
        unchanged; ``details`` are a rejection's (``RoomReject(..., details=)``).
        """
        fn = self._mutators.get(name)
        if fn is None:
            return DEOPT, f"no room mutator {name!r}", None, None
        tx = RoomTx(self)
        try:
            # Args of their own each run: a rebase re-runs the mutation on the args as
            # they arrived, whatever an earlier run did to its copy.
            fn(tx, json.loads(text))
        except MutationRejected as exc:
            return REJECTED, str(exc.reason), _json_details(exc.details), None
        except Exception as exc:
            rejection = validation_rejection(exc)  # invalid arguments, as on the main path
            if rejection is not None:
                return REJECTED, rejection.reason, rejection.details, None
            logger.exception("room mutator %r of %r raised", name, self.doc)
            return REJECTED, MUTATOR_ERROR_REASON, None, None
        return APPLIED, None, None, tx

    def _commit(self, tx):
        for slot, row in tx._overlay.items():
            if slot not in self._base:
                self._base[slot] = self._state.get(slot)
            if self._since is not None:
                self._since.add(slot)
            self._set(slot, row)
        return tx._ops

    def _set(self, slot, row):
        if self._shown is not None and slot not in self._shown:
            self._shown[slot] = self._state.get(slot)  # what peers saw before the rebase
        if row is None:
            self._state.pop(slot, None)
        else:
            self._state[slot] = row

    # --- flushes ----------------------------------------------------------------------

    def next_offset(self):
        """The offset the host's next flush (or ``seal``) commits under, as an int."""
        return self.epoch * OFFSET_SPAN + self._seq + 1

    def seal(self):
        """
        Commit an empty flush under the next offset, moving the downgrade watermark past
        every flush before it (what a downgrade's fence waits for); returns the offset.
        Pending mutations are flushed first.
        """
        self._open()
        if self._flight is not None:
            raise InvalidInput("a flush is in flight: end it before the seal")
        if self._pending:
            self.flush()
        offset = str(self.next_offset())
        try:
            self.engine.commit_room_flush(
                [], self.source, offset, doc=self.doc, epoch=self.epoch,
                batch_hash=_digest([]), cas=True,
            )  # fmt: skip
        except RoomFenced as exc:
            self._close(f"fenced by epoch {exc.details.get('epoch')}")
        self._seq += 1
        return int(offset)

    def flush(self):
        """
        Make the batch durable in one CAS room flush (rebased and resent up to
        ``MAX_REBASES`` times); see the module. A ``FlushResult``.
        """
        self._open()
        if self._flight is not None:
            raise InvalidInput("a flush is in flight: end it first")
        total = FlushResult(False, mutations=len(self._pending))
        for _attempt in range(MAX_REBASES + 1):
            flight = self.begin_flush()
            if flight is None:
                break
            result = self.end_flush(self.send(flight), report=False)
            total.rebases += result.rebases
            total.error = result.error
            if result.flushed:
                total.flushed, total.offset, total.cv = True, result.offset, result.cv
                total.lmids = result.lmids
            if not result.rebases:
                break
        if self._shown is not None:  # one net correction for every attempt's rebase
            self._report(total)
        return total

    def begin_flush(self):
        """The ``Flight`` of everything pending (None: nothing is); ``send`` writes it."""
        self._open()
        if self._flight is not None:
            raise InvalidInput("a flush is in flight: end it first")
        if not self._pending:
            return None
        if self._seq + 1 >= OFFSET_SPAN:
            self._close("the epoch's flush offsets are used up")
        changes, lmids = self._batch()
        offset = str(self.epoch * OFFSET_SPAN + self._seq + 1)
        images = {slot: self._state.get(slot) for slot in self._base}
        flight = Flight(changes, lmids, offset, _digest(changes), len(self._pending), images)
        self._flight, self._since = flight, set()
        return flight

    def send(self, flight):
        """
        Write ``flight`` (one ``commit_room_flush``). It reads only what the boot fixed
        and the flight itself, so it may run while the host's caller goes on.
        """
        try:
            flight.commit = self.engine.commit_room_flush(
                flight.changes,
                self.source,
                flight.offset,
                doc=self.doc,
                epoch=self.epoch,
                batch_hash=flight.digest,
                cas=True,
            )
        except BaseException as exc:
            flight.error = exc
            if not isinstance(exc, Exception):
                raise
        return flight

    def end_flush(self, flight, *, report=True):
        """
        Settle a sent ``flight``: durable, it leaves the pending mutations and the keys'
        bases; a CAS miss rebases every pending mutation (``rebases`` 1: flush again);
        a failure that wrote nothing keeps it pending (``error``); a fence, or an
        outcome that is unknown, closes the host. A ``FlushResult``; with ``report``
        its corrections and changed verdicts are in it (else they wait for the next
        ``_report``, so several rebases report once).
        """
        self._open()  # a host closed meanwhile dropped its flight with its state
        if flight is None or flight is not self._flight:
            raise InvalidInput("this is not the host's flush in flight")
        since, self._flight, self._since = self._since, None, None
        result = FlushResult(False, mutations=flight.count)
        exc = flight.error
        if exc is None:
            stored = flight.commit.checkpoint
            if not flight.commit.applied and (stored.offset, stored.batch_hash) != (
                flight.offset,
                flight.digest,
            ):
                self._close(f"source {self.source!r} is at {stored.offset}, not this host's")
            self._seq += 1
            seq = flight.commit.seq
            for slot, image in flight.images.items():
                if seq is not None:
                    self._written[slot] = seq
                if slot in since:  # written again meanwhile: based on what is durable now
                    self._base[slot] = image
                else:
                    del self._base[slot]
            del self._pending[: flight.count]
            self._durable.update(flight.lmids)
            result.flushed, result.offset, result.cv = True, flight.offset, flight.commit.cv
            result.lmids = flight.lmids
            return result
        if isinstance(exc, RoomFenced):
            self._close(f"fenced by epoch {exc.details.get('epoch')}")
        if isinstance(exc, RoomConflict):
            if self._shown is None:  # what peers were shown, and told, before any rebase
                self._judged = [(p, p.verdict) for p in self._pending]
                self._shown = {slot: self._state.get(slot) for slot in self._base}
            self._rebase(self._conflicts(exc.details.get("conflicts") or []))
            result.rebases = 1
            if report:
                self._report(result)
            return result
        if isinstance(exc, Unavailable) and exc.code != TIMEOUT:
            result.error = exc  # nothing was written: the batch stays pending
            return result
        if isinstance(exc, Unavailable):
            self._close(f"a flush's outcome is unknown ({exc})")
        self._close(f"a flush failed ({type(exc).__name__}: {exc})")

    def absorb(self, ops, version):
        """
        Take the database's images of footprint rows other writers changed: ``ops``
        are the footprint query's net row changes (``{table, op, row | old, new}``)
        up to ``version``; see the module. A ``FlushResult`` (not flushed) whose
        corrections are what the peers must be shown, and whose verdicts are those
        a rebase changed.
        """
        self._open()
        if self._flight is not None:
            raise InvalidInput("a flush is in flight: absorb after it ended")
        touched = set()
        for op in ops:
            meta = self._tables.get(op["table"])
            image = op["new"] if op["op"] == "edit" else op["row"] if op["op"] == "add" else None
            slot = (meta.name, self._tables.key(meta, op["row"] if image is None else image))
            if image is None:
                self._mirror.pop(slot, None)
            else:
                self._mirror[slot] = self._tables.full(meta, image)
            touched.add(slot)
        for slot, seq in list(self._written.items()):
            if seq <= version:  # its echo is in: from now on the mirror is its image
                del self._written[slot]
                touched.add(slot)
        result, conflicts = FlushResult(False), {}
        for slot in touched:
            if slot in self._written:
                continue  # this host flushed it after ``version``: the change is older
            image = self._mirror.get(slot)
            if slot in self._base:
                if not _same(self._base[slot], image):
                    conflicts[slot] = image  # a pending mutation wrote it: rebase on it
                continue
            change = _op(slot[0], self._state.get(slot), image)
            if change is not None:
                self._set(slot, image)
                result.corrections.append(change)
        if conflicts:
            if self._shown is None:  # what peers were shown, and told, before the rebase
                self._judged = [(p, p.verdict) for p in self._pending]
                self._shown = {slot: self._state.get(slot) for slot in self._base}
            self._rebase(conflicts)
            self._report(result)
        return result

    def _batch(self):
        """The flush's changes (net effects, ledger co-edits, outcomes) and its lmids."""
        changes = []
        for slot, before in self._base.items():
            table, after = slot[0], self._state.get(slot)
            if before is None and after is None:
                continue  # added and removed in the batch: no change
            if _same(before, after):
                # Left as it was: a CAS-only edit of the key onto itself (the capture
                # triggers skip an update that changes nothing), so an outside write
                # to the row is still a miss the mutations that touched it must see.
                meta = self._tables.get(table)
                key = {c: before[c] for c in meta.primary_key}
                changes.append({"table": table, "op": "edit", "old": before, "row": key})
                continue
            if before is None:
                changes.append({"table": table, "op": "add", "row": after})
            elif after is None:
                changes.append({"table": table, "op": "remove", "old": before})
            else:
                new = {c: v for c, v in after.items() if sort_key(v) != sort_key(before[c])}
                changes.append({"table": table, "op": "edit", "old": before, "row": new})
        lmids = {}
        for p in self._pending:
            lmids[p.client_id] = max(p.mid, lmids.get(p.client_id, 0))
            if p.verdict != APPLIED:
                row = {
                    "client_id": p.client_id,
                    "mid": p.mid,
                    "kind": p.verdict,
                    "reason": p.reason,
                    "name": p.name,
                    "args": json.loads(p.args),
                }
                changes.append({"table": ROOM_OUTCOMES, "op": "add", "row": row})
        for client, lmid in lmids.items():
            row = {"client_id": client, "last_mutation_id": lmid}
            changes.append({"table": CLIENT_LEDGER, "op": "add", "row": row})
        return changes, lmids

    def _conflicts(self, conflicts):
        """A CAS miss's conflicts as ``{(table, key): the database's image or None}``."""
        out = {}
        for conflict in conflicts:
            meta = self._tables.get(conflict["table"])
            slot = (meta.name, self._tables.key(meta, conflict["key"]))
            current = conflict.get("current")
            out[slot] = None if current is None else self._tables.full(meta, current)
        return out

    def _rebase(self, images):
        """Re-run the batch on its base images, the keys of ``images`` at those."""
        for slot, before in self._base.items():
            self._set(slot, before)
        self._base = {}
        for slot, image in images.items():
            self._set(slot, image)
        for p in self._pending:
            if p.verdict == DEOPT:
                continue
            p.verdict, p.reason, p.details, tx = self._run(p.name, p.args)
            if tx is not None:
                self._commit(tx)

    def _report(self, result):
        for slot, seen in self._shown.items():
            op = _op(slot[0], seen, self._state.get(slot))
            if op is not None:
                result.corrections.append(op)
        judged, self._shown, self._judged = self._judged, None, None
        for p, before in judged:
            if before != p.verdict:
                result.verdicts.append(
                    VerdictChange(p.client_id, p.mid, before, p.verdict, p.reason, p.details)
                )

    def __repr__(self):
        return f"<RoomHost {self.doc!r} epoch={self.epoch} pending={self.pending}>"


def _digest(changes):
    text = json.dumps(changes, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_envelope(client_id, mid, name, args):
    if not isinstance(client_id, str) or not client_id or len(client_id) > MAX_TEXT:
        raise InvalidInput("clientID must be a non-empty string", code=INVALID_CLIENT_ID)
    if isinstance(mid, bool) or not isinstance(mid, int) or not 1 <= mid < 2**63:
        raise InvalidInput("mid must be a positive integer", code=INVALID_MID)
    if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
        raise InvalidInput("name must be a non-empty string", code=INVALID_NAME)
    try:
        text = json.dumps(args, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"args must be JSON: {exc}", code=INVALID_ARGS) from exc
    if len(text) > int(rindle_settings.MAX_ARGS_BYTES):
        raise InvalidInput("args exceed MAX_ARGS_BYTES", code=ARGS_TOO_LARGE)
    return text
