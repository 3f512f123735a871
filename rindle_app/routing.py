"""
Websocket routes of rindle: include ``websocket_urlpatterns`` in the ASGI router, or
``websocket_urlpatterns_under("sync/")`` beside ``path("sync/", include("rindle_app.urls"))``
(``rindle_app.asgi.application(prefix=...)`` does either).
"""

from django.urls import path

from .realtime.consumer import RindleConsumer
from .realtime.room_consumer import RoomConsumer

websocket_urlpatterns = [
    path("ws/rindle/", RindleConsumer.as_asgi()),
    path("ws/rindle/room/", RoomConsumer.as_asgi()),
]


def websocket_urlpatterns_under(prefix=""):
    """The websocket routes under ``prefix`` (``""``, or a path ending in ``/``)."""
    if not prefix:
        return websocket_urlpatterns
    if prefix.startswith("/") or not prefix.endswith("/"):
        raise ValueError(f"a websocket prefix is like 'sync/' (no leading '/'), not {prefix!r}")
    return [path(prefix + p.pattern._route, p.callback) for p in websocket_urlpatterns]
