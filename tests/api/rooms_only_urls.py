"""A host project mounting the rooms plane without the ingest plane (rindle.E041)."""

from django.urls import include, path

urlpatterns = [
    path("", include("rindle_app.urls.app")),
    path("", include("rindle_app.urls.rooms")),
]
