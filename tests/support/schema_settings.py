"""
Settings of the schema-change tests' child processes (``manage.py migrate``,
Daphne): the host project's, plus the test app ``tests.schema_app`` whose
migrations live in the package ``RINDLE_SCHEMA_MIGRATIONS`` names (a temporary
directory on ``PYTHONPATH``; unset: the app has no migrations, for
``--run-syncdb``) and whose models ``RINDLE_SCHEMA_SYNCED`` lists as synced.
"""

import os

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS, RINDLE

INSTALLED_APPS = [*INSTALLED_APPS, "tests.schema_app"]
MIGRATION_MODULES = {"schema_app": os.environ.get("RINDLE_SCHEMA_MIGRATIONS") or None}
_synced = [s for s in os.environ.get("RINDLE_SCHEMA_SYNCED", "").split(",") if s]
RINDLE = {**RINDLE, "SYNCED_MODELS": [*RINDLE["SYNCED_MODELS"], *_synced]}
