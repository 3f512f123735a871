"""
Settings of the Celery worker the retention beat test starts: the host project's,
with stream retention as the only beat entry and a queue of the test's own.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import CELERY_BEAT_SCHEDULE

CELERY_TASK_DEFAULT_QUEUE = os.environ["RINDLE_TEST_CELERY_QUEUE"]
CELERY_BEAT_SCHEDULE = {
    name: entry
    for name, entry in CELERY_BEAT_SCHEDULE.items()
    if entry["task"] == "rindle_app.tasks.stream_retention"
}
