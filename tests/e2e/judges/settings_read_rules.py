"""The host project's settings, with the read rule of ``tests.support.adapters.HideComments``."""

from project.settings import *  # noqa: F403
from project.settings import RINDLE

RINDLE = {**RINDLE, "ADAPTER": "tests.support.adapters.HideComments"}
