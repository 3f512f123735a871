"""
Operations: the OpenAPI document and its viewers, Prometheus metrics, health.

django-prometheus's export is behind ``RINDLE["METRICS_AUTH"]`` (do not also include
``django_prometheus.urls``: its /metrics is open to anyone).
"""

from django.urls import path

from ..api.docs_views import OpenAPIView, RedocView, SwaggerView
from ..health import healthz
from ..metrics import metrics_view

urlpatterns = [
    path("api/schema/openapi", OpenAPIView.as_view(), name="rindle-openapi"),
    path("api/rindle/docs/", SwaggerView.as_view(url_name="rindle-openapi"), name="rindle-docs"),
    path("api/rindle/redoc/", RedocView.as_view(url_name="rindle-openapi"), name="rindle-redoc"),
    path("metrics", metrics_view, name="rindle-metrics"),
    path("healthz", healthz, name="rindle-healthz"),
]
