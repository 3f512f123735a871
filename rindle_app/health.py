"""
``GET /healthz``: whether this app server can serve, for load balancers and probes.

- ``ok`` (200): the database answers and the change stream keeps up.
- ``degraded`` (200): the database answers, but the watermark has lagged longer than
  STREAM_HEALTH_LAG_SECONDS, or a transaction has held the outbox fence that long.
  The body names the lag, its age and the offending backend pid. It stays 200 on
  purpose: the cause is one session in the shared database, the same for every app
  server, so taking servers out of rotation would not help and would turn a stall
  of live updates into an outage. Alert on it (or on the ``rindle_stream_*``
  gauges) instead.
- ``unavailable`` (503): the database cannot be read within the status read's
  statement timeout; this server cannot serve, so a balancer should route around it.

It is open to any caller (a probe has no credentials) and shows numbers and a pid,
never query text: the admin's stream page shows that to staff.
"""

import logging

from django.db import DatabaseError
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .conf import rindle_settings
from .stream import status

logger = logging.getLogger("rindle.health")


@never_cache
@require_safe
def healthz(request):
    using = rindle_settings.DATABASE
    try:
        current = status.sample(using, fenced_limit=5)
    except DatabaseError as exc:
        logger.warning("rindle healthz: the database cannot be read: %s", exc)
        return JsonResponse({"status": "unavailable", "database": "unavailable"}, status=503)
    limit = float(rindle_settings.STREAM_HEALTH_LAG_SECONDS)
    oldest = current.oldest_fenced
    reasons = []
    if current.lag and current.lag_seconds > limit:
        reasons.append("watermark_lag")
    if oldest is not None and (oldest.age_seconds or 0.0) > limit:
        reasons.append("long_fenced_transaction")
    return JsonResponse(
        {
            "status": "degraded" if reasons else "ok",
            "reasons": reasons,
            "database": "ok",
            "stream": {
                "epoch": current.epoch,
                "safe_seq": current.safe_seq,
                "max_seq": current.max_seq,
                "horizon": current.horizon,
                "lag": current.lag,
                "lag_seconds": round(current.lag_seconds, 3),
                "threshold_seconds": limit,
                "oldest_fenced_transaction": None
                if oldest is None
                else {
                    "pid": oldest.pid,
                    "age_seconds": None
                    if oldest.age_seconds is None
                    else round(oldest.age_seconds, 3),
                    "state": oldest.state,
                },
            },
        }
    )
