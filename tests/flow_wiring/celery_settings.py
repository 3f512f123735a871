"""
Settings of the Celery worker the beat test starts: the host project's, with the
flow tick as the only beat entry, a queue of the test's own, and a file cache the
test process can read the cached fleet from.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import CELERY_BEAT_SCHEDULE

CELERY_TASK_DEFAULT_QUEUE = os.environ["RINDLE_TEST_CELERY_QUEUE"]
CELERY_BEAT_SCHEDULE = {
    name: entry
    for name, entry in CELERY_BEAT_SCHEDULE.items()
    if entry["task"] == "rindle_app.tasks.flow_tick"
}
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": os.environ["RINDLE_TEST_CACHE_DIR"],
    }
}
