"""Websocket routes of rindle (the live-query consumer lands at /ws/rindle/)."""

websocket_urlpatterns = []
