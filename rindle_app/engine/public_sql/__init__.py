"""
Public SQL: one-shot statements, atomic batches and interactive transactions, with
the replay of retained outcomes (the original's ``/v1/sql/*``).

Statements are ``{sql, args?, want_rows?}``; placeholders are ``?`` (``args`` a
list) or ``:name`` (``args`` an object), values JSON scalars or tagged
``{"$rindle": "i64" | "float", "value": "..."}``. Only SELECT/VALUES/WITH and
INSERT/UPDATE/DELETE (REPLACE on SQLite, MERGE on PostgreSQL) are accepted: DDL
goes through the migrations journal, and transaction control, settings, pragmas
and the like are refused.

Where a statement runs:

- A request that writes nothing runs on a read-only connection (SQLite
  ``PRAGMA query_only``, PostgreSQL ``READ ONLY`` transactions that always roll
  back), never on the writer.
- A request that writes runs in ONE writer transaction (``engine.write``), so
  captured tables reach live subscribers like any write, and its outcome, when it
  is replayable, commits in the same transaction (``engine.outcomes``).

What a statement may read and write the database decides. On SQLite an
authorizer sees every table as the statement is compiled (triggers and cascades
included) and decides every read by the table really read (through CTEs, views
and subqueries alike); functions are an allow-list (``guards.SQLITE_FUNCTIONS``).
On PostgreSQL the statement runs under ``SET LOCAL ROLE`` to a NOLOGIN role
holding SELECT on the unprotected tables and INSERT/UPDATE/DELETE on the tables
``RindleAdapter.authorize_sql_write`` allows (``sandbox``), so even SQL a function
runs from text is checked; the plan's ModifyTable nodes only route the statement
to the writer. ``_rindle_*``, ``django_*`` and ``auth_*`` are never readable or
writable. Every statement has a time budget (``SQL_STATEMENT_TIMEOUT_SECONDS``,
``STATEMENT_TIMEOUT``: SQLite's progress handler, PostgreSQL's statement_timeout)
and its answer a row and byte cap (``RESULT_TOO_LARGE``). On SQLite a writing
request runs alone on the writer, since SQLite rolls back the whole transaction of
an interrupted write.

Interactive transactions never hold the writer across requests. Each statement
is answered when it is executed (reads with no earlier write of the transaction
on a read-only connection; anything after a write by re-running the
transaction's writes in a writer transaction that is rolled back). The commit
re-runs every statement, in order, in ONE writer transaction and applies it only
if every statement gives exactly the answer the client was given (rows, counts,
last insert rowid); otherwise nothing is applied (``TRANSACTION_CONFLICT``: retry
the whole transaction). A committed transaction is therefore serializable, at its
commit. One consequence: on PostgreSQL a statement whose answer shows a value
drawn from a sequence during the transaction conflicts at commit (the sequence
moved on), so prefer client-made keys there. The commit outcome is stored with
the effects under the transaction id, so a retried commit (same ``operation_id``)
replays it, from any process; the open transactions themselves live in the
memory of the process that began them.

The package: ``statements`` (errors, values, parsing), ``guards`` (who is asking
and which tables a statement touches), ``sandbox`` (the PostgreSQL roles),
``runner`` (the read-only connection, the writer, one-shot requests) and
``interactive`` (interactive transactions). Import from here.
"""

from .guards import PROTECTED_PREFIXES, Principal, SqliteGuard, protected
from .interactive import (
    TRANSACTION_ID,
    Transaction,
    Transactions,
    transaction_error,
    transactions,
)
from .runner import (
    MAX_KEY_LENGTH,
    Answer,
    Reader,
    commit_cursor,
    fingerprint,
    run_once,
    shown,
)
from .statements import (
    DDL,
    I64_MAX,
    I64_MIN,
    READS,
    RETRY_SCOPES,
    SAFE_INT,
    WRITES,
    SqlError,
    Statement,
    decode_value,
    encode_value,
    identity,
    parse_statement,
    parse_statements,
    protocol_error,
    scan,
)

__all__ = [
    "Answer",
    "DDL",
    "I64_MAX",
    "I64_MIN",
    "MAX_KEY_LENGTH",
    "PROTECTED_PREFIXES",
    "Principal",
    "READS",
    "RETRY_SCOPES",
    "Reader",
    "SAFE_INT",
    "SqlError",
    "SqliteGuard",
    "Statement",
    "TRANSACTION_ID",
    "Transaction",
    "Transactions",
    "WRITES",
    "commit_cursor",
    "decode_value",
    "encode_value",
    "fingerprint",
    "identity",
    "parse_statement",
    "parse_statements",
    "protected",
    "protocol_error",
    "run_once",
    "scan",
    "shown",
    "transaction_error",
    "transactions",
]
