"""The demo's issue tracker in the admin: every table listed, searchable, issues editable."""

import pytest
from django.urls import reverse

from project.demo import models as demo
from tests.support.demo import create_issue


@pytest.fixture
def tracker(db):
    demo.User.objects.create(id="ada", name="Ada Lovelace")
    demo.User.objects.create(id="alan", name="Alan Turing")
    create_issue("i1", owner="ada", title="Fix the login form", status="todo")
    create_issue("i2", owner="alan", title="Speed up the board", status="done")
    demo.Tag.objects.create(id="i1-t0", issue_id="i1", name="bug")
    demo.Comment.objects.create(
        id="i1-c0", issue_id="i1", author_id="alan", body="Steps to reproduce", created_at=1.0
    )


@pytest.mark.parametrize("model", [demo.User, demo.Issue, demo.Tag, demo.Comment])
def test_every_demo_table_is_listed_in_the_admin(tracker, operator, model):
    """The admin index links each demo table and its changelist opens."""
    url = reverse(f"admin:demo_{model._meta.model_name}_changelist")
    assert f'href="{url}"' in operator.get(reverse("admin:index")).text
    assert operator.get(url).status_code == 200


def test_issues_are_searched_by_title_and_owner_and_filtered_by_status(tracker, operator):
    """The issue list finds by title or owner name and narrows by status."""
    url = reverse("admin:demo_issue_changelist")
    by_title = operator.get(url, {"q": "login"}).text
    assert "Fix the login form" in by_title and "Speed up the board" not in by_title
    by_owner = operator.get(url, {"q": "Turing"}).text
    assert "Speed up the board" in by_owner and "Fix the login form" not in by_owner
    done = operator.get(url, {"status__exact": "done"}).text
    assert "Speed up the board" in done and "Fix the login form" not in done


def test_an_issue_page_shows_its_tags_and_comments(tracker, operator):
    """An issue's change page carries its tags and comments inline."""
    page = operator.get(reverse("admin:demo_issue_change", args=["i1"])).text
    assert 'value="bug"' in page
    assert "Steps to reproduce" in page
