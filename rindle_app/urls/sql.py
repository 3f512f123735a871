"""Public SQL: one-shot statements, atomic batches and interactive transactions."""

from django.urls import path

from ..api import sql_views as sql
from ._util import under

urlpatterns = [
    path("v1/sql/execute", sql.ExecuteView.as_view(), name="rindle-sql-execute"),
    path("v1/sql/batch", sql.BatchView.as_view(), name="rindle-sql-batch"),
    path("v1/sql/transactions", sql.TransactionsView.as_view(), name="rindle-sql-begin"),
    *under(
        "v1/sql/transactions/<str:transaction_id>/",
        ("execute", sql.TransactionExecuteView, "rindle-sql-txn-execute"),
        ("commit", sql.TransactionCommitView, "rindle-sql-txn-commit"),
        ("rollback", sql.TransactionRollbackView, "rindle-sql-txn-rollback"),
    ),
]
