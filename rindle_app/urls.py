"""
HTTP routes of rindle. Include them at the site root::

    path("", include("rindle_app.urls")),
"""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from .api import views

urlpatterns = [
    path("api/rindle/query", views.QueryView.as_view(), name="rindle-query"),
    path("api/rindle/read", views.ReadView.as_view(), name="rindle-read"),
    path("api/rindle/mutate", views.MutateView.as_view(), name="rindle-mutate"),
    path("schema", views.SchemaView.as_view(), name="rindle-schema"),
    path("api/schema/openapi", SpectacularAPIView.as_view(), name="rindle-openapi"),
]
