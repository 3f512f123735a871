"""
Run the watermarker standalone: ``python manage.py rindle_watermark [--once] [--database A]``.

For a fleet that sets ``RINDLE["STREAM_WATERMARKER"] = "external"`` (app servers
then run none), or beside embedded ones: every watermarker competes for the same
lease, so running more than one only adds standbys. It steps until SIGTERM or
SIGINT, then releases its lease (``safe_seq`` stays). ``--once`` runs one step
and prints its progress; exit status 0 on a step (a fence time-out included: it is
retryable), 1 when another process holds the lease.
"""

import json
import signal
import threading
from dataclasses import asdict

from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from rindle_app.exceptions import LeaseHeld


class Command(BaseCommand):
    help = (
        "Publish the outbox's safe_seq on PostgreSQL as the fleet's leased watermarker, "
        "until SIGTERM/SIGINT (--once: one step, printed as JSON)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one step and print it")
        parser.add_argument("--database", default=None, help="the database alias (RINDLE's)")

    def handle(self, *args, once=False, database=None, **options):
        from rindle_app.conf import rindle_settings
        from rindle_app.stream.watermark import Watermarker

        using = database or rindle_settings.DATABASE
        try:
            connections[using]
        except ConnectionDoesNotExist:
            raise CommandError(f"no database alias {using!r} in DATABASES") from None
        try:
            watermarker = Watermarker(using)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if once:
            return self._once(watermarker)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        self.stderr.write(f"rindle_watermark: {watermarker.owner} on {using!r}")
        try:
            watermarker.run(stop)
        finally:
            watermarker.close()
        self.stderr.write("rindle_watermark: stopped; lease released")

    def _once(self, watermarker):
        try:
            progress = watermarker.step()
        except LeaseHeld as exc:
            raise CommandError(str(exc), returncode=1) from None
        finally:
            watermarker.close()
        report = {**asdict(progress), "epoch": watermarker.stats.lease_epoch}
        self.stdout.write(json.dumps(report, sort_keys=True))
