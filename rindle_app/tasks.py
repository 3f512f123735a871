"""
Celery tasks of rindle: the periodic sweeps. Schedule them with Celery beat (the
host project's ``CELERY_BEAT_SCHEDULE``); each is also a plain function to call on
a timer where no broker runs.
"""

import logging

from celery import shared_task

from .conf import rindle_settings
from .engine import outcomes

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
