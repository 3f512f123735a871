"""Websocket routes of rindle: include ``websocket_urlpatterns`` in the ASGI router."""

from django.urls import path

from .realtime.consumer import RindleConsumer

websocket_urlpatterns = [path("ws/rindle/", RindleConsumer.as_asgi())]
