"""
rindle's Prometheus series, served at ``/metrics`` by ``metrics_view`` (which wraps
django-prometheus's export of the default registry behind ``RINDLE["METRICS_AUTH"]``).

Every value here is read from memory at scrape time: a scrape never takes the
request's database connection, let alone the writer, so a long write cannot stall
it (a scraper that authenticates by token or address reads no database either).
The change stream's watermark gauges (``StreamCollector``) are the database's own
state: on PostgreSQL they cost one bounded read-only transaction on a connection of
their own per scrape.
"""

import hmac
import ipaddress

from django.conf import settings
from django.http import JsonResponse
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY

from .exceptions import METRICS_FORBIDDEN

METRICS_AUTH_KEYS = frozenset({"TOKEN", "ADDRESSES", "STAFF", "OPEN"})


def metrics_view(request):
    """``GET /metrics``: the registry's text exposition, for callers METRICS_AUTH admits."""
    from django_prometheus.exports import ExportToDjangoView

    if metrics_allowed(request):
        return ExportToDjangoView(request)
    response = JsonResponse(
        {
            "error": {
                "code": METRICS_FORBIDDEN,
                "message": "/metrics is not open to this caller; see RINDLE['METRICS_AUTH']",
            }
        },
        status=403,
    )
    if isinstance(_auth(), dict) and _auth().get("TOKEN"):
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
    return response


def metrics_allowed(request):
    """
    Whether ``request`` may scrape: ``RINDLE["METRICS_AUTH"]`` None opens it while
    DEBUG is on and otherwise to staff sessions; a dict to any caller one of its
    keys admits (a malformed value admits nobody; check rindle.E011 reports it).
    """
    auth = _auth()
    if auth is None:
        return settings.DEBUG or _staff(request)
    if metrics_auth_problem(auth) is not None:
        return False
    if auth.get("OPEN"):
        return True
    if auth.get("TOKEN") and _bearer(request, auth["TOKEN"]):
        return True
    if _address_in(request.META.get("REMOTE_ADDR"), auth.get("ADDRESSES") or ()):
        return True
    return bool(auth.get("STAFF", True)) and _staff(request)


def metrics_auth_problem(auth):
    """What is wrong with a METRICS_AUTH value, or None."""
    if auth is None:
        return None
    if not isinstance(auth, dict) or not set(auth) <= METRICS_AUTH_KEYS:
        return f"it must be None or a dict with keys among {sorted(METRICS_AUTH_KEYS)}"
    token = auth.get("TOKEN")
    if token is not None and (not isinstance(token, str) or len(token) < 32):
        return "TOKEN must be a string of at least 32 characters"
    addresses = auth.get("ADDRESSES") or ()
    if isinstance(addresses, str):
        return "ADDRESSES must be a list of IP addresses or CIDR networks"
    try:
        [ipaddress.ip_network(a, strict=False) for a in addresses]
    except (TypeError, ValueError) as exc:
        return f"ADDRESSES: {exc}"
    return None


def _auth():
    from .conf import rindle_settings

    return rindle_settings.METRICS_AUTH


def _bearer(request, token):
    kind, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return kind.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _address_in(address, networks):
    try:
        ip = ipaddress.ip_address(address or "")
    except ValueError:
        return False
    return any(ip in ipaddress.ip_network(n, strict=False) for n in networks)


def _staff(request):
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


class EngineCollector:
    """Gauges of the engines running in this process, one sample per database alias."""

    def collect(self):
        from .runtime import runtimes

        producers = GaugeMetricFamily(
            "rindle_producers",
            "Distinct foreign producers holding a durable watermark row (ProducerCensus); "
            "growth without bound means callers mint fresh producer ids.",
            labels=["database"],
        )
        queue = GaugeMetricFamily(
            "rindle_writer_queue_depth",
            "Write requests waiting for the engine's writer.",
            labels=["database"],
        )
        for runtime in runtimes():
            using, engine = runtime.using, runtime.running_engine
            if engine is None:
                continue
            producers.add_metric([using], engine.producer_census.get())
            queue.add_metric([using], engine.queue_depth)
        yield producers
        yield queue

    def describe(self):
        return []


class FlowCollector:
    """
    Today's flow through this process's usage ledgers (``rindle_app.flow``), one
    sample set per database alias, summed over namespaces: never a namespace label,
    so the series count is fixed whatever the tenant count.

    Each figure is this process's live count of the current UTC day (what it has
    counted since midnight, flushed or not), read off the ledger's slots under
    their locks: no store read, and nothing on the transfer path waits longer
    than for one other counter. The figures are gauges that fall to zero at UTC
    midnight; sum them over processes for the fleet (a namespace served by two
    processes counts once in each ``rindle_flow_namespaces_seen_today``).
    """

    def collect(self):
        from . import flow

        today = flow.utc_day(flow.now_ms())
        wire = GaugeMetricFamily(
            "rindle_flow_bytes_today",
            "Wire bytes moved today (UTC) through this process, by direction.",
            labels=["database", "direction"],
        )
        bulk = GaugeMetricFamily(
            "rindle_flow_bulk_bytes_today",
            "The part of rindle_flow_bytes_today that was bulk payload, by direction.",
            labels=["database", "direction"],
        )
        transfers = GaugeMetricFamily(
            "rindle_flow_transfers_today",
            "Transfers finished today (UTC) through this process.",
            labels=["database"],
        )
        refusals = GaugeMetricFamily(
            "rindle_flow_refusals_today",
            "Requests refused today (UTC) by this process, by reason.",
            labels=["database", "reason"],
        )
        auth = GaugeMetricFamily(
            "rindle_flow_auth_failures_today",
            "Principals without a grant knocking on a namespace today (UTC), this process.",
            labels=["database"],
        )
        seen = GaugeMetricFamily(
            "rindle_flow_namespaces_seen_today",
            "Namespaces with a transfer or refusal today (UTC) in this process.",
            labels=["database"],
        )
        late = CounterMetricFamily(
            "rindle_flow_late_records",
            "Records dated before their namespace's current day (a clock stepped back, "
            "a late transfer), counted into the current day.",
            labels=["database"],
        )
        from .runtime import runtimes

        ledgers = [(rt.using, rt.running_ledger) for rt in runtimes()]
        for using, ledger in ledgers:
            if ledger is None:
                continue
            figures = live_totals(ledger, today)
            for direction in ("in", "out"):
                wire.add_metric([using, direction], figures[f"bytes_{direction}"])
                bulk.add_metric([using, direction], figures[f"bulk_{direction}"])
            transfers.add_metric([using], figures["transfers"])
            for reason, n in zip(flow.REASONS, figures["refusals"]):
                refusals.add_metric([using, reason], n)
            auth.add_metric([using], figures["auth_failures"])
            seen.add_metric([using], figures["seen"])
            late.add_metric([using], ledger.late_records)
        yield from (wire, bulk, transfers, refusals, auth, seen, late)

    def describe(self):
        return []


def live_totals(ledger, day):
    """
    ``ledger``'s live figures of UTC ``day`` summed over its namespaces, from memory.

    It reads the slots without rolling them (a slot still holding yesterday counts
    nothing for today) and without folding session ids, so a scrape changes no
    state and costs a few integer additions per namespace.
    """
    from .flow import REASONS

    totals = dict.fromkeys(
        ("bytes_in", "bytes_out", "bulk_in", "bulk_out", "transfers", "auth_failures", "seen"), 0
    )
    refusals = [0] * len(REASONS)
    for slot in list(ledger._slots.values()):
        with slot.lock:
            if slot.day != day:
                continue
            totals["bytes_in"] += slot.bytes_in
            totals["bytes_out"] += slot.bytes_out
            totals["bulk_in"] += slot.bulk_in
            totals["bulk_out"] += slot.bulk_out
            totals["transfers"] += slot.transfers
            totals["auth_failures"] += slot.auth_failures
            totals["seen"] += slot.last_seen > 0
            for i, n in enumerate(slot.refusals):
                refusals[i] += n
    totals["refusals"] = refusals
    return totals


class StreamCollector:
    """
    The change stream's watermark on PostgreSQL (``stream.status``): the lag, its
    age, and the oldest open transaction holding the outbox fence.

    These are the one exception to "read from memory": they are the database's
    state, the same for every process. A scrape reads them on a connection of its
    own (never the request's, never the writer's), in one read-only transaction
    under a statement timeout: a few index lookups and a capped scan of
    ``pg_locks``, taking no lock a writer waits on. If the read fails,
    ``rindle_stream_status_up`` is 0 and the other series are left out. On SQLite
    the write lock orders commits, nothing can lag, and no query runs.
    """

    FENCED_LIMIT = 100  # rindle_stream_fenced_transactions counts at most this many

    def collect(self):
        from django.db import DatabaseError, connections

        from .conf import rindle_settings
        from .stream import status

        using = rindle_settings.DATABASE
        if connections[using].vendor != "postgresql":
            return
        up = GaugeMetricFamily(
            "rindle_stream_status_up",
            "1 when this scrape could read the change stream's state, else 0.",
            labels=["database"],
        )
        try:
            current = status.sample(using, fresh=True, fenced_limit=self.FENCED_LIMIT)
        except DatabaseError:
            up.add_metric([using], 0)
            yield up
            return
        up.add_metric([using], 1)
        yield up
        oldest = current.oldest_fenced
        holding = [t for t in current.fenced if t.holding]
        for name, text, value in (
            (
                "rindle_stream_safe_seq",
                "The published watermark: every seq at or below it is final.",
                current.safe_seq,
            ),
            ("rindle_stream_max_seq", "The greatest committed outbox seq.", current.max_seq),
            ("rindle_stream_horizon", "The oldest outbox seq retention kept.", current.horizon),
            (
                "rindle_stream_lag",
                "Committed events not yet published: max_seq - safe_seq.",
                current.lag,
            ),
            (
                "rindle_stream_lag_seconds",
                "How long the oldest unpublished event has waited (0 without lag).",
                current.lag_seconds,
            ),
            (
                "rindle_stream_oldest_fenced_transaction_seconds",
                "Age of the oldest open transaction holding the outbox fence (0: none); "
                "it holds the watermark back while it stays open.",
                (oldest.age_seconds or 0.0) if oldest is not None else 0.0,
            ),
            (
                "rindle_stream_fenced_transactions",
                f"Open transactions holding the outbox fence (counted up to {self.FENCED_LIMIT}).",
                len(holding),
            ),
        ):
            gauge = GaugeMetricFamily(name, text, labels=["database"])
            gauge.add_metric([using], value)
            yield gauge

    def describe(self):
        return []


_collectors = []


def register():
    """Add rindle's collectors to the default registry once per process."""
    if not _collectors:
        _collectors.extend((EngineCollector(), FlowCollector(), StreamCollector()))
        for collector in _collectors:
            REGISTRY.register(collector)
