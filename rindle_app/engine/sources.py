"""
Change sources: batches from an upstream log, applied with a durable cursor.

A source names its position with an opaque ``offset`` and, inside a run cut at
a DDL boundary, a ``chunk_seq`` (``-1``: the whole run, the common case). The
batch's effects and the cursor upsert land in ONE writer transaction, so a crash
never keeps data without its cursor or a cursor without its data. Then:

- ``(offset, chunk_seq) <= stored``: already applied; ``{applied: False}`` and
  nothing is written. At exactly the stored position, a batch declaring a
  ``batch_hash`` other than the stored one is refused loudly (``hash_mismatch``):
  the source replayed different content under the same identity.
- A stored ``run_id`` fences the source: a batch must echo it (``fenced``
  otherwise), and only ``refresh_run_id`` (a compare-and-swap) moves it. A source
  without a stored run id may claim one with its next batch.
- There is no gap refusal: the source owns its contiguity.

Offsets compare as integers when both are decimal digit strings, otherwise as
strings: a source whose offsets are not numbers must keep them sortable (fixed
width, say). ``head`` accounting (rows and batches applied, and the source's own
stamps) rides in the same transaction.

The follower form, ``commit_follower_txn``, applies chunks as they arrive inside
one open transaction and upserts the cursor at its end.
"""

import json
from dataclasses import dataclass

from django.db import connections

from ..conf import rindle_settings
from ..exceptions import INVALID_CHUNK_SEQ, INVALID_HEAD, SourceFenced, SourceHashMismatch
from .census import PRODUCER_OFFSETS
from .changes import apply_changes, parse_changes
from .errors import InvalidInput, Unavailable

SOURCE_OFFSETS = "_rindle_source_offsets"
WHOLE_RUN = -1
MAX_TEXT = 255
MAX_HEAD_BYTES = 4096
# Replicated bookkeeping a replicator follower may carry from its master.
REPLICATED = ("_rindle_client_mutations", PRODUCER_OFFSETS)


@dataclass(frozen=True)
class Checkpoint:
    offset: str
    chunk_seq: int
    run_id: str = None
    batch_hash: str = None
    head: dict = None

    def as_dict(self):
        return {
            "offset": self.offset,
            "chunkSeq": self.chunk_seq,
            "runId": self.run_id,
            "batchHash": self.batch_hash,
            "head": self.head,
        }


@dataclass(frozen=True)
class SourceResult:
    applied: bool
    cv: int
    checkpoint: Checkpoint
    rows: int = 0
    # A room flush that wrote rows: the seq of its last outbox row (a room skips the
    # echo of its own flushes by it: ``realtime.room_host``); else None.
    seq: int = None


def position(offset, chunk_seq):
    """The sort key of a cursor position."""
    key = (0, int(offset), "") if offset.isdigit() else (1, 0, offset)
    return (*key, chunk_seq)


def _text(value, name, *, optional=False):
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise InvalidInput(
            f"{name} must be a non-empty string of at most {MAX_TEXT} characters",
            code=f"invalid_{name}",
        )
    return value


def validate_position(source, offset, chunk_seq, run_id, batch_hash, head):
    _text(source, "source")
    _text(offset, "offset")
    _text(run_id, "run_id", optional=True)
    _text(batch_hash, "batch_hash", optional=True)
    if isinstance(chunk_seq, bool) or not isinstance(chunk_seq, int) or chunk_seq < WHOLE_RUN:
        raise InvalidInput("chunk_seq must be an integer >= -1", code=INVALID_CHUNK_SEQ)
    if head is not None:
        if not isinstance(head, dict):
            raise InvalidInput("head must be an object", code=INVALID_HEAD)
        if len(json.dumps(head, default=str)) > MAX_HEAD_BYTES:
            raise InvalidInput(f"head exceeds {MAX_HEAD_BYTES} bytes", code=INVALID_HEAD)


def _read(tx, source):
    if tx.vendor == "postgresql":
        tx.scalar("SELECT pg_advisory_xact_lock(hashtextextended(%s, 2))", [source])
    row = tx.fetchone(
        f'SELECT "offset", chunk_seq, run_id, batch_hash, head FROM {SOURCE_OFFSETS} '
        "WHERE source = %s",
        [source],
    )
    return _checkpoint(row)


def _checkpoint(row):
    if row is None:
        return None
    head = row[4]
    if isinstance(head, str):
        head = json.loads(head)
    return Checkpoint(row[0], row[1], row[2], row[3], head)


def _store(tx, source, cp):
    head = json.dumps(cp.head, separators=(",", ":")) if cp.head is not None else None
    tx.run(
        f'INSERT INTO {SOURCE_OFFSETS} (source, "offset", chunk_seq, run_id, batch_hash, head) '
        "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (source) DO UPDATE SET "
        '"offset" = excluded."offset", chunk_seq = excluded.chunk_seq, '
        "run_id = excluded.run_id, batch_hash = excluded.batch_hash, head = excluded.head",
        [source, cp.offset, cp.chunk_seq, cp.run_id, cp.batch_hash, head],
    )


def _admit(tx, source, offset, chunk_seq, run_id, batch_hash):
    """The stored checkpoint, or raise / return "skip" if the batch must not apply."""
    stored = _read(tx, source)
    if stored is None:
        return None, False
    if stored.run_id is not None and run_id != stored.run_id:
        raise SourceFenced(
            f"source {source!r} is fenced to run {stored.run_id!r}; this batch is from "
            f"run {run_id!r}",
            stored=stored.as_dict(),
        )
    here, there = position(offset, chunk_seq), position(stored.offset, stored.chunk_seq)
    if here == there and batch_hash and stored.batch_hash and batch_hash != stored.batch_hash:
        raise SourceHashMismatch(
            f"source {source!r} replayed offset {offset!r} with batch hash {batch_hash!r}; "
            f"the applied batch's hash is {stored.batch_hash!r}",
            stored=stored.as_dict(),
        )
    return stored, here <= there


def _advance(stored, offset, chunk_seq, run_id, batch_hash, head, rows):
    before = (stored.head or {}) if stored is not None else {}
    accounting = {
        "rows": int(before.get("rows", 0)) + rows,
        "batches": int(before.get("batches", 0)) + 1,
    }
    if head is not None:
        accounting["source"] = head
    elif "source" in before:
        accounting["source"] = before["source"]
    return Checkpoint(offset, chunk_seq, run_id, batch_hash, accounting)


def _replicated_adds(changes):
    return sum(1 for c in changes if c.table == PRODUCER_OFFSETS and c.op == "add")


def apply_source_batch(
    engine,
    source,
    offset,
    changes,
    *,
    chunk_seq=WHOLE_RUN,
    run_id=None,
    batch_hash=None,
    head=None,
):
    """Apply one change-source batch and advance ``source``'s cursor, exactly once."""
    validate_position(source, offset, chunk_seq, run_id, batch_hash, head)
    parsed = _parse(engine, changes)
    return _commit(engine, source, offset, chunk_seq, run_id, batch_hash, head, [parsed])


def commit_follower_txn(
    engine, source, offset, chunks, *, chunk_seq=WHOLE_RUN, run_id=None, head=None
):
    """
    The streaming follower: apply each chunk of ``chunks`` (an iterable of change
    lists, consumed inside ONE open writer transaction as they arrive), then upsert
    the cursor in that same transaction and commit.
    """
    validate_position(source, offset, chunk_seq, run_id, None, head)
    parsed = (_parse(engine, chunk) for chunk in chunks)
    return _commit(engine, source, offset, chunk_seq, run_id, None, head, parsed)


def _parse(engine, changes):
    return parse_changes(
        engine.tables,
        changes,
        limit=int(rindle_settings.MAX_BATCH_CHANGES),
        extra_tables=REPLICATED,
    )


def _commit(engine, source, offset, chunk_seq, run_id, batch_hash, head, chunks):
    added = []
    replayable = isinstance(chunks, list)
    started = []

    def write(tx):
        stored, skip = _admit(tx, source, offset, chunk_seq, run_id, batch_hash)
        if skip:
            return False, stored, 0
        if started and not replayable:
            # The writer re-runs a request whose group failed; streamed chunks are gone.
            raise Unavailable("the follower transaction was interrupted; send it again")
        started.append(True)
        rows = 0
        added.clear()
        for chunk in chunks:
            rows += apply_changes(tx, chunk)
            added.append(_replicated_adds(chunk))
        cp = _advance(stored, offset, chunk_seq, run_id, batch_hash, head, rows)
        _store(tx, source, cp)
        return True, cp, rows

    commit = engine.write(write)
    applied, cp, rows = commit.value
    if applied:
        engine.producer_census.note_rows(sum(added))
    return SourceResult(applied, commit.cv, cp, rows)


def refresh_run_id(engine, source, offset, previous_run_id, next_run_id):
    """
    Move ``source``'s run id from ``previous_run_id`` to ``next_run_id`` at an
    unchanged cursor (a compare-and-swap: a stale caller is ``fenced``). No row
    changes, so no live query sees it; returns the new ``Checkpoint``.
    """
    _text(source, "source")
    _text(offset, "offset")
    _text(previous_run_id, "previous_run_id")
    _text(next_run_id, "next_run_id")

    def write(tx):
        stored = _read(tx, source)
        if stored is None or stored.offset != offset or stored.run_id != previous_run_id:
            raise SourceFenced(
                f"source {source!r} is not at offset {offset!r} under run {previous_run_id!r}",
                stored=stored.as_dict() if stored else None,
            )
        cp = Checkpoint(
            stored.offset, stored.chunk_seq, next_run_id, stored.batch_hash, stored.head
        )
        _store(tx, source, cp)
        return cp

    return engine.write(write).value


def source_checkpoint(using, source):
    """The stored ``Checkpoint`` of ``source`` (None: never applied), from committed data."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            f'SELECT "offset", chunk_seq, run_id, batch_hash, head FROM {SOURCE_OFFSETS} '
            "WHERE source = %s",
            [source],
        )
        return _checkpoint(cursor.fetchone())
