"""
The change stream's page: the watermark, the retention horizon, the epoch, the
singleton leases, and the open transactions on the outbox fence, so an operator
whose live updates stalled finds the session holding them back (its pid, age,
state and query) and can end it (``SELECT pg_terminate_backend(<pid>)``).

It is the ``StreamState`` changelist: the state is one row, and the page shows it
with what explains it rather than as a table of rows.
"""

from django.contrib import admin
from django.db import DatabaseError, connections
from django.template.response import TemplateResponse

from .. import models
from ..conf import rindle_settings
from ..stream import status
from .base import ReadOnlyAdmin

FENCED_SHOWN = 50


@admin.register(models.StreamState)
class StreamStateAdmin(ReadOnlyAdmin):
    def changelist_view(self, request, extra_context=None):
        if not self.has_view_or_change_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied
        using = rindle_settings.DATABASE
        context = {
            **self.admin_site.each_context(request),
            "title": "Change stream",
            "opts": self.opts,
            "threshold": float(rindle_settings.STREAM_HEALTH_LAG_SECONDS),
            "vendor": connections[using].vendor,
            "fenced_shown": FENCED_SHOWN,
        }
        http_status = 200
        try:
            context["status"] = status.sample(using, fenced_limit=FENCED_SHOWN)
            with connections[using].cursor() as cursor:
                context["leases"] = status.leases(cursor)
        except DatabaseError as exc:
            context["error"] = f"The stream's state cannot be read: {exc}"
            http_status = 503
        request.current_app = self.admin_site.name
        return TemplateResponse(
            request, "admin/rindle_app/stream_status.html", context, status=http_status
        )
