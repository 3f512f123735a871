"""
Quotas and the meter the transports count through.

A quota is a number of bytes moved (wire bytes in + out, as ``FlowLedger.moved``
counts them) per namespace over a rolling window of ``FLOW_QUOTA_WINDOW_DAYS`` UTC
days, today included. ``Quotas`` admits or refuses a namespace from a per-process
cache: the first check of a limited namespace reads ``moved()`` ONCE (the store's
copies of every process's flow, plus this process's live figures), and from then
on the cache is advanced by what this process records, never by reading the store
again. The cache keeps bytes per UTC day, so a day that leaves the window stops
counting at the midnight that ends it.

What the cache does not see: other processes' flow after the first sight. With N
serving processes a namespace may move up to its quota in each of them before all
of them refuse it; the store's figure (what ``moved()`` and the operator's pages
show) is exact as of the last flush.

Admission is checked before a transfer starts (an HTTP request before its view
runs, a websocket subscribe or pushMutation before it changes anything): the
transfer that crosses the quota completes, the next one is refused.

``Meter`` is what a transport holds for one principal (a request, a socket): it
counts transfers (into the ledger and the quota cache), refusals and auth
failures, and checks the quota.
"""

import logging
import threading

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from ..engine.errors import InvalidInput
from ..exceptions import (
    CLIENT_ID_TAKEN,
    FENCED,
    FRAME_TOO_LARGE,
    LEASE_EXPIRED,
    QUOTA_EXCEEDED,
    RATE_LIMITED,
    THROTTLED,
    UNAUTHORIZED,
    UNAVAILABLE,
    QuotaExceeded,
)
from . import now_ms
from .figures import DAY_MS, Refusal, Transfer, check_namespace

logger = logging.getLogger("rindle.flow")


class _Usage:
    """One namespace's bytes per UTC day, as this process knows them."""

    __slots__ = ("lock", "days")

    def __init__(self, days):
        self.lock = threading.Lock()
        self.days = days


class Quotas:
    """
    Per-process admission of namespaces against bytes-per-window quotas.

    ``default`` is every namespace's quota in bytes (None: unlimited);
    ``overrides`` maps a namespace to its own (an int, or None for unlimited).
    ``window_days`` is the rolling window in UTC days, today included, at most the
    ledger's retention. An unlimited namespace is never read from the store and
    costs one dict lookup per transfer.
    """

    def __init__(self, ledger, *, default=None, overrides=None, window_days=30):
        if not _is_quota(default):
            raise ImproperlyConfigured(
                f'RINDLE["FLOW_QUOTA_BYTES"] must be None or a non-negative integer, '
                f"not {default!r}"
            )
        overrides = {} if overrides is None else overrides
        if not isinstance(overrides, dict) or not all(
            isinstance(k, str) and _is_quota(v) for k, v in overrides.items()
        ):
            raise ImproperlyConfigured(
                'RINDLE["FLOW_QUOTAS"] must map namespaces to None or non-negative integers'
            )
        if type(window_days) is not int or not 1 <= window_days <= ledger.retention_days:
            raise ImproperlyConfigured(
                f'RINDLE["FLOW_QUOTA_WINDOW_DAYS"] must be an integer in '
                f"1..{ledger.retention_days} (FLOW_RETENTION_DAYS), not {window_days!r}"
            )
        self.ledger = ledger
        self.default = default
        self.overrides = dict(overrides)
        self.window_days = window_days
        self._usage = {}  # namespace -> _Usage, for limited namespaces seen
        self._seed_locks = {}
        self._lock = threading.Lock()
        # Store reads made to seed namespaces (one per limited namespace).
        self.seeds = 0

    @classmethod
    def from_settings(cls, ledger):
        from ..conf import rindle_settings

        return cls(
            ledger,
            default=rindle_settings.FLOW_QUOTA_BYTES,
            overrides=rindle_settings.FLOW_QUOTAS,
            window_days=rindle_settings.FLOW_QUOTA_WINDOW_DAYS,
        )

    def __repr__(self):
        return f"<Quotas default={self.default!r} window_days={self.window_days}>"

    def limit(self, namespace):
        """The namespace's quota in bytes, or None when it is unlimited."""
        return self.overrides.get(namespace, self.default)

    # --- the cache ---------------------------------------------------------------------

    def seed(self, namespace, now):
        """
        Read the namespace's window from the ledger, once per namespace per process
        (concurrent first checks wait for one read). Returns whether the namespace
        is limited. Call it off the event loop: it may read the store.
        """
        if self.limit(namespace) is None:
            return False
        if namespace in self._usage:
            return True
        with self._lock:
            lock = self._seed_locks.setdefault(namespace, threading.Lock())
        with lock:
            if namespace not in self._usage:
                moved = self.ledger.moved(namespace, now, self.window_days)
                self._usage[namespace] = _Usage(dict(moved))
                self.seeds += 1
        return True

    def count(self, namespace, at, nbytes):
        """
        Add ``nbytes`` moved at ``at`` to a seeded namespace's day. A namespace not
        seeded yet is not counted here: its seed reads the ledger, which has it.
        """
        usage = self._usage.get(namespace)
        if usage is None or not nbytes:
            return
        day = at // DAY_MS
        with usage.lock:
            days = usage.days
            days[day] = days.get(day, 0) + nbytes

    def used(self, namespace, now):
        """Bytes the namespace moved in the window ending today, as cached (None: not seeded)."""
        usage = self._usage.get(namespace)
        if usage is None:
            return None
        return sum(n for _day, n in self._window(usage, now))

    def _window(self, usage, now):
        """The cached ``[(day, bytes)]`` inside the window, oldest first; older days go."""
        floor = now // DAY_MS - self.window_days + 1
        with usage.lock:
            days = usage.days
            for day in [d for d in days if d < floor]:
                del days[day]
            return sorted(days.items())

    # --- admission ---------------------------------------------------------------------

    def check(self, namespace, now, *, seed=True):
        """
        Raise ``QuotaExceeded`` if the namespace moved its quota within the window.

        A limited namespace not seen before is seeded first (a store read), unless
        ``seed`` is False (on an event loop): it is then admitted. If the store
        cannot be read the namespace is admitted and the next check reads again.
        """
        limit = self.limit(namespace)
        if limit is None:
            return
        usage = self._usage.get(namespace)
        if usage is None:
            if not seed:
                return
            try:
                self.seed(namespace, now)
            except Exception:
                logger.exception("rindle flow: could not read %r's usage; admitted", namespace)
                return
            usage = self._usage[namespace]
        window = self._window(usage, now)
        used = sum(n for _day, n in window)
        if used < limit:
            return
        retry_after_ms = _retry_after(window, used, limit, now, self.window_days)
        raise QuotaExceeded(
            f"namespace {namespace!r} moved {used} bytes in the last {self.window_days} "
            f"UTC day(s), its quota is {limit}; retry in {retry_after_ms // 1000 + 1} s",
            limit=limit,
            used=used,
            window_days=self.window_days,
            retry_after_ms=retry_after_ms,
        )


def _is_quota(value):
    return value is None or (type(value) is int and value >= 0)


def _retry_after(window, used, limit, now, window_days):
    """
    Milliseconds until enough days have left the window for ``used`` to fall below
    ``limit``, if nothing more is moved (at most the whole window).
    """
    today = now // DAY_MS
    remaining = used
    by_day = dict(window)
    for k in range(1, window_days + 1):
        # At the start of day ``today + k`` the day ``today + k - window_days`` leaves.
        remaining -= by_day.get(today + k - window_days, 0)
        if remaining < limit:
            return (today + k) * DAY_MS - now
    return (today + window_days) * DAY_MS - now


# --- the meter --------------------------------------------------------------------------


class Meter:
    """
    What a transport counts for one principal: a request or a websocket.

    ``transfer`` records wire bytes as one transfer (into the ledger and the quota
    cache); ``refuse`` counts a refusal (no bytes: a refused frame or request is
    not a transfer); ``auth_failure`` counts a principal without a grant; ``check``
    raises ``QuotaExceeded``. Recording reads no database; ``check(seed=True)`` may,
    once per limited namespace per process.
    """

    __slots__ = ("namespace", "session", "_ledger", "_quotas")

    def __init__(self, quotas, namespace, session=None):
        self._quotas = quotas
        self._ledger = quotas.ledger
        self.namespace = namespace
        self.session = session

    def __repr__(self):
        return f"<Meter namespace={self.namespace!r} session={self.session!r}>"

    def transfer(self, bytes_in=0, bytes_out=0):
        at = now_ms()
        self._ledger.record(
            self.namespace,
            at,
            Transfer(bytes_in=bytes_in, bytes_out=bytes_out, session=self.session),
        )
        self._quotas.count(self.namespace, at, bytes_in + bytes_out)

    def refuse(self, reason):
        self._ledger.refuse(self.namespace, now_ms(), reason)

    def auth_failure(self):
        self._ledger.auth_failure(self.namespace, now_ms())

    def check(self, *, seed=True):
        self._quotas.check(self.namespace, now_ms(), seed=seed)

    def seed(self):
        """
        Seed the namespace's quota cache now (off the event loop). If the store
        cannot be read it is logged, and checks without seeding admit the namespace.
        """
        try:
            self._quotas.seed(self.namespace, now_ms())
        except Exception:
            logger.exception("rindle flow: could not read %r's usage; admitted", self.namespace)


# Refusal reasons of the transports' error codes and HTTP statuses.
_BY_CODE = {
    QUOTA_EXCEEDED: Refusal.QUOTA,
    RATE_LIMITED: Refusal.RATE_LIMIT,
    THROTTLED: Refusal.RATE_LIMIT,
    FENCED: Refusal.FENCED,
    FRAME_TOO_LARGE: Refusal.TOO_LARGE,
    UNAUTHORIZED: Refusal.PERMISSION,
    CLIENT_ID_TAKEN: Refusal.PERMISSION,
    LEASE_EXPIRED: Refusal.PERMISSION,
    UNAVAILABLE: Refusal.UNAVAILABLE,
}
_BY_STATUS = {
    403: Refusal.PERMISSION,
    413: Refusal.TOO_LARGE,
    429: Refusal.RATE_LIMIT,
    503: Refusal.UNAVAILABLE,
}


def refusal_for(code=None, status=None):
    """
    The ledger's reason for a refusal answered with error ``code`` (and HTTP
    ``status``, when there is one): the code decides where it is known, then the
    status; any other 4xx (or a code without status) is ``bad_request``, any other
    status ``other`` (a 409 conflict, a 500).
    """
    reason = _BY_CODE.get(code) or _BY_STATUS.get(status)
    if reason is not None:
        return reason
    if status is None or (400 <= status < 500 and status != 409):
        return Refusal.BAD_REQUEST
    return Refusal.OTHER


# --- the process's quotas: one cache per runtime (rindle_app/runtime.py) ----------------


def get_quotas(using=None):
    """
    The quotas over this process's serving ledger of ``using`` (see
    ``tick.serving_ledger``): built from the settings on first use, rebuilt when the
    ``RINDLE`` setting changes or the ledger was replaced.
    """
    from ..runtime import get_runtime

    return get_runtime(using).quotas


def meter(namespace, session=None, using=None):
    """
    A ``Meter`` for ``namespace`` (as ``RindleAdapter.namespace`` named it). The
    first call in a process starts the ledger and its flush tick, which reads the
    store: make it off the event loop.
    """
    try:
        check_namespace(namespace)
    except InvalidInput as exc:
        raise ImproperlyConfigured(
            f"RindleAdapter.namespace() returned an unusable namespace: {exc.message}"
        ) from None
    return Meter(get_quotas(using), namespace, session)


def reset():
    """Forget the process's quota caches (the next check reads the store again)."""
    from ..runtime import runtimes

    for runtime in runtimes():
        runtime.drop_quotas()


def _reload(*, setting, **kwargs):
    if setting == "RINDLE":
        reset()


setting_changed.connect(_reload)
