"""
Read-only admin pages of rindle's bookkeeping tables and API tokens, and the usage
ledger's operator pages (the fleet, one namespace, forget), and the change stream's
page (watermark, leases, open transactions on the outbox fence).

One module per area; importing them registers every admin class.
"""

from ..flow.charts import humanize_bytes, nice_scale
from . import bookkeeping, flow, outbox, rooms, stream, tokens

__all__ = [
    "bookkeeping",
    "flow",
    "humanize_bytes",
    "nice_scale",
    "outbox",
    "rooms",
    "stream",
    "tokens",
]
