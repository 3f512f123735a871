"""
HTTP routes of rindle, one URLconf per plane. Include them all, at the site root or
under a prefix::

    path("", include("rindle_app.urls")),       # every plane (the routes of docs/protocol.md)
    path("sync/", include("rindle_app.urls")),  # the same under /sync/

or only the planes a deployment serves, each under the same prefix::

    path("sync/", include("rindle_app.urls.app")),  # what the browser client needs
    path("sync/", include("rindle_app.urls.ops")),  # OpenAPI, its viewer, metrics, health

The planes: ``app`` (leases, reads, mutations, the client schema), ``daemon`` (the
original daemon's control plane), ``sql`` (public SQL), ``migrate`` (the migrations
journal), ``ingest`` (producers and change sources), ``rooms`` (the room write
authority and ``room-boot``; its flushes go through ``ingest``), ``stream`` (the
public change stream) and ``ops``. A plane left out answers 404. URL names are the
same whichever way they are included, so ``reverse("rindle-mutate")`` works under a
prefix. The websocket routes go under the same prefix (``rindle_app.asgi``).
"""

from importlib import import_module

PLANES = ("app", "daemon", "sql", "migrate", "ingest", "rooms", "stream", "ops")

# Flat, as before the split: code walking these patterns sees every route.
urlpatterns = [
    pattern for plane in PLANES for pattern in import_module(f"rindle_app.urls.{plane}").urlpatterns
]
