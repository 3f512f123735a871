"""
The kept half of the usage ledger: one row per (namespace, UTC day, node).

Every process (node) writes only its own rows, so any number of processes or
machines flushing the same namespace and day never overwrite each other; readers
sum the nodes' rows (and merge their session sketches). A flush writes all its
rows in ONE transaction: a bulk upsert that SETS each counter to the node's figure
(``GREATEST`` of the stored and the new value, so a late or racing copy of an
older figure can never lower a row), then deletes the rows that aged out of the
kept window.

``forget`` deletes a namespace's rows of every node and bumps its generation in a
tombstone table in the same transaction; a flush reads the tombstones committed
since its last flush in its own transaction and skips the rows of an older
generation, so a forgotten namespace is never written back. On PostgreSQL a flush
holds the shared side and ``forget`` the exclusive side of one advisory lock, so
they serialize; SQLite's write lock already does.

Both tables are engine bookkeeping: never captured, never synced. Statements run
on Django's connection of the store's alias, not on the engine's writer, so the
ledger works with or without a running engine.
"""

import json
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from django.db import DatabaseError, connections, transaction

from ..engine.errors import Unavailable
from ..engine.writer import is_infrastructure_error
from ..exceptions import FLOW_STORE_UNAVAILABLE
from .figures import REASONS, Row

DAYS = "_rindle_flow_days"
TOMBSTONES = "_rindle_flow_forgotten"
REFUSAL_COLUMNS = tuple(f"refused_{reason}" for reason in REASONS)
COUNTERS = (
    "bytes_in",
    "bytes_out",
    "bulk_bytes_in",
    "bulk_bytes_out",
    "transfers",
    *REFUSAL_COLUMNS,
    "auth_failures",
)
COLUMNS = ("namespace", "day", "node", *COUNTERS, "sessions", "last_seen_ms")
_SELECT = ", ".join(COLUMNS)
_BIGINT_MAX = 2**63 - 1
# The advisory lock serializing forgets with flushes (PostgreSQL).
_LOCK = "hashtextextended('rindle.flow', 4)"


@dataclass(frozen=True)
class Written:
    """What a flush did: rows written, and the tombstones it read."""

    written: int
    tombstones: tuple
    skipped: tuple = ()


class FlowStore:
    """The kept half over ``_rindle_flow_days`` of the database alias ``using``."""

    def __init__(self, using=None):
        self._using = using

    @property
    def using(self):
        if self._using is None:
            from ..conf import rindle_settings

            return rindle_settings.DATABASE
        return self._using

    def __repr__(self):
        return f"<FlowStore using={self.using!r}>"

    # --- writes ---------------------------------------------------------------------

    def write(self, rows, *, floor_day, since=0):
        """
        Copy ``rows`` (``Row``) in one transaction; delete rows before ``floor_day``.

        A row whose namespace has a tombstone after ``since`` with another
        generation than the row's is skipped. Returns ``Written``.
        """
        with self._atomic() as cursor:
            if cursor.db.vendor == "postgresql":
                cursor.execute(f"SELECT pg_advisory_xact_lock_shared({_LOCK})")
            tombstones = self._tombstones(cursor, since)
            gens = {namespace: gen for namespace, gen, _seq in tombstones}
            keep, skipped = [], []
            for row in rows:
                gen = gens.get(row.namespace)
                if gen is not None and gen != row.gen:
                    skipped.append(row)
                else:
                    keep.append(row)
            if keep:
                self._upsert(cursor, keep)
            cursor.execute(f"DELETE FROM {DAYS} WHERE day < %s", [floor_day])
        return Written(len(keep), tuple(tombstones), tuple(skipped))

    def _upsert(self, cursor, rows):
        values = [_values(row) for row in rows]
        if cursor.db.vendor == "postgresql":
            # One statement whatever the row count: each column is one array
            # parameter, so the statement text stays short and is parsed once.
            columns = [list(column) for column in zip(*values)]
            cursor.execute(_PG_UPSERT, columns)
        else:
            cursor.executemany(_SQLITE_UPSERT, values)

    def forget(self, namespace, now_ms=None):
        """
        Delete every node's rows of ``namespace`` and bump its generation, in one
        transaction. Returns ``(rows deleted, new generation, tombstone seq)``.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._atomic() as cursor:
            if cursor.db.vendor == "postgresql":
                cursor.execute(f"SELECT pg_advisory_xact_lock({_LOCK})")
            cursor.execute(f"DELETE FROM {DAYS} WHERE namespace = %s", [namespace])
            deleted = cursor.rowcount
            cursor.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {TOMBSTONES}")
            seq = cursor.fetchone()[0]
            cursor.execute(
                f"INSERT INTO {TOMBSTONES} (namespace, generation, seq, forgotten_ms) "
                "VALUES (%s, 1, %s, %s) ON CONFLICT (namespace) DO UPDATE SET "
                f"generation = {TOMBSTONES}.generation + 1, seq = excluded.seq, "
                "forgotten_ms = excluded.forgotten_ms",
                [namespace, seq, now_ms],
            )
            cursor.execute(f"SELECT generation FROM {TOMBSTONES} WHERE namespace = %s", [namespace])
            gen = cursor.fetchone()[0]
        return deleted, gen, seq

    # --- reads ------------------------------------------------------------------------

    def tombstones(self, since=0):
        """Forgets committed after tombstone seq ``since``: ``[(namespace, gen, seq)]``."""
        with self._reading() as cursor:
            return self._tombstones(cursor, since)

    def node_rows(self, node, day):
        """Every row ``node`` stored for ``day`` (restart seeding)."""
        return self._rows("WHERE node = %s AND day = %s", [node, day])

    def rows(self, namespace, first_day, last_day):
        """Every node's rows of ``namespace`` from ``first_day`` to ``last_day``."""
        return self._rows(
            "WHERE namespace = %s AND day >= %s AND day <= %s ORDER BY day, node",
            [namespace, first_day, last_day],
        )

    def last_seen(self, namespace, floor_day):
        """The latest ``last_seen_ms`` of ``namespace`` from ``floor_day`` on (0: none)."""
        with self._reading() as cursor:
            cursor.execute(
                f"SELECT MAX(last_seen_ms) FROM {DAYS} WHERE namespace = %s AND day >= %s",
                [namespace, floor_day],
            )
            return cursor.fetchone()[0] or 0

    def fleet_rows(self, day, floor_day):
        """
        ``(every node's rows of day, {namespace: latest last_seen_ms})``, the latter
        over every namespace with a row from ``floor_day`` on.
        """
        rows = self._rows("WHERE day = %s", [day])
        with self._reading() as cursor:
            cursor.execute(
                f"SELECT namespace, MAX(last_seen_ms) FROM {DAYS} WHERE day >= %s "
                "GROUP BY namespace",
                [floor_day],
            )
            last_seen = {namespace: ms or 0 for namespace, ms in cursor.fetchall()}
        return rows, last_seen

    def daily_bytes(self, first_day, last_day, node):
        """
        Wire bytes and transfers per namespace and UTC day over ``first_day`` ..
        ``last_day``, summed over the nodes in ONE grouped query: ``[(namespace, day,
        mine, bytes_in, bytes_out, transfers)]`` where ``mine`` is True for the row of
        ``node`` and False for the sum of every other node's rows, so a reader holding
        ``node``'s live figures can put them in place of its stored copy.
        """
        with self._reading() as cursor:
            cursor.execute(
                "SELECT namespace, day, CASE WHEN node = %s THEN 1 ELSE 0 END, "
                f"SUM(bytes_in), SUM(bytes_out), SUM(transfers) FROM {DAYS} "
                "WHERE day >= %s AND day <= %s GROUP BY 1, 2, 3 ORDER BY 1, 2",
                [node, first_day, last_day],
            )
            return [
                (namespace, day, bool(mine), int(b_in), int(b_out), int(transfers))
                for namespace, day, mine, b_in, b_out, transfers in cursor.fetchall()
            ]

    def last_seen_by_namespace(self, floor_day):
        """
        ``{namespace: latest last_seen_ms}`` over every namespace with a row from
        ``floor_day`` on (0: only auth failures), in one grouped query.
        """
        with self._reading() as cursor:
            cursor.execute(
                f"SELECT namespace, MAX(last_seen_ms) FROM {DAYS} WHERE day >= %s "
                "GROUP BY namespace",
                [floor_day],
            )
            return {namespace: ms or 0 for namespace, ms in cursor.fetchall()}

    def _rows(self, where, params):
        with self._reading() as cursor:
            cursor.execute(f"SELECT {_SELECT} FROM {DAYS} {where}", params)
            return [_row(values) for values in cursor.fetchall()]

    @staticmethod
    def _tombstones(cursor, since):
        cursor.execute(
            f"SELECT namespace, generation, seq FROM {TOMBSTONES} WHERE seq > %s ORDER BY seq",
            [since],
        )
        return [tuple(values) for values in cursor.fetchall()]

    # --- connections -------------------------------------------------------------------

    def _atomic(self):
        return _cursor(self.using, atomic=True)

    def _reading(self):
        return _cursor(self.using, atomic=False)


@contextmanager
def _cursor(using, atomic):
    """A cursor of ``using`` (in one transaction when ``atomic``)."""
    try:
        with transaction.atomic(using=using) if atomic else nullcontext():
            with connections[using].cursor() as cursor:
                yield cursor
    except DatabaseError as exc:
        if is_infrastructure_error(exc):
            raise Unavailable(
                f"the flow store is unavailable: {exc}", code=FLOW_STORE_UNAVAILABLE
            ) from exc
        raise


def _upsert_sql(greatest, source):
    updates = ", ".join(
        [f"{c} = {greatest}({DAYS}.{c}, excluded.{c})" for c in (*COUNTERS, "last_seen_ms")]
        + ["sessions = excluded.sessions"]
    )
    return (
        f"INSERT INTO {DAYS} ({_SELECT}) {source} "
        f"ON CONFLICT (namespace, day, node) DO UPDATE SET {updates}"
    )


_PG_TYPES = ("text", "integer", "text", *["bigint"] * len(COUNTERS), "text", "bigint")
_PG_UPSERT = _upsert_sql(
    "GREATEST",
    "SELECT * FROM unnest(" + ", ".join(f"%s::{t}[]" for t in _PG_TYPES) + ")",
)
_SQLITE_UPSERT = _upsert_sql("MAX", "VALUES (" + ", ".join(["%s"] * len(COLUMNS)) + ")")


def _values(row):
    """The parameters of one row, in ``COLUMNS`` order (counters capped at BIGINT)."""
    return (
        row.namespace,
        row.day,
        row.node,
        *(
            min(n, _BIGINT_MAX)
            for n in (
                row.bytes_in,
                row.bytes_out,
                row.bulk_bytes_in,
                row.bulk_bytes_out,
                row.transfers,
                *row.refusals,
                row.auth_failures,
            )
        ),
        json.dumps(list(row.sessions), separators=(",", ":")),
        row.last_seen_ms,
    )


def _row(values):
    namespace, day, node = values[0], values[1], values[2]
    n = len(COUNTERS)
    counters = values[3 : 3 + n]
    sessions = values[3 + n]
    if isinstance(sessions, str):
        sessions = json.loads(sessions)
    refusals = tuple(counters[5 : 5 + len(REASONS)])
    return Row(
        namespace,
        day,
        node,
        counters[0],
        counters[1],
        counters[2],
        counters[3],
        counters[4],
        refusals,
        counters[5 + len(REASONS)],
        tuple(sessions or ()),
        values[4 + n] or 0,
    )
