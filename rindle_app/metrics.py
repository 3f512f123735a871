"""
rindle's Prometheus series, served by the project's ``/metrics`` (django-prometheus
exports the default registry).

Every value here is read from memory at scrape time: a scrape never takes a
database connection, let alone the writer, so a long write cannot stall it.
"""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY


class EngineCollector:
    """Gauges of the engines running in this process, one sample per database alias."""

    def collect(self):
        from .engine.engine import _engines

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
        for using, engine in sorted(_engines.items()):
            if engine.closed:
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
        for using, ledger in sorted(flow._ledgers.items()):
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


_collectors = []


def register():
    """Add rindle's collectors to the default registry once per process."""
    if not _collectors:
        _collectors.extend((EngineCollector(), FlowCollector()))
        for collector in _collectors:
            REGISTRY.register(collector)
