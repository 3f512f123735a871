"""The foreign-key audit page, run on demand from the outbox admin."""

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from ..engine import RindleError
from ..engine.audit import run_audit

# The foreign-key audit page: who may run it and how many rows it shows at most.
FK_AUDIT_PERMISSION = "rindle_app.view_changeevent"
FK_AUDIT_DEFAULT_ROWS = 100
FK_AUDIT_ROWS_LIMIT = 10_000


def fk_audit_context(audit):
    """Template context of a ``ForeignKeyAudit``: keys and violations as text cells."""
    return {
        "audit": audit,
        "checked": [
            {"table": k["table"], "columns": ", ".join(k["columns"]), "references": k["references"]}
            for k in audit.checked
        ],
        "violations": [
            {
                "table": v["table"],
                "pk": ", ".join(str(k) for k in v["pk"]),
                "values": ", ".join(f"{c} = {val}" for c, val in zip(v["columns"], v["values"])),
                "references": v["references"],
            }
            for v in audit.violations
        ],
    }


def fk_audit_page(model_admin, request):
    """
    The outbox admin's foreign-key audit, run on demand (``?max_rows=N``) with a cap. Open to
    whoever may view the outbox: it shows keys of synced rows, as the outbox does.
    """
    if not request.user.has_perm(FK_AUDIT_PERMISSION):
        raise PermissionDenied
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Foreign key audit",
        "opts": model_admin.opts,
        "max_rows": FK_AUDIT_DEFAULT_ROWS,
        "max_rows_limit": FK_AUDIT_ROWS_LIMIT,
    }
    status = 200
    raw = request.GET.get("max_rows")
    if raw is not None:
        max_rows = raw.strip()
        # Length first: int() refuses (ValueError) text of thousands of digits.
        if not (len(max_rows) <= 6 and max_rows.isdecimal()) or not (
            1 <= int(max_rows) <= FK_AUDIT_ROWS_LIMIT
        ):
            context["error"] = f"The cap must be a whole number from 1 to {FK_AUDIT_ROWS_LIMIT}."
            status = 400
        else:
            context["max_rows"] = int(max_rows)
            try:
                context.update(fk_audit_context(run_audit(max_rows=int(max_rows))))
            except RindleError as exc:  # a synced table is missing: migrate first
                context["error"] = exc.message
                status = 503
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/rindle_app/fk_audit.html", context, status=status)
