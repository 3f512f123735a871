"""
Rooms' write authority (seed 001): placement epochs, the room ledger, and room
flushes with their fence, batch identity and compare-and-swap preconditions.

- ``claim_room_epoch(doc)`` bumps ``_rindle_room_placement`` once, in one write
  transaction: the new epoch fences every flush that carries an older one.
  ``room_epoch(doc)`` is None for a doc never claimed, so any fence-bearing flush
  for it is stale. A claim may name its ``host``: the channel of the process whose
  room holds the epoch, where other processes route the doc's sockets
  (``realtime.room_router``); a claim made without one (over HTTP) clears it.
- ``room_lmids(doc, clients)`` reads the room ledger ``_rindle_room_client_mutations``
  keyed ``(doc, client_id)``: what lets a rebooted room absorb mutations that are
  already durable instead of applying them twice. It never reads the slow-path
  ``_rindle_client_mutations``, so a client's room stream and its daemon stream
  never alias.
- ``commit_room_flush`` applies one batch of a room (or of a plain change source when
  ``doc`` is None). In ONE transaction: the fence (the batch's ``epoch`` must be the
  doc's current one, else ``fenced``), the ``(source, offset)`` identity (a replay is
  ``applied: False``; the stored offset with another batch hash is ``hash_mismatch``),
  the optional CAS pass, the effects, the room ledger, the outcomes, the downgrade
  watermark and the cursor.

For a room flush (``doc`` given) two kinds of change are split off before the CAS
pass and the effects, whatever their order in the batch:

- changes to ``_rindle_client_mutations`` (``{client_id, last_mutation_id}``) are the
  room's ledger co-edits: they are upserted into the ROOM ledger under ``doc``,
  monotonically (an lmid never goes down), and the slow-path row is never touched.
  Rewriting them into the slow-path table was the original's data-loss bug;
- changes to ``_rindle_room_mutation_outcomes`` (``{client_id, mid, kind, reason,
  name, args}``, the doc implied) record mutations that were NOT applied. With the
  realtime lifecycle on (``REALTIME_LIFECYCLE``) each is upserted by ``(doc,
  client_id, mid)`` in the same transaction as the lmid rows covering it, so an
  absent outcome under a covering lmid means "applied"; the rows of each client this
  flush advanced are pruned by lmid distance (``ROOM_OUTCOME_RETENTION_LMIDS``).
  With the lifecycle off they are accepted and discarded: there is no downgrade path
  that would read them.

With the lifecycle on, a room flush also co-commits ``_rindle_room_watermark(doc,
flush_seq = offset)``, monotonically: the downgrade fence a client waits for before
it drops a room's ghost.

CAS (``cas=True``) checks every change against the row as the batch has left it so
far: an ``edit`` or ``remove`` needs a current row whose columns named in ``old``
equal it, an ``add`` needs no row under its key. Equality is the identity comparator
(``ivm.compare.sort_key``): null equals null, and 1 equals 1.0 (one number domain),
unlike SQL's ``=``. Any miss rolls the whole batch back and raises ``RoomConflict``
with the authoritative current image of every change that missed.
"""

import json

from django.db import connections

from ..conf import rindle_settings
from ..exceptions import (
    INVALID_CHANGE,
    INVALID_CLIENTS,
    INVALID_DOC,
    INVALID_EPOCH,
    RoomConflict,
    RoomFenced,
)
from ..ivm.compare import sort_key
from .capture import last_seq
from .changes import _value, apply_changes, keyed, parse_changes
from .errors import InvalidInput
from .identifiers import quote
from .sources import (
    REPLICATED,
    WHOLE_RUN,
    SourceResult,
    _admit,
    _advance,
    _store,
    position,
    validate_position,
)
from .values import from_db

ROOM_PLACEMENT = "_rindle_room_placement"
ROOM_LEDGER = "_rindle_room_client_mutations"
ROOM_WATERMARK = "_rindle_room_watermark"
ROOM_OUTCOMES = "_rindle_room_mutation_outcomes"
CLIENT_LEDGER = "_rindle_client_mutations"
SCOPE_SESSIONS = "_rindle_scope_sessions"
# The realtime lifecycle's system streams (the doorbell, then the fence bundle).
LIFECYCLE_TABLES = (SCOPE_SESSIONS, ROOM_WATERMARK, ROOM_LEDGER, ROOM_OUTCOMES)
# The co-edits' columns, in the order of their positional form.
LEDGER_COLUMNS = ("client_id", "last_mutation_id")
OUTCOME_COLUMNS = ("client_id", "mid", "kind", "reason", "name", "args")  # doc-less
LEDGER_FIELDS = frozenset(LEDGER_COLUMNS)
OUTCOME_FIELDS = frozenset(OUTCOME_COLUMNS)
MAX_TEXT = 255
MAX_CLIENTS = 1000
MAX_ID = 2**63 - 1
CAS_READ_KEYS = 500  # keys per statement of the CAS pass's read of the current rows


def lifecycle_tables():
    """The system tables the engine registers and captures (none with the lifecycle off)."""
    return LIFECYCLE_TABLES if rindle_settings.REALTIME_LIFECYCLE else ()


def _doc(doc):
    if not isinstance(doc, str) or not doc or len(doc) > MAX_TEXT:
        raise InvalidInput(
            f"doc must be a non-empty string of at most {MAX_TEXT} characters", code=INVALID_DOC
        )
    return doc


def _epoch(epoch):
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 1 <= epoch <= MAX_ID:
        raise InvalidInput("epoch must be a positive integer", code=INVALID_EPOCH)
    return epoch


def _count(value, name, i):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise InvalidInput(
            f"changes[{i}].row.{name} must be a non-negative integer", code=INVALID_CHANGE
        )
    return value


def _client(value, i):
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise InvalidInput(
            f"changes[{i}].row.client_id must be a non-empty string", code=INVALID_CHANGE
        )
    return value


# --- placement --------------------------------------------------------------------------


ANY_EPOCH = object()  # claim_room_epoch's ``expect`` when any current epoch will do


def claim_room_epoch(engine, doc, host=None, expect=ANY_EPOCH):
    """
    Bump ``doc``'s placement epoch once (1 for a first claim) and return it, with
    ``host`` (a channel name, or None) as the process that holds it. With ``expect``
    (the epoch the caller read, None for never claimed) the claim is a
    compare-and-swap: it returns None, and changes nothing, when another claim came
    first (a fleet's processes racing to host a doc).
    """
    _doc(doc)
    if host is not None and (not isinstance(host, str) or not host or len(host) > MAX_TEXT):
        raise InvalidInput("a room host is a channel name of at most 255 characters")
    if expect is ANY_EPOCH:
        sql = (
            f"INSERT INTO {ROOM_PLACEMENT} (doc, epoch, host) VALUES (%s, 1, %s) "
            f"ON CONFLICT (doc) DO UPDATE SET epoch = {ROOM_PLACEMENT}.epoch + 1, "
            "host = excluded.host RETURNING epoch"
        )
        params = [doc, host]
    elif expect is None:
        sql = (
            f"INSERT INTO {ROOM_PLACEMENT} (doc, epoch, host) VALUES (%s, 1, %s) "
            "ON CONFLICT (doc) DO NOTHING RETURNING epoch"
        )
        params = [doc, host]
    else:
        sql = (
            f"UPDATE {ROOM_PLACEMENT} SET epoch = epoch + 1, host = %s "
            "WHERE doc = %s AND epoch = %s RETURNING epoch"
        )
        params = [host, doc, expect]
    return engine.write(lambda tx: tx.scalar(sql, params)).value


def room_placement(using, doc):
    """``(epoch, host)`` of ``doc`` as committed; ``(None, None)`` when never claimed."""
    _doc(doc)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT epoch, host FROM {ROOM_PLACEMENT} WHERE doc = %s", [doc])
        row = cursor.fetchone()
    return (None, None) if row is None else (row[0], row[1])


def room_epoch(using, doc):
    """``doc``'s committed placement epoch; None when it was never claimed."""
    _doc(doc)
    with connections[using].cursor() as cursor:
        cursor.execute(f"SELECT epoch FROM {ROOM_PLACEMENT} WHERE doc = %s", [doc])
        row = cursor.fetchone()
    return None if row is None else row[0]


def room_lmids(using, doc, clients):
    """
    The room ledger's ``{client_id: last_mutation_id}`` under ``doc`` for the clients
    asked about that have one (absent means 0 to the caller).
    """
    _doc(doc)
    if (
        not isinstance(clients, list)
        or len(clients) > MAX_CLIENTS
        or not all(isinstance(c, str) and c and len(c) <= MAX_TEXT for c in clients)
    ):
        raise InvalidInput(
            f"clients must be a list of at most {MAX_CLIENTS} non-empty client ids",
            code=INVALID_CLIENTS,
        )
    if not clients:
        return {}
    marks = ", ".join(["%s"] * len(clients))
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT client_id, last_mutation_id FROM {ROOM_LEDGER} "
            f"WHERE doc = %s AND client_id IN ({marks})",
            [doc, *clients],
        )
        return {client: lmid for client, lmid in cursor.fetchall()}


# --- the flush --------------------------------------------------------------------------


def _split(changes):
    """A room batch's (effects, ledger co-edits, outcome rows), each validated."""
    if not isinstance(changes, list):
        return changes, [], []  # parse_changes refuses it with its code
    effects, ledger, outcomes = [], {}, []
    for i, change in enumerate(changes):
        table = change.get("table") if isinstance(change, dict) else None
        if table not in (CLIENT_LEDGER, ROOM_OUTCOMES):
            effects.append(change)
            continue
        if change.get("op") not in ("add", "edit") or set(change) - {"table", "op", "row", "old"}:
            raise InvalidInput(
                f"changes[{i}]: a {table} co-edit is an add or edit of a row",
                code=INVALID_CHANGE,
            )
        columns = LEDGER_COLUMNS if table == CLIENT_LEDGER else OUTCOME_COLUMNS
        row = keyed(columns, change.get("row"), f"changes[{i}].row")
        fields = LEDGER_FIELDS if table == CLIENT_LEDGER else OUTCOME_FIELDS
        if not isinstance(row, dict) or not row.keys() <= fields:
            raise InvalidInput(
                f"changes[{i}].row must be an object of {sorted(fields)}", code=INVALID_CHANGE
            )
        client = _client(row.get("client_id"), i)
        if table == CLIENT_LEDGER:
            lmid = _count(row.get("last_mutation_id"), "last_mutation_id", i)
            ledger[client] = max(lmid, ledger.get(client, 0))
        else:
            mid = _count(row.get("mid"), "mid", i)
            kind = row.get("kind")
            if not isinstance(kind, str) or not kind or len(kind) > MAX_TEXT:
                raise InvalidInput(f"changes[{i}].row.kind must be a string", code=INVALID_CHANGE)
            for name in ("reason", "name"):
                if row.get(name) is not None and not isinstance(row[name], str):
                    raise InvalidInput(
                        f"changes[{i}].row.{name} must be a string or null", code=INVALID_CHANGE
                    )
            outcomes.append(
                (client, mid, kind, row.get("reason"), row.get("name"), row.get("args"))
            )
    return effects, ledger, outcomes


def commit_room_flush(
    engine, changes, source, offset, *, doc=None, epoch=None, batch_hash=None, cas=False
):
    """
    Apply one room flush (or, with ``doc`` None, one change-source batch) exactly
    once; see the module. Returns a ``SourceResult``; raises ``RoomFenced``,
    ``RoomConflict``, ``SourceHashMismatch`` or ``InvalidInput`` with nothing written.
    """
    validate_position(source, offset, WHOLE_RUN, None, batch_hash, None)
    if not isinstance(cas, bool):
        raise InvalidInput("cas must be a boolean", code=INVALID_CHANGE)
    if doc is None:
        if epoch is not None:
            raise InvalidInput("epoch fences a room: it needs doc", code=INVALID_EPOCH)
        effects, ledger, outcomes = changes, {}, []
    else:
        _doc(doc)
        _epoch(epoch)
        effects, ledger, outcomes = _split(changes)
    parsed = parse_changes(
        engine.tables,
        effects,
        limit=int(rindle_settings.MAX_BATCH_CHANGES),
        extra_tables=REPLICATED if doc is None else (),
    )
    lifecycle = bool(rindle_settings.REALTIME_LIFECYCLE)

    def write(tx):
        if doc is not None:
            _fence(tx, doc, epoch)
        stored, skip = _admit(tx, source, offset, WHOLE_RUN, None, batch_hash)
        if skip:
            return False, stored, 0, None
        if cas:
            conflicts = _cas(tx, parsed)
            if conflicts:
                raise RoomConflict(
                    f"{len(conflicts)} change(s) of the batch met another row than they "
                    "expected; nothing was applied",
                    conflicts=conflicts,
                )
        rows = apply_changes(tx, parsed)
        seq = last_seq(tx) if doc is not None and rows else None
        if doc is not None:
            advanced = _upsert_ledger(tx, doc, ledger)
            if lifecycle:
                _upsert_outcomes(tx, doc, outcomes, advanced)
                _advance_watermark(tx, doc, offset)
        cp = _advance(stored, offset, WHOLE_RUN, None, batch_hash, None, rows)
        _store(tx, source, cp)
        return True, cp, rows, seq

    commit = engine.write(write)
    applied, cp, rows, seq = commit.value
    return SourceResult(applied, commit.cv, cp, rows, seq)


def _fence(tx, doc, epoch):
    # FOR SHARE: a claim in another process waits for this flush to commit, so a flush
    # that passed the fence is never overtaken by a claim it did not see.
    lock = " FOR SHARE" if tx.vendor == "postgresql" else ""
    current = tx.scalar(f"SELECT epoch FROM {ROOM_PLACEMENT} WHERE doc = %s{lock}", [doc])
    if current != epoch:
        raise RoomFenced(
            f"room {doc!r} is at epoch {current}; this flush carries epoch {epoch}",
            epoch=current,
        )


def _upsert_ledger(tx, doc, ledger):
    """Raise each client's room lmid to the batch's (never lower it); those raised."""
    advanced = {}
    for client, lmid in ledger.items():
        before = tx.scalar(
            f"SELECT last_mutation_id FROM {ROOM_LEDGER} WHERE doc = %s AND client_id = %s",
            [doc, client],
        )
        if before is not None and before >= lmid:
            continue
        tx.run(
            f"INSERT INTO {ROOM_LEDGER} (doc, client_id, last_mutation_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (doc, client_id) DO UPDATE SET last_mutation_id = "
            "excluded.last_mutation_id",
            [doc, client, lmid],
        )
        advanced[client] = lmid
    return advanced


def _upsert_outcomes(tx, doc, outcomes, advanced):
    for client, mid, kind, reason, name, args in outcomes:
        tx.run(
            f"INSERT INTO {ROOM_OUTCOMES} (doc, client_id, mid, kind, reason, name, args) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (doc, client_id, mid) DO UPDATE "
            "SET kind = excluded.kind, reason = excluded.reason, name = excluded.name, "
            "args = excluded.args",
            [doc, client, mid, kind, reason, name, _json(tx, args)],
        )
    keep = int(rindle_settings.ROOM_OUTCOME_RETENTION_LMIDS)
    for client, lmid in advanced.items():
        tx.run(
            f"DELETE FROM {ROOM_OUTCOMES} WHERE doc = %s AND client_id = %s AND mid <= %s",
            [doc, client, lmid - keep],
        )


def _json(tx, value):
    if value is None:
        return None
    if tx.vendor == "postgresql":
        from psycopg.types.json import Jsonb

        return Jsonb(value)
    return json.dumps(value, separators=(",", ":"))


def _advance_watermark(tx, doc, offset):
    before = tx.scalar(f"SELECT flush_seq FROM {ROOM_WATERMARK} WHERE doc = %s", [doc])
    if before is not None and position(offset, WHOLE_RUN) <= position(before, WHOLE_RUN):
        return
    tx.run(
        f"INSERT INTO {ROOM_WATERMARK} (doc, flush_seq) VALUES (%s, %s) "
        "ON CONFLICT (doc) DO UPDATE SET flush_seq = excluded.flush_seq",
        [doc, offset],
    )


# --- CAS ------------------------------------------------------------------------------


def _cas(tx, changes):
    """The conflicts of ``changes`` checked in order against the rows they meet."""
    stored = _current_rows(tx, changes)  # (table, key) -> the committed row, or absent
    overlay = {}  # (table, key) -> the row as the batch has left it (None: absent)
    conflicts = []
    for i, change in enumerate(changes):
        table = tx.tables.get(change.table)
        image = change.row if change.op == "add" else change.old
        key = tuple(sort_key(image[k]) for k in table.primary_key)
        slot = (change.table, key)
        current = overlay[slot] if slot in overlay else stored.get(slot)
        if change.op == "add":
            hit = current is None
        else:
            hit = current is not None and all(
                col in current and sort_key(value) == sort_key(current[col])
                for col, value in change.old.items()
            )
        if not hit:
            conflicts.append(
                {
                    "index": i,
                    "table": change.table,
                    "op": change.op,
                    "key": {k: image[k] for k in table.primary_key},
                    "current": current,
                }
            )
        # Later changes of the batch meet what this one would leave.
        if change.op == "remove":
            overlay[slot] = None
        elif change.op == "add":
            overlay[slot] = dict(change.row)
        elif current is not None:  # an edit may move the row to another key
            after = {**current, **change.row}
            new_key = tuple(sort_key(after[k]) for k in table.primary_key)
            overlay[slot] = None
            overlay[(change.table, new_key)] = after
    return conflicts


def _current_rows(tx, changes):
    """The committed rows under every key the changes name, a few statements per table."""
    wanted = {}  # table name -> {key: [pk values]}
    for change in changes:
        table = tx.tables.get(change.table)
        image = change.row if change.op == "add" else change.old
        values = [image[k] for k in table.primary_key]
        wanted.setdefault(change.table, {})[tuple(sort_key(v) for v in values)] = values
    rows = {}
    for name, keys in wanted.items():
        table = tx.tables.get(name)
        keys = list(keys.values())
        for start in range(0, len(keys), CAS_READ_KEYS):
            for row in _read_keys(tx, table, keys[start : start + CAS_READ_KEYS]):
                key = tuple(sort_key(row[k]) for k in table.primary_key)
                rows[(name, key)] = row
    return rows


def _read_keys(tx, table, keys):
    lock = " FOR UPDATE" if tx.vendor == "postgresql" else ""
    cols = [c.name for c in table.columns]
    pk = table.primary_key
    if len(pk) == 1:
        where = f"{quote(pk[0])} IN ({', '.join(['%s'] * len(keys))})"
    else:
        one = f"({', '.join(['%s'] * len(pk))})"
        where = f"({', '.join(quote(k) for k in pk)}) IN (VALUES {', '.join([one] * len(keys))})"
    found = tx.fetchall(
        f"SELECT {', '.join(quote(c) for c in cols)} FROM {quote(table.name)} WHERE {where}{lock}",
        [_value(tx, table, k, v) for key in keys for k, v in zip(pk, key)],
    )
    return [_decode(table, dict(zip(cols, row))) for row in found]


def _decode(table, current):
    """A row as the driver returned it, in the wire encoding (``engine.values``)."""
    for column in table.columns:
        value = current[column.name]
        if column.type == "boolean" and value in (0, 1) and not isinstance(value, bool):
            current[column.name] = bool(value)
        elif column.type == "json" and isinstance(value, str):
            current[column.name] = json.loads(value)
        elif column.encoding and value is not None:
            current[column.name] = from_db(column.encoding, table.vendor, value)
    return current
