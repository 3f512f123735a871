"""What every rindle admin shares: read-only model admins and epoch-ms columns."""

from datetime import UTC, datetime

from django.contrib import admin


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
