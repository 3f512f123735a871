"""
Settings of the Celery worker the sweep test starts: the host project's, with the
beat entries other than the SQL outcome sweep left out and a queue of the test's
own, so workers of concurrent test runs on the same broker never take its tasks.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import CELERY_BEAT_SCHEDULE

CELERY_TASK_DEFAULT_QUEUE = os.environ["RINDLE_TEST_CELERY_QUEUE"]
CELERY_BEAT_SCHEDULE = {
    name: entry
    for name, entry in CELERY_BEAT_SCHEDULE.items()
    if entry["task"] == "rindle_app.tasks.sweep_sql_outcomes"
}
