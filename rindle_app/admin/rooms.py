"""Room admins: watermarks, placements, and listings of the composite-key room tables."""

from django.contrib import admin
from django.contrib.admin.utils import display_for_field
from django.contrib.auth import get_permission_codename
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.template.response import TemplateResponse
from django.urls import path
from django.utils.text import capfirst

from .. import models
from .base import ReadOnlyAdmin

# The admin refuses to register models with a composite primary key; these get a
# plain listing page hung off the room placement admin instead.
COMPOSITE_KEY_MODELS = (
    models.RoomClientMutation,
    models.RoomMutationOutcome,
    models.ScopeSession,
)


@admin.register(models.RoomWatermark)
class RoomWatermarkAdmin(ReadOnlyAdmin):
    list_display = ("doc", "flush_seq")
    search_fields = ("doc",)
    ordering = ("doc",)


@admin.register(models.RoomPlacement)
class RoomPlacementAdmin(ReadOnlyAdmin):
    """Room placements, and the listings of the room tables keyed by several columns."""

    list_display = ("doc", "epoch", "host")
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
