"""
HTTP routes of rindle. Include them at the site root::

    path("", include("rindle_app.urls")),
"""

from django.urls import path
from drf_spectacular.views import SpectacularAPIView

from .api import daemon_views as daemon
from .api import ingest_views as ingest
from .api import migrate_views, room_views, stream_views, views
from .api import sql_views as sql
from .health import healthz
from .metrics import metrics_view


def _under(prefix, *routes):
    """Flat routes ``(suffix, view class, name)`` under one prefix (each its own URLPattern)."""
    return [path(prefix + suffix, view.as_view(), name=name) for suffix, view, name in routes]


urlpatterns = [
    path("api/rindle/query", views.QueryView.as_view(), name="rindle-query"),
    path("api/rindle/read", views.ReadView.as_view(), name="rindle-read"),
    path("api/rindle/mutate", views.MutateView.as_view(), name="rindle-mutate"),
    path("schema", views.SchemaView.as_view(), name="rindle-schema"),
    path("v1/producers/write", ingest.ProducerWriteView.as_view(), name="rindle-producer-write"),
    path("v1/producers/<str:producer>", ingest.ProducerSeqView.as_view(), name="rindle-producer"),
    path("apply-row-change-txn", ingest.ApplyRowChangeTxnView.as_view(), name="rindle-apply-txn"),
    path("claim-room-epoch", ingest.ClaimRoomEpochView.as_view(), name="rindle-claim-room-epoch"),
    path("room-lmids", ingest.RoomLmidsView.as_view(), name="rindle-room-lmids"),
    # The original daemon's control plane (@rindle/daemon-client; docs/daemon.md).
    path("materialize", daemon.MaterializeView.as_view(), name="rindle-daemon-materialize"),
    path("dematerialize", daemon.DematerializeView.as_view(), name="rindle-daemon-dematerialize"),
    path("query", daemon.QueryOnceView.as_view(), name="rindle-daemon-query"),
    path("execute-sql-read", daemon.SqlReadView.as_view(), name="rindle-daemon-sql-read"),
    path("execute-sql-txn", daemon.SqlTxnView.as_view(), name="rindle-daemon-sql-txn"),
    path("reject-mutation", daemon.RejectMutationView.as_view(), name="rindle-daemon-reject"),
    path("migrate", daemon.DaemonMigrateView.as_view(), name="rindle-daemon-migrate"),
    path("stats", daemon.StatsView.as_view(), name="rindle-daemon-stats"),
    path("version", daemon.VersionView.as_view(), name="rindle-daemon-version"),
    *_under(
        "mutate-session/",
        ("begin", daemon.SessionBeginView, "rindle-daemon-session-begin"),
        ("exec", daemon.SessionExecView, "rindle-daemon-session-exec"),
        ("query", daemon.SessionQueryView, "rindle-daemon-session-query"),
        ("commit", daemon.SessionCommitView, "rindle-daemon-session-commit"),
        ("rollback", daemon.SessionRollbackView, "rindle-daemon-session-rollback"),
    ),
    path("api/rindle/room-boot", room_views.RoomBootView.as_view(), name="rindle-room-boot"),
    *_under(
        "v1/sources/<str:source>/",
        ("batches", ingest.SourceBatchView, "rindle-source"),
        ("checkpoint", ingest.SourceCheckpointView, "rindle-source-checkpoint"),
        ("run-id", ingest.SourceRunIdView, "rindle-source-run-id"),
    ),
    path("v1/sql/migrate", migrate_views.MigrateView.as_view(), name="rindle-sql-migrate"),
    path("v1/sql/execute", sql.ExecuteView.as_view(), name="rindle-sql-execute"),
    path("v1/sql/batch", sql.BatchView.as_view(), name="rindle-sql-batch"),
    path("v1/sql/transactions", sql.TransactionsView.as_view(), name="rindle-sql-begin"),
    *_under(
        "v1/sql/transactions/<str:transaction_id>/",
        ("execute", sql.TransactionExecuteView, "rindle-sql-txn-execute"),
        ("commit", sql.TransactionCommitView, "rindle-sql-txn-commit"),
        ("rollback", sql.TransactionRollbackView, "rindle-sql-txn-rollback"),
    ),
    path("v1/stream", stream_views.StreamView.as_view(), name="rindle-stream"),
    path("api/schema/openapi", SpectacularAPIView.as_view(), name="rindle-openapi"),
    # django-prometheus's export behind RINDLE["METRICS_AUTH"] (do not also include
    # django_prometheus.urls: its /metrics is open to anyone).
    path("metrics", metrics_view, name="rindle-metrics"),
    path("healthz", healthz, name="rindle-healthz"),
]
