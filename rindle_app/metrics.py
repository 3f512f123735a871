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
        resnapshots = CounterMetricFamily(
            "rindle_stream_resnapshots",
            "Times this process's live queries re-hydrated because their tail could not go "
            "on (below_horizon: retention pruned what they had not read; epoch_mismatch: "
            "a restored database), by reason. Every subscription got a fresh snapshot.",
            labels=["database", "reason"],
        )
        store_rows = GaugeMetricFamily(
            "rindle_store_rows",
            "Rows the live queries' partition store holds resident (bounded by "
            "RINDLE['STORE_MAX_ROWS']): what is watched, not what the tables hold.",
            labels=["database"],
        )
        store_reads = CounterMetricFamily(
            "rindle_store_reads",
            "Partitions and pages the live queries' store read from the database "
            "(a first query of a shape, a window refill, a partition read again after "
            "it was forgotten).",
            labels=["database"],
        )
        waiting = GaugeMetricFamily(
            "rindle_stream_waiters",
            "GET /v1/stream requests of this process waiting for events (long-poll or "
            "text/event-stream), and the most it admits at once "
            "(RINDLE['STREAM_LONG_POLL_MAX_WAITERS'], per process), by kind.",
            labels=["database", "kind"],
        )
        busy = CounterMetricFamily(
            "rindle_stream_busy",
            "GET /v1/stream requests refused with stream_busy: the waiters were at the limit.",
            labels=["database"],
        )
        for runtime in runtimes():
            using, engine = runtime.using, runtime.running_engine
            bell = runtime.running_bell
            if bell is not None:
                from .stream.bell import max_waiters

                limit = max_waiters() if bell.max_waiters is None else bell.max_waiters
                waiting.add_metric([using, "waiting"], bell.waiting)
                waiting.add_metric([using, "limit"], limit)
                busy.add_metric([using], bell.refused)
            if engine is None:
                continue
            producers.add_metric([using], engine.producer_census.get())
            queue.add_metric([using], engine.queue_depth)
            hub = runtime.running_hub
            live = getattr(hub, "live", None)
            if live is not None:
                from .exceptions import ResnapshotRequired as R

                for reason in (R.BELOW_HORIZON, R.EPOCH_MISMATCH):
                    resnapshots.add_metric([using, reason], live.resnapshots[reason])
                store = getattr(live.catalog, "store", None)
                if store is not None and hasattr(store, "rows_held"):
                    store_rows.add_metric([using], store.rows_held)
                    store_reads.add_metric([using], store.loads)
        yield producers
        yield queue
        yield resnapshots
        yield store_rows
        yield store_reads
        yield waiting
        yield busy

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
            figures = ledger.live_totals(today)
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


class WatermarkCollector:
    """
    The watermarker this process runs (``stream.watermark``), one sample set per
    database alias: steps by outcome (an advance, a step that found nothing new, a
    fence time-out, a standby's lease attempt, an error), the published and the
    greatest seen seq, whether it leads, the lease's epoch and transitions, and the
    time spent stepping. Fence time-outs are counted apart from advances: a
    time-out is an open transaction holding the fence, not a fault.
    """

    def collect(self):
        from .runtime import runtimes

        steps = CounterMetricFamily(
            "rindle_watermark_steps",
            "Watermark steps of this process, by outcome "
            "(advanced, unchanged, fence_timed_out, standby, error).",
            labels=["database", "outcome"],
        )
        safe = GaugeMetricFamily(
            "rindle_watermark_safe_seq",
            "safe_seq as this process's watermarker last published or saw it.",
            labels=["database"],
        )
        top = GaugeMetricFamily(
            "rindle_watermark_max_seq",
            "The greatest committed outbox seq this process's watermarker last saw.",
            labels=["database"],
        )
        leading = GaugeMetricFamily(
            "rindle_watermark_leader",
            "1 while this process's watermarker holds the lease, else 0.",
            labels=["database"],
        )
        epoch = GaugeMetricFamily(
            "rindle_watermark_lease_epoch",
            "The lease epoch (fencing token) this process's watermarker last held.",
            labels=["database"],
        )
        transitions = GaugeMetricFamily(
            "rindle_watermark_lease_transitions",
            "Changes of the lease's holder, as last seen; a fast rise means flapping.",
            labels=["database"],
        )
        seconds = CounterMetricFamily(
            "rindle_watermark_step_seconds",
            "Seconds spent in watermark steps (with rindle_watermark_steps: the mean).",
            labels=["database"],
        )
        for runtime in runtimes():
            watermarker = runtime.watermarker
            if watermarker is None:
                continue
            using, st = runtime.using, watermarker.stats
            unchanged = st.steps - st.advances - st.fence_timeouts
            outcomes = {
                "advanced": st.advances,
                "unchanged": unchanged,
                "fence_timed_out": st.fence_timeouts,
                "standby": st.standby_steps,
                "error": st.errors,
            }
            for outcome, n in outcomes.items():
                steps.add_metric([using, outcome], n)
            safe.add_metric([using], st.safe_seq)
            top.add_metric([using], st.max_seq)
            leading.add_metric([using], int(st.leading))
            epoch.add_metric([using], st.lease_epoch or 0)
            transitions.add_metric([using], st.lease_transitions)
            seconds.add_metric([using], st.step_seconds)
        yield from (steps, safe, top, leading, epoch, transitions, seconds)

    def describe(self):
        return []


class RetentionCollector:
    """
    The outbox retention this process ran (``stream/retention.py``: the embedded
    timer, or the beat task in a worker), one sample set per database alias, from
    the runtime's ``retention_stats``: never a database read.
    """

    def collect(self):
        from .runtime import runtimes

        pruned = CounterMetricFamily(
            "rindle_stream_retention_pruned_rows",
            "Outbox rows this process's retention deleted.",
            labels=["database"],
        )
        runs = CounterMetricFamily(
            "rindle_stream_retention_runs",
            "Retention runs finished, by outcome (ok, failed).",
            labels=["database", "outcome"],
        )
        minted = CounterMetricFamily(
            "rindle_stream_epochs_minted",
            "New stream epochs this process minted on finding a restored database.",
            labels=["database"],
        )
        horizon = GaugeMetricFamily(
            "rindle_stream_horizon",
            "The outbox horizon (first seq kept) as this process's retention last saw it.",
            labels=["database"],
        )
        last_prune = GaugeMetricFamily(
            "rindle_stream_retention_last_prune_timestamp_seconds",
            "Unix time of the last retention batch that deleted rows (0: none yet).",
            labels=["database"],
        )
        last_run = GaugeMetricFamily(
            "rindle_stream_retention_last_run_timestamp_seconds",
            "Unix time of the last retention run that finished (0: none yet).",
            labels=["database"],
        )
        for runtime in runtimes():
            stats = runtime.retention_stats
            with stats.lock:
                if not (stats.runs or stats.failures or stats.batches):
                    continue
                using = runtime.using
                pruned.add_metric([using], stats.pruned)
                runs.add_metric([using, "ok"], stats.runs)
                runs.add_metric([using, "failed"], stats.failures)
                minted.add_metric([using], stats.epochs_minted)
                horizon.add_metric([using], stats.horizon)
                last_prune.add_metric([using], stats.last_prune_at)
                last_run.add_metric([using], stats.last_run_at)
        yield from (pruned, runs, minted, horizon, last_prune, last_run)

    def describe(self):
        return []


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
        _collectors.extend(
            (
                EngineCollector(),
                FlowCollector(),
                WatermarkCollector(),
                RetentionCollector(),
                StreamCollector(),
            )
        )
        for collector in _collectors:
            REGISTRY.register(collector)
