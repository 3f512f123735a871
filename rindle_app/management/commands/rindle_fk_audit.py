"""
Audit declared foreign keys: ``python manage.py rindle_fk_audit [--max-rows N] [--json]``.

Exit status: 0 when no violation was found, 1 when some were (the report lists
them, at most ``--max-rows``), 2 when the audit could not run (bad arguments, a
synced table missing).
"""

import argparse
import json

from django.core.management.base import BaseCommand, CommandError
from django.core.serializers.json import DjangoJSONEncoder
from django.utils.connection import ConnectionDoesNotExist

from rindle_app.engine import RindleError
from rindle_app.engine.audit import run_audit

DEFAULT_MAX_ROWS = 1000
# The report is held in memory; past this a cap is a typo, not a plan.
MAX_ROWS_LIMIT = 10**9


def audit_report(audit, max_rows):
    """The audit as a JSON-ready dict (the ``--json`` output)."""
    return {
        "ok": audit.ok,
        "maxRows": max_rows,
        "truncated": audit.truncated,
        "checked": audit.checked,
        "violations": audit.violations,
    }


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 1 <= value <= MAX_ROWS_LIMIT:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_ROWS_LIMIT}, got {value}")
    return value


class ReportEncoder(DjangoJSONEncoder):
    """Key values as JSON: dates, decimals and UUIDs as text, bytes as hex."""

    def default(self, o):
        if isinstance(o, (bytes, bytearray, memoryview)):
            return bytes(o).hex()
        try:
            return super().default(o)
        except TypeError:
            return str(o)


class Command(BaseCommand):
    help = (
        "Walk every declared foreign key of rindle's registered tables and report rows "
        "whose reference has no target (read-only; at most --max-rows rows). Exit "
        "status: 0 clean, 1 violations found, 2 the audit could not run."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--max-rows",
            type=positive_int,
            default=DEFAULT_MAX_ROWS,
            help=f"report at most this many violating rows (default {DEFAULT_MAX_ROWS})",
        )
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--database", default=None, help="database alias (default: rindle's)")

    def handle(self, *args, **options):
        max_rows = options["max_rows"]
        try:
            audit = run_audit(options["database"], max_rows)
        except RindleError as exc:  # a synced table missing: migrate first
            raise CommandError(exc.message, returncode=2) from None
        except ConnectionDoesNotExist as exc:
            raise CommandError(str(exc), returncode=2) from None
        if options["json"]:
            self.stdout.write(json.dumps(audit_report(audit, max_rows), cls=ReportEncoder))
        else:
            self.write_text(audit, max_rows)
        if not audit.ok:
            noun = "violation" if len(audit.violations) == 1 else "violations"
            more = " (truncated)" if audit.truncated else ""
            raise CommandError(
                f"{len(audit.violations)} foreign key {noun} found{more}", returncode=1
            )

    def write_text(self, audit, max_rows):
        out = self.stdout
        out.write(f"Checked {len(audit.checked)} foreign key(s):")
        for key in audit.checked:
            out.write(f"  {key['table']}({', '.join(key['columns'])}) -> {key['references']}")
        if audit.ok:
            out.write(self.style.SUCCESS("No violations."))
            return
        out.write(self.style.ERROR(f"{len(audit.violations)} violating row(s):"))
        for v in audit.violations:
            values = ", ".join(f"{c}={val!r}" for c, val in zip(v["columns"], v["values"]))
            pk = ", ".join(repr(k) for k in v["pk"])
            out.write(f"  {v['table']} [{pk}]: {values} has no row in {v['references']}")
        if audit.truncated:
            out.write(
                self.style.WARNING(
                    f"Truncated at --max-rows {max_rows}: more violations may exist."
                )
            )
