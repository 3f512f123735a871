"""The API token admin: read-only but for revoking."""

from django.contrib import admin
from django.contrib.auth import get_permission_codename
from django.utils import timezone

from .. import models
from .base import ReadOnlyAdmin


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
