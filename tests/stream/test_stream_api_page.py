"""GET /v1/stream pages: committed events up to safe_seq in order, cursor rules, filters, scopes."""

import pytest
from django.db import connection, transaction

from project.demo import models as demo
from rindle_app import models
from rindle_app.stream import page as stream_page

from ..api.conftest import token_client
from .api_support import *  # noqa: F403  (the fixtures)
from .api_support import (
    HeldTransaction,
    current_state,
    postgres,
    publish,
    publish_to,
    set_horizon,
)

pytestmark = pytest.mark.django_db(transaction=True)


def users(*ids):
    for i in ids:
        demo.User.objects.create(id=i, name=f"name-{i}")


def get(client, **params):
    return client.get("/v1/stream", params)


def ok(response):
    assert response.status_code == 200, response.content
    return response.json()


def refused(response, status, code, reason=None):
    assert response.status_code == status, (response.status_code, response.content)
    error = response.json()["error"]
    assert error["code"] == code, error
    if reason is not None:
        assert error["reason"] == reason, error
    return error


def seqs(body):
    return [e["seq"] for e in body["events"]]


def test_events_come_in_seq_order_with_their_images_and_a_cursor_to_continue(reader):
    """A consumer reads every committed change in seq order, each with op, key, old and new."""
    users("a", "b")
    demo.User.objects.filter(id="a").update(name="renamed")
    demo.User.objects.filter(id="b").delete()
    publish()
    body = ok(get(reader))
    assert [(e["op"], e["key"]) for e in body["events"]] == [
        ("add", ["a"]),
        ("add", ["b"]),
        ("edit", ["a"]),
        ("remove", ["b"]),
    ]
    assert seqs(body) == sorted(seqs(body))
    edit = body["events"][2]
    assert edit["old"]["name"] == "name-a" and edit["new"]["name"] == "renamed"
    assert body["events"][3]["new"] is None and body["events"][0]["old"] is None
    assert all(e["table"] == "user" and e["created_at"] for e in body["events"])
    state = current_state()
    assert body["cursor"] == f"{state.epoch}:{seqs(body)[-1]}"
    assert (body["epoch"], body["safe_seq"], body["horizon"]) == (state.epoch, state.safe_seq, 1)
    again = ok(get(reader, cursor=body["cursor"]))
    assert again["events"] == [] and again["cursor"] == body["cursor"]


def test_a_schema_change_is_an_event_of_op_ddl_in_its_place(reader):
    """A DDL marker reaches a consumer in seq order as op ddl, with no key and no images."""
    from rindle_app.engine.schema_changes import mark

    users("a")
    with transaction.atomic(), connection.cursor() as cursor:
        mark(cursor, connection.vendor, "user")
    users("b")
    publish()
    body = ok(get(reader))
    assert [(e["table"], e["op"], e["key"]) for e in body["events"]] == [
        ("user", "add", ["a"]),
        ("user", "ddl", []),
        ("user", "add", ["b"]),
    ]
    ddl = body["events"][1]
    assert ddl["old"] is None and ddl["new"] is None and ddl["created_at"]


def test_pages_split_the_stream_without_losing_or_repeating_an_event(reader):
    """Reading page by page with the returned cursor yields each event exactly once, in order."""
    users(*(f"u{n}" for n in range(7)))
    publish()
    everything = seqs(ok(get(reader)))
    seen, cursor = [], None
    for _ in range(10):
        body = ok(get(reader, limit=3, **({"cursor": cursor} if cursor else {})))
        seen += seqs(body)
        cursor = body["cursor"]
        if not body["more"]:
            break
    assert seen == everything and len(seen) == 7


def test_an_event_above_the_published_safe_seq_is_not_returned(reader):
    """
    A commit that overtook an open transaction holding a lower seq stays invisible
    until the watermark passes both: a consumer never moves past a seq that may still commit.
    """
    if not postgres():
        pytest.skip("SQLite's write lock orders commits by seq: nothing can overtake")
    users("before")
    published = publish()
    held = HeldTransaction("INSERT INTO \"user\" (id, name) VALUES ('slow', 'slow')")
    try:
        users("fast")  # commits with a higher seq while 'slow' holds the lower one open
        with connection.cursor() as cursor:
            cursor.execute("SELECT MAX(seq) FROM _rindle_change_events")
            fast_seq = cursor.fetchone()[0]
        publish_to(published)  # the watermark cannot pass the open transaction
        body = ok(get(reader))
        assert [e["key"] for e in body["events"]] == [["before"]]
        assert fast_seq > body["safe_seq"] == published
        assert body["cursor"].endswith(f":{published}")
    finally:
        held.release()
    publish()
    rest = ok(get(reader, cursor=body["cursor"]))
    assert [e["key"] for e in rest["events"]] == [["slow"], ["fast"]]


def test_cursor_boundaries_at_the_horizon_and_the_watermark(reader):
    """
    c = horizon-1 continues; c = horizon-2 must resnapshot; c = safe_seq is caught up;
    c = safe_seq+5 is ahead and must resnapshot; another epoch must resnapshot.
    """
    users(*(f"u{n}" for n in range(6)))
    publish()
    first = seqs(ok(get(reader)))
    horizon = first[3]
    set_horizon(horizon)
    state = current_state()
    epoch, safe = state.epoch, state.safe_seq

    body = ok(get(reader, cursor=f"{epoch}:{horizon - 1}"))
    assert seqs(body) == first[3:]
    error = refused(
        get(reader, cursor=f"{epoch}:{horizon - 2}"), 409, "resnapshot_required", "below_horizon"
    )
    assert error["horizon"] == horizon and error["epoch"] == epoch
    caught_up = ok(get(reader, cursor=f"{epoch}:{safe}"))
    assert caught_up["events"] == [] and caught_up["cursor"] == f"{epoch}:{safe}"
    refused(get(reader, cursor=f"{epoch}:{safe + 5}"), 409, "resnapshot_required", "ahead")
    refused(get(reader, cursor=f"0123abcd:{safe}"), 409, "resnapshot_required", "epoch_mismatch")
    # No cursor: from the oldest retained event.
    assert seqs(ok(get(reader))) == first[3:]


MALFORMED_CURSORS = [
    "", ":", "abc", "abc:", ":5", "abc:-1", "abc:1.5", "abc:1e3", "abc: 1", "abc:0x10",
    f"abc:{2**63}", "abc:99999999999999999999", "a b:1", "é:1", "x" * 65 + ":1",
]  # fmt: skip
MALFORMED_PARAMETERS = [
    {"limit": "0"}, {"limit": "-1"}, {"limit": "1001"}, {"limit": "ten"}, {"limit": "1.5"},
    {"wait": "-1"}, {"wait": "31"}, {"wait": "nan"}, {"wait": "1e3"}, {"tables": ""},
    {"tables": "user,"}, {"tables": ",".join(["user"] * 65)}, {"since": "1"},
    {"limit": ["1", "2"]},
]  # fmt: skip


def test_a_malformed_cursor_or_parameter_is_400_and_never_500(reader):
    """
    A malformed cursor (negative, non-integer, 2**63, garbage) is 400 invalid_cursor;
    limit, wait and tables out of range or malformed, an unknown or a repeated
    parameter are 400 invalid_parameter.
    """
    users("a")
    publish()
    for cursor in MALFORMED_CURSORS:
        refused(get(reader, cursor=cursor), 400, "invalid_cursor")
    for params in MALFORMED_PARAMETERS:
        refused(get(reader, **params), 400, "invalid_parameter")


def test_an_unknown_table_in_the_filter_is_400_unknown_table(reader):
    """A filter naming a table the engine does not register is refused, not ignored."""
    error = refused(get(reader, tables="user,no_such_table"), 400, "unknown_table")
    assert error["table"] == "no_such_table"


def test_a_pruner_between_two_pages_makes_the_reader_resnapshot_never_skip(reader):
    """
    Retention moving the horizon past a reader's cursor between its pages gets it a
    resnapshot: it never receives a page that silently jumps the pruned events.
    """
    users(*(f"u{n}" for n in range(6)))
    publish()
    body = ok(get(reader, limit=2))
    after = int(body["cursor"].split(":")[1])
    set_horizon(after + 3)  # deletes after+1 and after+2, unread
    refused(get(reader, cursor=body["cursor"], limit=2), 409, "resnapshot_required")


def test_the_page_reads_state_and_events_in_one_statement(reader):
    """
    The horizon check and the events come from ONE statement (one snapshot): a pruner
    can never fall between them.
    """
    start = publish()  # the state row exists, and the page starts just before "a"
    users("a")
    publish()
    executed = []

    def spy(execute, sql, params, many, context):
        executed.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy):
        page = stream_page.read_page("default", after=start, limit=10, scan=10**9)
    assert len(executed) == 1 and "_rindle_stream" in executed[0]
    assert [e["key"] for e in page.events] == [["a"]]


def test_a_table_filter_returns_only_those_tables_and_a_quiet_table_still_advances(reader):
    """
    tables=a,b returns only their events; a page that matched nothing still moves the
    cursor to the last seq it examined, so a consumer of a quiet table does not rescan.
    """
    users("a")
    models.ClientMutation.objects.create(client_id="c1", last_mutation_id=1)
    users("b")
    publish()
    only_users = ok(get(reader, tables="user"))
    assert [e["key"] for e in only_users["events"]] == [["a"], ["b"]]
    ledger = ok(get(reader, tables="_rindle_client_mutations"))
    assert [e["table"] for e in ledger["events"]] == ["_rindle_client_mutations"]
    assert ledger["cursor"] == only_users["cursor"]  # both examined up to safe_seq
    users("c")
    publish()
    quiet = ok(get(reader, tables="_rindle_client_mutations", cursor=ledger["cursor"]))
    assert quiet["events"] == []
    assert (
        int(quiet["cursor"].split(":")[1])
        == quiet["safe_seq"]
        > int(ledger["cursor"].split(":")[1])
    )


def test_a_page_examines_a_bounded_window_and_resumes_after_it(reader, settings):
    """
    A filtered read over a long run of other tables' events examines at most
    STREAM_PAGE_SCAN_SEQS seqs, says there is more, and the next page goes on from there.
    """
    users("first")
    publish()
    start = ok(get(reader, cursor="now"))["cursor"]  # just before the run below
    users(*(f"u{n}" for n in range(5)))
    models.ClientMutation.objects.create(client_id="c1", last_mutation_id=1)
    publish()
    settings.RINDLE = {**settings.RINDLE, "STREAM_PAGE_SCAN_SEQS": 2}
    body = ok(get(reader, tables="_rindle_client_mutations", cursor=start))
    assert body["events"] == [] and body["more"] is True
    cursor, found = body["cursor"], []
    for _ in range(10):
        body = ok(get(reader, tables="_rindle_client_mutations", cursor=cursor))
        found += body["events"]
        cursor = body["cursor"]
        if not body["more"]:
            break
    assert [e["key"] for e in found] == [["c1"]]


def test_cursor_now_starts_at_the_current_watermark(reader):
    """cursor=now answers no history, and the cursor it returns sees only later events."""
    users("old")
    publish()
    now = ok(get(reader, cursor="now"))
    assert now["events"] == [] and now["cursor"].endswith(f":{now['safe_seq']}")
    users("new")
    publish()
    assert [e["key"] for e in ok(get(reader, cursor=now["cursor"]))["events"]] == [["new"]]


def test_only_the_stream_scope_or_a_staff_session_may_read(engine, alice, client):
    """
    No credentials: 401; a token without the stream scope or a non-staff session: 403;
    the stream scope, the admin scope and a staff session: 200.
    """
    users("a")
    publish()
    assert client.get("/v1/stream").status_code == 401
    refused(get(token_client(alice, "read", "mutate")), 403, "insufficient_scope")
    assert get(token_client(alice, "stream")).status_code == 200
    assert get(token_client(alice, "admin")).status_code == 200
    client.force_login(alice)
    refused(client.get("/v1/stream"), 403, "unauthorized")
    alice.is_staff = True
    alice.save()
    client.force_login(alice)
    assert [e["key"] for e in ok(client.get("/v1/stream"))["events"]] == [["a"]]


def test_the_stream_is_in_the_openapi_document(engine, alice):
    """The route is documented with its parameters, like its /v1 siblings."""
    admin = token_client(alice, "admin")
    alice.is_staff = alice.is_superuser = True
    alice.save()
    admin.force_login(alice)
    document = admin.get("/api/schema/openapi", HTTP_ACCEPT="application/json").json()
    operation = document["paths"]["/v1/stream"]["get"]
    assert {p["name"] for p in operation["parameters"]} >= {"cursor", "tables", "limit", "wait"}
    assert {"200", "400", "403", "409"} <= set(operation["responses"])
