"""Which Django models are synced: ``RINDLE["SYNCED_MODELS"]`` plus ``@synced``."""

from django.apps import apps

from ..conf import rindle_settings

_decorated = []


def synced(model):
    """Class decorator: sync this model's table (capture + live queries)."""
    _decorated.append(model._meta.label)
    return model


def synced_labels():
    return list(dict.fromkeys([*rindle_settings.SYNCED_MODELS, *_decorated]))


def synced_models():
    """The synced model classes; an unknown label raises LookupError."""
    return [apps.get_model(label) for label in synced_labels()]


def introspect_tables(using=None):
    """
    A ``TableMap`` of the tables an engine of ``using`` registers (the client ledger,
    every synced model's table and the tables journaled migrations created), read
    from the database without starting one.
    """
    from django.db import connections

    from .errors import UnknownTable
    from .journal import journaled_tables
    from .mutations import LEDGER
    from .tables import TableMap, introspect

    conn = connections[using or rindle_settings.DATABASE]
    tables = TableMap()
    with conn.cursor() as cursor:
        tables.put(introspect(conn, cursor, LEDGER))
        for model in synced_models():
            tables.put(introspect(conn, cursor, model._meta.db_table, model=model))
        for name in journaled_tables(conn, cursor):
            if name in tables:  # a synced model's table, already typed from its model
                continue
            try:
                tables.put(introspect(conn, cursor, name))
            except UnknownTable:  # changed outside the journal: the engine skips it too
                continue
    return tables
