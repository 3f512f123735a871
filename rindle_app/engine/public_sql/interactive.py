"""Public SQL interactive transactions, answered statement by statement, applied at commit."""

import json
import re
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from ...conf import rindle_settings
from ...exceptions import SQL_TRANSACTION_BUSY, TIMEOUT
from .. import outcomes
from ..errors import Unavailable
from .runner import Answer, Reader, _check_key, _Run, _stored, commit_cursor, fingerprint, shown
from .statements import SqlError, Statement, identity, protocol_error

TRANSACTION_ID = re.compile(r"^tx_[0-9a-f]{32}$")


# --- interactive transactions ----------------------------------------------------------------


@dataclass
class _Entry:
    statement: Statement
    writes: bool
    fingerprint: str


@dataclass
class Transaction:
    """One interactive transaction: the statements it ran and the answers it gave."""

    id: str
    owner: str
    read_only: bool
    entries: list = field(default_factory=list)
    size: int = 0
    state: str = "open"  # open | committed | rolled_back | failed | expired
    touched: float = field(default_factory=time.monotonic)
    last_op: tuple = None  # (operation_id, identity, Answer or SqlError)
    seen_ops: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (before(tx), after(tx)) run in the commit's writer transaction around the
    # statements: a client-attributed session's lmid (``attributed.session_ledger``).
    # ``before`` returning a body ends the commit with it, applying nothing.
    hooks: tuple = None

    @property
    def writes(self):
        return any(e.writes for e in self.entries)


def transaction_error(code, message, state, status, retry_scope="never"):
    return SqlError(
        message, code=code, status=status, retry_scope=retry_scope, transaction_state=state
    )


class Transactions:
    """The open interactive transactions of one engine, in this process (bounded)."""

    def __init__(self, engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._open = {}
        self._ended = OrderedDict()

    # --- registry --------------------------------------------------------------------

    def begin(self, principal, read_only=False, hooks=None):
        if not isinstance(read_only, bool):
            raise protocol_error("read_only must be a boolean")
        with self._lock:
            self._expire()
            limit = int(rindle_settings.SQL_TRANSACTIONS_MAX_OPEN)
            if len(self._open) >= limit:
                raise transaction_error(
                    "TOO_MANY_TRANSACTIONS",
                    f"{limit} transactions are open in this process; retry later",
                    "closed",
                    503,
                    retry_scope="request",
                )
            txn = Transaction("tx_" + secrets.token_hex(16), principal.key, read_only)
            txn.hooks = hooks
            self._open[txn.id] = txn
        return {
            "transaction_id": txn.id,
            "read_only": read_only,
            "idle_timeout_ms": self._idle_ms(),
        }

    def _idle_ms(self):
        return int(float(rindle_settings.SQL_TRANSACTION_IDLE_SECONDS) * 1000)

    def _expire(self):
        idle = self._idle_ms() / 1000
        now = time.monotonic()
        for txn in list(self._open.values()):
            # Never under a running operation: it holds the lock until it is done.
            if now - txn.touched > idle and txn.lock.acquire(blocking=False):
                try:
                    if txn.state == "open":
                        txn.state = "expired"
                        self._end(txn)
                finally:
                    txn.lock.release()

    def _end(self, txn):
        self._open.pop(txn.id, None)
        txn.entries = []
        if txn.last_op is not None and isinstance(txn.last_op[2], Answer):
            op, ident, answer = txn.last_op
            body = json.loads(outcomes.encode({"body": answer.body}))["body"]
            txn.last_op = (op, ident, Answer(answer.status, body))
        self._ended[txn.id] = txn
        while len(self._ended) > 4 * int(rindle_settings.SQL_TRANSACTIONS_MAX_OPEN):
            self._ended.popitem(last=False)

    def _find(self, principal, transaction_id):
        if not isinstance(transaction_id, str) or not TRANSACTION_ID.match(transaction_id):
            raise protocol_error("malformed transaction id")
        with self._lock:
            self._expire()
            txn = self._open.get(transaction_id) or self._ended.get(transaction_id)
        if txn is None or txn.owner != principal.key:
            return None
        return txn

    def _unknown(self):
        return transaction_error(
            "TRANSACTION_EXPIRED",
            "no open transaction has this id here: it expired, or never existed",
            "unknown",
            404,
            retry_scope="closure",
        )

    def _closed(self, txn):
        if txn.state == "expired":
            return transaction_error(
                "TRANSACTION_EXPIRED",
                "the transaction expired after being idle; nothing of it was applied",
                "closed",
                404,
                retry_scope="closure",
            )
        return transaction_error(
            "TRANSACTION_CLOSED", f"the transaction is {txn.state.replace('_', ' ')}", "closed", 409
        )

    def _operation(self, txn, operation_id, ident):
        """A stored answer to replay (or raise), else None: the operation is new."""
        if txn.last_op is not None and txn.last_op[0] == operation_id:
            if txn.last_op[1] != ident:
                raise transaction_error(
                    "OPERATION_ID_REUSED",
                    "this operation_id already answered a different operation",
                    "open" if txn.state == "open" else "closed",
                    409,
                )
            answer = txn.last_op[2]
            if isinstance(answer, SqlError):
                raise answer
            return Answer(answer.status, answer.body, replayed=True)
        if operation_id in txn.seen_ops:
            raise transaction_error(
                "OPERATION_ID_REUSED",
                "this operation_id was used by an earlier operation",
                "open" if txn.state == "open" else "closed",
                409,
            )
        return None

    def _record(self, txn, operation_id, ident, answer):
        txn.seen_ops.add(operation_id)
        txn.last_op = (operation_id, ident, answer)
        txn.touched = time.monotonic()

    @staticmethod
    def _op_id(operation_id):
        if isinstance(operation_id, int) and not isinstance(operation_id, bool):
            operation_id = str(operation_id)
        _check_key(operation_id, "operation_id")
        return operation_id

    # --- operations --------------------------------------------------------------------

    def execute(self, principal, transaction_id, operation_id, statements):
        operation_id = self._op_id(operation_id)
        txn = self._find(principal, transaction_id)
        if txn is None:
            raise self._unknown()
        ident = identity("transaction.execute", statements)
        with _locked(txn):
            replay = self._operation(txn, operation_id, ident)
            if replay is not None:
                return replay
            if txn.state != "open":
                raise self._closed(txn)
            try:
                answer = self._execute(principal, txn, statements)
            except SqlError as exc:
                if exc.details.get("transaction_state") == "closed":
                    txn.state = "failed"
                    with self._lock:
                        self._end(txn)
                self._record(txn, operation_id, ident, exc)
                raise
            self._record(txn, operation_id, ident, answer)
            return answer

    def _execute(self, principal, txn, statements):
        count = len(txn.entries) + len(statements)
        limit = int(rindle_settings.SQL_MAX_STATEMENTS)
        size = txn.size + sum(st.size for st in statements)
        byte_limit = int(rindle_settings.SQL_TRANSACTION_MAX_BYTES)
        if count > limit or size > byte_limit:
            raise transaction_error(
                "TRANSACTION_TOO_LARGE",
                f"the transaction would hold {count} statements and {size} bytes; the "
                f"limits are {limit} and {byte_limit} (it stays open, without them)",
                "open",
                400,
            )
        # Number the new statements after the ones already run.
        base = len(txn.entries)
        statements = [_renumber(st, base + i) for i, st in enumerate(statements)]
        try:
            with Reader(self.engine.using, principal) as reader:
                writes = [bool(reader.classify(st)) for st in statements]
                if txn.read_only and any(writes):
                    index = statements[writes.index(True)].index
                    raise transaction_error(
                        "TRANSACTION_READ_ONLY", "this transaction is read-only", "open", 400
                    ).at(index)
                if not txn.writes and not any(writes):
                    results = [reader.run(st) for st in statements]
                    return self._answer(txn, statements, writes, results)
        except SqlError as exc:
            raise _relative(exc, base, "open") from None
        except Unavailable as exc:
            raise _unavailable(exc, "open") from exc
        prior = [e for e in txn.entries if e.writes]

        def speculate(tx):
            run = _Run(tx, principal)
            for entry in prior:
                try:
                    result = run.one(entry.statement, True)
                except SqlError as exc:
                    # An earlier statement fails now: the answers given no longer hold.
                    raise _conflict(entry.statement.index, exc.message) from None
                if fingerprint(result) != entry.fingerprint:
                    raise _conflict(entry.statement.index)
            raise _Speculation(run.statements(statements, writes, state="open"))

        try:
            self.engine.write(speculate, alone=True)
        except _Speculation as done:
            return self._answer(txn, statements, writes, done.results)
        except SqlError as exc:
            raise _relative(exc, base) from None
        except Unavailable as exc:
            raise _unavailable(exc, "open") from exc
        raise AssertionError("speculation must roll back")  # pragma: no cover

    def _answer(self, txn, statements, writes, results):
        for st, w, result in zip(statements, writes, results):
            txn.entries.append(_Entry(st, w, fingerprint(result)))
            txn.size += st.size
        shown_results = [shown(r, st) for r, st in zip(results, statements)]
        return Answer(200, {"results": shown_results})

    def commit(self, principal, transaction_id, operation_id):
        operation_id = self._op_id(operation_id)
        key = f"txn:{transaction_id}"
        ident = "commit"
        txn = self._find(principal, transaction_id)
        if txn is not None:
            with _locked(txn):
                replay = self._operation(txn, operation_id, ident)
                if replay is not None:
                    return replay
                if txn.state != "open":
                    raise self._closed(txn)
                try:
                    answer = self._commit(principal, txn, key, operation_id)
                except SqlError as exc:
                    if exc.retryable:  # nothing was decided: the same commit may be retried
                        raise
                    txn.state = "failed"
                    self._record(txn, operation_id, ident, exc)
                    with self._lock:
                        self._end(txn)
                    raise
                if answer.replayed:  # committed by an earlier attempt whose answer was lost
                    answer = self._from_record(answer.body, principal, operation_id)
                self._record(txn, operation_id, ident, Answer(answer.status, answer.body))
                txn.state = "committed"
                with self._lock:
                    self._end(txn)
                return answer
        # Unknown here (another process, a restart, an eviction): the stored outcome.
        if not TRANSACTION_ID.match(transaction_id):
            raise protocol_error("malformed transaction id")
        record = _stored(self.engine, key)
        if record is None:
            raise self._unknown()
        return self._from_record(record, principal, operation_id)

    def _from_record(self, record, principal, operation_id):
        if record.get("owner") != principal.key:
            raise self._unknown()
        if record.get("operation_id") != operation_id:
            raise transaction_error(
                "TRANSACTION_CLOSED", "the transaction is committed", "closed", 409
            )
        return Answer(record["status"], record["body"], replayed=True)

    def _commit(self, principal, txn, key, operation_id):
        entries = list(txn.entries)
        hooks = txn.hooks
        if not txn.writes and hooks is None:
            # Nothing to apply: the reads must still hold together, in one snapshot.
            try:
                with Reader(self.engine.using, principal) as reader:
                    results = []
                    for e in entries:
                        try:
                            result = reader.run(e.statement)
                        except SqlError as exc:
                            raise _conflict(e.statement.index, exc.message) from None
                        if fingerprint(result) != e.fingerprint:
                            raise _conflict(e.statement.index)
                        results.append(shown(result, e.statement))
            except Unavailable as exc:
                raise _unavailable(exc, "open") from exc
            body = {"committed": True, "results": results, "cv": None, "commit_cursor": None}
            return Answer(200, body)

        def apply(tx):
            now = outcomes.now_ms()
            outcomes.lock(tx, key)
            found = outcomes.read_in(tx, key, now)
            if found is not None:
                return found, True
            if hooks is not None:
                early = hooks[0](tx)
                if early is not None:
                    body = {"committed": False, "absorbed": early, "results": []}
                    return {"owner": principal.key, "status": 200, "body": body}, False
            run = _Run(tx, principal)
            results = []
            for e in entries:
                try:
                    result = run.one(e.statement, e.writes)
                except SqlError as exc:
                    raise _conflict(e.statement.index, exc.message) from None
                if fingerprint(result) != e.fingerprint:
                    raise _conflict(e.statement.index)
                results.append(shown(result, e.statement))
            if hooks is not None:
                hooks[1](tx)
            cv = run.cv()
            body = {
                "committed": True,
                "results": results,
                "cv": cv,
                "commit_cursor": commit_cursor(cv),
            }
            record = {
                "owner": principal.key,
                "identity": "commit",
                "operation_id": operation_id,
                "status": 200,
                "body": body,
            }
            outcomes.store(tx, key, record, now)
            return record, False

        try:
            record, replayed = self.engine.write(apply, alone=True).value
        except Unavailable as exc:
            # A timed-out commit may still land: retry it with the same operation_id.
            raise _unavailable(exc, "unknown" if exc.code == TIMEOUT else "open") from exc
        if replayed:
            return Answer(record["status"], record, replayed=True)
        return Answer(record["status"], record["body"])

    def rollback(self, principal, transaction_id, operation_id):
        operation_id = self._op_id(operation_id)
        txn = self._find(principal, transaction_id)
        if txn is None:
            if _stored(self.engine, f"txn:{transaction_id}") is not None:
                raise transaction_error(
                    "TRANSACTION_CLOSED", "the transaction is committed", "closed", 409
                )
            raise self._unknown()
        with _locked(txn):
            replay = self._operation(txn, operation_id, "rollback")
            if replay is not None:
                return replay
            if txn.state != "open":
                raise self._closed(txn)
            answer = Answer(200, {"rolled_back": True})
            txn.state = "rolled_back"
            self._record(txn, operation_id, "rollback", answer)
            with self._lock:
                self._end(txn)
            return answer


class _Speculation(Exception):
    """Raised to roll back a speculative run, carrying its results."""

    def __init__(self, results):
        super().__init__("speculation")
        self.results = results


def _conflict(index, detail=None):
    message = "the transaction's earlier answers no longer hold; run it again"
    if detail:
        message += f" ({detail})"
    return transaction_error(
        "TRANSACTION_CONFLICT", message, "closed", 409, retry_scope="closure"
    ).at(index)


def _renumber(st, index):
    st.index = index
    return st


def _relative(exc, base, state=None):
    """
    ``exc`` with its statement index counted in the request, not the transaction,
    unless it is a conflict (whose index counts every statement the transaction ran).
    """
    index = exc.details.get("statement_index")
    if exc.code != "TRANSACTION_CONFLICT" and index is not None and index >= base:
        exc.details["statement_index"] = index - base
    if state is not None and exc.code != "TRANSACTION_CONFLICT":
        exc.details["transaction_state"] = state
    return exc


def _unavailable(exc, state):
    return SqlError(
        exc.message, code=exc.code, status=503, retry_scope="request", transaction_state=state
    )


class _locked:
    """Hold a transaction's lock (operations on one transaction run one at a time)."""

    def __init__(self, txn):
        self.txn = txn

    def __enter__(self):
        if not self.txn.lock.acquire(timeout=float(rindle_settings.WRITE_TIMEOUT)):
            raise SqlError(
                "another operation of this transaction is still running",
                code=SQL_TRANSACTION_BUSY,
                status=409,
                retry_scope="request",
                transaction_state="unknown",
            )
        self.txn.touched = time.monotonic()

    def __exit__(self, *exc):
        self.txn.lock.release()


def transactions(engine):
    """The interactive transactions of ``engine`` in this process (they end with it)."""
    return engine.attachment("sql_transactions", Transactions)
