"""Read-only admin pages of rindle's bookkeeping tables and API tokens."""

from datetime import UTC, datetime

from django.contrib import admin
from django.contrib.admin.utils import display_for_field
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Max, Min
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.text import capfirst

from . import models
from .engine import RindleError
from .engine.registry import synced_models
from .management.commands.rindle_fk_audit import run_audit

# The admin refuses to register models with a composite primary key; these get a
# plain listing page hung off the room placement admin instead.
COMPOSITE_KEY_MODELS = (
    models.RoomClientMutation,
    models.RoomMutationOutcome,
    models.ScopeSession,
)


def epoch_ms(field, description):
    """A list_display column showing a milliseconds-since-the-epoch field as a time."""

    @admin.display(description=description, ordering=field)
    def show(obj):
        return datetime.fromtimestamp(getattr(obj, field) / 1000, UTC)

    return show


class ReadOnlyAdmin(admin.ModelAdmin):
    """The engine owns these rows: operators may view them, never add, change or delete."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


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
        return [(op, op) for op in ("add", "edit", "remove")]

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


# The foreign-key audit page: who may run it and how many rows it shows at most.
FK_AUDIT_PERMISSION = "rindle_app.view_changeevent"
FK_AUDIT_DEFAULT_ROWS = 100
FK_AUDIT_ROWS_LIMIT = 10_000


def fk_audit_context(audit):
    """Template context of a ``ForeignKeyAudit``: keys and violations as text cells."""
    return {
        "audit": audit,
        "checked": [
            {"table": k["table"], "columns": ", ".join(k["columns"]), "references": k["references"]}
            for k in audit.checked
        ],
        "violations": [
            {
                "table": v["table"],
                "pk": ", ".join(str(k) for k in v["pk"]),
                "values": ", ".join(f"{c} = {val}" for c, val in zip(v["columns"], v["values"])),
                "references": v["references"],
            }
            for v in audit.violations
        ],
    }


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
        """
        The foreign-key audit, run on demand (``?max_rows=N``) with a cap. Open to
        whoever may view the outbox: it shows keys of synced rows, as the outbox does.
        """
        if not request.user.has_perm(FK_AUDIT_PERMISSION):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Foreign key audit",
            "opts": self.opts,
            "max_rows": FK_AUDIT_DEFAULT_ROWS,
            "max_rows_limit": FK_AUDIT_ROWS_LIMIT,
        }
        status = 200
        raw = request.GET.get("max_rows")
        if raw is not None:
            max_rows = raw.strip()
            # Length first: int() refuses (ValueError) text of thousands of digits.
            if not (len(max_rows) <= 6 and max_rows.isdecimal()) or not (
                1 <= int(max_rows) <= FK_AUDIT_ROWS_LIMIT
            ):
                context["error"] = (
                    f"The cap must be a whole number from 1 to {FK_AUDIT_ROWS_LIMIT}."
                )
                status = 400
            else:
                context["max_rows"] = int(max_rows)
                try:
                    context.update(fk_audit_context(run_audit(max_rows=int(max_rows))))
                except RindleError as exc:  # a synced table is missing: migrate first
                    context["error"] = exc.message
                    status = 503
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/rindle_app/fk_audit.html", context, status=status)

    def get_search_results(self, request, queryset, search_term):
        # An exact seq is an index lookup; matching text would scan the whole outbox.
        term = search_term.strip().lstrip("#")
        if not term:
            return queryset, False
        if term.isdecimal() and int(term) < 2**63:
            return queryset.filter(seq=int(term)), False
        return queryset.none(), False


@admin.register(models.ClientMutation)
class ClientMutationAdmin(ReadOnlyAdmin):
    list_display = ("client_id", "last_mutation_id")
    search_fields = ("client_id",)
    ordering = ("client_id",)


@admin.register(models.ProducerOffset)
class ProducerOffsetAdmin(ReadOnlyAdmin):
    list_display = ("producer", "seq", "digest")
    search_fields = ("producer",)
    ordering = ("producer",)


@admin.register(models.SourceOffset)
class SourceOffsetAdmin(ReadOnlyAdmin):
    list_display = ("source", "offset", "chunk_seq", "run_id", "batch_hash")
    search_fields = ("source", "run_id")
    ordering = ("source",)


@admin.register(models.AppliedDdl)
class AppliedDdlAdmin(ReadOnlyAdmin):
    list_display = ("key", epoch_ms("applied_at", "applied at"), "checksum")
    search_fields = ("key",)
    ordering = ("-applied_at",)


@admin.register(models.SqlOutcome)
class SqlOutcomeAdmin(ReadOnlyAdmin):
    list_display = ("outcome_key", epoch_ms("expires_at", "expires at"))
    search_fields = ("outcome_key",)
    ordering = ("expires_at",)


@admin.register(models.RindleToken)
class RindleTokenAdmin(ReadOnlyAdmin):
    """
    API tokens, read-only but for revoking. The digest is never shown; tokens are
    created with ``manage.py rindle_token_create``, which prints the secret once.
    """

    list_display = (
        "prefix",
        "name",
        "user",
        "scopes",
        "active",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    )
    fields = (
        "prefix",
        "name",
        "user",
        "scopes",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    )
    search_fields = ("prefix", "name")
    ordering = ("-created_at",)
    actions = ["revoke"]

    @admin.display(boolean=True, description="active")
    def active(self, obj):
        return obj.is_active()

    def has_revoke_permission(self, request):
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}")

    @admin.action(description="Revoke the selected tokens", permissions=["revoke"])
    def revoke(self, request, queryset):
        count = queryset.filter(revoked_at=None).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} token(s).")


@admin.register(models.RoomWatermark)
class RoomWatermarkAdmin(ReadOnlyAdmin):
    list_display = ("doc", "flush_seq")
    search_fields = ("doc",)
    ordering = ("doc",)


@admin.register(models.RoomPlacement)
class RoomPlacementAdmin(ReadOnlyAdmin):
    """Room placements, and the listings of the room tables keyed by several columns."""

    list_display = ("doc", "epoch")
    search_fields = ("doc",)
    ordering = ("doc",)
    list_per_page = 100

    def get_urls(self):
        listings = [
            path(
                f"{model._meta.model_name}/",
                self.admin_site.admin_view(self.composite_list_view),
                {"model": model},
                name=f"{model._meta.app_label}_{model._meta.model_name}_changelist",
            )
            for model in COMPOSITE_KEY_MODELS
        ]
        return listings + super().get_urls()

    def composite_list_view(self, request, model):
        """A read-only table of ``model``'s rows in primary-key order, 100 a page."""
        opts = model._meta
        if not request.user.has_perm(f"{opts.app_label}.{get_permission_codename('view', opts)}"):
            raise PermissionDenied
        fields = opts.concrete_fields
        rows = model._default_manager.order_by("pk").values_list(*(f.name for f in fields))
        page = Paginator(rows, self.list_per_page).get_page(request.GET.get("p"))
        empty = self.get_empty_value_display()
        context = {
            **self.admin_site.each_context(request),
            "title": capfirst(opts.verbose_name_plural),
            "opts": opts,
            "columns": [f.verbose_name for f in fields],
            "rows": [[display_for_field(v, f, empty) for v, f in zip(row, fields)] for row in page],
            "page": page,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/rindle_app/composite_list.html", context)
