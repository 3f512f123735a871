"""The migrations journal over HTTP (``/v1/sql/migrate``)."""

from django.urls import path

from ..api import migrate_views

urlpatterns = [
    path("v1/sql/migrate", migrate_views.MigrateView.as_view(), name="rindle-sql-migrate"),
]
