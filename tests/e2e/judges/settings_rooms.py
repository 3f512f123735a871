"""The host project's settings with rooms on, and occupancy that expires in seconds."""

from project.settings import *  # noqa: F403
from project.settings import RINDLE

RINDLE = {**RINDLE, "ROOMS_ENABLED": True, "ROOM_SESSION_TTL": 1, "ROOM_SESSION_GRACE": 1}
