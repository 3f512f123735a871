"""Write the client schema as TypeScript: ``python manage.py rindle_schema_ts -o schema.gen.ts``."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from rindle_app.engine import RindleError
from rindle_app.engine.registry import introspect_tables
from rindle_app.schema_ts import render


class Command(BaseCommand):
    help = (
        "Write a TypeScript module defining the synced tables for @rindle/client "
        "(the tables GET /schema lists), to stdout or --output."
    )

    def add_arguments(self, parser):
        parser.add_argument("--output", "-o", help="the file to write (default: stdout)")
        parser.add_argument("--database", default=None, help="database alias (default: rindle's)")

    def handle(self, *args, **options):
        try:
            tables = introspect_tables(options["database"]).base_table_schemas()
        except RindleError as exc:  # a synced table missing: migrate first
            raise CommandError(exc.message) from None
        text = render(tables)
        if options["output"]:
            Path(options["output"]).write_text(text, encoding="utf-8")
            self.stderr.write(f"Wrote {len(tables)} table(s) to {options['output']}.")
        else:
            self.stdout.write(text, ending="")
