"""The public change stream (``/v1/stream``, docs/stream.md)."""

from django.urls import path

from ..api import stream_views

urlpatterns = [
    path("v1/stream", stream_views.StreamView.as_view(), name="rindle-stream"),
]
