"""
What one socket and one principal may hold (``RINDLE`` settings of the same names).

- ``WS_MAX_SUBSCRIPTIONS``: subscriptions of one socket. Checked before the query
  is registered, so a refused subscribe allocates nothing.
- ``WS_MAX_FOOTPRINT_ROWS``: rows the socket's subscriptions hold together (each
  subscription's view footprint, ``View.footprint``). Known only once the view is
  hydrated, so an over-budget subscription is built, counted and dropped at once:
  its memory goes back as soon as the refusal is sent; a socket whose budget is
  already full is refused before anything is built. It is checked at subscribe: a
  subscription that grows afterwards is not cut (its client's view would tear).
- ``WS_MAX_SEND_BYTES``: the largest frame the server may write (Daphne's own
  outgoing limit, ``--websocket-max-message-size``, refuses anything larger, and
  the write would otherwise fail where nobody hears it).
- ``WS_MAX_SOCKETS_PER_PRINCIPAL``: open sockets of one principal in this
  process (``Sockets``, one per runtime, and so per database alias and process:
  ``Runtime.sockets``, there before the hub starts, so a handshake is counted
  without waiting for it). A socket counts from its handshake until its consumer
  ends, whichever way it ends (a close, a reset, Daphne cancelling it). Counted
  per process: N server processes admit N times the cap.

A refused subscribe is a ``queryError`` with the code and ``retryable: false``.
"""

import logging
import threading

from ..conf import rindle_settings
from ..exceptions import (
    FOOTPRINT_TOO_LARGE,
    RESULT_TOO_LARGE,
    TOO_MANY_SUBSCRIPTIONS,
    LimitExceeded,
)

logger = logging.getLogger("rindle.realtime")

CLOSE_TOO_MANY_SOCKETS = 4429


def _cap(name):
    value = getattr(rindle_settings, name)
    return None if value is None else int(value)


def check_subscriptions(conn, query_id):
    """Refuse a new queryId on a socket already holding ``WS_MAX_SUBSCRIPTIONS``."""
    cap = _cap("WS_MAX_SUBSCRIPTIONS")
    if cap is not None and query_id not in conn.subs and len(conn.subs) >= cap:
        raise LimitExceeded(
            f"this socket holds {len(conn.subs)} subscriptions; the limit is "
            f"WS_MAX_SUBSCRIPTIONS = {cap}",
            TOO_MANY_SUBSCRIPTIONS,
        )


def footprint_budget(catalog, conn, query_id):
    """
    The rows a new view for ``conn``'s ``query_id`` may hold: what its other
    subscriptions leave of ``WS_MAX_FOOTPRINT_ROWS`` (None: no cap).
    """
    cap = _cap("WS_MAX_FOOTPRINT_ROWS")
    if cap is None:
        return None
    return cap - _rows_held(catalog, conn, replacing=query_id)


def footprint_cap():
    """``WS_MAX_FOOTPRINT_ROWS`` alone (None: no cap): the most a read ahead of the lock reads."""
    return _cap("WS_MAX_FOOTPRINT_ROWS")


def _rows_held(catalog, conn, replacing):
    queries = catalog.queries
    rows = 0
    for query_id, sub in conn.subs.items():
        shared = queries.get(sub.key)
        if shared is not None and query_id != replacing:
            rows += len(getattr(shared.view, "footprint", ()))
    return rows


def check_footprint(catalog, conn, *, replacing=None):
    """
    Refuse when the socket's subscriptions hold more than ``WS_MAX_FOOTPRINT_ROWS``.

    With ``replacing`` (the queryId about to be subscribed, before its view is
    built), refuse already when the other subscriptions fill the budget: a socket
    at its cap is refused without hydrating anything.
    """
    cap = _cap("WS_MAX_FOOTPRINT_ROWS")
    if cap is None:
        return
    rows = _rows_held(catalog, conn, replacing)
    if rows > cap or (replacing is not None and rows >= cap):
        raise LimitExceeded(
            f"this socket's subscriptions would hold {rows} rows or more; the limit is "
            f"WS_MAX_FOOTPRINT_ROWS = {cap}",
            FOOTPRINT_TOO_LARGE,
        )


def send_bytes(text):
    """The UTF-8 size of ``text`` (no copy for ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def check_snapshot(frame, query_id):
    """Refuse a seq-0 frame larger than ``WS_MAX_SEND_BYTES``."""
    cap = _cap("WS_MAX_SEND_BYTES")
    if cap is not None and (size := send_bytes(frame)) > cap:
        raise LimitExceeded(
            f"the snapshot of query {query_id} is {size} bytes; the limit is "
            f"WS_MAX_SEND_BYTES = {cap} (narrow the query, or raise the setting "
            "together with Daphne's --websocket-max-message-size)",
            RESULT_TOO_LARGE,
        )


def batch_too_large(body):
    """The refusal message when an increment's ``body`` exceeds ``WS_MAX_SEND_BYTES``."""
    cap = _cap("WS_MAX_SEND_BYTES")
    # The frame adds ~150 bytes of envelope around the body.
    if cap is None or (size := send_bytes(body) + 256) <= cap:
        return None
    return (
        f"a change of about {size} bytes exceeds WS_MAX_SEND_BYTES = {cap}; re-subscribe "
        "for a fresh snapshot"
    )


def principal(scope, user, token):
    """The key sockets are counted under: the token, the user, or the client address."""
    if token is not None:
        return f"token:{token.pk}"
    if getattr(user, "is_authenticated", False):
        return f"user:{user.pk}"
    client = scope.get("client") or ("?",)
    return f"address:{client[0]}"


class Sockets:
    """Open sockets per principal in this process (``WS_MAX_SOCKETS_PER_PRINCIPAL``)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open = {}

    def acquire(self, key):
        """Count one more socket of ``key``; False (nothing counted) when at the cap."""
        cap = _cap("WS_MAX_SOCKETS_PER_PRINCIPAL")
        with self._lock:
            count = self._open.get(key, 0)
            if cap is not None and count >= cap:
                logger.warning(
                    "rindle consumer: refused a socket of %s: %d open, the limit is %d",
                    key,
                    count,
                    cap,
                )
                return False
            self._open[key] = count + 1
            return True

    def release(self, key):
        with self._lock:
            count = self._open.get(key, 0) - 1
            if count > 0:
                self._open[key] = count
            else:
                self._open.pop(key, None)

    def count(self, key):
        with self._lock:
            return self._open.get(key, 0)


class FrameBudget:
    """
    A socket's token bucket of client frames: ``WS_RATE`` per second, up to
    ``WS_BURST`` at once (both sockets, ``/ws/rindle/`` and the room socket).
    """

    def __init__(self, now):
        self.tokens = float(rindle_settings.WS_BURST)
        self.refill = now

    def admit(self, now):
        """Take one token for a frame received at ``now``; False when none is left."""
        rate = float(rindle_settings.WS_RATE)
        burst = float(rindle_settings.WS_BURST)
        self.tokens = min(burst, self.tokens + (now - self.refill) * rate)
        self.refill = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True
