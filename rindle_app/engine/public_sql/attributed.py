"""
Client-attributed SQL transactions: the original daemon's ``/execute-sql-txn`` and
its interactive mutation sessions, on the public SQL runner and the lmid ledger.

The rule (the original's, and NOT the one of ``engine.mutations``): statements with
a ``(client_id, mid)`` run in ONE writer transaction with the lmid upsert. ``mid <=
lmid`` is absorbed (nothing runs, the stored lmid is answered); ``mid > lmid + 1``
is a gap (``MutationGap``, 409, nothing written). Any failure of a statement, a
constraint included, rolls everything back and advances NO lmid: the caller (the
api-server's mutator harness) decides what a failure means, and a corrected retry
of the same mid applies. A business rejection is recorded separately, by
``engine.mutations.reject`` (``/reject-mutation``), in an lmid-only commit.

Without a client id, ``idempotency_key`` dedupes a foreign write: its answer is
stored with its effects, and a retry with the same key answers ``applied: false``
with the stored commit version (another request under the same key is 409
``IDEMPOTENCY_KEY_REUSED``).
"""

from ...exceptions import SQL_IDEMPOTENCY_KEY_REUSED, SQL_READ_ONLY
from .. import outcomes
from ..capture import OUTBOX
from ..errors import MutationGap
from ..mutations import _read_lmid, _store_lmid, check_owner, client_lmid
from .guards import Principal, protected
from .runner import Reader, _check_key, _Run, _stored, commit_cursor
from .statements import SqlError, identity


class DaemonPrincipal(Principal):
    """
    A daemon-scope token: the original's database token, which writes every table
    of the app. Bookkeeping tables (``_rindle_*``, ``django_*``, ``auth_*``) stay
    out of reach of its SQL, as of every public SQL caller's.
    """

    def can_write(self, table):
        return not protected(table)


def read_only(engine, principal, statement):
    """
    ``(columns, rows)`` of one read statement on the read-only connection; a
    statement that would write is refused (400 ``READ_ONLY``) before it runs.
    """
    with Reader(engine.using, principal) as reader:
        if reader.classify(statement):
            raise SqlError("this route only reads: the statement writes", code=SQL_READ_ONLY).at(
                statement.index
            )
        result = reader.run(statement)
    return [c["name"] for c in result["columns"]], result["rows"]


def client_receipt(client_id, lmid, cv, applied):
    """The original's answer to an attributed write (``SqlTxnOutput``)."""
    body = {"applied": applied, "cv": cv, "txId": cv, "cursor": commit_cursor(cv)}
    if client_id is not None:
        body["lmid"] = lmid
        body["lmidAdvances"] = [{"clientID": client_id, "lmid": lmid}]
    return body


def stored_lmid(engine, client_id, owner):
    """The committed lmid of ``client_id`` (0 if new), ``owner`` checked."""
    if owner is not None:
        check_owner(engine.using, client_id, owner)
    return client_lmid(engine.using, client_id)


def run_txn(engine, principal, statements, *, client_id=None, mid=None, owner=None, key=None):
    """
    Apply ``statements`` (parsed) once, as the module says; the receipt. ``owner``
    is the principal key the client id is bound to; ``key`` an idempotency key.
    """
    if key is not None:
        _check_key(key, "idempotencyKey")
        key = f"daemon:{principal.key}:{key}"
        found = _stored(engine, key)
        if found is not None:
            return _replayed(found, identity("daemon.txn", statements))
    if client_id is not None:
        lmid = stored_lmid(engine, client_id, owner)
        if mid <= lmid:  # absorbed before any statement is even classified
            return client_receipt(client_id, lmid, None, False)
    writes = []
    if statements:
        with Reader(engine.using, principal) as reader:
            writes = [reader.classify(st) for st in statements]
    ident = identity("daemon.txn", statements)

    def apply(tx):
        now = outcomes.now_ms()
        if key is not None:
            outcomes.lock(tx, key)
            found = outcomes.read_in(tx, key, now)
            if found is not None:
                return found, True
        if client_id is not None:
            stored = _read_lmid(tx, client_id, owner)
            if mid <= stored:
                return {"body": client_receipt(client_id, stored, None, False)}, True
            if mid > stored + 1:
                raise MutationGap(client_id, mid, stored)
        run = _Run(tx, principal)
        run.statements(statements, writes)
        if client_id is not None:
            _store_lmid(tx, client_id, mid, owner)
        cv = run.cv()
        record = {"identity": ident, "body": client_receipt(client_id, mid, cv, True)}
        if key is not None:
            outcomes.store(tx, key, record, now)
        return record, False

    record, replayed = engine.write(apply, alone=True).value
    if replayed and key is not None and "identity" in record:
        return _replayed(record, ident)
    return record["body"]


def _replayed(record, ident):
    if record.get("identity") != ident:
        raise SqlError(
            "this idempotency key already answered a different transaction",
            code=SQL_IDEMPOTENCY_KEY_REUSED,
            status=409,
        )
    return {**record["body"], "applied": False}


def session_ledger(principal, client_id=None, mid=None, owner=None, key=None):
    """
    The commit hooks of a mutation session, in the commit's writer transaction:
    before the statements run, the lmid read (absorbed, or a gap) and the
    idempotency key's stored answer (absorbed); after them, the lmid upsert and the
    key's answer. ``(before, after, (client_id, mid))``; None when there is neither.
    """
    if client_id is None and key is None:
        return None
    if key is not None:
        key = f"daemon:{principal.key}:{key}"

    def before(tx):
        if key is not None:
            outcomes.lock(tx, key)
            found = outcomes.read_in(tx, key, outcomes.now_ms())
            if found is not None:
                return {**found["body"], "applied": False}
        if client_id is None:
            return None
        stored = _read_lmid(tx, client_id, owner)
        if mid <= stored:
            return client_receipt(client_id, stored, None, False)
        if mid > stored + 1:
            raise MutationGap(client_id, mid, stored)
        return None

    def after(tx):
        if client_id is not None:
            _store_lmid(tx, client_id, mid, owner)
        if key is not None:
            cv = tx.scalar(f"SELECT COALESCE(MAX(seq), 0) FROM {OUTBOX}")
            body = client_receipt(client_id, mid, cv, True)
            outcomes.store(tx, key, {"identity": "session", "body": body}, outcomes.now_ms())

    return before, after, (client_id, mid)


def stored_key(engine, principal, key):
    """The stored answer of a session's idempotency key, as a replay; else None."""
    _check_key(key, "idempotencyKey")
    found = _stored(engine, f"daemon:{principal.key}:{key}")
    return None if found is None else {**found["body"], "applied": False}
