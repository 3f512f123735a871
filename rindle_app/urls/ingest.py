"""Machine writes: foreign producers and change sources (room flushes arrive here too)."""

from django.urls import path

from ..api import ingest_views as ingest
from ._util import under

urlpatterns = [
    path("v1/producers/write", ingest.ProducerWriteView.as_view(), name="rindle-producer-write"),
    path("v1/producers/<str:producer>", ingest.ProducerSeqView.as_view(), name="rindle-producer"),
    path("apply-row-change-txn", ingest.ApplyRowChangeTxnView.as_view(), name="rindle-apply-txn"),
    *under(
        "v1/sources/<str:source>/",
        ("batches", ingest.SourceBatchView, "rindle-source"),
        ("checkpoint", ingest.SourceCheckpointView, "rindle-source-checkpoint"),
        ("run-id", ingest.SourceRunIdView, "rindle-source-run-id"),
    ),
]
