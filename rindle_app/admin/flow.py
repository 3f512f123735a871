"""The usage ledger's operator pages: the fleet, one namespace, forget."""

from django.contrib import admin, messages
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path

from .. import flow, models
from ..conf import rindle_settings
from ..engine import RindleError
from ..engine.errors import InvalidInput
from ..exceptions import FLOW_FORGET_UNCONFIRMED, FLOW_INVALID_WINDOW, FLOW_UNKNOWN_NAMESPACE
from ..flow.figures import check_namespace, utc_day
from .base import ReadOnlyAdmin, epoch_ms
from .flow_pages import (
    FLOW_DEFAULT_DAYS,
    fleet_context,
    fleet_overview,
    flow_url,
    glance_context,
    namespace_context,
)

# Who may read the flow pages, and who may forget a namespace's flow.
FLOW_VIEW_PERMISSION = "rindle_app.view_flowdayrecord"
FLOW_FORGET_PERMISSION = "rindle_app.delete_flowdayrecord"


class NothingKept(InvalidInput):
    """A namespace page was asked for a namespace with no figure in the kept window."""

    code = FLOW_UNKNOWN_NAMESPACE


def _days_param(request, name, default, limit):
    """A ``?name=N`` of whole days in 1..limit, or ``default`` when absent."""
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip()
    # Length first: int() refuses (ValueError) text of thousands of digits.
    if not (len(value) <= 6 and value.isdecimal()) or not 1 <= int(value) <= limit:
        raise InvalidInput(
            f"{name} must be a whole number of days from 1 to {limit}, not {raw[:40]!r}",
            code=FLOW_INVALID_WINDOW,
            field=name,
        )
    return int(value)


def _silent_default(limit):
    value = rindle_settings.FLOW_SILENT_AFTER_DAYS
    if type(value) is not int or value < 1:
        raise ImproperlyConfigured(
            'RINDLE["FLOW_SILENT_AFTER_DAYS"] must be a positive whole number of days, '
            f"not {value!r}"
        )
    return min(value, limit)


@admin.register(models.FlowTombstone)
class FlowTombstoneAdmin(ReadOnlyAdmin):
    """
    Forgotten namespaces, read-only; and the usage ledger's operator pages, which
    hang off this admin's URLs: the fleet, one namespace, and forget.
    """

    list_display = ("namespace", "generation", epoch_ms("forgotten_ms", "forgotten at"))
    search_fields = ("namespace",)
    ordering = ("-seq",)

    def get_urls(self):
        def route(suffix, view, name):
            return path(suffix, self.admin_site.admin_view(view), name=f"rindle_app_flow_{name}")

        pages = [
            route("fleet/", self.fleet_view, "fleet"),
            route("fleet/namespace/", self.namespace_view, "namespace"),
            route("fleet/forget/", self.forget_view, "forget"),
        ]
        return pages + super().get_urls()

    def _render(self, request, template, context, status=200):
        context = {**self.admin_site.each_context(request), "opts": self.opts, **context}
        request.current_app = self.admin_site.name
        return TemplateResponse(request, f"admin/rindle_app/{template}", context, status=status)

    def _error(self, request, template, context, exc):
        context = {**context, "error": exc.message, "error_code": exc.code}
        return self._render(request, template, context, status=exc.status)

    def fleet_view(self, request):
        """Today's totals, the quiet namespaces, and bytes per day of the largest movers."""
        if not request.user.has_perm(FLOW_VIEW_PERMISSION):
            raise PermissionDenied
        context = {"title": "Usage: the fleet"}
        try:
            ledger = flow.get_ledger()
            limit = ledger.retention_days
            days = _days_param(request, "days", min(FLOW_DEFAULT_DAYS, limit), limit)
            silent = _days_param(request, "silent", _silent_default(limit), limit)
            context.update(days=days, silent=silent, retention=limit)
            now = flow.now_ms()
            overview = fleet_overview(ledger, now, days, silent)
        except RindleError as exc:
            context.setdefault("days", FLOW_DEFAULT_DAYS)
            return self._error(request, "flow_fleet.html", context, exc)
        context.update(fleet_context(overview, now, days, silent, limit))
        return self._render(request, "flow_fleet.html", context)

    def namespace_view(self, request):
        """One namespace: today beside its last sighting, bytes per day, refusals."""
        if not request.user.has_perm(FLOW_VIEW_PERMISSION):
            raise PermissionDenied
        namespace = request.GET.get("namespace", "")
        context = {"title": "Usage: a namespace", "namespace": namespace}
        try:
            ledger = flow.get_ledger()
            limit = ledger.retention_days
            days = _days_param(request, "days", min(FLOW_DEFAULT_DAYS, limit), limit)
            context.update(days=days, retention=limit)
            check_namespace(namespace)
            now = flow.now_ms()
            glance = ledger.glance(namespace, now)
            today = utc_day(now)
            # The ledger's own merge of live, parked and stored figures, every node summed.
            series = ledger.series(namespace, today - days + 1, today)
        except RindleError as exc:
            return self._error(request, "flow_namespace.html", context, exc)
        if glance.last_seen_ms is None and not series:
            exc = NothingKept(
                f"Nothing is kept for namespace {namespace!r} in the last {limit} days."
            )
            return self._error(request, "flow_namespace.html", context, exc)
        context.update(namespace_context(namespace, glance, series, now, days, limit))
        context["title"] = f"Usage: {namespace}"
        return self._render(request, "flow_namespace.html", context)

    def forget_view(self, request):
        """
        GET asks for confirmation and changes nothing; a POST with ``confirm=yes``
        forgets the namespace: every node's kept rows, and a tombstone so no
        process writes its figures back.
        """
        if not request.user.has_perm(FLOW_FORGET_PERMISSION):
            raise PermissionDenied
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        data = request.POST if request.method == "POST" else request.GET
        namespace = data.get("namespace", "")
        context = {"title": "Forget a namespace's flow", "namespace": namespace}
        try:
            check_namespace(namespace)
            ledger = flow.get_ledger()
            now = flow.now_ms()
            if request.method == "GET":
                context["glance"] = glance_context(ledger.glance(namespace, now), now)
                return self._render(request, "flow_forget.html", context)
            if data.get("confirm") != "yes":
                raise InvalidInput(
                    "Forgetting needs the confirmation step: confirm=yes.",
                    code=FLOW_FORGET_UNCONFIRMED,
                )
            had = ledger.forget(namespace, now)
        except RindleError as exc:
            return self._error(request, "flow_forget.html", context, exc)
        if had:
            self.message_user(
                request,
                f"Forgot the flow of {namespace!r}: every node's kept days are deleted, "
                "and other processes drop their live figures at their next flush.",
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request,
                f"Nothing was kept for {namespace!r}; its tombstone stops any process "
                "from writing figures it still holds.",
                messages.WARNING,
            )
        return HttpResponseRedirect(flow_url("fleet"))


@admin.register(models.Usage)
class UsageAdmin(ReadOnlyAdmin):
    """
    The admin index's "Usage" entry: its changelist is the fleet page, for whoever
    may read the flow pages. It has no rows of its own to add, change or delete.
    """

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(FLOW_VIEW_PERMISSION)

    def get_urls(self):
        view = self.admin_site.admin_view(self.changelist_view)
        return [path("", view, name="rindle_app_usage_changelist")]

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(flow_url("fleet"))
