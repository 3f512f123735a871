"""bench/room_live.py's server settings: the project's, without the per-socket frame rate cap."""

from project.settings import *  # noqa: F403
from project.settings import RINDLE

# The bench measures the server's capacity: one socket may send as fast as it can.
RINDLE = {**RINDLE, "WS_RATE": 1_000_000, "WS_BURST": 1_000_000}
