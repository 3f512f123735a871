"""
bench/datascale.py's data: the demo's issue tracker bulk-generated at N synced rows.

Run as a child process (``bench/datascale.py --child generate``) with DATABASE_URL
set: it migrates the database with this checkout's code (which installs the
capture triggers), checks that every synced table has its triggers, then fills the
tables with set-based SQL, ``INSERT ... SELECT`` over a recursive CTE (SQLite) or
``generate_series`` (PostgreSQL), one transaction per chunk of issues. Nothing is
dropped or bypassed: every row goes through its capture trigger into the outbox,
and the outbox must grow by exactly the rows inserted.

The shape is the demo seed's (``rindle_seed_demo``): its 20 users, then per issue
0-3 tags (1.5 on average) and 1-4 comments (the description and 0-3 more, 2.5 on
average), so 5 rows per issue; 25k rows is the demo's default of 5,000 issues. The
values are drawn with the seed's word lists and distributions (status, priority,
owner with 10 % unassigned, an hour between issues, ten minutes between comments),
from integer hashes of the row number instead of Python's RNG, so the same N gives
the same rows on either backend.

Afterwards the outbox is pruned the way production prunes it: ``Retention`` with
the default 7-day age, run on a clock 8 days ahead (what the outbox of a database
loaded more than a week ago holds: the newest captured row only). On PostgreSQL the
watermark is published first (retention prunes at or below ``safe_seq`` only).
Then ``ANALYZE``.

It also creates the auth user ``ada`` (a demo user who owns issues) and a bearer
token with the ``read`` scope, so ``myIssues`` has someone to answer for. One JSON
line on stdout says what was made.
"""

import datetime
import json
import os
import time

ISSUE_ROWS = 5  # 1 issue + 1.5 tags + 2.5 comments, on average
CHUNK_ISSUES = 200_000  # issues per transaction (about 1M captured rows)
TOKEN_USER = "ada"


def issue_count(total_rows, users):
    return max(1, round((total_rows - users) / ISSUE_ROWS))


def id_width(issues):
    return max(6, len(str(issues - 1)))


def issue_id(i, issues):
    """The id the generator gives issue number ``i`` of ``issues``."""
    return f"s1-i{i:0{id_width(issues)}d}"


def lit(value):
    return "'" + str(value).replace("'", "''") + "'"


def pick(values, expr):
    """SQL choosing ``values[expr]`` (``expr`` an integer in range): a portable CASE."""
    whens = " ".join(f"WHEN {i} THEN {lit(v)}" for i, v in enumerate(values))
    return f"(CASE {expr} {whens} END)"


class Shape:
    """The SQL pieces of one backend; ``i`` is the issue number, ``j`` a child index."""

    def __init__(self, vendor, issues):
        from project.demo.management.commands import rindle_seed_demo as seed
        from project.demo.models import PRIORITIES, STATUSES

        self.vendor, self.issues, self.seed = vendor, issues, seed
        self.width = id_width(issues)
        self.people = [u for u, _ in seed.USERS[1:]]
        self.statuses, self.priorities = STATUSES, PRIORITIES

    def series(self, lo, hi):
        """A FROM item of the rows ``i`` in [lo, hi), with the two hashes h1, h2."""
        h1 = "((i * 2654435761) % 2147483647)"
        h2 = "((i * 1597334677 + 3) % 2147483629)"
        if self.vendor == "postgresql":
            ident = f"'s1-i' || lpad(i::text, {self.width}, '0')"
            src = f"generate_series({int(lo)}::bigint, {int(hi) - 1}::bigint) AS g(i)"
            return f"(SELECT i, {ident} AS iid, {h1} AS h1, {h2} AS h2 FROM {src}) AS b"
        ident = f"'s1-i' || printf('%0{self.width}d', i)"
        return (
            f"(SELECT i, {ident} AS iid, {h1} AS h1, {h2} AS h2 FROM "
            f"(WITH RECURSIVE n(i) AS (SELECT {int(lo)} UNION ALL SELECT i + 1 FROM n "
            f"WHERE i + 1 < {int(hi)}) SELECT i FROM n)) AS b"
        )

    def real(self, expr):
        return (
            f"CAST({expr} AS DOUBLE PRECISION)"
            if self.vendor == "postgresql"
            else (f"CAST({expr} AS REAL)")
        )

    def issue_sql(self, lo, hi):
        s = self.seed
        created = f"({int(s.EPOCH_MS)} + i * {int(s.HOUR_MS)} + ((h1 / 3800) % 3600) * 1000)"
        qual = pick(s.QUALIFIERS, "((h2 / 15360) % 6)")
        title = (
            f"{pick(s.VERBS, '((h2 / 160) % 8)')} || ' ' || {pick(s.NOUNS, '((h2 / 1280) % 12)')}"
            f" || (CASE WHEN {qual} = '' THEN '' ELSE ' ' || {qual} END)"
        )
        owner = (
            f"(CASE WHEN (h1 / 20) % 10 = 0 THEN 'unassigned' "
            f"ELSE {pick(self.people, '((h1 / 200) % 19)')} END)"
        )
        return (
            'INSERT INTO issue (id, title, status, priority, "ownerId", "createdAt", "updatedAt") '
            f"SELECT iid, {title}, {pick(self.statuses, '(h1 % 5)')}, "
            f"{pick(self.priorities, '((h1 / 5) % 4)')}, {owner}, {self.real(created)}, "
            f"{self.real(f'({created} + (h2 % 4) * 600000)')} FROM {self.series(lo, hi)}"
        )

    def tag_sql(self, lo, hi):
        # 0-3 distinct tags per issue: offsets 0, 3, 6 from a per-issue start (mod 10).
        name = pick(self.seed.TAGS, "(((h2 / 16) % 10 + k.j * 3) % 10)")
        return (
            'INSERT INTO tag (id, "issueId", name) '
            f"SELECT iid || '-t' || k.j, iid, {name} FROM {self.series(lo, hi)} "
            "CROSS JOIN (SELECT 0 AS j UNION ALL SELECT 1 UNION ALL SELECT 2) AS k "
            "WHERE k.j < (h2 / 4) % 4 ORDER BY i, k.j"
        )

    def comment_sql(self, lo, hi):
        s = self.seed
        created = f"({int(s.EPOCH_MS)} + i * {int(s.HOUR_MS)} + ((h1 / 3800) % 3600) * 1000)"
        first = "((h1 + k.j * 5) % 8)"
        count = "((h2 / 64 + k.j) % 3)"  # 0, 1 or 2 more sentences
        body = (
            f"{pick(s.SENTENCES, first)}"
            f" || (CASE WHEN {count} >= 1 THEN ' ' || {pick(s.SENTENCES, f'(({first} + 3) % 8)')}"
            " ELSE '' END)"
            f" || (CASE WHEN {count} >= 2 THEN ' ' || {pick(s.SENTENCES, f'(({first} + 5) % 8)')}"
            " ELSE '' END)"
        )
        author = pick(self.people, "(((h1 / 7) + k.j * 7) % 19)")
        return (
            'INSERT INTO comment (id, "issueId", "authorId", body, "createdAt") '
            f"SELECT iid || '-c' || k.j, iid, {author}, {body}, "
            f"{self.real(f'({created} + k.j * 600000)')} FROM {self.series(lo, hi)} "
            "CROSS JOIN (SELECT 0 AS j UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3) "
            "AS k WHERE k.j <= h2 % 4 ORDER BY i, k.j"
        )


def check_triggers(cursor, vendor, tables):
    """Every synced table has its three capture triggers; else the run stops."""
    from rindle_app.engine.capture import trigger_names

    missing = []
    for table in tables:
        for name in trigger_names(table).values():
            if vendor == "sqlite":
                cursor.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'trigger' AND name = %s", [name]
                )
            else:
                cursor.execute(
                    "SELECT 1 FROM pg_trigger WHERE tgname = %s AND tgrelid = %s::regclass",
                    [name, f'"{table}"'],
                )
            if cursor.fetchone() is None:
                missing.append(f"{table}.{name}")
    if missing:
        raise SystemExit(f"capture triggers missing after migrate: {missing}")


def outbox_count(cursor):
    from rindle_app.engine.capture import OUTBOX

    cursor.execute(f"SELECT count(*), COALESCE(MAX(seq), 0) FROM {OUTBOX}")
    return cursor.fetchone()


def generate():
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction

    from project.demo.management.commands.rindle_seed_demo import USERS

    total = int(os.environ["DATASCALE_ROWS"])
    t0 = time.monotonic()
    call_command("migrate", verbosity=0)
    vendor = connection.vendor
    tables = ["user", "issue", "tag", "comment"]
    issues = issue_count(total, len(USERS))
    shape = Shape(vendor, issues)
    with connection.cursor() as cursor:
        check_triggers(cursor, vendor, tables)
        cursor.execute("SELECT count(*) FROM issue")
        if cursor.fetchone()[0]:
            raise SystemExit("the database already holds issues: generate into a fresh one")
        outbox_before, _ = outbox_count(cursor)
    t_migrated = time.monotonic()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany('INSERT INTO "user" (id, name) VALUES (%s, %s)', USERS)
    for lo in range(0, issues, CHUNK_ISSUES):
        hi = min(issues, lo + CHUNK_ISSUES)
        with transaction.atomic(), connection.cursor() as cursor:
            for sql in (shape.issue_sql(lo, hi), shape.tag_sql(lo, hi), shape.comment_sql(lo, hi)):
                cursor.execute(sql)
    t_filled = time.monotonic()
    counts = {}
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            counts[table] = cursor.fetchone()[0]
        outbox_after, max_seq = outbox_count(cursor)
    captured = outbox_after - outbox_before
    rows = sum(counts.values())
    if captured != rows:
        raise SystemExit(f"capture is not intact: {rows} rows inserted, {captured} captured")
    token = make_token()
    pruned = prune(connection)
    analyze(connection)
    with connection.cursor() as cursor:
        outbox_left, _ = outbox_count(cursor)
    print(
        json.dumps(
            {
                "vendor": vendor,
                "rows": rows,
                "tables": counts,
                "issues": issues,
                "captured": captured,
                "max_seq": max_seq,
                "outbox_pruned": pruned,
                "outbox_left": outbox_left,
                "token": token,
                "token_user": TOKEN_USER,
                "migrate_s": round(t_migrated - t0, 2),
                "fill_s": round(t_filled - t_migrated, 2),
                "total_s": round(time.monotonic() - t0, 2),
            }
        ),
        flush=True,
    )


def make_token():
    from django.contrib.auth import get_user_model

    from rindle_app import tokens

    user = get_user_model().objects.create_user(TOKEN_USER)  # no password: a demo user
    raw, _token = tokens.create(user, ["read"], name="bench/datascale.py")
    return raw


def prune(connection):
    """Production's retention (7-day age) on a clock 8 days ahead: the rows pruned."""
    from django.utils import timezone

    from rindle_app.stream.retention import Retention

    if connection.vendor == "postgresql":
        from rindle_app.stream.watermark import Watermarker

        w = Watermarker("default", owner="bench-datascale")
        try:
            w.step()
        finally:
            w.close()
    ahead = timezone.now() + datetime.timedelta(days=8)
    run = Retention("default", batch_size=100_000, now=lambda: ahead).run_once()
    return run.pruned


def analyze(connection):
    """Planner statistics of the new rows (no VACUUM: autovacuum deals with the pruned
    outbox, as in production)."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
