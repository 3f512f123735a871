"""
The partition store's reads (``ivm.partitions``): some rows of one table and the
outbox changes of that table above a version, in ONE snapshot that takes no lock.

The snapshot is the stream's (``reader.consistent_read``): its first statement
reads the state row, so the horizon and the epoch checked here are those of the
rows read. A version below the horizon, or of another epoch, cannot be corrected
to (the changes above it are pruned, or numbered anew): that is
``ResnapshotRequired``, exactly as for the tail, and the hub re-hydrates.
"""

from ..engine.capture import OUTBOX, sqlite_image
from ..exceptions import ResnapshotRequired
from .reader import consistent_read, decode

_LATER = f'SELECT old, new FROM {OUTBOX} WHERE seq > %s AND "table" = %s ORDER BY seq'


class PartitionSource:
    """Reads for the partition store of the catalog of ``using``, in ``epoch``."""

    def __init__(self, using, epoch):
        self.using = using
        self.epoch = epoch

    def read(self, table, sql, params, version):
        """
        ``(rows, later)``: the images of ``SELECT ... <sql>`` (``sql`` is ``FROM
        <table> t WHERE ...``, from ``ivm.sql.compile_rows``) and the (old, new)
        images of ``table``'s changes with seq above ``version``, oldest first.
        """

        def body(cursor, current):
            if current.epoch != self.epoch:
                raise ResnapshotRequired(
                    ResnapshotRequired.EPOCH_MISMATCH,
                    f"the stream's epoch changed from {self.epoch} to {current.epoch}",
                )
            if version + 1 < current.horizon:
                raise ResnapshotRequired(
                    ResnapshotRequired.BELOW_HORIZON,
                    f"a read at {version} is below the horizon {current.horizon}",
                )
            image = sqlite_image("t", table) if cursor.db.vendor == "sqlite" else "to_jsonb(t)"
            image = image.replace("%", "%%")  # the statement has parameters
            cursor.execute(f"SELECT {image} {sql}", params)
            rows = [decode(table, r[0]) for r in cursor.fetchall()]
            cursor.execute(_LATER, [version, table.name])
            later = [(decode(table, old), decode(table, new)) for old, new in cursor.fetchall()]
            return rows, later

        _state, found = consistent_read(self.using, body)
        return found
