"""
rindle's Prometheus series, served by the project's ``/metrics`` (django-prometheus
exports the default registry).

Every value here is read from memory at scrape time: a scrape never takes a
database connection, let alone the writer, so a long write cannot stall it.
"""

from prometheus_client.core import GaugeMetricFamily
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


_collector = None


def register():
    """Add rindle's collector to the default registry once per process."""
    global _collector
    if _collector is None:
        _collector = EngineCollector()
        REGISTRY.register(_collector)
