"""The AST: validation with clear errors, ordering completion, and the canonical key."""

import pytest

from rindle_app.ivm.ast import QueryError, parse, query_key, to_json
from rindle_app.ivm.fixtures import Schema
from tests.support.wire import column, compare, exists, rel, simple

SCHEMA = Schema.from_sources(
    {
        "issue": {
            "columns": {"id": {}, "owner": {}, "score": {"type": "number"}},
            "primaryKeys": ["id"],
        },
        "comment": {"columns": {"id": {}, "issue": {}, "body": {}}, "primaryKeys": ["id"]},
        "tagged": {"columns": {"a": {}, "b": {}}, "primaryKeys": ["b", "a"]},
    }
)

COMMENTS = rel(["id"], ["issue"], {"table": "comment", "alias": "comments"})


def refused(ast):
    with pytest.raises(QueryError) as info:
        parse(ast, SCHEMA)
    return info.value


def test_missing_pk_columns_are_appended_at_every_level():
    """Each level's orderBy ends with the primary key, EXISTS subqueries included."""
    q = parse(
        {
            "table": "tagged",
            "orderBy": [["a", "desc"]],
            "where": exists(["a"], ["issue"], {"table": "comment"}),
            "related": [
                rel(
                    ["a"],
                    ["issue"],
                    {"table": "comment", "alias": "c", "orderBy": [["body", "asc"]]},
                )
            ],
        },
        SCHEMA,
    )
    assert q.order_by == (("a", "desc"), ("b", "asc"))
    assert q.related[0].subquery.order_by == (("body", "asc"), ("id", "asc"))
    assert q.where.related.subquery.order_by == (("id", "asc"),)
    assert q.where.related.subquery.alias == "comment"  # an EXISTS alias defaults to the table


def test_the_query_key_ignores_field_order_and_flip():
    """{table, orderBy} and {orderBy, table} are one query; flip never changes a result."""
    a = parse({"table": "issue", "orderBy": [["score", "asc"]]}, SCHEMA)
    b = parse({"orderBy": [["score", "asc"]], "table": "issue"}, SCHEMA)
    assert query_key(a) == query_key(b)
    where = {"type": "correlatedSubquery", "op": "EXISTS", "related": COMMENTS}
    flipped = {**where, "flip": True}
    assert query_key(parse({"table": "issue", "where": where}, SCHEMA)) == query_key(
        parse({"table": "issue", "where": flipped}, SCHEMA)
    )
    assert query_key(a) != query_key(parse({"table": "issue"}, SCHEMA))


def test_one_implies_limit_one_and_a_repeated_alias_keeps_the_last():
    """one: true caps the limit at 1; the last related entry of an alias wins."""
    second = {**COMMENTS, "subquery": {**COMMENTS["subquery"], "orderBy": [["body", "desc"]]}}
    q = parse({"table": "issue", "one": True, "related": [COMMENTS, second]}, SCHEMA)
    assert q.limit == 1
    assert len(q.related) == 1
    assert q.related[0].subquery.order_by[0] == ("body", "desc")


def test_normalized_json_round_trips():
    """to_json of a parsed query parses back to the same query."""
    ast = {
        "table": "issue",
        "where": {
            "type": "or",
            "conditions": [
                simple("owner", "IN", ["a", "b"]),
                {"type": "correlatedSubquery", "op": "NOT EXISTS", "related": COMMENTS},
            ],
        },
        "related": [{**COMMENTS, "subquery": {**COMMENTS["subquery"], "aggregate": "count"}}],
        "start": {"row": {"score": 3, "id": "x"}, "exclusive": True},
        "orderBy": [["score", "desc"]],
        "limit": 10,
    }
    q = parse(ast, SCHEMA)
    assert parse(to_json(q), SCHEMA) == q


@pytest.mark.parametrize(
    "ast, code, where",
    [
        ({"table": "nope"}, "unknown_table", "$.table"),
        ({"table": "issue", "select": ["nope"]}, "unknown_column", "$.select[0]"),
        ({"table": "issue", "orderBy": [["score", "up"]]}, "invalid_query", "$.orderBy[0]"),
        ({"table": "issue", "limit": -1}, "invalid_query", "$.limit"),
        ({"table": "issue", "bogus": 1}, "invalid_query", "$"),
        ({"table": "issue", "groupBy": ["owner"]}, "unsupported", "$"),
        (
            {"table": "issue", "related": [{**COMMENTS, "subquery": {"table": "comment"}}]},
            "invalid_query",
            "$.related[0].subquery.alias",
        ),
        (
            {
                "table": "issue",
                "related": [
                    {**COMMENTS, "correlation": {"parentField": ["id"], "childField": ["x"]}}
                ],
            },
            "unknown_column",
            "$.related[0].correlation.childField[0]",
        ),
        (
            {"table": "issue", "where": compare("owner", "=", column("id"))},
            "unsupported",
            "$.where.right",
        ),
        (
            {"table": "issue", "where": simple("owner", "IN", "a")},
            "invalid_query",
            "$.where.right.value",
        ),
        ({"table": "issue", "where": simple("owner", "~", "a")}, "unsupported", "$.where.op"),
        ({"table": "issue", "aggregate": "count", "orderBy": [["id", "asc"]]}, "unsupported", "$"),
        (
            {
                "table": "issue",
                "related": [
                    {
                        **COMMENTS,
                        "subquery": {
                            "table": "comment",
                            "alias": "n",
                            "aggregate": "count",
                            "limit": 2,
                        },
                    }
                ],
            },
            "unsupported",
            "$.related[0].subquery",
        ),
        (
            {
                "table": "issue",
                "where": {
                    "type": "correlatedSubquery",
                    "op": "EXISTS",
                    "related": {
                        **COMMENTS,
                        "subquery": {
                            "table": "comment",
                            "start": {"row": {"id": 1}, "exclusive": False},
                        },
                    },
                },
            },
            "unsupported",
            "$.where.related.subquery",
        ),
        (
            {"table": "issue", "start": {"row": {"score": 1}, "exclusive": True}},
            "invalid_query",
            "$.start.row",
        ),
    ],
)
def test_unsupported_or_unknown_parts_are_refused_by_name(ast, code, where):
    """Each refusal carries a machine-readable code and the path of the offending part."""
    error = refused(ast)
    assert (error.code, error.path) == (code, where)
    assert error.path in str(error)


def test_sum_and_avg_need_a_number_column_and_negative_zero_is_zero():
    """sum over a text column is refused; a -0.0 literal reads as 0.0, as databases store it."""
    error = refused(
        {
            "table": "issue",
            "related": [
                {
                    **COMMENTS,
                    "subquery": {"table": "comment", "alias": "s", "aggregate": {"sum": "body"}},
                }
            ],
        }
    )
    assert error.code == "unsupported" and "number column" in error.message
    q = parse({"table": "issue", "where": simple("score", "=", -0.0)}, SCHEMA)
    assert str(q.where.value) == "0.0"
