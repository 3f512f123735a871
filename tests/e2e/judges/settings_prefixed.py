"""The host project's settings with rindle mounted under ``sync/`` (prefixed_urls.py)."""

from project.settings import *  # noqa: F403

ROOT_URLCONF = "tests.e2e.judges.prefixed_urls"
