"""The host project's settings, with the read rule of ``tests.judges.read_rules``."""

from project.settings import *  # noqa: F403
from project.settings import RINDLE

RINDLE = {**RINDLE, "ADAPTER": "tests.judges.read_rules.HideComments"}
