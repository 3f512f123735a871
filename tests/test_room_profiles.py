"""
Room profiles are checked loudly: a windowed footprint, a context table outside the
footprint or a label naming a missing profile is a system check error; the write
scopes a room boots with are compiled from the footprint; occupancy counts the
other live sessions and those expired within the grace window.
"""

import pytest
from django.db import connection

from rindle_app import named, rooms
from rindle_app.ivm.builder import correlate, table
from rindle_app.rooms import compile_scopes, find_window


@pytest.fixture
def scratch(monkeypatch):
    """Registries the test may add to, restored afterwards."""
    monkeypatch.setattr(rooms, "_profiles", dict(rooms._profiles))
    monkeypatch.setattr(named, "_registry", dict(named._registry))


ISSUE = correlate("id", "issueId")


@pytest.mark.parametrize(
    ("query", "where"),
    [
        (table("issue").limit(5), "limit at footprint.limit"),
        (table("issue").one(), "one() at footprint.one"),
        (
            table("issue").related("c", ISSUE, table("comment").limit(1)),
            "limit at footprint.related[c].limit",
        ),
    ],
)
def test_a_window_anywhere_in_a_footprint_is_found(query, where):
    assert find_window(query.build()) == where
    assert find_window(table("issue").related("c", ISSUE, table("comment")).build()) is None


def test_a_windowed_or_inconsistent_profile_is_a_system_check_error(scratch):
    from rindle_app.checks import _check_room_profiles

    rooms.room_profile("paged", key=str, example_key="1")(lambda key, ctx: table("x").limit(3))
    rooms.room_profile("ctx", key=str, context=("user",), example_key="1")(
        lambda key, ctx: table("issue").where("id", "=", key)
    )
    named.named_query("orphan", realtime="missing")(lambda args, ctx: table("issue"))
    problems = [e.msg for e in _check_room_profiles()]
    assert {e.id for e in _check_room_profiles()} == {"rindle.E035"}
    assert any("'paged'" in p and "unwindowed" in p for p in problems)
    assert any("'ctx'" in p and "'user'" in p for p in problems)
    assert any("'orphan'" in p and "'missing'" in p for p in problems)


def test_the_demo_profiles_pass_the_check():
    from rindle_app.checks import _check_room_profiles

    assert _check_room_profiles() == []


def test_a_label_is_a_profile_name_or_room_and_args():
    assert rooms.RealtimeLabel.of("issue") == rooms.RealtimeLabel("issue")
    mapper = lambda args: args["id"]  # noqa: E731
    assert rooms.RealtimeLabel.of({"room": "issue", "args": mapper}).args is mapper
    with pytest.raises(ValueError):
        rooms.RealtimeLabel.of(7)
    with pytest.raises(ValueError):
        rooms.room_profile("a/b", key=str)


def test_the_write_scopes_keep_row_local_predicates_and_mark_context_tables():
    footprint = (
        table("issue")
        .where("id", "=", "i1")
        .related("comments", ISSUE, table("comment").where("deleted", "=", False))
        .related("owner", correlate("ownerId", "id"), table("user"))
    ).build()
    scopes = {s["table"]: s for s in compile_scopes(footprint, {"user"})}
    assert scopes["issue"]["footprintWhere"]["right"]["value"] == "i1"
    assert scopes["issue"]["writable"]["joinKeyCols"] == ["id", "ownerId"]
    assert "footprintWhere" not in scopes["comment"]  # a child: membership is not exact
    assert scopes["comment"]["writable"]["where"]["left"]["name"] == "deleted"
    assert scopes["comment"]["writable"]["joinKeyCols"] == ["issueId"]
    assert scopes["user"] == {"table": "user", "writable": {"kind": "none"}}
    whole = compile_scopes(table("issue").build())
    assert whole == [
        {
            "table": "issue",
            "footprintWhere": {"type": "and", "conditions": []},
            "writable": {"kind": "predicate", "joinKeyCols": []},
        }
    ]


def test_an_or_with_a_non_row_local_branch_is_dropped_whole():
    from rindle_app.ivm.builder import exists, or_

    footprint = (
        table("issue")
        .where(or_({"type": "simple", "op": "=", "left": {"type": "column", "name": "a"},
                    "right": {"type": "literal", "value": 1}},
                   exists(ISSUE, table("comment"))))
    ).build()  # fmt: skip
    (spec, _comment) = compile_scopes(footprint)
    assert "footprintWhere" not in spec and "where" not in spec["writable"]


@pytest.mark.django_db(transaction=True)
def test_occupancy_counts_other_live_sessions_and_the_recently_expired(settings):
    from rindle_app.engine import get_engine, shutdown

    shutdown()
    engine = get_engine()
    try:
        settings.RINDLE = {**settings.RINDLE, "ROOM_SESSION_TTL": 10, "ROOM_SESSION_GRACE": 5}
        now = 1_000_000_000
        assert rooms.touch_session(engine, "issue/1", "a", now) == (0, 0, 0)
        assert rooms.touch_session(engine, "issue/1", "b", now) == (1, 0, 1)
        assert rooms.touch_session(engine, "issue/1", "a", now) == (1, 0, 1)  # a renewal
        # b expired 2 s ago: within the grace, so it still holds the room open.
        assert rooms.touch_session(engine, "issue/1", "a", now + 12_000) == (0, 1, 1)
        # Past the grace b no longer holds it open, but says a room plausibly existed.
        assert rooms.touch_session(engine, "issue/1", "a", now + 20_000) == (0, 0, 1)
        # Long past grace + slack, b is swept by the next touch of the scope.
        assert rooms.touch_session(engine, "issue/1", "a", now + 200_000) == (0, 0, 0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT client_id FROM _rindle_scope_sessions ORDER BY client_id")
            assert cursor.fetchall() == [("a",)]
    finally:
        shutdown()


@pytest.mark.parametrize("value", [0, -1, "300", True, None])
def test_bad_session_timings_are_a_system_check_error(settings, value):
    from rindle_app.checks import _check_room_profiles

    settings.RINDLE = {**settings.RINDLE, "ROOM_SESSION_GRACE": value}
    assert [e.id for e in _check_room_profiles()] == ["rindle.E036"]


@pytest.mark.django_db(transaction=True)
def test_a_footprint_loads_every_row_the_doc_owns_and_no_other():
    from project.demo import models as demo
    from rindle_app.engine import get_engine, shutdown

    shutdown()
    engine = get_engine()
    try:
        for uid in ("u1", "u2"):
            demo.User.objects.create(id=uid, name=uid)
        for iid, owner in (("i1", "u1"), ("i2", "u2")):
            demo.Issue.objects.create(
                id=iid, title=iid, status="todo", priority="low", owner_id=owner,
                created_at=1, updated_at=1,
            )  # fmt: skip
            demo.Comment.objects.create(
                id=f"c-{iid}", issue_id=iid, author_id=owner, body="b", created_at=1
            )
            demo.Tag.objects.create(id=f"t-{iid}", issue_id=iid, name="x")
        profile, key = rooms.split_doc("issue/i1")
        rows = rooms.load_footprint(engine, profile, key)
        assert {t: sorted(r["id"] for r in rs) for t, rs in rows.items()} == {
            "issue": ["i1"],
            "comment": ["c-i1"],
            "tag": ["t-i1"],
            "user": ["u1"],
        }
        assert rows["issue"][0]["ownerId"] == "u1" and "comments" not in rows["issue"][0]
    finally:
        shutdown()
