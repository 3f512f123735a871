"""Signal receivers: keep capture triggers and the table map in step with migrations."""

import logging

from django.db import connections, transaction

logger = logging.getLogger("rindle.engine")


def guard_capture_before_migrate(sender, using="default", plan=None, **kwargs):
    """
    Before ``migrate`` applies ``plan``, guard every schema operation in it so that
    capture is reinstalled, and a DDL marker appended, in the migration's own
    transaction (``engine.schema_changes``).
    """
    from .conf import rindle_settings
    from .engine.schema_changes import instrument

    if using == rindle_settings.DATABASE:
        instrument(plan)


def install_capture_after_migrate(sender, using="default", **kwargs):
    """After ``migrate``, install or refresh capture on every synced table."""
    from .conf import rindle_settings
    from .engine import capture
    from .engine.engine import running_engine
    from .engine.registry import synced_models
    from .engine.rooms import lifecycle_tables
    from .engine.tables import introspect

    if using != rindle_settings.DATABASE:
        return
    conn = connections[using]
    system = ("_rindle_client_mutations", "_rindle_producer_offsets", *lifecycle_tables())
    targets = [(t, None) for t in system] + [(m._meta.db_table, m) for m in synced_models()]
    existing = set(conn.introspection.table_names())
    with transaction.atomic(using=using), conn.cursor() as cursor:
        for table, model in targets:
            if table in existing:
                capture.install(cursor, conn.vendor, introspect(conn, cursor, table, model=model))
    engine = running_engine(using)
    if engine is not None:
        engine.refresh()


def install_sql_sandbox_after_migrate(sender, using="default", **kwargs):
    """After ``migrate`` on PostgreSQL, create or refresh the public SQL sandbox roles."""
    from .conf import rindle_settings
    from .engine.public_sql import SqlError, sandbox

    if using != rindle_settings.DATABASE or not rindle_settings.SQL_ENABLED:
        return
    if connections[using].vendor != "postgresql":
        return
    try:
        needed = sandbox.install(using)
    except SqlError as exc:
        # migrate goes on; the system check rindle.E020 and every public SQL request
        # (SANDBOX_MISSING) say what is missing until it is fixed.
        logger.warning("%s (run manage.py rindle_sql_role for the SQL to fix it)", exc.message)
        return
    for statement in needed:
        logger.info("public SQL sandbox, recommended as a superuser: %s", statement)
