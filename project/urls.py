"""URL routes of the host project."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("rindle_app.urls")),
    path("", include("project.demo.urls")),
]
