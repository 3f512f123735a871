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


@shared_task(name="rindle_app.tasks.stream_retention", ignore_result=True)
def stream_retention():
    """
    Prune the outbox (``rindle_app.stream.retention``): the prefix older than
    ``STREAM_RETENTION_SECONDS``, in batches, each raising the horizon in its own
    transaction, after a restore check. Beat runs it every
    ``STREAM_RETENTION_PERIOD_SECONDS``; the embedded mode runs the same function on
    the runtime's timer (both at once are harmless). Returns a summary for the log.
    """
    from .runtime import get_runtime

    run = get_runtime(rindle_settings.DATABASE).retention().run_once()
    logger.info(
        "rindle: stream retention pruned %d row(s) in %d batch(es); horizon %d%s",
        run.pruned,
        run.batches,
        run.horizon,
        "; a new epoch was minted" if run.minted else "",
    )
    return {"pruned": run.pruned, "batches": run.batches, "horizon": run.horizon}
