"""The builder: the original clients' wire JSON, parsed, keyed like a hand-written AST."""

import pytest

from rindle_app.ivm.ast import QueryError, parse, query_key
from rindle_app.ivm.builder import (
    and_,
    cond,
    correlate,
    exists,
    not_,
    not_exists,
    or_,
    table,
)
from rindle_app.ivm.fixtures import Schema

# The demo's tables (project/demo/models.py), with the original's column names.
DEMO = Schema.from_sources(
    {
        "user": {"columns": {"id": {}, "name": {}}, "primaryKeys": ["id"]},
        "issue": {
            "columns": {
                "id": {},
                "title": {},
                "status": {},
                "priority": {},
                "ownerId": {},
                "createdAt": {"type": "number"},
                "updatedAt": {"type": "number"},
            },
            "primaryKeys": ["id"],
        },
        "tag": {"columns": {"id": {}, "issueId": {}, "name": {}}, "primaryKeys": ["id"]},
        "comment": {
            "columns": {
                "id": {},
                "issueId": {},
                "authorId": {},
                "body": {},
                "createdAt": {"type": "number"},
            },
            "primaryKeys": ["id"],
        },
    }
)

# rindle-original.md §6: issuesPage({limit: 50, filter: [{axis: "tag", value: "ui"}]}).
ISSUES_PAGE = {
    "table": "issue",
    "where": {
        "type": "correlatedSubquery",
        "op": "EXISTS",
        "related": {
            "correlation": {"parentField": ["id"], "childField": ["issueId"]},
            "subquery": {
                "table": "tag",
                "alias": "tag",
                "where": {
                    "type": "simple",
                    "op": "ILIKE",
                    "left": {"type": "column", "name": "name"},
                    "right": {"type": "literal", "value": "%ui%"},
                },
            },
        },
    },
    "related": [
        {
            "correlation": {"parentField": ["id"], "childField": ["issueId"]},
            "subquery": {"table": "comment", "alias": "commentCount", "aggregate": "count"},
        },
        {
            "correlation": {"parentField": ["ownerId"], "childField": ["id"]},
            "subquery": {"table": "user", "alias": "owner", "select": ["id", "name"]},
        },
        {
            "correlation": {"parentField": ["id"], "childField": ["issueId"]},
            "subquery": {
                "table": "tag",
                "alias": "tags",
                "select": ["id", "name"],
                "orderBy": [["name", "asc"]],
            },
        },
    ],
    "orderBy": [["createdAt", "desc"], ["id", "asc"]],
    "limit": 50,
    "select": ["id", "ownerId", "priority", "status", "title", "updatedAt"],
}

ISSUE_TAGS = correlate("id", "issueId")


def issues_page():
    return (
        table("issue")
        .where(exists(ISSUE_TAGS, table("tag").where("name", "ILIKE", "%ui%")))
        .count_as("commentCount", ISSUE_TAGS, table("comment"))
        .related("owner", correlate("ownerId", "id"), table("user").select("id", "name"))
        .related("tags", ISSUE_TAGS, table("tag").select("id", "name").order_by("name"))
        .order_by("createdAt", "desc")
        .order_by("id")
        .limit(50)
        .select("id", "ownerId", "priority", "status", "title", "updatedAt")
    )


def test_the_issues_page_example_builds_the_original_wire_json():
    """The builder emits exactly the §6 JSON (dict key order aside)."""
    assert issues_page().build() == ISSUES_PAGE


def test_the_build_parses_and_keys_like_the_hand_written_json():
    q = issues_page().parse(DEMO)
    assert q == parse(ISSUES_PAGE, DEMO)
    assert query_key(q) == query_key(parse(ISSUES_PAGE, DEMO))
    assert [r.subquery.alias for r in q.related] == ["commentCount", "owner", "tags"]
    assert q.where.related.subquery.alias == "tag"


def test_equivalent_builds_share_a_query_key():
    """Call order, where-vs-and_, and an explicit trailing pk do not change the key."""
    a = table("issue").where("status", "=", "todo").where("priority", "=", "high")
    b = table("issue").where(and_(cond("status", "=", "todo"), cond("priority", "=", "high")))
    assert a.build() == b.build()
    c = a.order_by("createdAt", "desc").limit(10)
    d = a.limit(10).order_by("createdAt", "desc").order_by("id", "asc")
    assert c.build() != d.build()
    assert query_key(c.parse(DEMO)) == query_key(d.parse(DEMO))
    assert query_key(c.parse(DEMO)) != query_key(a.parse(DEMO))


def test_the_brief_example_and_every_builder_method_parse():
    q = (
        table("issue")
        .where("status", "=", "todo")
        .where(exists(ISSUE_TAGS, table("tag").where("name", "ILIKE", "%ui%")))
        .order_by("createdAt", "desc")
        .limit(50)
        .related("owner", correlate("ownerId", "id"), table("user").select("id", "name"), one=True)
        .count_as("commentCount", ISSUE_TAGS, table("comment"))
        .start({"createdAt": 5.0, "id": "i9"}, exclusive=True)
    )
    ast = q.build()
    assert ast["where"]["type"] == "and"
    assert [c["type"] for c in ast["where"]["conditions"]] == ["simple", "correlatedSubquery"]
    assert ast["related"][0]["subquery"] == {
        "table": "user",
        "alias": "owner",
        "select": ["id", "name"],
        "one": True,
    }
    assert ast["start"] == {"row": {"createdAt": 5.0, "id": "i9"}, "exclusive": True}
    parsed = q.parse(DEMO)
    assert parsed.related[0].subquery.one and parsed.related[0].subquery.limit == 1
    assert parsed.start.exclusive
    one = table("issue").where("id", "=", "i1").one().parse(DEMO)
    assert one.one and one.limit == 1


def test_builders_are_immutable():
    base = table("issue").where("status", "=", "todo")
    base.where("priority", "=", "low").limit(3).select("id")
    assert base.build() == {"table": "issue", "where": cond("status", "=", "todo")}
    built = base.build()
    built["where"]["op"] = "!="
    assert base.build()["where"]["op"] == "="


def test_permission_gates_and_not_exists():
    gate = exists(
        correlate("ownerId", "id"), table("user").where("name", "=", "me"), system="permissions"
    )
    assert gate["related"]["system"] == "permissions"
    q = table("issue").where(gate).where(not_exists(ISSUE_TAGS, table("tag"))).parse(DEMO)
    assert q.where.conditions[0].related.system == "permissions"
    assert q.where.conditions[1].negated
    assert q.visible_related == ()


def test_or_and_and_nest_and_not_pushes_negation_into_the_operators():
    c = or_(
        cond("status", "IN", ["todo", "done"]),
        and_(cond("title", "LIKE", "a%"), exists(ISSUE_TAGS, table("tag"))),
    )
    assert not_(c) == and_(
        cond("status", "NOT IN", ["todo", "done"]),
        or_(cond("title", "NOT LIKE", "a%"), not_exists(ISSUE_TAGS, table("tag"))),
    )
    assert not_(not_(c)) == c
    assert not_(cond("ownerId", "IS", None)) == cond("ownerId", "IS NOT", None)
    assert not_(cond("createdAt", "<", 3)) == cond("createdAt", ">=", 3)
    table("issue").where(not_(c)).parse(DEMO)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: cond("status", "==", 1), "unknown operator '=='"),
        (lambda: cond("status", "IN", "todo"), "IN needs a list"),
        (lambda: cond("createdAt", "=", float("nan")), "is not a literal"),
        (lambda: cond("status", "=", ["a"]), "is not a literal"),
        (lambda: table("issue").order_by("id", "up"), "direction"),
        (lambda: correlate(["a", "b"], "c"), "as many parent columns"),
    ],
)
def test_the_builder_refuses_malformed_parts(make, message):
    with pytest.raises(QueryError) as info:
        make()
    assert message in str(info.value)


def test_schema_problems_surface_at_parse():
    with pytest.raises(QueryError) as info:
        table("issue").where("nope", "=", 1).parse(DEMO)
    assert info.value.code == "unknown_column"
    assert info.value.path == "$.where.left.name"
