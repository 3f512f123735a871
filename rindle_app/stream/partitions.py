"""
The partition store's reads (``ivm.partitions``): some rows of one table and the
outbox changes of that table above a version, in ONE snapshot that takes no lock.

The snapshot is one statement that reads the rows, the stream's state row and the
changes together, so the horizon and the epoch checked here are those of the rows
read. A version below the horizon, or of another epoch, cannot be corrected to
(the changes above it are pruned, or numbered anew): that is
``ResnapshotRequired``, exactly as for the tail, and the hub re-hydrates.
"""

import json
import time

from django.db import connections

from ..engine.capture import OUTBOX, sqlite_image
from ..engine.schema_changes import DDL_OP
from ..exceptions import ResnapshotRequired
from . import state as stream_state
from .reader import _SQLITE_SAFE, decode

# Rows decoded between two hand-overs of the GIL (a few hundred microseconds).
_YIELD_ROWS = 64


def _text(vendor, expression):
    return f"CAST({expression} AS text)" if vendor == "postgresql" else expression


class PartitionSource:
    """Reads for the partition store of the catalog of ``using``, in ``epoch``."""

    def __init__(self, using, epoch):
        self.using = using
        self.epoch = epoch

    def read(self, table, sql, params, version):
        """
        ``(rows, later, cover)``: the images of ``SELECT ... <sql>`` (``sql`` is
        ``FROM <table> t WHERE ...``, from ``ivm.sql.compile_rows``; rows in no
        particular order), the (seq, old, new) of ``table``'s changes with seq above
        ``version``, oldest first, and the snapshot's safe_seq: every change at or
        below ``cover`` is in these rows, so they can be corrected to any version
        from ``version`` up to ``cover`` (a read ahead of the hub's lock needs that:
        ``ivm.partitions.PartitionStore.install_ahead``).

        ONE statement reads the rows, the state row and the changes, so they are one
        snapshot on both databases with no transaction to open and close: a cold
        partition costs one round trip.
        """
        conn = connections[self.using]
        vendor = conn.vendor
        image = sqlite_image("t", table) if vendor == "sqlite" else "to_jsonb(t)"
        image = image.replace("%", "%%")  # the statement has parameters
        safe = "s.safe_seq" if vendor == "postgresql" else _SQLITE_SAFE
        statement = (
            f"SELECT 0, {_text(vendor, 'r.image')}, NULL, NULL "
            f"FROM (SELECT {image} AS image {sql}) AS r "
            f"UNION ALL SELECT 1, s.epoch, {_text(vendor, 's.horizon')}, {_text(vendor, safe)} "
            f"FROM {stream_state.TABLE} AS s WHERE s.name = %s "
            f"UNION ALL SELECT 2, {_text(vendor, 'e.old')}, {_text(vendor, 'e.new')}, "
            f"{_text(vendor, 'e.seq')} "
            f'FROM {OUTBOX} AS e WHERE e.seq > %s AND e."table" = %s'
            # A DDL marker (engine.schema_changes) changes no row.
            f" AND e.op <> '{DDL_OP}'"
        )
        with conn.cursor() as cursor:
            cursor.execute(statement, [*params, stream_state.STREAM, version, table.name])
            found = cursor.fetchall()
        rows, later, current = [], [], None
        for n, (part, a, b, seq) in enumerate(found, 1):
            if part == 0:
                rows.append(decode(table, a))
                if not n % _YIELD_ROWS:
                    # Hand the GIL over: another thread (a socket's event loop) waits
                    # a switch interval (5 ms) for it otherwise, once per hand-over.
                    time.sleep(0)
            elif part == 1:
                current = (a, int(b), int(seq))
            else:
                later.append((seq, a, b))
        if current is None or current[0] != self.epoch:
            raise ResnapshotRequired(
                ResnapshotRequired.EPOCH_MISMATCH,
                f"the stream's epoch changed from {self.epoch} to "
                f"{None if current is None else current[0]}",
            )
        if version + 1 < current[1]:
            raise ResnapshotRequired(
                ResnapshotRequired.BELOW_HORIZON,
                f"a read at {version} is below the horizon {current[1]}",
            )
        later = sorted(((int(seq), old, new) for seq, old, new in later), key=lambda e: e[0])
        events = [
            (seq, decode(table, _json(old)), decode(table, _json(new))) for seq, old, new in later
        ]
        return rows, events, max(version, current[2])


def _json(text):
    return None if text is None else json.loads(text)
