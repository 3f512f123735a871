"""
A Django QuerySet as a rindle wire AST: ``from_queryset(Issue.objects.filter(...))``.

The translation reads the QuerySet's SQL tree (``qs.query``) and keeps the rows
Django's own SQL selects. What maps:

- ``filter`` / ``exclude`` / ``Q`` (AND, OR, ``~``) with the lookups ``exact``,
  ``iexact``, ``lt``, ``lte``, ``gt``, ``gte``, ``in``, ``range``, ``isnull``,
  ``contains``, ``icontains``, ``startswith``, ``istartswith``, ``endswith``,
  ``iendswith``; ``qs.none()``. Negation is pushed into the operators (``=`` → ``!=``,
  ``IN`` → ``NOT IN``, ``LIKE`` → ``NOT LIKE``, ``range`` (``>= lo AND <= hi``) →
  ``< lo OR > hi``, EXISTS → NOT EXISTS, De Morgan for AND/OR), and Django's null
  handling comes along: ``exclude(x=1)`` on a nullable column is
  ``x != 1 OR x IS NULL`` because Django's tree says so.
- Filters across relations (``owner__name``, ``comments__body__contains``, many
  hops): each join becomes an EXISTS correlated by the join's columns. Conditions
  that share one join in Django (one ``filter()`` call on a multi-valued relation)
  share one EXISTS; a LEFT JOIN that can match its null row (``tags__isnull=True``)
  adds ``OR NOT EXISTS``; an INNER JOIN that only some OR branches test still
  requires the related row, as in Django's SQL. ``exclude`` over a multi-valued
  relation and ``filter(Exists(Sub.objects.filter(fk=OuterRef("pk"), ...)))``
  become NOT EXISTS / EXISTS.
- Values: datetimes, dates, times, UUIDs, decimals and durations become literals
  in the wire encoding of the column's field (``engine.values``), as the engine's
  rows hold them; ``col__date`` and ``col__year`` (``exact``, ``gt``, ``gte``,
  ``lt``, ``lte``) become ranges of the column, bounded in the current time zone
  as Django bounds them. Other date transforms (``__month``, ``__hour``...) are
  refused, naming a range of the column as the alternative.
- ``order_by`` (``"-field"``, ``F(...).asc()/desc()``, ``Meta.ordering``,
  ``reverse()``), ``qs[:n]`` as ``limit``, and ``distinct()`` without fields (a
  no-op: rindle rows are distinct). Column names are the database's
  (``field.column``: ``owner`` → ``ownerId``).
- ``values(*fields)``, ``values_list(*fields)`` (``named=True`` too), ``only()`` and
  ``defer()`` as the level's ``select``. A ``select`` always keeps the primary key
  (Django's ``only()`` does; a ``values("title")`` row gains ``id``): the engine and
  the clients key rows by it. It also keeps the correlation columns Django loads
  for a prefetch (the foreign key to the parent, the one a nested prefetch follows).
  ``values()`` with no fields, ``defer(None)`` and a plain QuerySet select the whole
  row. ``select`` shapes the flat mode's rows (which also keep the ``orderBy``
  columns) and snapshots; the normalized mode syncs whole rows whatever it says.
- ``prefetch_related`` as nested ``related`` entries, aliased by the attribute
  Django fills (the accessor, or ``to_attr``): a forward foreign key or one-to-one
  is a ``one`` relationship (null when the row is missing, where Django raises
  ``RelatedObjectDoesNotExist`` on a non-null key), a reverse foreign key its rows.
  ``"comments__author"`` nests (the comments come along, as in Django).
  ``Prefetch(lookup, queryset=...)`` translates its queryset as the subquery: its
  filters, ordering, projection, own ``prefetch_related`` and slice (``[:n]`` is a
  per-parent ``limit``, as Django's sliced prefetch). Without a queryset the related
  model's manager Django reads is translated (the default manager for a reverse
  foreign key's rows, the base manager for one row); the children of an unordered
  prefetch come in primary-key order.
- ``select_related`` is ignored on purpose: it changes neither the rows nor their
  columns, only how Django fetches them, and code adds it for speed to QuerySets
  whose pages never read the relation. Turning it into a relationship would sync
  tables nobody shows; a page that shows the owner says
  ``prefetch_related("owner")``.

What is refused, with ``QueryError(code="unsupported")`` naming the part and the
alternative (a supported spelling, or ``rindle_app.queries.table(...)``, the builder
that writes any AST the engine runs): other lookups and transforms (``regex``,
``month``...), F()/OuterRef/subquery values outside an EXISTS correlation, values
that are not literals (see ``_literal``), JSON columns, pattern lookups on non-text
columns, offsets (``qs[10:20]``: the AST pages by keyset ``start``), annotations and
aggregates (``values()`` with expressions included), ``values_list(flat=True)``,
``values()`` / ``only()`` naming a related path (``owner__name``: prefetch the
relation), ``prefetch_related`` with ``values()``, a many-to-many prefetch (the AST
nests one foreign key per level: the message names the through model's path that
maps, ``prefetch_related("memberships__crew")``), generic relations, ``extra()``,
``distinct(*fields)``, set operations, random or related-column ordering,
FilteredRelation, multi-table inheritance.

Where rindle's documented value semantics (``compare.py``) differ from a backend:

- ``contains`` / ``startswith`` / ``endswith`` are case-sensitive LIKE, on every
  backend, as Django documents them. Django on SQLite runs them case-insensitively.
- The i-lookups fold ASCII letters only; PostgreSQL's ``UPPER`` folds more.
- Text compares and sorts bytewise; a PostgreSQL database with a non-C collation
  sorts text differently.
- Nulls sort first ascending and last descending (SQLite's order). PostgreSQL sorts
  them the other way by default, so the translation refuses an explicit
  ``nulls_last`` ascending / ``nulls_first`` descending on a nullable column;
  ``F(col).asc(nulls_first=True)`` says what rindle does on both backends.
- A multi-valued filter (``filter(tags__name="ui")``) yields each row once; Django
  repeats a row per matching related row unless ``.distinct()``.
- Rows of an unordered QuerySet come in primary-key order (the AST's ordering is
  always completed with the primary key).
"""

import datetime

from django.conf import settings
from django.core.exceptions import FieldDoesNotExist
from django.db import models
from django.db.models.expressions import Col, Exists, F, NegatedExpression, OrderBy
from django.db.models.fields.reverse_related import ManyToOneRel
from django.db.models.lookups import Lookup
from django.db.models.query import (
    FlatValuesListIterable,
    ModelIterable,
    NamedValuesListIterable,
    Prefetch,
    ValuesIterable,
    ValuesListIterable,
)
from django.db.models.sql.constants import INNER, LOUTER
from django.db.models.sql.datastructures import BaseTable, Join
from django.db.models.sql.query import Query as SQLQuery
from django.db.models.sql.where import ExtraWhere, NothingNode, WhereNode
from django.utils import timezone

from ..engine.values import field_encoding, to_wire
from ..exceptions import UNSUPPORTED
from .ast import QueryError, parse
from .builder import NEGATED_OPS, cond
from .compare import matches

TRUE = {"type": "and", "conditions": []}
FALSE = {"type": "or", "conditions": []}

_COMPARISONS = {"exact": "=", "lt": "<", "lte": "<=", "gt": ">", "gte": ">="}
_SUPPORTED = (
    "exact/iexact, lt/lte/gt/gte, in, range, isnull, contains/startswith/endswith "
    "(and their i- forms)"
)
_PATTERNS = {
    "iexact": ("ILIKE", "{}"),
    "contains": ("LIKE", "%{}%"),
    "icontains": ("ILIKE", "%{}%"),
    "startswith": ("LIKE", "{}%"),
    "istartswith": ("ILIKE", "{}%"),
    "endswith": ("LIKE", "%{}"),
    "iendswith": ("ILIKE", "%{}"),
}


# The way out named by most refusals: the builder writes any AST the engine runs.
BUILDER = "write the query with rindle_app.queries.table(...)"
_VALUES = (ValuesIterable, ValuesListIterable, NamedValuesListIterable)


def unsupported(message):
    return QueryError(message, code=UNSUPPORTED)


def from_queryset(qs, *, schema=None):
    """The wire AST selecting what ``qs`` selects; validated when ``schema`` is given."""
    out = _translate(_queryset(qs))
    if schema is not None:
        parse(out, schema)
    return out


def _queryset(qs):
    return qs.get_queryset() if hasattr(qs, "get_queryset") else qs  # a manager


def _translate(qs, keep=()):
    """The AST of ``qs``; a ``select`` keeps the columns in ``keep`` too."""
    query = qs.query
    _check_shape(qs, query)
    out = {"table": query.model._meta.db_table}
    select = _select(qs, query)
    if select is not None:
        out["select"] = select
    where = _Level(query, query.base_table).translate(query.where)
    if where != TRUE:
        out["where"] = where
    order = _ordering(query)
    if order:
        out["orderBy"] = order
    if query.high_mark is not None:
        out["limit"] = query.high_mark
    related = _related(qs)
    if related:
        out["related"] = related
    if select is not None:
        # The correlation columns stay, as Django loads them to match the rows (a
        # deferred one on first use): to the parent, and to each relationship's rows.
        joined = [c for r in related for c in r["correlation"]["parentField"]]
        select.extend(dict.fromkeys(c for c in (*keep, *joined) if c not in select))
    return out


def escape_like(text):
    """``text`` as a LIKE pattern matching itself (``\\`` escapes, as Django's)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


# --- the shape of the QuerySet ----------------------------------------------------------


def _check_shape(qs, query):
    opts = query.model._meta
    name = opts.db_table
    if qs._iterable_class is FlatValuesListIterable:
        raise unsupported(
            f"{name}: values_list(flat=True) is not supported: a live row keeps its "
            "primary key; use values_list(...) without flat, or values(...)"
        )
    if qs._iterable_class is not ModelIterable and qs._iterable_class not in _VALUES:
        raise unsupported(
            f"{name}: the iterable {qs._iterable_class.__name__} is not supported: "
            "use values(...) or the model rows"
        )
    if query.combinator:
        raise unsupported(
            f"{name}: {query.combinator}() is not supported: combine the conditions "
            "with Q(...) | Q(...), & and ~ in one filter()"
        )
    if query.annotations:
        raise unsupported(
            f"{name}: annotations {sorted(query.annotations)} (annotate/alias/aggregates, "
            "expressions in values()) are not supported: filter and order on stored "
            "columns; for a related count use table(...).count_as(...) of "
            "rindle_app.queries"
        )
    if query.group_by is not None:
        raise unsupported(
            f"{name}: aggregation (GROUP BY) is not supported: for a related count use "
            "table(...).count_as(...) of rindle_app.queries"
        )
    if query.extra or query.extra_tables or query.extra_order_by:
        raise unsupported(f"{name}: extra() is not supported: use filter() with Q, or {BUILDER}")
    if query.distinct_fields:
        raise unsupported(
            f"{name}: distinct(*fields) is not supported: use distinct() (rindle rows are "
            "distinct already)"
        )
    if query.low_mark:
        raise unsupported(
            f"{name}: an offset (qs[{query.low_mark}:...]) is not supported; "
            "the AST pages with a keyset start, not an offset: use qs[:n] and "
            "table(...).start(row) of rindle_app.queries"
        )
    if query._filtered_relations:
        raise unsupported(
            f"{name}: FilteredRelation is not supported: filter across the relation in "
            "filter(), or use Exists()"
        )
    if opts.parents:
        raise unsupported(
            f"{name}: a multi-table inheritance child is not supported: query the parent "
            "model, or make the parent abstract"
        )
    if getattr(opts, "is_composite_pk", False):
        raise unsupported(
            f"{name}: a composite primary key is not supported: {BUILDER} and name the columns"
        )
    if qs._iterable_class in _VALUES and qs._prefetch_related_lookups:
        raise unsupported(
            f"{name}: prefetch_related() with values() is not supported (a values() row "
            "carries no relationships): use only(...) to project the rows"
        )


# --- the projection: values() / values_list() / only() / defer() -------------------------


def _select(qs, query):
    """
    The columns of ``select``, or None for the whole row. Each level keeps its primary
    key whatever was asked (Django's ``only()`` keeps it too; ``values("title")`` rows
    gain it): the engine and the clients key rows by it.
    """
    opts = query.model._meta
    if qs._iterable_class in _VALUES:
        if not qs._fields:  # values() with no names: every concrete field
            return None
        names, only = query.values_select, True
        what = "values"
    else:
        names, defer = query.deferred_loading
        if defer and not names:
            return None
        only = not defer
        what = "only" if only else "defer"
    fields = [_projected(opts, name, what) for name in names]
    if only:
        chosen = [opts.pk, *(f for f in fields if f is not opts.pk)]
        if what == "only":  # Django loads only()'s fields in model order
            chosen = [f for f in opts.concrete_fields if f in chosen]
    else:
        chosen = [f for f in opts.concrete_fields if f not in fields or f.primary_key]
    return list(dict.fromkeys(f.column for f in chosen))


def _is_relation(opts, name):
    try:
        return opts.get_field(name).is_relation
    except FieldDoesNotExist:
        return False


def _projected(opts, name, what):
    label = f"{what}({name!r}) on {opts.db_table}"
    head = name.split("__")[0]
    if "__" in name and not _is_relation(opts, head):
        raise unsupported(
            f"{label}: a transform of a column is not supported: select {head!r} and "
            "derive the value where it is shown"
        )
    if "__" in name:
        raise unsupported(
            f"{label}: a related table's column is not supported: use "
            f"prefetch_related({name.split('__')[0]!r}), whose rows travel nested under "
            "each row (or the builder's .related(...))"
        )
    try:
        field = opts.pk if name == "pk" else opts.get_field(name)
    except FieldDoesNotExist:
        raise unsupported(f"{label}: no such column; name a concrete field") from None
    if not getattr(field, "concrete", False) or not getattr(field, "column", None):
        raise unsupported(
            f"{label}: {name!r} is not a column: use prefetch_related({name!r}), whose "
            "rows travel nested under each row (or the builder's .related(...))"
        )
    return field


# --- prefetch_related: nested relationships ----------------------------------------------


def _related(qs):
    """``qs``'s ``prefetch_related`` lookups as ``related`` entries, nested by path."""
    return _entries(_prefetch_tree(qs))


def _entries(tree):
    out = []
    for entry, children, _ in tree.values():
        nested = _entries(children)
        if nested:
            sub = entry["subquery"]
            sub["related"] = nested
            if "select" in sub:
                joined = (c for r in nested for c in r["correlation"]["parentField"])
                sub["select"].extend(dict.fromkeys(c for c in joined if c not in sub["select"]))
        out.append(entry)
    return out


def _prefetch_tree(qs):
    """
    alias -> (its related entry, its children's tree, its model), in lookup order. A
    path's first steps are prefetched by Django too (``"comments__author"`` fetches
    the comments), so they become entries of their own, read from the default manager.
    """
    tree = {}
    for lookup in qs._prefetch_related_lookups:
        if not isinstance(lookup, Prefetch):
            lookup = Prefetch(lookup)
        through = lookup.prefetch_through.split("__")
        to = lookup.prefetch_to.split("__")
        model, level = qs.model, tree
        for depth, (name, alias) in enumerate(zip(through, to)):
            last = depth == len(through) - 1
            given = lookup.queryset if last else None
            if alias in level:
                if given is not None:
                    raise unsupported(
                        f"prefetch_related: {lookup.prefetch_to!r} is prefetched twice: "
                        "give each Prefetch its own to_attr"
                    )
            else:
                entry, children, child = _relation(model, name, lookup.prefetch_through, given)
                entry["subquery"]["alias"] = alias
                level[alias] = (entry, children, child)
            _, level, model = level[alias]
    return tree


def _relation(model, name, path, given):
    """
    The related entry for ``model``'s relation ``name`` (a forward foreign key or
    one-to-one: one row; a reverse one: its rows), its subquery translated from
    ``given`` (a Prefetch's queryset) or the related model's manager Django's prefetch
    reads.
    """
    opts = model._meta
    label = f"prefetch_related({path!r}) on {opts.db_table}"
    field = next((r for r in opts.related_objects if r.get_accessor_name() == name), None)
    if field is None:
        try:
            field = opts.get_field(name)
        except FieldDoesNotExist:
            raise unsupported(
                f"{label}: {name!r} is not a relation of {opts.label}: name a foreign key "
                "or a reverse accessor (related_name)"
            ) from None
    if getattr(field, "many_to_many", False):
        raise unsupported(f"{label}: {_many_to_many(field, name)}")
    if isinstance(field, models.ForeignKey):  # one-to-one included
        pairs = [(local.column, remote.column) for local, remote in field.related_fields]
        one, child = True, field.related_model
    elif isinstance(field, ManyToOneRel) and isinstance(field.field, models.ForeignKey):
        pairs = [(remote.column, local.column) for local, remote in field.field.related_fields]
        one, child = field.one_to_one, field.related_model
    else:
        raise unsupported(
            f"{label}: the relation {name!r} ({type(field).__name__}) is not supported: "
            "prefetch a foreign key or its reverse, or use the builder's .related(...)"
        )
    # Django reads a single related row through the base manager (no custom filters),
    # a reverse foreign key's rows through the default one.
    manager = child._base_manager if one else child._default_manager
    sub_qs = _queryset(given if given is not None else manager)
    if sub_qs.model._meta.concrete_model is not child._meta.concrete_model:
        raise unsupported(f"{label}: the Prefetch queryset must be of {child._meta.label}")
    subquery = _translate(_unprefetched(sub_qs), keep=[c for _, c in pairs])
    if one:
        subquery["one"] = True
    entry = {
        "correlation": {"parentField": [p for p, _ in pairs], "childField": [c for _, c in pairs]},
        "subquery": subquery,
    }
    children = _prefetch_tree(sub_qs)
    return entry, children, child


def _unprefetched(qs):
    out = qs._chain()
    out._prefetch_related_lookups = ()
    return out


def _many_to_many(field, name):
    """Why a many-to-many is refused, and the through-table path that maps."""
    rel = field.remote_field if field.concrete else field
    through = rel.through
    near, far = field.model, field.related_model  # a reverse rel's model is its target
    base = f"the many-to-many {name!r} is not supported: the AST nests one foreign key per level"
    if through._meta.auto_created:
        return (
            f"{base}; declare its through model (ManyToManyField(through=...)) and "
            "prefetch its rows and their foreign key instead"
        )
    to_near = next(
        (f for f in through._meta.concrete_fields if f.is_relation and f.related_model is near),
        None,
    )
    to_far = next(
        (
            f
            for f in through._meta.concrete_fields
            if f.is_relation and f.related_model is far and f is not to_near
        ),
        None,
    )
    if to_near is None or to_far is None or to_near.remote_field.hidden:
        return f"{base}; prefetch the through model {through._meta.label}'s rows instead"
    accessor = to_near.remote_field.get_accessor_name()
    path = f"{accessor}__{to_far.name}"
    return f"{base}; prefetch the through rows instead: prefetch_related({path!r})"


# --- ordering ---------------------------------------------------------------------------


def _ordering(query):
    opts = query.model._meta
    items = query.order_by or (opts.ordering if query.default_ordering else ())
    out = []
    for item in items:
        nulls_first = nulls_last = False
        if isinstance(item, str):
            if item == "?":
                raise unsupported(
                    f"{opts.db_table}: random ordering is not supported: order by a column"
                )
            descending, name = item.startswith("-"), item.removeprefix("-")
        elif isinstance(item, F):
            descending, name = False, item.name
        elif isinstance(item, OrderBy) and isinstance(item.expression, F):
            descending, name = item.descending, item.expression.name
            nulls_first, nulls_last = bool(item.nulls_first), bool(item.nulls_last)
        else:
            raise unsupported(
                f"{opts.db_table}: ordering by {item!r} is not supported: order by a "
                "column name, or F(name).asc() / .desc()"
            )
        if not query.standard_ordering:  # reverse()
            descending = not descending
            nulls_first, nulls_last = nulls_last, nulls_first
        field = _order_field(opts, name)
        if field.null and (nulls_first if descending else nulls_last):
            raise unsupported(
                f"ordering by {opts.db_table}.{field.column} with nulls "
                f"{'first' if descending else 'last'} is not supported: rindle sorts nulls "
                "as the smallest value; use F(name).asc(nulls_first=True) or "
                ".desc(nulls_last=True)"
            )
        out.append([field.column, "desc" if descending else "asc"])
    return out


def _order_field(opts, name):
    if "__" in name:
        raise unsupported(
            f"ordering {opts.db_table} by {name!r}, a related table's column, is not "
            "supported: order by a column of this table (copy the value into one), or "
            "order the prefetched rows in their Prefetch queryset"
        )
    try:
        field = opts.pk if name == "pk" else opts.get_field(name)
    except FieldDoesNotExist:
        raise unsupported(
            f"ordering {opts.db_table} by {name!r} is not supported: order by a column"
        ) from None
    if not getattr(field, "concrete", False) or not getattr(field, "column", None):
        raise unsupported(
            f"ordering {opts.db_table} by {name!r} is not supported: order by a column"
        )
    if field.is_relation and name == field.name and field.related_model._meta.ordering:
        raise unsupported(
            f"ordering {opts.db_table} by {name!r} follows "
            f"{field.related_model._meta.db_table}'s Meta.ordering, which is not supported; "
            f"order by {field.attname!r}"
        )
    return field


# --- conditions -------------------------------------------------------------------------
#
# The WHERE tree becomes an intermediate tree in negation normal form whose leaves
# know the join alias whose row they test. A row of Django's query is one choice of
# a related row per join, so the whole WHERE reads "there exist related rows such
# that ...". That existential is pushed down join by join: through OR always; through
# AND when the conjuncts test different joins, or one single-valued join (a forward
# foreign key has at most one row); conjuncts testing one multi-valued join must all
# be about that join only, and become one EXISTS. An INNER JOIN also requires its row
# to exist, whatever the branch; a LEFT JOIN without a match offers one all-null row.


class _Leaf:
    __slots__ = ("alias", "cond", "null")

    def __init__(self, alias, condition, null):
        self.alias = alias  # the join alias whose row this tests
        self.cond = condition  # the wire condition on that row's columns
        self.null = null  # its value on the all-null row of an unmatched LEFT JOIN


class _Node:
    __slots__ = ("kind", "children")

    def __init__(self, kind, children):
        self.kind = kind  # "and" | "or"
        self.children = children


def _aliases(node):
    if isinstance(node, _Leaf):
        return {node.alias}
    return set().union(*(_aliases(c) for c in node.children))


def _null(node):
    if isinstance(node, _Leaf):
        return node.null
    values = [_null(c) for c in node.children]
    return all(values) if node.kind == "and" else any(values)


def _and(parts):
    return _junction("and", FALSE, parts)


def _or(parts):
    return _junction("or", TRUE, parts)


def _junction(kind, absorbing, parts):
    """``parts`` joined by ``kind`` ("and" / "or"), nested junctions of the same kind
    flattened; ``absorbing`` (FALSE for and, TRUE for or) among them is the answer."""
    flat = []
    for p in parts:
        if p == absorbing:
            return absorbing
        flat.extend(p["conditions"] if p["type"] == kind else [p])
    return flat[0] if len(flat) == 1 else {"type": kind, "conditions": flat}


def _exists(table, parent, child, where, *, negated=False):
    if where == FALSE:
        return TRUE if negated else FALSE
    subquery = {"table": table, "alias": table}
    if where != TRUE:
        subquery["where"] = where
    return {
        "type": "correlatedSubquery",
        "op": "NOT EXISTS" if negated else "EXISTS",
        "related": {
            "correlation": {"parentField": list(parent), "childField": list(child)},
            "subquery": subquery,
        },
    }


def _label(col):
    return f"{col.target.model._meta.db_table}.{col.target.column}"


def _literal(value, label, field=None):
    """
    ``value`` (a lookup's right-hand side, already prepared by ``field``) as a wire
    literal: datetimes, dates, times, UUIDs, decimals and durations in the wire
    encoding of ``field``'s column (``engine.values``), so the AST compares them as
    the engine's rows hold them.
    """
    if field is not None and not isinstance(value, (bool, str)):
        encoding = field_encoding(field)
        if encoding:
            value = to_wire(encoding, value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float) and value == value and abs(value) != float("inf"):
        return value
    raise unsupported(
        f"the value {value!r} for {label} is not a literal the AST can carry "
        "(null, a boolean, a finite number, a string, or a date, time, datetime, "
        "UUID, decimal or duration of a column of that type)"
    )


# Transforms that are a range of the column (``created__date``, ``created__year``);
# the others (``__month``, ``__hour``...) select a set no range expresses.
_RANGES = ("date", "year")
_RANGE_OPS = ("exact", "gt", "gte", "lt", "lte")


def _bounds(transform, lookup, field):
    """
    ``(first, last)``: the first and last instants (inclusive, in the column's Python
    type) of the date or year ``lookup.rhs`` names, in the transform's time zone
    (the current one unless given), as Django's own bounds are.
    """
    rhs = lookup.rhs
    if transform.lookup_name == "year":
        first, last = datetime.date(int(rhs), 1, 1), datetime.date(int(rhs), 12, 31)
        if not isinstance(field, models.DateTimeField):
            return first, last
    else:
        first = last = rhs.date() if isinstance(rhs, datetime.datetime) else rhs
    first = datetime.datetime.combine(first, datetime.time.min)
    last = datetime.datetime.combine(last, datetime.time.max)
    if settings.USE_TZ:
        tz = getattr(transform, "tzinfo", None) or timezone.get_current_timezone()
        first, last = timezone.make_aware(first, tz), timezone.make_aware(last, tz)
    return first, last


class _Level:
    """One SQL query (the root or an Exists subquery): its base table and joins."""

    def __init__(self, query, base):
        self.query = query
        self.base = base
        self.used = set()  # the join aliases the conditions reach, and their parents
        self.witness = {}  # id(an EXISTS built for an INNER join) -> (alias, the EXISTS)

    def translate(self, where):
        tree = self.tree(where, False)
        for alias in _aliases(tree):
            while alias is not None and alias not in self.used:
                self.used.add(alias)
                join = self.query.alias_map.get(alias)
                alias = join.parent_alias if isinstance(join, Join) else None
        return self.require(self.base, self.conv(tree, self.base))

    # --- Django's tree, in negation normal form ---

    def tree(self, node, negated):
        if isinstance(node, WhereNode):
            if node.connector not in ("AND", "OR"):
                raise unsupported(
                    f"the {node.connector} connector is not supported: write it with "
                    "&, | and ~ (a ^ b is (a & ~b) | (~a & b))"
                )
            negated ^= node.negated
            kind = "and" if (node.connector == "AND") != negated else "or"
            return _Node(kind, [self.tree(c, negated) for c in node.children])
        if isinstance(node, NothingNode):  # qs.none()
            return _Leaf(self.base, TRUE if negated else FALSE, negated)
        if isinstance(node, ExtraWhere):
            raise unsupported(
                f"extra(where=...) is not supported: use filter() with Q, or {BUILDER}"
            )
        if isinstance(node, Lookup):
            return self.lookup(node, negated)
        raise unsupported(
            f"the condition {type(node).__name__} is not supported: use field lookups, "
            f"Q and Exists(), or {BUILDER}"
        )

    def lookup(self, lookup, negated):
        lhs, rhs, name = lookup.lhs, lookup.rhs, lookup.lookup_name
        if name == "exact" and isinstance(rhs, bool):
            exists, negated = lhs, negated != (not rhs)
            while isinstance(exists, NegatedExpression):  # ~Exists(...)
                exists, negated = exists.expression, not negated
            if isinstance(exists, Exists):
                return self.exists_leaf(exists, negated)
        if getattr(lhs, "lookup_name", None) in _RANGES and isinstance(
            getattr(lhs, "lhs", None), Col
        ):
            return self.range_leaf(lookup, negated)
        if not isinstance(lhs, Col):
            inner = lhs
            while not isinstance(inner, Col) and getattr(inner, "lhs", None) is not None:
                inner = inner.lhs
            if getattr(lhs, "lookup_name", None) and isinstance(inner, Col):  # a transform
                raise unsupported(
                    f"lookup {lhs.lookup_name!r} on {_label(inner)} is not supported: "
                    f"filter on a range of the column instead ({inner.target.name}__gte=..., "
                    f"{inner.target.name}__lt=...), on the stored column with {_SUPPORTED}, "
                    f"or {BUILDER}"
                )
            raise unsupported(
                f"filtering on a {type(lhs).__name__} expression is not supported: filter "
                f"on a stored column, or {BUILDER}"
            )
        label = _label(lhs)
        if lhs.alias not in self.query.alias_map:
            raise unsupported(
                f"a condition on the outer query's {label} is only supported as the "
                "equality correlating an Exists() subquery: write it as "
                "Exists(Sub.objects.filter(fk=OuterRef('pk'), ...))"
            )
        field = lhs.target
        values = rhs if name in ("in", "range") and isinstance(rhs, (list, tuple)) else [rhs]
        expression = next((v for v in values if hasattr(v, "resolve_expression")), None)
        if expression is not None:
            if isinstance(expression, Col):
                what = f"the column {_label(expression)} (F() / OuterRef())"
            elif isinstance(expression, SQLQuery):
                what = "a subquery"
            else:
                what = f"the expression {expression!r}"
            fix = (
                "filter across the relation (owner__name=...) or use Exists()"
                if isinstance(expression, SQLQuery)
                else "compare to a value, or store the computed value in a column"
            )
            raise unsupported(
                f"comparing {label} to {what} is not supported: the AST compares a column "
                f"to a literal; {fix}"
            )
        if isinstance(field, models.JSONField):
            raise unsupported(
                f"lookups on the JSON column {label} are not supported: copy the value "
                "you filter on into a column of its own"
            )
        if name == "isnull":
            if not isinstance(rhs, bool):
                raise unsupported(f"isnull on {label} needs True or False")
            op, value = ("IS" if rhs else "IS NOT"), None
        elif name in _COMPARISONS:
            op, value = _COMPARISONS[name], _literal(rhs, label, field)
        elif name == "range":  # BETWEEN: lo <= x <= hi, its negation x < lo OR x > hi
            lo, hi = (_literal(v, label, field) for v in rhs)
            parts = [(">=", lo), ("<=", hi)]
            if negated:
                parts = [(NEGATED_OPS[o], v) for o, v in parts]
            join = _or if negated else _and
            null = (any if negated else all)(matches(o, None, v) for o, v in parts)
            return _Leaf(lhs.alias, join([cond(field.column, o, v) for o, v in parts]), null)
        elif name == "in":
            value = [_literal(v, label, field) for v in rhs if v is not None]
            if not value:  # Django: an empty IN matches nothing, its negation everything
                return _Leaf(lhs.alias, TRUE if negated else FALSE, negated)
            op = "IN"
        elif name in _PATTERNS:
            if not isinstance(field, (models.CharField, models.TextField)):
                raise unsupported(
                    f"lookup {name!r} on the non-text column {label} is not supported: "
                    "use exact, in, range or the comparisons on it"
                )
            op, template = _PATTERNS[name]
            value = template.format(escape_like(str(rhs)))
        else:
            raise unsupported(
                f"lookup {name!r} on {label} is not supported: use {_SUPPORTED}, or {BUILDER}"
            )
        if negated:
            op = NEGATED_OPS[op]
        condition = cond(field.column, op, value)
        if value is None and field.primary_key:  # a primary key is never null
            condition = FALSE if op == "IS" else TRUE
        return _Leaf(lhs.alias, condition, matches(op, None, value))

    def range_leaf(self, lookup, negated):
        """
        ``col__date`` / ``col__year`` (with ``exact``, ``gt``, ``gte``, ``lt``, ``lte``)
        as a range of the column itself, bounded as Django bounds it.
        """
        transform, name = lookup.lhs, lookup.lookup_name
        col = transform.lhs
        field, label = col.target, _label(col)
        if col.alias not in self.query.alias_map:
            raise unsupported(f"a condition on the outer query's {label} is not supported")
        kind = transform.lookup_name
        if name not in _RANGE_OPS or hasattr(lookup.rhs, "resolve_expression"):
            raise unsupported(
                f"lookup {kind}__{name} on {label} is not supported: only exact, gt, gte, lt "
                f"and lte on a literal; filter on a range of the column instead"
            )
        if not isinstance(field, (models.DateField, models.DateTimeField)):
            raise unsupported(f"lookup {kind!r} on {label} needs a date or datetime column")
        if kind == "date" and not isinstance(field, models.DateTimeField):
            raise unsupported(f"lookup 'date' on the date column {label}: compare the column")
        first, last = (_literal(b, label, field) for b in _bounds(transform, lookup, field))
        column = field.column
        parts = {
            "exact": [cond(column, ">=", first), cond(column, "<=", last)],
            "gt": [cond(column, ">", last)],
            "gte": [cond(column, ">=", first)],
            "lt": [cond(column, "<", first)],
            "lte": [cond(column, "<=", last)],
        }[name]
        if negated:
            parts = [
                cond(c["left"]["name"], NEGATED_OPS[c["op"]], c["right"]["value"]) for c in parts
            ]
            return _Leaf(col.alias, _or(parts), False)
        return _Leaf(col.alias, _and(parts), False)

    def exists_leaf(self, expr, negated):
        inner = expr.query
        if inner.combinator or inner.low_mark or inner.group_by is not None:
            raise unsupported(
                "an Exists() subquery with a set operation, offset or GROUP BY is not "
                "supported: use a filtered Exists(Sub.objects.filter(...))"
            )
        if inner.extra or inner.extra_tables:
            raise unsupported(
                "extra() in an Exists() subquery is not supported: use filter() with Q"
            )
        base = next((a for a in inner.alias_map if inner.alias_refcount.get(a)), None)
        if base is None or not isinstance(inner.alias_map[base], BaseTable):
            raise unsupported(
                "an Exists() subquery without a base table is not supported: use "
                "Exists(Model.objects.filter(...))"
            )
        where = inner.where
        parts = where.children if where.connector == "AND" and not where.negated else [where]
        pairs, rest = [], []
        for part in parts:
            if (
                isinstance(part, Lookup)
                and part.lookup_name == "exact"
                and isinstance(part.lhs, Col)
                and part.lhs.alias == base
                and isinstance(part.rhs, Col)
                and part.rhs.alias not in inner.alias_map
            ):
                pairs.append((part.rhs, part.lhs))
            else:
                rest.append(part)
        outer = {o.alias for o, _ in pairs}
        if len(outer) != 1 or not outer <= set(self.query.alias_map):
            raise unsupported(
                "an Exists() subquery must be correlated by equalities between its table's "
                "columns and OuterRef() columns of one table of the enclosing query: "
                "Exists(Sub.objects.filter(fk=OuterRef('pk'), ...))"
            )
        table = inner.alias_map[base].table_name
        level = _Level(inner, base)
        condition = _exists(
            table,
            [o.target.column for o, _ in pairs],
            [i.target.column for _, i in pairs],
            level.translate(WhereNode(rest)),
            negated=negated,
        )
        return _Leaf(outer.pop(), condition, negated)  # a null parent has no children

    # --- from the tree to wire conditions, one join level at a time ---

    def hop(self, alias, level):
        """The join right below ``level`` on the way to ``alias``; None for ``level``."""
        while alias != level:
            join = self.query.alias_map.get(alias)
            if not isinstance(join, Join):
                raise unsupported(
                    f"the join {alias!r} does not hang off {level!r}: split the filter "
                    "into Exists() subqueries"
                )
            if join.parent_alias == level:
                return alias
            alias = join.parent_alias
        return None

    def hops(self, node, level):
        return {self.hop(a, level) for a in _aliases(node)}

    def conv(self, node, level):
        hops = self.hops(node, level)
        if isinstance(node, _Leaf):
            return node.cond if hops == {None} else self.exists(hops.pop(), node)
        if len(hops) == 1 and None not in hops:  # all about one join: one EXISTS
            return self.exists(hops.pop(), node)
        if node.kind == "or":
            return _or([self.conv(c, level) for c in node.children])
        child_hops = [self.hops(c, level) for c in node.children]
        out, merged = [], set()
        for child, hs in zip(node.children, child_hops):
            shared = [h for h in hs - {None} if sum(h in other for other in child_hops) > 1]
            if len(hs) == 1 and shared:  # about one join its siblings test too: merge them
                (h,) = hs
                if h not in merged:
                    merged.add(h)
                    group = [c for c, other in zip(node.children, child_hops) if other == {h}]
                    out.append(self.exists(h, _Node("and", group)))
                continue
            for h in shared:
                if self.multi_valued(h):
                    raise unsupported(
                        f"conditions on one {self.relation(h)} mixed with conditions on "
                        "other tables under one AND are not supported; split them into "
                        "separate filter() calls or use Exists()"
                    )
            out.append(self.conv(child, level))
        return _and(out)

    def multi_valued(self, alias):
        field = self.query.alias_map[alias].join_field
        return bool(field.one_to_many or field.many_to_many)

    def relation(self, alias):
        join = self.query.alias_map[alias]
        return f"join {self.query.alias_map[join.parent_alias].table_name} → {join.table_name}"

    def exists(self, alias, node):
        join = self.query.alias_map[alias]
        if join.filtered_relation is not None:
            raise unsupported(
                "FilteredRelation is not supported: filter across the relation in "
                "filter(), or use Exists()"
            )
        if join.join_field.get_extra_restriction(alias, join.parent_alias) is not None:
            raise unsupported(
                f"the {self.relation(alias)} carries a restriction (not supported): use "
                "Exists() over the related model"
            )
        parent, child = zip(*join.join_cols)
        where = self.require(alias, self.conv(node, alias))
        found = _exists(join.table_name, parent, child, where)
        if join.join_type == LOUTER:
            if _null(node):
                return _or([found, _exists(join.table_name, parent, child, TRUE, negated=True)])
        else:  # it holds this join's requirement, nested ones included
            self.witness[id(found)] = (alias, found)
        return found

    def require(self, level, condition):
        """AND ``condition`` with the existence of every INNER join below ``level``."""
        needed = []
        for alias, join in self.query.alias_map.items():
            if alias not in self.used or not isinstance(join, Join):
                continue
            if join.parent_alias != level:
                continue
            if join.join_type != INNER:
                continue
            parent_join = self.query.alias_map[level]
            if isinstance(parent_join, Join) and parent_join.join_type == LOUTER:
                raise unsupported(
                    f"an INNER join below a LEFT JOIN ({self.relation(alias)}) is not "
                    "supported: write that part as an Exists()"
                )
            parent, child = zip(*join.join_cols)
            req = _exists(join.table_name, parent, child, self.require(alias, TRUE))
            needed.append((alias, req))
        conjuncts = condition["conditions"] if condition["type"] == "and" else [condition]
        witnessed = {self.witness.get(id(c), (None,))[0] for c in conjuncts}
        implied = [r for a, r in needed if a in witnessed]
        kept = []
        for _, r in needed:
            if r not in implied and r not in kept:
                kept.append(r)
        return _and([condition, *kept])
