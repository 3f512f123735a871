"""Create or refresh the public SQL sandbox roles: ``python manage.py rindle_sql_role``."""

from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from rindle_app.conf import rindle_settings
from rindle_app.engine.public_sql import SqlError, sandbox


class Command(BaseCommand):
    help = (
        "Create the PostgreSQL roles public SQL runs as (NOLOGIN; SELECT on the app's "
        "unprotected tables; one write role per token table set) and refresh their "
        "grants. Idempotent; migrate runs it too. Prints the SQL a superuser must run "
        "for what this database user may not do itself."
    )

    def add_arguments(self, parser):
        parser.add_argument("--database", default=None, help="the alias (default: rindle's)")

    def handle(self, *args, **options):
        alias = options["database"] or rindle_settings.DATABASE
        if connections[alias].vendor != "postgresql":
            self.stdout.write("Not PostgreSQL: public SQL is sandboxed by SQLite's authorizer.")
            return
        try:
            needed = sandbox.install(alias)
        except SqlError as exc:
            self.stderr.write(exc.message)
            for statement in sandbox.superuser_sql(alias):
                self.stderr.write(statement)
            raise CommandError("the public SQL sandbox is not usable") from None
        self.stdout.write(f"Sandbox role {sandbox.base_role()!r} is ready.")
        if needed:
            self.stdout.write("Recommended, as a superuser in this database:")
            for statement in needed:
                self.stdout.write(statement)
