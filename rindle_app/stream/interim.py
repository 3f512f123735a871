"""
TEMPORARY until the Watermarker merges (branch ``wm``, ``stream/watermark.py``):
the lead deletes this module and every line marked "TEMPORARY" in
``realtime/hub.py`` and ``tests/stream/test_reader_wake.py`` at the merge.

Readers tail only up to the published safe_seq, and until the watermarker runs
nothing publishes it. So the hub thread, on PostgreSQL, publishes it itself at most
once per STREAM_REFRESH_SECONDS, the way a watermark step does (minus the lease):
the exclusive side of the fence under a short lock timeout, then
``state.publish`` and a ``rindle_watermark`` notification in one transaction.
"""

import time

from django.db import connections, transaction

from ..conf import rindle_settings
from . import fence, state
from .notify import WATERMARK_CHANNEL


def _interim_publish(using, due):
    """
    TEMPORARY until the Watermarker merges. Publish safe_seq if ``due`` (a
    ``time.monotonic()`` value) has passed; returns when the next one is due.
    """
    now = time.monotonic()
    if now < due:
        return due
    timeout = float(rindle_settings.STREAM_FENCE_LOCK_TIMEOUT_MS) / 1000
    seq = fence.safe_seq(using, timeout)
    if seq is not None:
        with transaction.atomic(using), connections[using].cursor() as cursor:
            before = state.read(cursor).safe_seq
            if state.publish(cursor, seq) > before:
                cursor.execute("SELECT pg_notify(%s, %s)", [WATERMARK_CHANNEL, str(seq)])
    return now + float(rindle_settings.STREAM_REFRESH_SECONDS)
