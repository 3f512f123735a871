"""The SQL of ``Tx``'s model helpers: a model's fields mapped to columns, once per model."""

import functools

from django.db.models import Model

from ..exceptions import INVALID_ROW, UNKNOWN_COLUMN
from .errors import InvalidInput
from .identifiers import quote


@functools.cache
def for_model(model):
    """The ``ModelRows`` of ``model``, built on first use and kept for the process."""
    return ModelRows(model)


class ModelRows:
    """
    How a model's rows are written with plain SQL, as the ORM would write them.

    A field is named by its name or its attname (``owner`` or ``owner_id``) and
    written to its column (``db_column`` included); values are prepared by the
    field for the connection (``get_db_prep_save``), so JSON, dates and UUIDs are
    stored as the ORM stores them. No signals run and ``Model.save()`` is not
    called: a model that needs them is written through the ORM instead.
    """

    def __init__(self, model):
        meta = model._meta
        self.model = model
        self.table = quote(meta.db_table)
        self.pk = meta.pk
        self.where_pk = f"{quote(meta.pk.column)} = %s"
        self.fields = tuple(meta.concrete_fields)
        self.by_name = {}
        for f in self.fields:
            self.by_name[f.name] = f
            self.by_name[f.attname] = f
        self.by_name["pk"] = meta.pk
        self.column = {f: quote(f.column) for f in self.fields}

    def insert(self, connection, values):
        """``(sql, params, returns_pk)`` inserting a row of ``values`` (field → value)."""
        given = self._given(values)
        obj = self.model(**values)  # defaults and pre_save hooks, as the ORM applies them
        cols, params = [], []
        for f in self.fields:
            if f not in given and (f.has_db_default() or (f is self.pk and f.db_returning)):
                continue  # the database fills it in
            cols.append(self.column[f])
            params.append(f.get_db_prep_save(f.pre_save(obj, True), connection))
        returns_pk = self.pk not in given and self.pk.db_returning
        sql = (
            f"INSERT INTO {self.table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})"
            if cols
            else f"INSERT INTO {self.table} DEFAULT VALUES"
        )
        if returns_pk:
            sql += f" RETURNING {self.column[self.pk]}"
        return sql, params, (None if returns_pk else getattr(obj, self.pk.attname))

    def update(self, connection, pk, values):
        """``(sql, params)`` setting ``values`` on the row keyed ``pk``, or None if empty."""
        given = self._given(values)
        if not given:
            return None
        sets, params = [], []
        for f, value in given.items():
            if f.is_relation and isinstance(value, Model):
                value = getattr(value, f.target_field.attname)
            sets.append(f"{self.column[f]} = %s")
            params.append(f.get_db_prep_save(value, connection))
        params.append(self.key(connection, pk))
        return f"UPDATE {self.table} SET {', '.join(sets)} WHERE {self.where_pk}", params

    def delete(self, connection, pk):
        """``(sql, params)`` deleting the row keyed ``pk`` (no cascade)."""
        return f"DELETE FROM {self.table} WHERE {self.where_pk}", [self.key(connection, pk)]

    def key(self, connection, pk):
        if isinstance(pk, Model):
            pk = pk.pk
        return self.pk.get_db_prep_save(pk, connection)

    def _given(self, values):
        """field → value of ``values``; an unknown or twice-named field is refused."""
        given = {}
        for name, value in values.items():
            f = self.by_name.get(name)
            if f is None:
                raise InvalidInput(
                    f"unknown field {name!r} of model {self.model.__name__}",
                    code=UNKNOWN_COLUMN,
                )
            if f in given:
                raise InvalidInput(
                    f"field {f.name!r} of model {self.model.__name__} given twice",
                    code=INVALID_ROW,
                )
            given[f] = value
        return given
