"""The original daemon's control plane, for ``@rindle/daemon-client`` (docs/daemon.md)."""

from django.urls import path

from ..api import daemon_views as daemon
from ._util import under

urlpatterns = [
    path("materialize", daemon.MaterializeView.as_view(), name="rindle-daemon-materialize"),
    path("dematerialize", daemon.DematerializeView.as_view(), name="rindle-daemon-dematerialize"),
    path("query", daemon.QueryOnceView.as_view(), name="rindle-daemon-query"),
    path("execute-sql-read", daemon.SqlReadView.as_view(), name="rindle-daemon-sql-read"),
    path("execute-sql-txn", daemon.SqlTxnView.as_view(), name="rindle-daemon-sql-txn"),
    path("reject-mutation", daemon.RejectMutationView.as_view(), name="rindle-daemon-reject"),
    path("migrate", daemon.DaemonMigrateView.as_view(), name="rindle-daemon-migrate"),
    path("stats", daemon.StatsView.as_view(), name="rindle-daemon-stats"),
    path("version", daemon.VersionView.as_view(), name="rindle-daemon-version"),
    *under(
        "mutate-session/",
        ("begin", daemon.SessionBeginView, "rindle-daemon-session-begin"),
        ("exec", daemon.SessionExecView, "rindle-daemon-session-exec"),
        ("query", daemon.SessionQueryView, "rindle-daemon-session-query"),
        ("commit", daemon.SessionCommitView, "rindle-daemon-session-commit"),
        ("rollback", daemon.SessionRollbackView, "rindle-daemon-session-rollback"),
    ),
]
