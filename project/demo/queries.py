"""
The issue tracker's named queries, with the original demo's names, arguments and
shapes (``src/components/*.queries.ts``), so a client written for it works here.
"""

from rest_framework import serializers

from rindle_app.queries import correlate, exists, named_query, room_profile, table

PAGE_MAX = 5000
FILTER_VALUE_MAX = 200
AXES = ("title", "status", "priority", "owner", "tag", "comment")

ISSUE_OWNER = correlate("ownerId", "id")
ISSUE_CHILDREN = correlate("id", "issueId")  # tags and comments of an issue
COMMENT_AUTHOR = correlate("authorId", "id")
COMMENT_ISSUE = correlate("issueId", "id")


# --- fragments ------------------------------------------------------------------------


def user_badge():
    return table("user").select("id", "name")


def issue_chrome(query):
    return (
        query.select("id", "title", "status", "priority", "ownerId")
        .related("owner", ISSUE_OWNER, user_badge(), one=True)
        .related("tags", ISSUE_CHILDREN, table("tag").select("id", "name").order_by("name"))
    )


def issue_card(query):
    return (
        issue_chrome(query)
        .select("updatedAt")
        .count_as("commentCount", ISSUE_CHILDREN, table("comment"))
    )


def comment_card(query):
    return query.select("id", "authorId", "body", "createdAt").related(
        "author", COMMENT_AUTHOR, user_badge(), one=True
    )


def newest_first(query):
    return query.order_by("createdAt", "desc").order_by("id", "asc")


# --- arguments ------------------------------------------------------------------------


class FilterTerm(serializers.Serializer):
    axis = serializers.ChoiceField(choices=AXES)
    value = serializers.CharField(max_length=FILTER_VALUE_MAX, trim_whitespace=False)


class IssuesPageArgs(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=PAGE_MAX)
    filter = FilterTerm(many=True, required=False)


class LimitArgs(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=PAGE_MAX)


class RecentCommentsArgs(serializers.Serializer):
    limit = serializers.IntegerField(min_value=1, max_value=30)


def _contains(value):
    escaped = value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _filter(query, term):
    axis, value = term["axis"], term["value"]
    if axis == "title":
        return query.where("title", "ILIKE", _contains(value))
    if axis in ("status", "priority"):
        return query.where(axis, "=", value)
    if axis == "owner":
        return query.where(
            exists(ISSUE_OWNER, table("user").where("name", "ILIKE", _contains(value)))
        )
    if axis == "tag":
        return query.where(
            exists(ISSUE_CHILDREN, table("tag").where("name", "ILIKE", _contains(value)))
        )
    return query.where(
        exists(ISSUE_CHILDREN, table("comment").where("body", "ILIKE", _contains(value)))
    )


# --- the queries ----------------------------------------------------------------------


@named_query("issuesPage", args=IssuesPageArgs)
def issues_page(args, ctx):
    query = table("issue")
    for term in args.get("filter") or ():
        query = _filter(query, term)
    return issue_card(newest_first(query)).limit(args["limit"])


@named_query("myIssues", args=LimitArgs)
def my_issues(args, ctx):
    me = getattr(ctx.user, "username", "") or ""
    query = table("issue").where("ownerId", "=", me)
    return issue_card(newest_first(query)).limit(args["limit"])


@room_profile("issue", key=lambda issue_id: issue_id, context=("user",), example_key="probe")
def issue_room(issue_id, ctx):
    """One issue's room: the issue, its comments and tags (users are read, never written)."""
    return (
        table("issue")
        .where("id", "=", issue_id)
        .related("comments", ISSUE_CHILDREN, table("comment"))
        .related("tags", ISSUE_CHILDREN, table("tag"))
        .related("owner", ISSUE_OWNER, table("user"))
    )


@named_query(
    "issueDetail",
    args=serializers.CharField(max_length=128, trim_whitespace=False),
    realtime="issue",
)
def issue_detail(issue_id, ctx):
    query = issue_chrome(table("issue").where("id", "=", issue_id)).select("updatedAt")
    comments = comment_card(table("comment")).order_by("createdAt").order_by("id")
    return query.related("comments", ISSUE_CHILDREN, comments).one()


@named_query(
    "issueLive",
    args=serializers.CharField(max_length=128, trim_whitespace=False),
    realtime="issue",
)
def issue_live(issue_id, ctx):
    """
    The issue's own fields, without relationships: what the issue page serves from the
    room once two people are on it (``rindle.js`` joins no rows from a room). The rest
    of the page stays on ``issueDetail`` over the main socket, since comments and tags
    are written on the main path, which a room's rows do not follow.
    """
    query = table("issue").where("id", "=", issue_id)
    return query.select("id", "title", "status", "priority", "updatedAt").one()


@named_query("recentComments", args=RecentCommentsArgs)
def recent_comments(args, ctx):
    issue = table("issue").select("id", "title", "status")
    query = comment_card(newest_first(table("comment")))
    return query.related("issue", COMMENT_ISSUE, issue, one=True).limit(args["limit"])


@named_query("users")
def users(args, ctx):
    return table("user").order_by("name")


@named_query("tagOptions")
def tag_options(args, ctx):
    return table("tag").select("name").order_by("name")
