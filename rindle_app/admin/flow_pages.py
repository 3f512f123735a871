"""What the usage ledger's pages show: the ledger's figures as template context."""

from datetime import UTC, datetime
from urllib.parse import urlencode

from django.urls import reverse

from ..flow.charts import fleet_chart, humanize_bytes, namespace_chart
from ..flow.figures import DAY_MS, REASONS, day_date, utc_day

# The charts' window in UTC days (?days=N, at most the kept window) and its presets.
FLOW_DEFAULT_DAYS = 14
FLOW_DAYS_PRESETS = (7, 14, 30, 90)
# Namespaces drawn as rows of the fleet chart (the largest movers of the window),
# and quiet namespaces listed by name.
FLOW_TOP_NAMESPACES = 20
FLOW_QUIET_LISTED = 50


def _utc(ms):
    return datetime.fromtimestamp(ms / 1000, UTC) if ms else None


def flow_url(name, **query):
    url = reverse(f"admin:rindle_app_flow_{name}")
    query = {k: v for k, v in query.items() if v is not None}
    return f"{url}?{urlencode(query)}" if query else url


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
    local = ledger.local_rows(None, floor, today)
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


def _moved_cells(figure):
    """``(css class, label, value, shown)`` rows of what ``figure`` (a day or the fleet) moved."""
    return [
        ("bytes-in", "Bytes in", figure.bytes_in, humanize_bytes(figure.bytes_in)),
        ("bytes-out", "Bytes out", figure.bytes_out, humanize_bytes(figure.bytes_out)),
        ("bulk-in", "of which bulk in", figure.bulk_bytes_in, humanize_bytes(figure.bulk_bytes_in)),
        (
            "bulk-out",
            "of which bulk out",
            figure.bulk_bytes_out,
            humanize_bytes(figure.bulk_bytes_out),
        ),
        ("transfers", "Transfers", figure.transfers, figure.transfers),
    ]


def glance_context(glance, now):
    """A ``Glance`` as display cells: today's figure, and the last sighting apart."""
    today = glance.today
    last = glance.last_seen_ms
    return {
        "today": today,
        "rows": [
            *_moved_cells(today),
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
            flow_url("namespace", namespace=ns, days=days),
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
            *_moved_cells(fleet),
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
                "url": flow_url("namespace", namespace=ns, days=days),
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
            (n, flow_url("fleet", days=n, silent=silent), n == days)
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
            (n, flow_url("namespace", namespace=namespace, days=n), n == days)
            for n in FLOW_DAYS_PRESETS
            if n <= limit
        ],
        "forget_url": flow_url("forget", namespace=namespace),
        "fleet_url": flow_url("fleet", days=days),
    }
