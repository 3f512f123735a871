"""
Foreign producers: sequenced writes from a machine writer, applied exactly once.

A producer sends ``(producer, seq, changes)`` with ``seq`` counting 1, 2, 3, ...
The engine keeps the last applied ``seq`` and the digest of its payload in
``_rindle_producer_offsets`` (captured: it is replicated data) and, in ONE writer
transaction:

- ``seq == stored + 1``: applies the changes and upserts the offset;
- ``seq <= stored``: absorbs the replay, applying nothing; a replay of the stored
  ``seq`` whose payload digest differs is a conflict (an older replay cannot be
  checked: only the last digest is kept);
- ``seq > stored + 1``: refuses the gap with the stored value, writing nothing.

A producer id is bound to the principal that first wrote it (``owner``): another
principal gets ``producer_not_owned``, so one token cannot advance, or learn, a
producer it does not own. The census of distinct producers is noted after commit.
"""

from dataclasses import dataclass

from ..conf import rindle_settings
from ..exceptions import (
    INVALID_PRODUCER,
    INVALID_SEQ,
    ProducerConflict,
    ProducerGap,
    ProducerNotOwned,
)
from .census import PRODUCER_OFFSETS
from .changes import apply_changes, digest, parse_changes
from .errors import InvalidInput

MAX_PRODUCER_LENGTH = 255


@dataclass(frozen=True)
class ProducerResult:
    """``applied`` False means an absorbed replay; ``seq`` is the stored seq after it."""

    applied: bool
    seq: int
    cv: int
    rows: int = 0


def validate_producer(producer):
    if not isinstance(producer, str) or not producer or len(producer) > MAX_PRODUCER_LENGTH:
        raise InvalidInput(
            f"producer must be a non-empty string of at most {MAX_PRODUCER_LENGTH} characters",
            code=INVALID_PRODUCER,
        )


def _read(tx, producer):
    if tx.vendor == "postgresql":
        # Engines of several processes may share the table: serialize per producer.
        tx.scalar("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", [producer])
    return tx.fetchone(
        f"SELECT seq, digest, owner FROM {PRODUCER_OFFSETS} WHERE producer = %s", [producer]
    )


def _store(tx, producer, seq, payload_digest, owner):
    tx.run(
        f"INSERT INTO {PRODUCER_OFFSETS} (producer, seq, digest, owner) "
        "VALUES (%s, %s, %s, %s) ON CONFLICT (producer) DO UPDATE SET "
        "seq = excluded.seq, digest = excluded.digest",
        [producer, seq, payload_digest, owner],
    )


def admit(tx, producer, seq, changes, payload_digest, owner):
    """The write request: admission, effects and the offset upsert in ``tx``."""
    stored = _read(tx, producer)
    stored_seq = 0
    if stored is not None:
        stored_seq, stored_digest, stored_owner = stored
        if stored_owner != owner:
            raise ProducerNotOwned(f"producer {producer!r} belongs to another principal")
        if seq == stored_seq and stored_digest is not None and stored_digest != payload_digest:
            raise ProducerConflict(
                f"producer {producer!r} replayed seq {seq} with a different payload",
                stored=stored_seq,
            )
    if seq <= stored_seq:
        return ProducerResult(False, stored_seq, 0)
    if seq > stored_seq + 1:
        raise ProducerGap(producer, seq, stored_seq)
    rows = apply_changes(tx, changes)
    _store(tx, producer, seq, payload_digest, owner)
    return ProducerResult(True, seq, 0, rows)


def producer_write(engine, producer, seq, changes, owner=None):
    """
    Apply producer ``producer``'s write ``seq`` through ``engine`` exactly once;
    return a ``ProducerResult``. ``owner`` is the principal the id is bound to
    (``None``: trusted server code, which only ever meets its own ids).
    """
    validate_producer(producer)
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidInput(f"seq must be a positive integer, got {seq!r}", code=INVALID_SEQ)
    parsed = parse_changes(engine.tables, changes, limit=int(rindle_settings.MAX_BATCH_CHANGES))
    payload_digest = digest(changes)
    commit = engine.write(lambda tx: admit(tx, producer, seq, parsed, payload_digest, owner))
    result = commit.value
    if result.applied:
        engine.producer_census.note_committed(seq)
    return ProducerResult(result.applied, result.seq, commit.cv, result.rows)


def producer_seq(using, producer, owner=None):
    """The durable last seq of ``producer`` (0 if new), read from committed data."""
    from django.db import connections

    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT seq, owner FROM {PRODUCER_OFFSETS} WHERE producer = %s", [producer])
        row = cursor.fetchone()
    if row is None:
        return 0
    if row[1] != owner:
        raise ProducerNotOwned(f"producer {producer!r} belongs to another principal")
    return row[0]
