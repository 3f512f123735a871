"""The demo issue tracker's mutators, applied through the engine."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser

from project.demo import models as demo
from tests.support.demo import counts

T0 = 1_704_067_200_000.0


@pytest.fixture
def alice(transactional_db):
    return get_user_model().objects.create_user("alice")


@pytest.fixture
def bob(transactional_db):
    return get_user_model().objects.create_user("bob")


def run(engine, name, args, user, client="client-1"):
    """Send ``name`` as the client's next mutation."""
    return engine.mutate(client, engine.client_lmid(client) + 1, name, args, user)


def issue_args(issue_id="i1", **overrides):
    args = {
        "id": issue_id,
        "title": "Fix the login form",
        "status": "todo",
        "priority": "high",
        "owner": "alice",
        "tags": [{"id": f"{issue_id}-t1", "name": "bug"}],
        "description": "It fails on Safari.",
        "descriptionCommentId": f"{issue_id}-c0",
        "createdAt": T0,
    }
    args.update(overrides)
    return args


def create(engine, user, issue_id="i1", **overrides):
    result = run(engine, "createIssue", issue_args(issue_id, **overrides), user)
    assert result.status == "applied", result
    return result


NOTHING = {"user": 0, "issue": 0, "tag": 0, "comment": 0}


# --- createIssue ----------------------------------------------------------------------


def test_create_issue_writes_the_issue_its_description_and_unique_tags(engine, alice):
    """createIssue inserts the issue, the description comment and at most 8 unique tags."""
    names = ["UI", " ui ", "Backend", "perf", "docs", "api", "ux", "infra", "security", "extra"]
    tags = [{"id": f"t{n}", "name": name} for n, name in enumerate(names)]
    create(engine, alice, owner="bob", tags=tags)

    issue = demo.Issue.objects.get(id="i1")
    assert (issue.title, issue.status, issue.priority, issue.owner_id) == (
        "Fix the login form",
        "todo",
        "high",
        "bob",
    )
    assert issue.created_at == issue.updated_at == T0
    assert dict(demo.User.objects.values_list("id", "name")) == {"alice": "alice", "bob": "bob"}
    description = demo.Comment.objects.get(id="i1-c0")
    assert (description.issue_id, description.author_id, description.body) == (
        "i1",
        "alice",
        "It fails on Safari.",
    )
    assert description.created_at == T0
    tags = demo.Tag.objects.filter(issue_id="i1").order_by("id")
    assert list(tags.values_list("id", "name")) == [
        ("t0", "ui"),
        ("t2", "backend"),
        ("t3", "perf"),
        ("t4", "docs"),
        ("t5", "api"),
        ("t6", "ux"),
        ("t7", "infra"),
        ("t8", "security"),
    ]


def test_a_spam_title_is_rejected_and_writes_nothing(engine, alice):
    """A title mentioning spam is a business rejection: nothing is written, lmid advances."""
    result = run(engine, "createIssue", issue_args(title="Cheap SpAm here"), alice)
    assert (result.status, result.code, result.lmid) == ("rejected", "spam", 1)
    assert engine.client_lmid("client-1") == 1
    assert counts() == NOTHING


def test_edit_title_rejects_spam_and_keeps_the_title(engine, alice):
    """editTitle to a spam title is rejected; the stored title and updatedAt stay."""
    create(engine, alice)
    result = run(engine, "editTitle", {"id": "i1", "title": "spam", "updatedAt": T0 + 1}, alice)
    assert (result.status, result.code, result.lmid) == ("rejected", "spam", 2)
    issue = demo.Issue.objects.get(id="i1")
    assert (issue.title, issue.updated_at) == ("Fix the login form", T0)


def test_an_anonymous_user_is_unauthorized(engine):
    """Without an authenticated user createIssue is rejected as unauthorized."""
    for n, user in enumerate([None, AnonymousUser()], start=1):
        result = run(engine, "createIssue", issue_args(), user)
        assert (result.status, result.code, result.lmid) == ("rejected", "unauthorized", n)
    assert counts() == NOTHING


def test_invalid_args_are_rejected_and_write_nothing(engine, alice):
    """An unknown status is rejected as invalid_args before anything is written."""
    result = run(engine, "createIssue", issue_args(status="someday"), alice)
    assert (result.status, result.code, result.lmid) == ("rejected", "invalid_args", 1)
    assert "status" in result.reason
    assert counts() == NOTHING

    create(engine, alice)
    result = run(engine, "setStatus", {"id": "i1", "status": "wip", "updatedAt": T0 + 1}, alice)
    assert (result.status, result.code) == ("rejected", "invalid_args")
    assert demo.Issue.objects.get(id="i1").status == "todo"


def test_arguments_are_normalized(engine, alice):
    """Titles are trimmed to 180, owners cut to 40, tags lower-cased to 28, bodies to 4000."""
    create(
        engine,
        alice,
        title="  " + "t" * 300 + "  ",
        owner=" " + "o" * 50,
        tags=[{"id": "t1", "name": "  " + "LOUD" * 10}],
        description="d" * 5000,
    )
    issue = demo.Issue.objects.get(id="i1")
    assert issue.title == "t" * 180
    assert issue.owner_id == "o" * 40
    assert demo.User.objects.filter(id="o" * 40).exists()
    assert demo.Tag.objects.get(id="t1").name == ("loud" * 10)[:28]
    assert demo.Comment.objects.get(id="i1-c0").body == "d" * 4000


def test_a_blank_owner_is_unassigned(engine, alice):
    """A blank owner becomes the ``unassigned`` sentinel user."""
    create(engine, alice, owner="  ")
    assert demo.Issue.objects.get(id="i1").owner_id == "unassigned"
    assert demo.User.objects.filter(id="unassigned").exists()


# --- issue edits -----------------------------------------------------------------------


def test_issue_edits_set_the_field_and_bump_updated_at(engine, alice):
    """editTitle, setStatus and setPriority change their field and updatedAt."""
    create(engine, alice)
    run(engine, "editTitle", {"id": "i1", "title": "  Renamed ", "updatedAt": T0 + 1}, alice)
    run(engine, "setStatus", {"id": "i1", "status": "in-progress", "updatedAt": T0 + 2}, alice)
    run(engine, "setPriority", {"id": "i1", "priority": "urgent", "updatedAt": T0 + 3}, alice)
    issue = demo.Issue.objects.get(id="i1")
    assert (issue.title, issue.status, issue.priority) == ("Renamed", "in-progress", "urgent")
    assert issue.updated_at == T0 + 3


def test_set_owner_ensures_the_user_row(engine, alice):
    """setOwner creates the new owner's user row if it is missing."""
    create(engine, alice)
    result = run(engine, "setOwner", {"id": "i1", "owner": "carol", "updatedAt": T0 + 5}, alice)
    assert result.status == "applied"
    assert demo.User.objects.get(id="carol").name == "carol"
    issue = demo.Issue.objects.get(id="i1")
    assert (issue.owner_id, issue.updated_at) == ("carol", T0 + 5)


def test_add_tag_dedupes_by_name(engine, alice):
    """addTag of a name the issue already carries applies and adds no row."""
    create(engine, alice)
    args = {"id": "t-dup", "issueId": "i1", "name": " BUG ", "updatedAt": T0 + 1}
    assert run(engine, "addTag", args, alice).status == "applied"
    args = {"id": "t-new", "issueId": "i1", "name": "UI", "updatedAt": T0 + 2}
    assert run(engine, "addTag", args, alice).status == "applied"
    assert sorted(demo.Tag.objects.filter(issue_id="i1").values_list("id", "name")) == [
        ("i1-t1", "bug"),
        ("t-new", "ui"),
    ]
    assert demo.Issue.objects.get(id="i1").updated_at == T0 + 2


def test_add_tag_to_a_missing_issue_changes_nothing(engine, alice):
    """addTag for an issue that does not exist is accepted and adds no orphan tag."""
    args = {"id": "t1", "issueId": "nope", "name": "bug", "updatedAt": T0}
    assert run(engine, "addTag", args, alice).status == "applied"
    assert not demo.Tag.objects.exists()


def test_remove_tag_deletes_it_and_bumps_updated_at(engine, alice):
    """removeTag deletes the issue's tag and bumps the issue's updatedAt."""
    create(engine, alice)
    args = {"id": "i1-t1", "issueId": "i1", "updatedAt": T0 + 9}
    assert run(engine, "removeTag", args, alice).status == "applied"
    assert not demo.Tag.objects.exists()
    assert demo.Issue.objects.get(id="i1").updated_at == T0 + 9


# --- comments --------------------------------------------------------------------------


def test_add_comment_is_written_by_the_acting_user(engine, alice, bob):
    """addComment's author is the acting user, whose user row is ensured."""
    create(engine, alice)
    args = {"id": "c1", "issueId": "i1", "body": "Me too.", "createdAt": T0 + 1}
    assert run(engine, "addComment", args, bob).status == "applied"
    comment = demo.Comment.objects.get(id="c1")
    assert (comment.issue_id, comment.author_id, comment.body) == ("i1", "bob", "Me too.")
    assert demo.User.objects.filter(id="bob").exists()


def test_add_comment_to_a_missing_issue_changes_nothing(engine, alice):
    """addComment on an issue that does not exist is accepted and adds no orphan comment."""
    args = {"id": "c1", "issueId": "nope", "body": "Hello", "createdAt": T0}
    assert run(engine, "addComment", args, alice).status == "applied"
    assert not demo.Comment.objects.exists()


def test_add_comment_bumps_the_issues_updated_at(engine, alice):
    """addComment bumps the issue's updatedAt (the original's), to createdAt without one."""
    create(engine, alice)
    args = {"id": "c1", "issueId": "i1", "body": "Me too.", "createdAt": T0 + 1}
    assert run(engine, "addComment", {**args, "updatedAt": T0 + 2}, alice).status == "applied"
    assert demo.Issue.objects.get(id="i1").updated_at == T0 + 2
    args = {"id": "c2", "issueId": "i1", "body": "Same.", "createdAt": T0 + 3}
    assert run(engine, "addComment", args, alice).status == "applied"
    assert demo.Issue.objects.get(id="i1").updated_at == T0 + 3


def test_only_the_author_edits_a_comment(engine, alice, bob):
    """
    editComment by the author applies and bumps its issue's updatedAt; anyone else's
    is accepted and changes nothing, the issue included.
    """
    create(engine, alice)
    create(engine, alice, "i2", descriptionCommentId="i2-c0", tags=[])
    hijack = {"id": "i1-c0", "body": "Hijacked", "updatedAt": T0 + 5}
    result = run(engine, "editComment", hijack, bob)
    assert result.status == "applied"
    assert demo.Comment.objects.get(id="i1-c0").body == "It fails on Safari."
    assert demo.Issue.objects.get(id="i1").updated_at == T0
    # issueId (the original's clients send it) never redirects the bump.
    edit = {"id": "i1-c0", "issueId": "i2", "body": "Also Firefox.", "updatedAt": T0 + 6}
    result = run(engine, "editComment", edit, alice)
    assert result.status == "applied"
    assert demo.Comment.objects.get(id="i1-c0").body == "Also Firefox."
    assert demo.Issue.objects.get(id="i1").updated_at == T0 + 6
    assert demo.Issue.objects.get(id="i2").updated_at == T0


def test_edit_comment_needs_updated_at(engine, alice):
    """The time of an edit comes from the client, as in the original: without it, invalid_args."""
    create(engine, alice)
    result = run(engine, "editComment", {"id": "i1-c0", "body": "x"}, alice)
    assert (result.status, result.code) == ("rejected", "invalid_args")
    assert demo.Comment.objects.get(id="i1-c0").body == "It fails on Safari."


# --- deleteIssue -----------------------------------------------------------------------


def test_the_owner_deletes_an_issue_and_its_children(engine, alice):
    """The owner's delete removes the issue, its tags and its comments, and nothing else."""
    create(engine, alice, "i1")
    create(engine, alice, "i2")
    run(engine, "addComment", {"id": "c1", "issueId": "i1", "body": "x", "createdAt": T0}, alice)
    result = run(engine, "deleteIssue", {"id": "i1"}, alice)
    assert result.status == "applied"
    assert list(demo.Issue.objects.values_list("id", flat=True)) == ["i2"]
    assert list(demo.Tag.objects.values_list("issue_id", flat=True)) == ["i2"]
    assert list(demo.Comment.objects.values_list("issue_id", flat=True)) == ["i2"]


def test_a_non_owners_delete_is_accepted_and_changes_nothing(engine, alice, bob):
    """A non-owner's delete is accepted and changes nothing."""
    create(engine, alice)
    before = counts()
    result = run(engine, "deleteIssue", {"id": "i1"}, bob)
    assert (result.status, result.code, result.lmid) == ("applied", None, 2)
    assert counts() == before == {"user": 1, "issue": 1, "tag": 1, "comment": 1}


def test_an_anonymous_delete_is_unauthorized(engine, alice):
    """deleteIssue without an authenticated user is rejected as unauthorized."""
    create(engine, alice)
    result = run(engine, "deleteIssue", {"id": "i1"}, None)
    assert (result.status, result.code) == ("rejected", "unauthorized")
    assert demo.Issue.objects.filter(id="i1").exists()
