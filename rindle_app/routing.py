"""Websocket routes of rindle: include ``websocket_urlpatterns`` in the ASGI router."""

from django.urls import path

from .realtime.consumer import RindleConsumer
from .realtime.room_consumer import RoomConsumer

websocket_urlpatterns = [
    path("ws/rindle/", RindleConsumer.as_asgi()),
    path("ws/rindle/room/", RoomConsumer.as_asgi()),
]
