"""
Celery tasks of rindle: the periodic sweeps. Schedule them with Celery beat (the
host project's ``CELERY_BEAT_SCHEDULE``); each is also a plain function to call on
a timer where no broker runs.
"""

import logging

from celery import shared_task

from .conf import rindle_settings
from .engine import outcomes
from .flow import tick

logger = logging.getLogger("rindle.tasks")


@shared_task(name="rindle_app.tasks.sweep_sql_outcomes", ignore_result=True)
def sweep_sql_outcomes(now_ms=None):
    """
    Delete the public SQL outcomes whose retention ended (and only those), in one
    short transaction; return how many went.
    """
    removed = outcomes.sweep(rindle_settings.DATABASE, now_ms)
    if removed:
        logger.info("rindle: swept %d expired SQL outcome(s)", removed)
    return removed


@shared_task(name="rindle_app.tasks.flow_tick", ignore_result=True)
def flow_tick(now_ms=None):
    """
    The usage ledger's periodic job in a worker (every minute): flush this
    process's ledger, which drops the rows past the kept window, and cache the
    fleet's figure for the operator's band. Web processes flush their own counters
    (``rindle_app.flow.tick``): a worker cannot reach them.
    """
    summary = tick.beat(now_ms)
    logger.info(
        "rindle: flow tick wrote %d row(s); %d namespace(s), %d active, %d silent",
        summary["written"],
        summary["namespaces"],
        summary["active"],
        summary["silent"],
    )
    return summary
