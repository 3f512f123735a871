"""
The app plane: what the browser client (and ``@rindle/remote``, ``@rindle/optimistic``)
needs besides the websocket: leases, one-shot reads, mutations, the client schema.
"""

from django.urls import path

from ..api import views

urlpatterns = [
    path("api/rindle/query", views.QueryView.as_view(), name="rindle-query"),
    path("api/rindle/read", views.ReadView.as_view(), name="rindle-read"),
    path("api/rindle/mutate", views.MutateView.as_view(), name="rindle-mutate"),
    path("schema", views.SchemaView.as_view(), name="rindle-schema"),
]
