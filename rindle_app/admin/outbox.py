"""The outbox (``ChangeEvent``) admin: cheap paging, fixed filters, and the FK audit page."""

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Max, Min
from django.urls import path
from django.utils.functional import cached_property

from .. import models
from ..engine.registry import synced_models
from .base import ReadOnlyAdmin
from .fk_audit import fk_audit_page


class OutboxPaginator(Paginator):
    """
    Pages the outbox without a COUNT(*) over all of it.

    Unfiltered, the count is read off the ``seq`` range, two index lookups; gaps
    left by rolled-back writes only make the last pages short. A filtered list is
    counted exactly.
    """

    @cached_property
    def count(self):
        if self.object_list.query.where:
            return super().count
        bounds = self.object_list.aggregate(first=Min("seq"), last=Max("seq"))
        return 0 if bounds["last"] is None else bounds["last"] - bounds["first"] + 1


class OpFilter(admin.SimpleListFilter):
    """Filters by operation from the fixed set, not a DISTINCT scan of the outbox."""

    title = "op"
    parameter_name = "op"

    def lookups(self, request, model_admin):
        return [(op, op) for op in ("add", "edit", "remove", "ddl")]  # ddl: a schema change

    def queryset(self, request, queryset):
        return queryset.filter(op=self.value()) if self.value() else queryset


class TableFilter(admin.SimpleListFilter):
    """Filters by the captured tables, not a DISTINCT scan of the outbox."""

    title = "table"
    parameter_name = "table"

    def lookups(self, request, model_admin):
        tables = ["_rindle_client_mutations", *(m._meta.db_table for m in synced_models())]
        return [(table, table) for table in tables]

    def queryset(self, request, queryset):
        return queryset.filter(table=self.value()) if self.value() else queryset


@admin.register(models.ChangeEvent)
class ChangeEventAdmin(ReadOnlyAdmin):
    list_display = ("seq", "table", "op", "key", "txid")
    list_filter = (TableFilter, OpFilter)
    search_fields = ("seq",)
    search_help_text = "Find an event by its seq."
    ordering = ("-seq",)
    paginator = OutboxPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # one COUNT per filter choice

    def get_urls(self):
        audit = path(
            "fk-audit/",
            self.admin_site.admin_view(self.fk_audit_view),
            name=f"{self.opts.app_label}_fk_audit",
        )
        return [audit, *super().get_urls()]

    def fk_audit_view(self, request):
        """The foreign-key audit page (``fk_audit.fk_audit_page``)."""
        return fk_audit_page(self, request)

    def get_search_results(self, request, queryset, search_term):
        # An exact seq is an index lookup; matching text would scan the whole outbox.
        term = search_term.strip().lstrip("#")
        if not term:
            return queryset, False
        if term.isdecimal() and int(term) < 2**63:
            return queryset.filter(seq=int(term)), False
        return queryset.none(), False
