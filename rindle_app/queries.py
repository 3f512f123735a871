"""
Public API: named queries, the only queries a client can subscribe to.

::

    from rindle_app.queries import correlate, exists, named_query, table

    @named_query("myIssues")
    def my_issues(args, ctx):
        return table("issue").where("ownerId", "=", ctx.user.pk).order_by("createdAt", "desc")

``table`` starts an AST builder; ``cond``, ``and_``, ``or_``, ``not_``, ``exists``,
``not_exists`` and ``correlate`` build its conditions; ``from_queryset`` turns a
Django QuerySet into the same AST. ``room_profile`` declares a room profile, the
rows one collaborative doc owns (see ``rindle_app.rooms``), that a query opts into
with ``named_query(..., realtime="<profile>")``.
"""

from .ivm.builder import and_, cond, correlate, exists, not_, not_exists, or_, table
from .ivm.queryset import from_queryset
from .named import named_query
from .rooms import room_profile

__all__ = [
    "and_",
    "cond",
    "correlate",
    "exists",
    "from_queryset",
    "named_query",
    "not_",
    "not_exists",
    "or_",
    "room_profile",
    "table",
]
