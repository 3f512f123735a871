"""
Settings of the Celery worker a beat test starts (``celery_beat_worker`` in
tests/conftest.py): the host project's, with one beat entry, the task named by
``RINDLE_TEST_CELERY_TASK``, and a queue of the test's own, so workers of concurrent
test runs on the same broker never take its tasks. With ``RINDLE_TEST_CACHE_DIR``
set, a file cache there, so the test process can read what the worker cached.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import CELERY_BEAT_SCHEDULE

CELERY_TASK_DEFAULT_QUEUE = os.environ["RINDLE_TEST_CELERY_QUEUE"]
CELERY_BEAT_SCHEDULE = {
    name: entry
    for name, entry in CELERY_BEAT_SCHEDULE.items()
    if entry["task"] == os.environ["RINDLE_TEST_CELERY_TASK"]
}
if os.environ.get("RINDLE_TEST_CACHE_DIR"):
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": os.environ["RINDLE_TEST_CACHE_DIR"],
        }
    }
