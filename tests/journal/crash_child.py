"""
Child process of ``tests/journal/test_crash.py``: runs ``rindle_migrate DIR`` until done or killed.

Run with ``child_env()`` so Django uses the parent test run's database. Usage::

    python tests/journal/crash_child.py DIR SEED

Each statement of each migration is followed by a random pause of up to ``PACE``
seconds inside the migration's transaction (a step effect), so the parent's
SIGKILL lands between the statements of a migration as often as between
migrations. Protocol on stdout: ``STARTED`` once the engine runs, the command's
own lines, then ``DONE``.
"""

import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from rindle_app.engine import get_engine, journal  # noqa: E402

PACE = 0.02


def main(folder, seed):
    rng = random.Random(seed)
    apply = journal.apply

    def paced(engine, migration, *, on_step=None):
        return apply(engine, migration, on_step=lambda tx, step: time.sleep(rng.random() * PACE))

    journal.apply = paced
    get_engine()
    sys.stdout.write("STARTED\n")
    sys.stdout.flush()
    call_command("rindle_migrate", folder, stdout=sys.stdout)
    sys.stdout.write("DONE\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
