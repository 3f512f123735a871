"""Create an API token: ``python manage.py rindle_token_create --user NAME --scope read``."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from rindle_app import tokens


class Command(BaseCommand):
    help = (
        "Create a scoped bearer token for a user and print it. The token is shown "
        "only this once; the database keeps its prefix and a hash."
    )

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="the owner's username")
        parser.add_argument(
            "--scope",
            action="append",
            required=True,
            choices=tokens.SCOPES,
            help="a scope to grant (repeat for several)",
        )
        parser.add_argument("--name", default="", help="what the token is for")
        parser.add_argument(
            "--table",
            action="append",
            default=[],
            help="a table public SQL with this token may write (repeat for several)",
        )
        parser.add_argument(
            "--expires-days", type=int, default=None, help="days until it expires (default: never)"
        )

    def handle(self, *args, **options):
        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(options["user"])
        except model.DoesNotExist:
            raise CommandError(f"no user {options['user']!r}") from None
        days = options["expires_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-days must be at least 1")
        expires_at = timezone.now() + timedelta(days=days) if days is not None else None
        raw, token = tokens.create(
            user,
            options["scope"],
            name=options["name"][:100],
            expires_at=expires_at,
            tables=options["table"],
        )
        self.stderr.write(
            f"Created token {token.prefix} for {user} with scopes "
            f"{', '.join(token.scopes)}; it is shown only this once:"
        )
        self.stdout.write(raw)
