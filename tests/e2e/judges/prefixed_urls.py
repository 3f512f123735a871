"""A host project mounting five of rindle's planes under ``sync/`` (test_prefixed_mount.py)."""

from django.urls import include, path

urlpatterns = [
    path("sync/", include("rindle_app.urls.app")),
    path("sync/", include("rindle_app.urls.daemon")),
    # @rindle/daemon-client also writes row changes (/apply-row-change-txn) and claims
    # room epochs (/claim-room-epoch, /room-lmids).
    path("sync/", include("rindle_app.urls.ingest")),
    path("sync/", include("rindle_app.urls.rooms")),
    path("sync/", include("rindle_app.urls.ops")),
]
