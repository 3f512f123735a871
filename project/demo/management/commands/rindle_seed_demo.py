"""``manage.py rindle_seed_demo``: fill the issue tracker with deterministic sample data."""

import random
import secrets
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from rindle_app.runtime import get_runtime

from ...models import PRIORITIES, STATUSES

USERS = [
    ("unassigned", "Unassigned"),
    ("ada", "Ada Lovelace"),
    ("alan", "Alan Turing"),
    ("barbara", "Barbara Liskov"),
    ("dennis", "Dennis Ritchie"),
    ("donald", "Donald Knuth"),
    ("edsger", "Edsger Dijkstra"),
    ("frances", "Frances Allen"),
    ("grace", "Grace Hopper"),
    ("john", "John Backus"),
    ("ken", "Ken Thompson"),
    ("leslie", "Leslie Lamport"),
    ("margaret", "Margaret Hamilton"),
    ("niklaus", "Niklaus Wirth"),
    ("radia", "Radia Perlman"),
    ("richard", "Richard Hamming"),
    ("shafi", "Shafi Goldwasser"),
    ("sophie", "Sophie Wilson"),
    ("tony", "Tony Hoare"),
    ("linus", "Linus Torvalds"),
]
VERBS = ["Fix", "Add", "Remove", "Refactor", "Document", "Speed up", "Test", "Polish"]
NOUNS = [
    "login form",
    "search index",
    "issue board",
    "comment editor",
    "tag picker",
    "sync engine",
    "websocket reconnect",
    "dark mode",
    "export to CSV",
    "keyboard shortcuts",
    "notification badge",
    "settings page",
]
QUALIFIERS = ["", "on mobile", "for large teams", "after reconnect", "in Safari", "again"]
TAGS = ["bug", "feature", "ui", "backend", "perf", "docs", "infra", "security", "ux", "api"]
SENTENCES = [
    "Steps to reproduce are in the linked thread.",
    "This regressed in the last release.",
    "Customers have asked for this twice this week.",
    "A small change, but it touches the hot path.",
    "Needs a design review before it lands.",
    "Looks fine to me; shipping behind a flag.",
    "I can take this one.",
    "Blocked on the schema migration.",
]
# 2024-01-01T00:00:00Z in epoch milliseconds; issues are an hour apart after it.
EPOCH_MS = 1_704_067_200_000.0
HOUR_MS = 3_600_000.0


def seed_rows(issues, seed):
    """Yield ``(table, row)`` for the sample data; the same arguments give the same rows."""
    for user_id, name in USERS:
        yield "user", {"id": user_id, "name": name}
    people = [user_id for user_id, _ in USERS[1:]]
    for n in range(issues):
        rng = random.Random(f"{seed}:{n}")
        issue_id = f"s{seed}-i{n:06d}"
        created = EPOCH_MS + n * HOUR_MS + rng.randrange(3_600) * 1000.0
        title = " ".join(
            w for w in (rng.choice(VERBS), rng.choice(NOUNS), rng.choice(QUALIFIERS)) if w
        )
        comments = rng.randrange(4)
        yield (
            "issue",
            {
                "id": issue_id,
                "title": title,
                "status": rng.choice(STATUSES),
                "priority": rng.choice(PRIORITIES),
                "ownerId": "unassigned" if rng.random() < 0.1 else rng.choice(people),
                "createdAt": created,
                "updatedAt": created + comments * 600_000.0,
            },
        )
        for k, name in enumerate(rng.sample(TAGS, rng.randrange(4))):
            yield "tag", {"id": f"{issue_id}-t{k}", "issueId": issue_id, "name": name}
        for k in range(comments + 1):  # comment 0 is the description
            yield (
                "comment",
                {
                    "id": f"{issue_id}-c{k}",
                    "issueId": issue_id,
                    "authorId": rng.choice(people),
                    "body": " ".join(rng.sample(SENTENCES, rng.randrange(1, 4))),
                    "createdAt": created + k * 600_000.0,
                },
            )


class Command(BaseCommand):
    help = (
        "Insert deterministic sample users, issues, tags and comments in one engine "
        "write. Rows that exist are left alone, so running it again inserts nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("--issues", type=int, default=5000, help="issues to create")
        parser.add_argument("--seed", type=int, default=1, help="seed of the sample data")
        parser.add_argument(
            "--no-admin",
            action="store_true",
            help="do not create the demo admin (which is only ever created under DEBUG)",
        )

    def handle(self, *args, issues, seed, no_admin=False, **options):
        if issues < 0:
            raise CommandError("--issues must not be negative")
        counts = dict.fromkeys(["user", "issue", "tag", "comment"], 0)

        def write(tx):
            for table, row in seed_rows(issues, seed):
                counts[table] += tx.insert_ignore(table, row)

        started = time.monotonic()
        commit = get_runtime(None).engine.write(write)  # None: RINDLE["DATABASE"]
        elapsed = time.monotonic() - started
        total = sum(counts.values())
        detail = ", ".join(f"{n} {table}" for table, n in counts.items())
        self.stdout.write(f"Inserted {total} rows ({detail}) in {elapsed:.1f}s at cv {commit.cv}.")
        self.stdout.write(self.admin_login(create=not no_admin))

    def admin_login(self, create):
        """
        How to sign in to /admin/. Under DEBUG, with no superuser yet, a demo admin
        ``admin`` with a random password printed once; never with DEBUG off, where a
        printed password would end up in a deployment's logs.
        """
        users = get_user_model()
        superuser = users.objects.filter(is_superuser=True).order_by("pk").first()
        if superuser is not None:
            return (
                f"Admin: sign in at /admin/ as {superuser.get_username()!r} "
                f"(`python manage.py changepassword {superuser.get_username()}` resets it)."
            )
        if not (settings.DEBUG and create):
            return "Admin: `python manage.py createsuperuser` creates a login for /admin/."
        password = secrets.token_urlsafe(12)
        users.objects.create_superuser("admin", "admin@example.com", password)
        return f"Admin (demo only, DEBUG): sign in at /admin/ as 'admin', password {password}"
