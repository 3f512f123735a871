"""
The issue tracker's mutators, ported from the original's ``shared/app-def.ts``
and its server-only overrides.

Arguments are validated and normalized by the serializers below, so a mutator
receives clean values; it writes with the Django ORM (the room's in-memory mutators
at the end are the exception). The acting user's id is ``user.username``; it never
comes from the arguments. Gated writes (deleting an issue, editing a comment) from
someone who may not make them are accepted and change nothing, like the
original's owner-gated delete, so a client's optimistic state simply snaps back.
"""

from django.core.exceptions import PermissionDenied
from rest_framework import serializers

from rindle_app.mutators import MutationRejected, mutator, room_mutator

from .models import PRIORITIES, STATUSES, Comment, Issue, Tag, User

TITLE_MAX = 180
OWNER_MAX = 40
TAG_MAX = 28
BODY_MAX = 4000
TAGS_PER_ISSUE = 8
UNASSIGNED = "unassigned"


# --- normalization -------------------------------------------------------------------


def norm_title(value):
    return value.strip()[:TITLE_MAX]


def norm_owner(value):
    return value.strip()[:OWNER_MAX] or UNASSIGNED


def norm_tag(value):
    return value.strip().lower()[:TAG_MAX]


def norm_body(value):
    return value[:BODY_MAX]


class Normalized(serializers.CharField):
    """A string field whose validated value is passed through ``normalize``."""

    def __init__(self, normalize, **kwargs):
        self.normalize = normalize
        super().__init__(**kwargs)

    def run_validation(self, data=serializers.empty):
        value = super().run_validation(data)
        return value if value is None else self.normalize(value)


def Id(**kwargs):
    return serializers.CharField(max_length=128, trim_whitespace=False, **kwargs)


def Millis(**kwargs):
    return serializers.FloatField(min_value=0, **kwargs)


def Title():
    return Normalized(norm_title)


def Owner():
    return Normalized(norm_owner, allow_blank=True)


def TagName():
    return Normalized(norm_tag)


def Body(**kwargs):
    return Normalized(norm_body, trim_whitespace=False, **kwargs)


# --- arguments -------------------------------------------------------------------------


class TagArgs(serializers.Serializer):
    id = Id()
    name = TagName()


class CreateIssueArgs(serializers.Serializer):
    id = Id()
    title = Title()
    status = serializers.ChoiceField(STATUSES)
    priority = serializers.ChoiceField(PRIORITIES)
    owner = Owner()
    tags = TagArgs(many=True, default=list)
    description = Body(allow_blank=True)
    descriptionCommentId = Id()
    createdAt = Millis()


class EditTitleArgs(serializers.Serializer):
    id = Id()
    title = Title()
    updatedAt = Millis()


class SetStatusArgs(serializers.Serializer):
    id = Id()
    status = serializers.ChoiceField(STATUSES)
    updatedAt = Millis()


class SetPriorityArgs(serializers.Serializer):
    id = Id()
    priority = serializers.ChoiceField(PRIORITIES)
    updatedAt = Millis()


class SetOwnerArgs(serializers.Serializer):
    id = Id()
    owner = Owner()
    updatedAt = Millis()


class AddTagArgs(serializers.Serializer):
    id = Id()
    issueId = Id()
    name = TagName()
    updatedAt = Millis()


class RemoveTagArgs(serializers.Serializer):
    id = Id()
    issueId = Id()
    updatedAt = Millis()


class AddCommentArgs(serializers.Serializer):
    id = Id()
    issueId = Id()
    body = Body()
    createdAt = Millis()
    # The original's clients send it; one that does not bumps the issue to createdAt.
    updatedAt = Millis(required=False)


class EditCommentArgs(serializers.Serializer):
    id = Id()
    # The original's clients send it; the issue bumped is the comment's own, whatever it says.
    issueId = Id(required=False)
    body = Body(allow_blank=True)
    updatedAt = Millis()


class DeleteIssueArgs(serializers.Serializer):
    id = Id()


# --- helpers ---------------------------------------------------------------------------


def acting_user_id(user):
    """The demo user id of the acting Django user; PermissionDenied if anonymous."""
    if user is None or not user.is_authenticated:
        raise PermissionDenied("sign in to do this")
    return user.username


def ensure_user(user_id):
    User.objects.get_or_create(id=user_id, defaults={"name": user_id})


def reject_spam(title):
    if "spam" in title.lower():
        raise MutationRejected("titles mentioning spam are not allowed", code="spam")


def touch(issue_id, updated_at, **changes):
    """
    Set ``changes`` on the issue and bump its updatedAt; true if the issue exists
    (a missing issue: no-op, false).
    """
    return Issue.objects.filter(pk=issue_id).update(updated_at=updated_at, **changes) == 1


def unique_tags(tags):
    """The first ``TAGS_PER_ISSUE`` tags, dropping repeats of a (normalized) name."""
    seen, kept = set(), []
    for tag in tags:
        if tag["name"] not in seen:
            seen.add(tag["name"])
            kept.append(tag)
    return kept[:TAGS_PER_ISSUE]


# --- mutators --------------------------------------------------------------------------
#
# Plain Django ORM: inside a mutator the engine's writer connection is the thread's
# connection, so these queries run in the mutation's transaction, are captured like
# any write, and roll back with a rejection.


@mutator("createIssue", args=CreateIssueArgs)
def create_issue(tx, args, user):
    author = acting_user_id(user)
    reject_spam(args["title"])
    ensure_user(args["owner"])
    ensure_user(author)
    issue = Issue.objects.create(
        id=args["id"],
        title=args["title"],
        status=args["status"],
        priority=args["priority"],
        owner_id=args["owner"],
        created_at=args["createdAt"],
        updated_at=args["createdAt"],
    )
    Comment.objects.create(
        id=args["descriptionCommentId"],
        issue=issue,
        author_id=author,
        body=args["description"],
        created_at=issue.created_at,
    )
    Tag.objects.bulk_create(
        Tag(id=tag["id"], issue=issue, name=tag["name"]) for tag in unique_tags(args["tags"])
    )


@mutator("editTitle", args=EditTitleArgs)
def edit_title(tx, args, user):
    reject_spam(args["title"])
    touch(args["id"], args["updatedAt"], title=args["title"])


@mutator("setStatus", args=SetStatusArgs)
def set_status(tx, args, user):
    touch(args["id"], args["updatedAt"], status=args["status"])


@mutator("setPriority", args=SetPriorityArgs)
def set_priority(tx, args, user):
    touch(args["id"], args["updatedAt"], priority=args["priority"])


@mutator("setOwner", args=SetOwnerArgs)
def set_owner(tx, args, user):
    ensure_user(args["owner"])
    touch(args["id"], args["updatedAt"], owner_id=args["owner"])


@mutator("addTag", args=AddTagArgs)
def add_tag(tx, args, user):
    """Tag an existing issue, unless it already carries a tag of that name."""
    issue_id, name = args["issueId"], args["name"]
    if touch(issue_id, args["updatedAt"]):
        if not Tag.objects.filter(issue_id=issue_id, name=name).exists():
            Tag.objects.create(id=args["id"], issue_id=issue_id, name=name)


@mutator("removeTag", args=RemoveTagArgs)
def remove_tag(tx, args, user):
    Tag.objects.filter(pk=args["id"], issue_id=args["issueId"]).delete()
    touch(args["issueId"], args["updatedAt"])


@mutator("addComment", args=AddCommentArgs)
def add_comment(tx, args, user):
    """
    Comment on an existing issue as the acting user and bump the issue's updatedAt,
    as every edit of an issue does (a missing issue: no-op).
    """
    author = acting_user_id(user)
    ensure_user(author)
    issue_id = args["issueId"]
    if touch(issue_id, args.get("updatedAt", args["createdAt"])):
        Comment.objects.create(
            id=args["id"],
            issue_id=issue_id,
            author_id=author,
            body=args["body"],
            created_at=args["createdAt"],
        )


@mutator("editComment", args=EditCommentArgs)
def edit_comment(tx, args, user):
    """
    Only the comment's author edits it, which bumps its issue's updatedAt; anyone
    else's edit changes nothing, the issue included.
    """
    mine = Comment.objects.filter(pk=args["id"], author_id=acting_user_id(user))
    if mine.update(body=args["body"]):
        Issue.objects.filter(comments__pk=args["id"]).update(updated_at=args["updatedAt"])


@mutator("deleteIssue", args=DeleteIssueArgs)
def delete_issue(tx, args, user):
    """Only the owner deletes an issue, children first; anyone else's delete is a no-op."""
    owned = Issue.objects.filter(pk=args["id"], owner_id=acting_user_id(user))
    if owned.exists():
        # The references are not enforced by the database (as in the original), so
        # the children go explicitly.
        Comment.objects.filter(issue_id=args["id"]).delete()
        Tag.objects.filter(issue_id=args["id"]).delete()
        owned.delete()


# --- the issue room's mutators ---------------------------------------------------------
#
# In a room (two or more people on one issue, RINDLE["ROOMS_ENABLED"]), these run in
# the room host's memory and reach the other people at once; the host flushes them
# to the database in batches. Same names, arguments and effects as the mutators above.
# They stay on the room's ``tx`` (``get``/``edit`` over in-memory rows), not the ORM:
# nothing reaches the database until the host's flush, which is what makes a room fast.


_ROOM_FIELDS = {}


def _room_args(serializer_class, args):
    """
    ``args`` validated by the serializer's own fields (built once: a room is hot). A
    ValidationError of its field errors rejects the mutation as ``invalid_args`` with
    them as the details, as the main path's serializer does.
    """
    fields = _ROOM_FIELDS.get(serializer_class)
    if fields is None:
        fields = _ROOM_FIELDS[serializer_class] = serializer_class().fields
    if not isinstance(args, dict):  # unknown keys are ignored, as the serializer does
        raise serializers.ValidationError({"non_field_errors": ["Expected a dictionary."]})
    out, errors = {}, {}
    for name, field in fields.items():
        try:
            out[name] = field.run_validation(args.get(name, serializers.empty))
        except serializers.ValidationError as exc:
            errors[name] = exc.detail
    if errors:
        raise serializers.ValidationError(errors)
    return out


def _room_touch(tx, issue_id, changes, updated_at):
    if tx.get("issue", issue_id) is not None:
        tx.edit("issue", issue_id, {**changes, "updatedAt": updated_at})


@room_mutator("issue", "editTitle")
def room_edit_title(tx, args):
    args = _room_args(EditTitleArgs, args)
    reject_spam(args["title"])
    _room_touch(tx, args["id"], {"title": args["title"]}, args["updatedAt"])


@room_mutator("issue", "setStatus")
def room_set_status(tx, args):
    args = _room_args(SetStatusArgs, args)
    _room_touch(tx, args["id"], {"status": args["status"]}, args["updatedAt"])


@room_mutator("issue", "setPriority")
def room_set_priority(tx, args):
    args = _room_args(SetPriorityArgs, args)
    _room_touch(tx, args["id"], {"priority": args["priority"]}, args["updatedAt"])
