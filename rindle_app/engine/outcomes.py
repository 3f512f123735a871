"""
Retained outcomes of public SQL operations, for exact replay of a retried request.

An outcome is written in the SAME writer transaction as the effects it reports, so
a crash never leaves effects without their outcome (or an outcome without its
effects). It lives in ``_rindle_sql_outcomes`` until ``expires_at`` (now plus
``SQL_OUTCOME_RETENTION_SECONDS``); an expired outcome is treated as absent even
before the sweep deletes it, so replay never depends on when the sweep ran. The
stored text is bounded by ``SQL_OUTCOME_MAX_BYTES``: a larger answer is kept with
its rows elided, so a replay still tells the client what committed.

``_rindle_sql_outcomes`` is host-local metadata, never captured.
"""

import json
import time

from django.db import connections, transaction

from ..conf import rindle_settings

OUTCOMES = "_rindle_sql_outcomes"
# Advisory-lock namespace of outcome keys on PostgreSQL (1: producers, 2: sources).
LOCK_NAMESPACE = 3


def now_ms():
    return int(time.time() * 1000)


def retention_ms():
    return int(float(rindle_settings.SQL_OUTCOME_RETENTION_SECONDS) * 1000)


def operation_floor_ms(now):
    """
    The retention floor at ``now``: outcomes recorded before it may be gone, so a
    retry older than the retention period can no longer be recognised.
    """
    return now - retention_ms()


def encode(record):
    """
    ``record`` as stored text, within ``SQL_OUTCOME_MAX_BYTES``: when the whole
    answer is larger, every result's rows are dropped (``rows_elided``), keeping
    counts, cursor and status.
    """
    text = _dumps(record)
    limit = int(rindle_settings.SQL_OUTCOME_MAX_BYTES)
    if len(text.encode()) <= limit:
        return text
    body = dict(record["body"])
    for key in ("result", "results"):
        if key in body and body[key] is not None:
            body[key] = _elide(body[key])
    body["results_elided"] = True
    text = _dumps({**record, "body": body})
    if len(text.encode()) <= limit:
        return text
    # Even the summary is too large (very many statements): keep the bare fact.
    bare = {k: v for k, v in body.items() if k not in ("result", "results")}
    return _dumps({**record, "body": bare})


def _elide(results):
    if isinstance(results, list):
        return [_elide(r) for r in results]
    return {**results, "rows": None, "rows_elided": True}


def _dumps(value):
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def lock(tx, key):
    """Serialize writers of ``key`` across processes (SQLite's write lock already does)."""
    if tx.vendor == "postgresql":
        tx.scalar(f"SELECT pg_advisory_xact_lock(hashtextextended(%s, {LOCK_NAMESPACE}))", [key])


def read_in(tx, key, now):
    """The live outcome record of ``key`` inside the writer transaction, or None."""
    text = tx.scalar(
        f"SELECT result FROM {OUTCOMES} WHERE outcome_key = %s AND expires_at > %s",
        [key, now],
    )
    return None if text is None else json.loads(text)


def store(tx, key, record, now):
    """Write ``record`` under ``key`` in the writer transaction (an expired one is replaced)."""
    tx.run(
        f"INSERT INTO {OUTCOMES} (outcome_key, result, expires_at) VALUES (%s, %s, %s) "
        "ON CONFLICT (outcome_key) DO UPDATE SET result = excluded.result, "
        "expires_at = excluded.expires_at",
        [key, encode(record), now + retention_ms()],
    )


def stored(using, key, now=None):
    """The live outcome record of ``key`` from committed data, or None."""
    now = now_ms() if now is None else now
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT result FROM {OUTCOMES} WHERE outcome_key = %s AND expires_at > %s",
            [key, now],
        )
        row = cursor.fetchone()
    return None if row is None else json.loads(row[0])


def sweep(using, now=None):
    """Delete every outcome expired at ``now`` (and only those); return how many."""
    now = now_ms() if now is None else now
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        cursor.execute(f"DELETE FROM {OUTCOMES} WHERE expires_at <= %s", [now])
        return cursor.rowcount
