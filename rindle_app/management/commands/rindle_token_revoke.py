"""Revoke an API token by its prefix: ``python manage.py rindle_token_revoke PREFIX``."""

from django.core.management.base import BaseCommand, CommandError

from rindle_app import tokens
from rindle_app.models import RindleToken


class Command(BaseCommand):
    help = "Revoke the API token with the given prefix (the part after 'rdl_'). Idempotent."

    def add_arguments(self, parser):
        parser.add_argument("prefix", help="the token's prefix, or the whole token")

    def handle(self, *args, **options):
        prefix = tokens.split(options["prefix"]) or options["prefix"]
        try:
            token = tokens.revoke(prefix)
        except RindleToken.DoesNotExist:
            raise CommandError(f"no token with prefix {prefix!r}") from None
        self.stdout.write(f"Revoked token {token.prefix} ({token.name or token.user}).")
