"""A host project mounting some of rindle's planes under ``sync/`` (test_url_planes.py)."""

from django.urls import include, path

urlpatterns = [
    path("sync/", include("rindle_app.urls.app")),
    path("sync/", include("rindle_app.urls.ingest")),
    path("sync/", include("rindle_app.urls.rooms")),
    path("sync/", include("rindle_app.urls.ops")),
    # left out: daemon, sql, migrate, stream
]
