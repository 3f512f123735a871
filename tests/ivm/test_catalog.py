"""The catalog: shared queries, families, routing, fault isolation, versions."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rindle_app.ivm.ast import to_json
from rindle_app.ivm.catalog import Catalog, FamilyTemplate
from rindle_app.ivm.evaluate import evaluate
from rindle_app.ivm.view import View
from tests.support.wire import compare, parameter, simple

from ..conftest import examples
from .test_view import SCHEMA, batch_changes, batches, fresh_footprint, queries, row_key, seed_rows


def rows_now(catalog):
    return {t: list(catalog.store.rows(t)) for t in SCHEMA}


def commit(catalog, shadow, batch):
    return catalog.commit(catalog.version + 1, batch_changes(shadow, batch))


@settings(max_examples=examples(60))
@given(qs=st.lists(queries(), min_size=2, max_size=6), seed=seed_rows(), writes=batches(5))
def test_every_view_of_a_catalog_stays_exact_whatever_the_routing_skips(qs, seed, writes):
    """Views the router did not visit are still exact: routing never skips a view it must reach."""
    catalog = Catalog(SCHEMA)
    catalog.load(1, seed)
    shared = [catalog.register(to_json(q)) for q in qs]
    shadow = {(t, r["id"]): r for t, rows in seed.items() for r in rows}
    for batch in writes:
        outputs, faults = commit(catalog, shadow, batch)
        assert faults == []
        rows = rows_now(catalog)
        for s in shared:
            assert s.view.result() == evaluate(s.query, rows, SCHEMA)


def test_identical_asts_share_one_view_and_late_subscribers_start_from_the_footprint():
    """Field order does not matter; a second subscriber's seq 0 is the current footprint."""
    catalog = Catalog(SCHEMA)
    catalog.load(
        1, {"issue": [{"id": 1, "owner": 1, "score": 1, "title": "a"}], "comment": [], "label": []}
    )
    ast = {
        "table": "issue",
        "orderBy": [["id", "asc"]],
        "related": [
            {
                "correlation": {"parentField": ["id"], "childField": ["issue"]},
                "subquery": {"table": "comment", "alias": "comments"},
            }
        ],
    }
    reordered = {"related": ast["related"], "orderBy": ast["orderBy"], "table": "issue"}
    a, b = catalog.register(ast), catalog.register(reordered)
    assert a is b and len(catalog.queries) == 1
    assert catalog.attach(a.key, "sub-1") == [
        {"table": "issue", "op": "add", "row": {"id": 1, "owner": 1, "score": 1, "title": "a"}}
    ]
    catalog.commit(2, [("comment", None, {"id": 5, "issue": 1, "body": "hi"})])
    late = catalog.attach(a.key, "sub-2")
    expected = fresh_footprint(a.query, rows_now(catalog))
    assert {row_key(op["table"], op["row"]): op["row"] for op in late} == expected
    catalog.detach("sub-1")
    assert catalog.queries[a.key].subscribers == {"sub-2"}


def test_a_change_reaches_its_family_partition_through_the_binding_index(monkeypatch):
    """Bindings of a family are looked up by value: other partitions are never visited."""
    catalog = Catalog(SCHEMA)
    catalog.load(1, {"issue": [], "comment": [], "label": []})
    template = FamilyTemplate(
        {
            "table": "issue",
            "where": compare("owner", "=", parameter()),
            "orderBy": [["score", "desc"]],
            "limit": 2,
        }
    )
    parts = {owner: catalog.bind("byOwner", template, owner) for owner in range(50)}
    visited = []
    original = View.apply

    def spy(self, changes, affected=None):
        visited.append(self)
        return original(self, changes, affected)

    monkeypatch.setattr(View, "apply", spy)
    outputs, _ = catalog.commit(
        2, [("issue", None, {"id": 1, "owner": 7, "score": 3, "title": "x"})]
    )
    assert visited == [parts[7].view]
    assert list(outputs) == [parts[7].key]
    assert parts[7].view.result() == [{"id": 1, "owner": 7, "score": 3, "title": "x"}]
    # Moving the row to another owner visits exactly the partition it left and the one it joins.
    visited.clear()
    catalog.commit(
        3,
        [
            (
                "issue",
                {"id": 1, "owner": 7, "score": 3, "title": "x"},
                {"id": 1, "owner": 9, "score": 3, "title": "x"},
            )
        ],
    )
    assert {id(v) for v in visited} == {id(parts[7].view), id(parts[9].view)}
    assert parts[7].view.result() == [] and len(parts[9].view.result()) == 1
    # A change below the root (a comment) is traced to its issue once for the whole
    # family, then sent only to the partition holding that issue's owner.
    catalog_with_comments = Catalog(SCHEMA)
    catalog_with_comments.load(
        1,
        {
            "issue": [{"id": i, "owner": i, "score": i, "title": "t"} for i in range(30)],
            "comment": [],
            "label": [],
        },
    )
    with_comments = FamilyTemplate(
        {
            **template.ast,
            "related": [
                {
                    "correlation": {"parentField": ["id"], "childField": ["issue"]},
                    "subquery": {"table": "comment", "alias": "comments"},
                }
            ],
        }
    )
    members = {o: catalog_with_comments.bind("f", with_comments, o) for o in range(30)}
    visited.clear()
    catalog_with_comments.commit(2, [("comment", None, {"id": 1, "issue": 12, "body": "hi"})])
    assert visited == [members[12].view]
    assert members[12].view.result()[0]["comments"] == [{"id": 1, "issue": 12, "body": "hi"}]
    assert catalog.unbind("byOwner", 9) and catalog.partition("byOwner", 9) is None


def test_a_failing_view_faults_only_its_own_query(monkeypatch):
    """An exception in one view faults that query (its subscribers, retryably); others go on."""
    catalog = Catalog(SCHEMA)
    catalog.load(1, {"issue": [], "comment": [], "label": []})
    good = catalog.register({"table": "issue"})
    bad = catalog.register({"table": "issue", "orderBy": [["score", "asc"]]})
    catalog.attach(bad.key, "s1")
    catalog.attach(bad.key, "s2")
    original = View.apply

    def explode(self, changes, affected=None):
        if self is bad.view:
            raise RuntimeError("bug in an operator")
        return original(self, changes, affected)

    monkeypatch.setattr(View, "apply", explode)
    outputs, faults = catalog.commit(
        2, [("issue", None, {"id": 1, "owner": 1, "score": 1, "title": "t"})]
    )
    assert [(f.key, f.subscribers, f.retryable) for f in faults] == [(bad.key, ["s1", "s2"], True)]
    assert "bug in an operator" in faults[0].message
    assert bad.key not in catalog.queries
    assert good.view.result() == [{"id": 1, "owner": 1, "score": 1, "title": "t"}]
    assert list(outputs) == [good.key]


def test_a_replayed_commit_is_not_applied_twice():
    """A commit at or below the catalog's version is ignored."""
    catalog = Catalog(SCHEMA)
    catalog.load(5, {"issue": [], "comment": [], "label": []})
    shared = catalog.register({"table": "issue"})
    row = {"id": 1, "owner": None, "score": None, "title": None}
    assert catalog.commit(5, [("issue", None, row)]) == ({}, [])
    assert shared.view.result() == []
    catalog.commit(6, [("issue", None, row)])
    assert catalog.commit(6, [("issue", row, None)]) == ({}, [])
    assert shared.view.result() == [row]


def test_snapshot_nests_cells_under_cols():
    """query_snapshot's shape: {cols: {...}, <alias>: ...}, so no column hides an alias."""
    catalog = Catalog(SCHEMA)
    catalog.load(
        1,
        {
            "issue": [{"id": 1, "owner": 2, "score": 0, "title": "t"}],
            "comment": [{"id": 3, "issue": 1, "body": "b"}],
            "label": [],
        },
    )
    shared = catalog.register(
        {
            "table": "issue",
            "select": ["id"],
            "related": [
                {
                    "correlation": {"parentField": ["id"], "childField": ["issue"]},
                    "subquery": {"table": "comment", "alias": "comments", "select": ["body"]},
                },
                {
                    "correlation": {"parentField": ["id"], "childField": ["issue"]},
                    "subquery": {"table": "label", "alias": "labelCount", "aggregate": "count"},
                },
            ],
        }
    )
    assert catalog.snapshot(shared.key) == [
        {"cols": {"id": 1}, "comments": [{"cols": {"body": "b"}}], "labelCount": 0}
    ]


def test_a_template_without_an_equality_parameter_is_refused():
    """A family needs a root `column = parameter`."""
    with pytest.raises(ValueError):
        FamilyTemplate({"table": "issue"})


def test_a_guarded_query_that_reads_its_own_table_again_is_not_pruned_by_its_guard():
    """With a self-join, a row failing the root guard can still change a guarded row's subtree."""
    catalog = Catalog(SCHEMA)
    catalog.load(
        1,
        {
            "issue": [
                {"id": 1, "owner": 2, "score": 0, "title": "guarded"},
                {"id": 2, "owner": 9, "score": 0, "title": "before"},
            ],
            "comment": [],
            "label": [],
        },
    )
    shared = catalog.register(
        {
            "table": "issue",
            "where": simple("owner", "=", 2),
            "related": [
                {
                    "correlation": {"parentField": ["owner"], "childField": ["id"]},
                    "subquery": {"table": "issue", "alias": "ownerIssue", "one": True},
                }
            ],
        }
    )
    old = {"id": 2, "owner": 9, "score": 0, "title": "before"}
    new = {**old, "title": "after"}
    catalog.commit(2, [("issue", old, new)])  # owner 9 fails the guard owner = 2
    assert shared.view.result()[0]["ownerIssue"]["title"] == "after"
    assert shared.view.result() == evaluate(shared.query, rows_now(catalog), SCHEMA)


def test_fault_subscribers_detaches_everyone_and_keeps_the_query():
    """Subscribers are faulted (to re-subscribe) while the query stays for a later destroy."""
    catalog = Catalog(SCHEMA)
    catalog.load(1, {"issue": [], "comment": [], "label": []})
    shared = catalog.register({"table": "issue"})
    catalog.attach(shared.key, "a")
    fault = catalog.fault_subscribers(shared.key, "dematerializing")
    assert (fault.subscribers, fault.message, fault.retryable) == (["a"], "dematerializing", True)
    assert shared.key in catalog.queries and not shared.subscribers
    catalog.destroy(shared.key)
    assert shared.key not in catalog.queries


def test_partition_snapshot_reads_one_bound_partition():
    """A family partition's snapshot holds only that binding's rows."""
    catalog = Catalog(SCHEMA)
    rows = [{"id": i, "owner": i % 2, "score": i, "title": "t"} for i in range(1, 5)]
    catalog.load(1, {"issue": rows, "comment": [], "label": []})
    template = FamilyTemplate(
        {
            "table": "issue",
            "select": ["id"],
            "where": compare("owner", "=", parameter()),
        }
    )
    catalog.bind("f", template, 1)
    assert catalog.partition_snapshot("f", 1) == [{"cols": {"id": 1}}, {"cols": {"id": 3}}]
    assert catalog.partition_snapshot("f", 0) == []


def test_a_root_aggregate_is_answered_once_but_not_maintained_live():
    """evaluate() counts at the root; the catalog says plainly it cannot maintain it yet."""
    from rindle_app.ivm.ast import QueryError, parse

    rows = {
        "issue": [
            {"id": 1, "owner": 1, "score": 1, "title": "a"},
            {"id": 2, "owner": 2, "score": 1, "title": "b"},
        ]
    }
    query = parse({"table": "issue", "aggregate": "count"}, SCHEMA)
    assert evaluate(query, rows, SCHEMA) == 2
    catalog = Catalog(SCHEMA)
    catalog.load(1, rows)
    with pytest.raises(QueryError) as info:
        catalog.register({"table": "issue", "aggregate": "count"})
    assert info.value.code == "unsupported"
