"""Run conformance fixtures: ``python manage.py rindle_fixture FILE...``."""

import sys

from django.core.management.base import BaseCommand

from rindle_app.ivm.fixtures import run_fixture


class Command(BaseCommand):
    help = (
        "Run rindle diff fixtures (the original's format). Prints 'PASS name' or "
        "'FAIL name: why' per file; exits 0 only when every file passes."
    )

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", help="fixture JSON files")

    def handle(self, *args, **options):
        failed = 0
        for path in options["files"]:
            outcome = run_fixture(path)
            failed += not outcome.passed
            self.stdout.write(outcome.line())
        if failed:
            sys.exit(1)
