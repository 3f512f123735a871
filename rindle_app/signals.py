"""Signal receivers: keep capture triggers and the table map in step with migrations."""

import logging

from django.db import connections, transaction

logger = logging.getLogger("rindle.engine")


def install_capture_after_migrate(sender, using="default", **kwargs):
    """After ``migrate``, install or refresh capture on every synced table."""
    from .conf import rindle_settings
    from .engine import capture
    from .engine.engine import running_engine
    from .engine.registry import synced_models
    from .engine.tables import introspect

    if using != rindle_settings.DATABASE:
        return
    conn = connections[using]
    targets = [("_rindle_client_mutations", None), ("_rindle_producer_offsets", None)] + [
        (m._meta.db_table, m) for m in synced_models()
    ]
    existing = set(conn.introspection.table_names())
    with transaction.atomic(using=using), conn.cursor() as cursor:
        for table, model in targets:
            if table in existing:
                capture.install(cursor, conn.vendor, introspect(conn, cursor, table, model=model))
    engine = running_engine(using)
    if engine is not None:
        engine.refresh()
