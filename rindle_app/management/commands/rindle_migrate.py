"""``manage.py rindle_migrate DIR``: apply a folder of ``*.sql`` migrations through the journal."""

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from rindle_app.engine import RindleError, get_engine, journal


class Command(BaseCommand):
    help = (
        "Apply every *.sql file of DIR in name order through the migrations journal "
        "(id = file stem; each file pure DDL or pure DML). Applied files are reported "
        "'present'; a changed file fails unless its first line is "
        "'-- OVERRIDE_HASH: <stored checksum>' and only comments or spacing changed. "
        "Stops at the first failure with a non-zero exit; earlier files stay applied."
    )

    def add_arguments(self, parser):
        parser.add_argument("directory", help="The folder of .sql migration files.")

    def handle(self, directory, **options):
        folder = Path(directory)
        if not folder.is_dir():
            raise CommandError(f"{folder} is not a directory")
        files = sorted(p for p in folder.glob("*.sql") if p.is_file())
        if not files:
            self.stdout.write(f"no .sql files in {folder}")
            return
        migrations = []
        for path in files:  # refuse a bad file before anything runs
            try:
                migrations.append(journal.parse_file(path))
            except RindleError as exc:
                raise CommandError(f"{path.name}: {exc.code}: {exc.message}") from None
        engine = get_engine()
        for migration in migrations:
            try:
                outcome = journal.apply(engine, migration)
            except RindleError as exc:
                raise CommandError(f"{migration.id}: {exc.code}: {exc.message}") from None
            self._report(migration, outcome)
        version = engine.write(journal.schema_version).value
        self.stdout.write(f"schema version: {version or '-'}")

    def _report(self, migration, outcome):
        if not outcome.applied:
            note = " (hash overridden)" if outcome.hash_overridden else ""
            self.stdout.write(f"present {migration.id}{note}")
            return
        report = outcome.report
        if outcome.kind == "dml":
            detail = f"dml, {report['rowChanges']} row changes"
        else:
            detail = f"ddl, {len(report['steps'])} statements"
        self.stdout.write(self.style.SUCCESS(f"applied {migration.id} ({detail})"))
        for step in migration.destructive:
            self.stdout.write(self.style.WARNING(f"[destructive] {migration.id}: {step.sql}"))
