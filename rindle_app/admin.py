"""
Read-only admin pages of rindle's bookkeeping tables and API tokens, and the usage
ledger's operator pages (the fleet, one namespace, forget).
"""

from datetime import UTC, datetime
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import display_for_field
from django.contrib.auth import get_permission_codename
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Max, Min
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.text import capfirst

from . import flow, models
from .conf import rindle_settings
from .engine import RindleError
from .engine.errors import InvalidInput
from .engine.registry import synced_models
from .exceptions import FLOW_FORGET_UNCONFIRMED, FLOW_INVALID_WINDOW, FLOW_UNKNOWN_NAMESPACE
from .flow.ledger import DAY_MS, REASONS, check_namespace, day_date, utc_day
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


# --- the usage ledger: the fleet page, a namespace's page, forget ------------------------

# Who may read the flow pages, and who may forget a namespace's flow.
FLOW_VIEW_PERMISSION = "rindle_app.view_flowdayrecord"
FLOW_FORGET_PERMISSION = "rindle_app.delete_flowdayrecord"
# The charts' window in UTC days (?days=N, at most the kept window) and its presets.
FLOW_DEFAULT_DAYS = 14
FLOW_DAYS_PRESETS = (7, 14, 30, 90)
# Namespaces drawn as rows of the fleet chart (the largest movers of the window),
# and quiet namespaces listed by name.
FLOW_TOP_NAMESPACES = 20
FLOW_QUIET_LISTED = 50
_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def humanize_bytes(n):
    """``n`` bytes in binary units, three significant figures: ``"12.3 MiB"``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _BYTE_UNITS:
        value /= 1024
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            break
    text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{text.removesuffix('.0')} {unit}"


def nice_scale(peak, ticks=4):
    """
    ``(top, step)`` of an axis from 0 that holds ``peak`` bytes: ``step`` is 1, 2 or
    5 times a power of ten of a binary unit (KiB, MiB ...), so every tick label is a
    round number.
    """
    if peak <= 0:
        return 1, 1
    raw = peak / ticks
    unit = 1
    while unit * 1024 <= raw:
        unit *= 1024
    for factor in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1024):
        step = factor * unit
        if step >= raw:
            break
    step = max(1, int(step))
    return -(-peak // step) * step, step


class NothingKept(InvalidInput):
    """A namespace page was asked for a namespace with no figure in the kept window."""

    code = FLOW_UNKNOWN_NAMESPACE
    status = 404


def _utc(ms):
    return datetime.fromtimestamp(ms / 1000, UTC) if ms else None


def _flow_url(name, **query):
    url = reverse(f"admin:rindle_app_flow_{name}")
    query = {k: v for k, v in query.items() if v is not None}
    return f"{url}?{urlencode(query)}" if query else url


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


# Geometry of the charts, in SVG user units (the SVG scales to the page width).
_FLEET = {"label": 200, "plot": 640, "total": 110, "row": 42, "bar": 32, "top": 30, "foot": 44}
_DETAIL = {"left": 80, "plot": 800, "right": 20, "height": 220, "top": 16, "foot": 48}


def _day_bars(series, days, left, slot, bar_w, base, scale, namespace=None):
    """One bar per day of ``days`` that moved bytes; ``scale``: pixels per byte."""
    bars = []
    for i, d in enumerate(days):
        b_in, b_out = series.get(d, (0, 0))
        if not b_in + b_out:
            continue
        day = day_date(d).isoformat()
        title = (
            f"{namespace + ' · ' if namespace else ''}{day}: {humanize_bytes(b_in + b_out)} "
            f"(in {humanize_bytes(b_in)}, out {humanize_bytes(b_out)})"
        )
        x = left + slot * i + (slot - bar_w) / 2
        bar = _bar(x, bar_w, base, scale * (b_in + b_out), b_in, b_out, title)
        bar["day"] = day
        bar["bytes"] = b_in + b_out
        bars.append(bar)
    return bars


def _bar(x, width, base, height, bytes_in, bytes_out, title):
    """One stacked bar (bytes in below, bytes out above); a day that moved bytes
    is at least two units tall, so activity never rounds away."""
    total = bytes_in + bytes_out
    if total and height < 2:
        height = 2.0
    h_in = height * bytes_in / total if total else 0.0
    return {
        "x": f"{x:.2f}",
        "width": f"{width:.2f}",
        "in_y": f"{base - h_in:.2f}",
        "in_h": f"{h_in:.2f}",
        "out_y": f"{base - height:.2f}",
        "out_h": f"{height - h_in:.2f}",
        "title": title,
    }


def _day_labels(days):
    """Indexes of the days that get a date label: about seven, the last always."""
    every = max(1, -(-len(days) // 7))
    last = len(days) - 1
    return {i for i in range(len(days)) if (last - i) % every == 0}


def fleet_chart(days, rows):
    """
    The fleet's bytes per day as small multiples: one row per namespace, every
    row on ONE scale (so rows compare), with a date axis and the scale printed.
    ``rows`` is ``[(namespace, {day: (bytes_in, bytes_out)}, url)]``.
    """
    g = _FLEET
    peak = max((i + o for _ns, series, _url in rows for i, o in series.values()), default=0)
    top, _step = nice_scale(peak)
    slot = g["plot"] / len(days)
    bar_w = max(1.0, slot * 0.8)
    labelled = _day_labels(days)
    width = g["label"] + g["plot"] + g["total"]
    height = g["top"] + g["row"] * len(rows) + g["foot"]
    axis = [
        {"x": f"{g['label'] + slot * (i + 0.5):.2f}", "text": day_date(d).strftime("%b %d")}
        for i, d in enumerate(days)
        if i in labelled
    ]
    chart_rows = []
    for n, (namespace, series, url) in enumerate(rows):
        y0 = g["top"] + g["row"] * n
        base = y0 + g["row"] - 4
        bars = _day_bars(series, days, g["label"], slot, bar_w, base, g["bar"] / top, namespace)
        total = sum(i + o for i, o in series.values())
        chart_rows.append(
            {
                "namespace": namespace,
                "label": namespace if len(namespace) <= 26 else namespace[:25] + "…",
                "url": url,
                "y": y0,
                "text_y": base - g["bar"] / 2 + 4,
                "base": base,
                "ceiling": base - g["bar"],
                "total": humanize_bytes(total),
                "bars": bars,
            }
        )
    return {
        "width": width,
        "height": height,
        "plot_x0": g["label"],
        "plot_x1": g["label"] + g["plot"],
        "total_x": width - 4,
        "axis_y": g["top"] - 10,
        "legend_y": height - g["foot"] + 22,
        "scale": humanize_bytes(top),
        "rows": chart_rows,
        "axis": axis,
        "days": len(days),
        # A faint band behind today's column: today is still counting.
        "today_x": f"{g['label'] + slot * (len(days) - 1):.2f}",
        "today_w": f"{slot:.2f}",
        "today_h": g["row"] * len(rows),
        "rows_y": g["top"],
    }


def namespace_chart(namespace, days, series):
    """One namespace's bytes per day as a bar chart with a labelled byte axis.
    ``series`` is ``{day: (bytes_in, bytes_out)}``."""
    g = _DETAIL
    peak = max((i + o for i, o in series.values()), default=0)
    top, step = nice_scale(peak)
    slot = g["plot"] / len(days)
    bar_w = max(1.0, slot * 0.75)
    base = g["top"] + g["height"]
    ticks = [
        {"y": f"{base - g['height'] * value / top:.2f}", "text": humanize_bytes(value)}
        for value in range(0, top + 1, step)
    ]
    bars = _day_bars(series, days, g["left"], slot, bar_w, base, g["height"] / top)
    labelled = _day_labels(days)
    return {
        "namespace": namespace,
        "width": g["left"] + g["plot"] + g["right"],
        "height": g["top"] + g["height"] + g["foot"],
        "plot_x0": g["left"],
        "plot_x1": g["left"] + g["plot"],
        "tick_x": g["left"] - 6,
        "base": base,
        "label_y": base + 18,
        "legend_y": base + 40,
        "ticks": ticks,
        "bars": bars,
        "axis": [
            {"x": f"{g['left'] + slot * (i + 0.5):.2f}", "text": day_date(d).strftime("%b %d")}
            for i, d in enumerate(days)
            if i in labelled
        ],
        "days": len(days),
    }


def fleet_overview(ledger, now, days, silent):
    """
    What the fleet page shows: ``fleet()`` once, and the store read twice in
    grouped queries (bytes per namespace per day over the chart's window; each
    namespace's last sighting over the kept window), with this process's live
    figures in place of its own stored copies. O(namespaces x days), never a
    query per namespace.
    """
    fleet = ledger.fleet(now, silent)
    today = utc_day(now)
    first = today - days + 1
    floor = today - ledger.retention_days + 1
    store = ledger.store
    # This process's live and parked figures, which replace its stored copies
    # (the readers of the ledger do the same).
    local = ledger._local_rows(None, floor, today)
    series = {}
    for namespace, day, mine, b_in, b_out, transfers in store.daily_bytes(
        first, today, ledger.node
    ):
        if mine and (namespace, day) in local:
            continue
        figure = series.setdefault(namespace, {}).setdefault(day, [0, 0, 0])
        figure[0] += b_in
        figure[1] += b_out
        figure[2] += transfers
    last_seen = store.last_seen_by_namespace(floor)
    for (namespace, day), row in local.items():
        last_seen[namespace] = max(last_seen.get(namespace, 0), row.last_seen_ms)
        if day >= first:
            figure = series.setdefault(namespace, {}).setdefault(day, [0, 0, 0])
            figure[0] += row.bytes_in
            figure[1] += row.bytes_out
            figure[2] += row.transfers
    totals = {ns: sum(f[0] + f[1] for f in by_day.values()) for ns, by_day in series.items()}
    ranked = sorted((ns for ns, total in totals.items() if total), key=lambda ns: (-totals[ns], ns))
    quiet_before = (today - silent + 1) * DAY_MS
    # Never seen (0: auth failures only) first, then the longest quiet.
    quiet = sorted((ms, ns) for ns, ms in last_seen.items() if ms < quiet_before)
    return {
        "fleet": fleet,
        "today": today,
        "days": list(range(first, today + 1)),
        "series": series,
        "totals": totals,
        "ranked": ranked,
        "last_seen": last_seen,
        "quiet": quiet,
    }


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
            series = ledger._series(namespace, today - days + 1, today)
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
        return HttpResponseRedirect(_flow_url("fleet"))


def glance_context(glance, now):
    """A ``Glance`` as display cells: today's figure, and the last sighting apart."""
    today = glance.today
    last = glance.last_seen_ms
    return {
        "today": today,
        "rows": [
            ("bytes-in", "Bytes in", today.bytes_in, humanize_bytes(today.bytes_in)),
            ("bytes-out", "Bytes out", today.bytes_out, humanize_bytes(today.bytes_out)),
            (
                "bulk-in",
                "of which bulk in",
                today.bulk_bytes_in,
                humanize_bytes(today.bulk_bytes_in),
            ),
            (
                "bulk-out",
                "of which bulk out",
                today.bulk_bytes_out,
                humanize_bytes(today.bulk_bytes_out),
            ),
            ("transfers", "Transfers", today.transfers, today.transfers),
            ("refusals", "Refusals", today.refused, today.refused),
            ("auth-failures", "Auth failures", today.auth_failures, today.auth_failures),
            ("sessions", "Distinct sessions", today.sessions, today.sessions),
        ],
        "last_seen": _utc(last),
        "last_seen_ms": last,
        "days_ago": None if last is None else utc_day(now) - utc_day(last),
    }


def fleet_context(overview, now, days, silent, limit):
    """Template context of the fleet page from ``fleet_overview``."""
    fleet = overview["fleet"]
    window = overview["days"]
    ranked = overview["ranked"]
    series = overview["series"]
    totals = overview["totals"]
    today = overview["today"]
    shown = ranked[:FLOW_TOP_NAMESPACES]
    chart_rows = [
        (
            ns,
            {d: (f[0], f[1]) for d, f in series[ns].items()},
            _flow_url("namespace", namespace=ns, days=days),
        )
        for ns in shown
    ]
    table = [
        {
            "namespace": ns,
            "url": url,
            "total": humanize_bytes(totals[ns]),
            "total_bytes": totals[ns],
            "cells": [
                (d, by_day[d][0] + by_day[d][1], humanize_bytes(by_day[d][0] + by_day[d][1]))
                if d in by_day
                else (d, 0, "")
                for d in window
            ],
        }
        for ns, by_day, url in chart_rows
    ]
    quiet = overview["quiet"]
    return {
        "now": _utc(now),
        "day": day_date(today),
        "fleet": fleet,
        "totals": [
            ("bytes-in", "Bytes in", fleet.bytes_in, humanize_bytes(fleet.bytes_in)),
            ("bytes-out", "Bytes out", fleet.bytes_out, humanize_bytes(fleet.bytes_out)),
            (
                "bulk-in",
                "of which bulk in",
                fleet.bulk_bytes_in,
                humanize_bytes(fleet.bulk_bytes_in),
            ),
            (
                "bulk-out",
                "of which bulk out",
                fleet.bulk_bytes_out,
                humanize_bytes(fleet.bulk_bytes_out),
            ),
            ("transfers", "Transfers", fleet.transfers, fleet.transfers),
            ("refusals", "Refusals", sum(fleet.refusals.values()), sum(fleet.refusals.values())),
            ("auth-failures", "Auth failures", fleet.auth_failures, fleet.auth_failures),
            ("active", "Namespaces active today", fleet.active, fleet.active),
            ("namespaces", "Namespaces in the kept window", fleet.namespaces, fleet.namespaces),
            (
                "sessions",
                "Distinct sessions (summed per namespace)",
                fleet.sessions,
                fleet.sessions,
            ),
        ],
        "refusals": [(reason, fleet.refusals[reason]) for reason in REASONS],
        "quiet": [
            {
                "namespace": ns,
                "url": _flow_url("namespace", namespace=ns, days=days),
                "last_seen": _utc(ms),
                "days_ago": today - utc_day(ms) if ms else None,
            }
            for ms, ns in quiet[:FLOW_QUIET_LISTED]
        ],
        "quiet_count": len(quiet),
        "quiet_more": max(0, len(quiet) - FLOW_QUIET_LISTED),
        "chart": fleet_chart(window, chart_rows) if chart_rows else None,
        "window": [day_date(d) for d in window],
        "table": table,
        "movers": len(ranked),
        "others": len(ranked) - len(shown),
        "others_bytes": humanize_bytes(sum(totals[ns] for ns in ranked[len(shown) :])),
        "presets": [
            (n, _flow_url("fleet", days=n, silent=silent), n == days)
            for n in FLOW_DAYS_PRESETS
            if n <= limit
        ],
    }


def namespace_context(namespace, glance, series, now, days, limit):
    """Template context of a namespace's page: glance, chart, per-day table, refusals."""
    today = utc_day(now)
    window = list(range(today - days + 1, today + 1))
    table = []
    for d in reversed(window):
        figure = series.get(d)
        table.append(
            {
                "date": day_date(d),
                "figure": figure,
                "moved": humanize_bytes(figure.moved) if figure else "",
                "bytes_in": humanize_bytes(figure.bytes_in) if figure else "",
                "bytes_out": humanize_bytes(figure.bytes_out) if figure else "",
                "bulk": humanize_bytes(figure.bulk_bytes_in + figure.bulk_bytes_out)
                if figure
                else "",
            }
        )
    window_refusals = dict.fromkeys(REASONS, 0)
    for figure in series.values():
        for reason, n in figure.refusals.items():
            window_refusals[reason] += n
    return {
        "glance": glance_context(glance, now),
        "day": day_date(today),
        "now": _utc(now),
        "chart": namespace_chart(
            namespace, window, {d: (f.bytes_in, f.bytes_out) for d, f in series.items()}
        ),
        "table": table,
        "window_moved": humanize_bytes(sum(f.moved for f in series.values())),
        "refusals": [
            (reason, glance.today.refusals[reason], window_refusals[reason]) for reason in REASONS
        ],
        "presets": [
            (n, _flow_url("namespace", namespace=namespace, days=n), n == days)
            for n in FLOW_DAYS_PRESETS
            if n <= limit
        ],
        "forget_url": _flow_url("forget", namespace=namespace),
        "fleet_url": _flow_url("fleet", days=days),
    }
