"""The ``rindle_seed_demo`` management command."""

import re
from io import StringIO

import pytest
from django.core.management import call_command

from project.demo import models as demo
from rindle_app.engine import shutdown
from rindle_app.testing import outbox_high_water, outbox_since
from tests.support.demo import counts


@pytest.fixture
def seed(transactional_db):
    """Run the command; stop the engine it starts before the test database goes."""

    def run(**options):
        out = StringIO()
        call_command("rindle_seed_demo", stdout=out, **options)
        return out.getvalue()

    yield run
    shutdown()


def test_seeding_twice_inserts_nothing_the_second_time(seed):
    """A re-run with the same seed inserts no row and doubles nothing."""
    first = seed(issues=40, seed=3)
    after_first = counts()
    assert after_first["user"] == 20
    assert after_first["issue"] == 40
    assert after_first["comment"] >= 40  # every issue has its description
    assert f"Inserted {sum(after_first.values())} rows" in first

    second = seed(issues=40, seed=3)
    assert counts() == after_first
    assert "Inserted 0 rows" in second


def test_seeded_rows_are_captured(seed):
    """Every seeded row is captured in the outbox; a no-op re-run captures nothing."""
    before = outbox_high_water()
    seed(issues=25, seed=1)
    events = outbox_since(before)
    assert {e["op"] for e in events} == {"add"}
    by_table = {}
    for e in events:
        by_table[e["table"]] = by_table.get(e["table"], 0) + 1
    assert by_table == counts()

    high_water = outbox_high_water()
    seed(issues=25, seed=1)
    assert outbox_since(high_water) == []


def test_seeded_rows_are_consistent(seed):
    """Seeded issues reference seeded users and carry a description comment."""
    seed(issues=30, seed=7)
    users = set(demo.User.objects.values_list("id", flat=True))
    assert "unassigned" in users
    assert set(demo.Issue.objects.values_list("owner_id", flat=True)) <= users
    assert set(demo.Comment.objects.values_list("author_id", flat=True)) <= users
    for issue in demo.Issue.objects.all():
        assert isinstance(issue.created_at, float)
        assert issue.updated_at >= issue.created_at
        assert demo.Comment.objects.filter(issue=issue, created_at=issue.created_at).exists()
    assert not demo.Tag.objects.exclude(issue__in=demo.Issue.objects.all()).exists()


def test_another_seed_adds_new_issues_beside_the_old(seed):
    """A different seed inserts its own issues and reuses the existing users."""
    seed(issues=10, seed=1)
    out = seed(issues=10, seed=2)
    assert "0 user, 10 issue" in out
    assert counts()["issue"] == 20


def test_under_debug_the_seed_creates_a_demo_admin_once(seed, settings, django_user_model):
    """Under DEBUG the first seed creates superuser 'admin' and prints its password once."""
    settings.DEBUG = True
    out = seed(issues=1, seed=1)
    match = re.search(r"as 'admin', password (\S+)$", out, re.M)
    assert match, out
    admin = django_user_model.objects.get(username="admin")
    assert admin.is_superuser and admin.is_staff and admin.check_password(match.group(1))

    again = seed(issues=1, seed=1)
    assert "password" not in again.replace("changepassword", "")
    assert "as 'admin'" in again and "changepassword admin" in again
    assert django_user_model.objects.count() == 1


def test_with_debug_off_the_seed_creates_no_admin(seed, settings, django_user_model):
    """Outside DEBUG (or with --no-admin) no account is made; the output names createsuperuser."""
    settings.DEBUG = False
    assert "python manage.py createsuperuser" in seed(issues=1, seed=1)
    settings.DEBUG = True
    assert "python manage.py createsuperuser" in seed(issues=1, seed=1, no_admin=True)
    assert not django_user_model.objects.exists()
