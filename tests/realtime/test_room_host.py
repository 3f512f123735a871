"""
A room host applies one doc's mutations in memory in arrival order and flushes them
in CAS batches under its epoch: verdicts, replays and gaps, net changes, the room
ledger and outcome rows, rebases on conflict, fencing and the pending bound.
"""

import pytest
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from rindle_app.exceptions import MutationGap, RoomBusy, RoomClosed, RoomReject
from rindle_app.realtime.room_host import FlushResult, RoomHost

TABLE = "room_host_rows"
DOC = "notes/7"


@pytest.fixture
def room(engine):
    # No json column: on PostgreSQL a table with one gets no CAS-only edits (see
    # RoomHost), and the properties below rely on them.
    engine.register_table(TABLE, ["id", "label", "n"], [0], ["string", "string", "int64"])
    yield engine
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE IF EXISTS "{TABLE}"')


def put(tx, args):
    if tx.get(TABLE, args["id"]) is None:
        tx.add(TABLE, {"id": args["id"], "label": args["label"], "n": 0})
    else:
        tx.edit(TABLE, args["id"], {"label": args["label"]})


def inc(tx, args):
    row = tx.get(TABLE, args["id"])
    if row is None:
        raise RoomReject("no such row")
    if row["n"] >= 2:
        raise RoomReject("capped")
    tx.edit(TABLE, args["id"], {"n": row["n"] + 1})


def drop(tx, args):
    tx.remove(TABLE, args["id"])  # RoomReject when absent


def half(tx, args):
    tx.add(TABLE, {"id": args["id"], "label": "half"})
    raise RuntimeError("after a write")


def checked(tx, args):
    """Rejections with details: a RoomReject's own, a serializer's field errors."""
    from rest_framework import serializers

    if args.get("why") == "rule":
        raise RoomReject("over the limit", details={"n": ["at most 2"]})
    if args.get("why") == "opaque":
        raise RoomReject("opaque", details={"when": object()})  # not JSON: dropped
    field = serializers.CharField(max_length=3)
    tx.add(TABLE, {"id": field.run_validation(args.get("id")), "label": "ok", "n": 0})


MUTATORS = {"put": put, "inc": inc, "drop": drop, "half": half, "checked": checked}


def load_prefix(prefix):
    def load(engine):
        return {TABLE: [row for row in db_rows() if row["id"].startswith(prefix)]}

    return load


def host(engine, doc=DOC, prefix=""):
    h = RoomHost(engine, doc, mutators=MUTATORS, load=load_prefix(prefix))
    h.boot()
    return h


def db_rows():
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id, label, n FROM "{TABLE}" ORDER BY id')
        return [{"id": i, "label": label, "n": n} for i, label, n in cursor.fetchall()]


def same_rows(h, prefix=""):
    mine = sorted((r for r in h.rows(TABLE) if r["id"].startswith(prefix)), key=lambda r: r["id"])
    theirs = [r for r in db_rows() if r["id"].startswith(prefix)]
    return mine == theirs


def all_rows(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(r) for r in cursor.fetchall()]


def outcomes(doc=DOC):
    return all_rows(
        "SELECT client_id, mid, kind, reason FROM _rindle_room_mutation_outcomes "
        "WHERE doc = %s ORDER BY client_id, mid",
        [doc],
    )


def external(engine, sql, params):
    engine.write(lambda tx: tx.run(sql, params))


# --- verdicts ----------------------------------------------------------------------------


def test_each_verdict_and_the_changes_peers_must_see(room):
    h = host(room)
    assert h.footprint == (TABLE,) and h.epoch == 1
    added = h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    assert added.verdict == "applied"
    assert added.changes == [
        {"table": TABLE, "op": "add", "row": {"id": "r1", "label": "a", "n": 0}}
    ]
    edited = h.mutate("c1", 2, "put", {"id": "r1", "label": "b"})
    assert [c["op"] for c in edited.changes] == ["edit"]
    assert edited.changes[0]["old"]["label"] == "a" and edited.changes[0]["new"]["label"] == "b"
    rejected = h.mutate("c1", 3, "drop", {"id": "nope"})
    assert (rejected.verdict, rejected.changes) == ("rejected", [])
    assert "no row" in rejected.reason
    deopt = h.mutate("c2", 1, "slow_only", {})
    assert deopt.verdict == "deopt" and deopt.changes == []
    assert h.mutate("c1", 2, "put", {"id": "r1", "label": "zzz"}).verdict == "replay"
    assert h.rows(TABLE)[0]["label"] == "b"
    assert h.pending == 4


def test_a_gap_is_refused_and_changes_nothing(room):
    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    with pytest.raises(MutationGap) as err:
        h.mutate("c1", 3, "put", {"id": "r2", "label": "b"})
    assert err.value.code == "mid_gap" and err.value.lmid == 1
    assert h.pending == 1 and len(h.rows(TABLE)) == 1
    assert h.mutate("c1", 2, "put", {"id": "r2", "label": "b"}).verdict == "applied"


def test_a_mutator_that_raises_after_writing_changes_nothing_and_is_rejected(room, caplog):
    h = host(room)
    result = h.mutate("c1", 1, "half", {"id": "r1"})
    assert result.verdict == "rejected" and result.reason == "mutator_error"
    assert h.rows(TABLE) == [] and "half" in caplog.text
    h.flush()
    assert db_rows() == []
    assert outcomes() == [("c1", 1, "rejected", "mutator_error")]


# --- flushes -----------------------------------------------------------------------------


def test_a_flush_writes_net_changes_lmids_and_only_non_applied_outcomes(room):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO _rindle_client_mutations (client_id, last_mutation_id) VALUES ('c1', 40)"
        )
    h = host(room)
    assert h.flush().flushed is False  # nothing pending: a no-op
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.mutate("c1", 2, "put", {"id": "gone", "label": "x"})
    h.mutate("c1", 3, "drop", {"id": "gone"})  # added and removed in one batch
    h.mutate("c2", 1, "inc", {"id": "missing"})
    h.mutate("c2", 2, "unknown", {"a": 1})
    result = h.flush()
    assert result.flushed and result.mutations == 5 and h.pending == 0
    assert result.lmids == {"c1": 3, "c2": 2}
    assert same_rows(h) and [r["id"] for r in db_rows()] == ["r1"]
    assert room.room_lmids(DOC, ["c1", "c2"]) == {"c1": 3, "c2": 2}
    assert room.client_lmid("c1") == 40 and room.client_lmid("c2") == 0
    assert outcomes() == [("c2", 1, "rejected", "no such row"), ("c2", 2, "deopt", mock_reason())]
    h.mutate("c1", 4, "inc", {"id": "r1"})
    second = h.flush()
    assert int(second.offset) > int(result.offset)
    assert db_rows()[0]["n"] == 1 and same_rows(h)
    assert all_rows("SELECT flush_seq FROM _rindle_room_watermark") == [(second.offset,)]


def mock_reason():
    return "no room mutator 'unknown'"


def test_a_conflict_rebases_on_the_database_images_and_reports_corrections(room):
    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.flush()
    h.mutate("c1", 2, "inc", {"id": "r1"})  # n 0 -> 1, broadcast
    h.mutate("c2", 1, "inc", {"id": "r1"})  # n 1 -> 2, broadcast
    external(room, f'UPDATE "{TABLE}" SET n = 2, label = %s WHERE id = %s', ["ext", "r1"])
    result = h.flush()
    assert result.flushed and result.rebases == 1
    # on the database's n = 2 the first inc is capped, and so is the second
    assert [(v.client_id, v.mid, v.before, v.after) for v in result.verdicts] == [
        ("c1", 2, "applied", "rejected"),
        ("c2", 1, "applied", "rejected"),
    ]
    assert result.corrections == [
        {
            "table": TABLE,
            "op": "edit",
            "old": {"id": "r1", "label": "a", "n": 2},
            "new": {"id": "r1", "label": "ext", "n": 2},
        }
    ]
    assert same_rows(h)
    assert outcomes() == [("c1", 2, "rejected", "capped"), ("c2", 1, "rejected", "capped")]


def test_a_rejection_carries_its_details_to_the_outcome(room, caplog):
    h = host(room)
    rule = h.mutate("c1", 1, "checked", {"why": "rule"})
    assert (rule.verdict, rule.reason, rule.details) == (
        "rejected",
        "over the limit",
        {"n": ["at most 2"]},
    )
    bad = h.mutate("c1", 2, "checked", {"id": "much too long"})
    assert bad.verdict == "rejected" and bad.reason.startswith("invalid arguments")
    assert list(bad.details) == ["non_field_errors"] and bad.details["non_field_errors"]
    opaque = h.mutate("c1", 3, "checked", {"why": "opaque"})
    assert (opaque.verdict, opaque.details) == ("rejected", None)
    assert "not a JSON object" in caplog.text
    ok = h.mutate("c1", 4, "checked", {"id": "r1"})
    assert ok.verdict == "applied" and ok.details is None
    h.flush()
    assert [o[:3] for o in outcomes()] == [
        ("c1", 1, "rejected"),
        ("c1", 2, "rejected"),
        ("c1", 3, "rejected"),
    ]


def test_a_rebase_can_turn_a_rejection_into_an_application(room):
    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.mutate("c1", 2, "inc", {"id": "r1"})
    h.mutate("c1", 3, "inc", {"id": "r1"})
    h.flush()
    h.mutate("c1", 4, "put", {"id": "r1", "label": "x"})
    assert h.mutate("c1", 5, "inc", {"id": "r1"}).reason == "capped"
    external(room, f'UPDATE "{TABLE}" SET n = 0 WHERE id = %s', ["r1"])
    result = h.flush()
    assert result.flushed and result.rebases == 1
    assert [(v.mid, v.before, v.after) for v in result.verdicts] == [(5, "rejected", "applied")]
    assert [(c["op"], c["old"]["n"], c["new"]["n"]) for c in result.corrections] == [("edit", 2, 1)]
    assert same_rows(h) and db_rows()[0]["n"] == 1 and db_rows()[0]["label"] == "x"
    assert outcomes() == []  # every mid of the batch was finally applied


def test_a_conflict_on_a_key_the_database_removed_adopts_the_absence(room):
    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.flush()
    h.mutate("c1", 2, "drop", {"id": "r1"})
    external(room, f'DELETE FROM "{TABLE}" WHERE id = %s', ["r1"])
    result = h.flush()
    assert result.flushed and result.rebases == 1
    assert [(v.mid, v.after) for v in result.verdicts] == [(2, "rejected")]
    assert result.corrections == []  # peers saw r1 removed, and it is gone
    assert h.rows(TABLE) == [] and db_rows() == []
    assert outcomes() == [("c1", 2, "rejected", f"{TABLE}: no row under 'r1' to remove")]


def test_a_row_put_back_as_it_was_still_meets_an_outside_write(room):
    """A touched row with no net change is CAS-checked: the room adopts the outside write."""
    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.flush()
    h.mutate("c1", 2, "put", {"id": "r1", "label": "b"})
    h.mutate("c1", 3, "put", {"id": "r1", "label": "a"})
    external(room, f'UPDATE "{TABLE}" SET n = 2 WHERE id = %s', ["r1"])
    result = h.flush()
    assert result.flushed and result.rebases == 1 and result.verdicts == []
    assert [(c["op"], c["new"]["n"]) for c in result.corrections] == [("edit", 2)]
    assert same_rows(h) and db_rows()[0]["n"] == 2


def test_a_row_put_back_on_a_table_with_a_json_column_flushes_and_stays_checked(engine):
    """
    On PostgreSQL a json column has no equality operator: the CAS-only edit of a row
    put back as it was must still commit, and still meet an outside write.
    """
    table = "room_host_json"
    engine.register_table(table, ["id", "label", "meta"], [0], ["string", "string", "json"])

    def relabel(tx, args):
        tx.edit(table, args["id"], {"label": args["label"]})

    def load(e):
        with connection.cursor() as cursor:
            cursor.execute(f'SELECT id, label, meta FROM "{table}"')
            return {table: [{"id": i, "label": la, "meta": m} for i, la, m in cursor.fetchall()]}

    try:
        external(engine, f'INSERT INTO "{table}" (id, label, meta) VALUES (%s, %s, %s)',
                 ["r1", "a", '{"k": 1}'])  # fmt: skip
        h = RoomHost(engine, DOC, mutators={"relabel": relabel}, load=load)
        h.boot()
        h.mutate("c1", 1, "relabel", {"id": "r1", "label": "b"})
        h.mutate("c1", 2, "relabel", {"id": "r1", "label": "a"})
        assert h.flush().flushed  # a CAS-only edit of the row onto itself
        h.mutate("c1", 3, "relabel", {"id": "r1", "label": "b"})
        h.mutate("c1", 4, "relabel", {"id": "r1", "label": "a"})
        external(engine, f'UPDATE "{table}" SET label = %s WHERE id = %s', ["z", "r1"])
        result = h.flush()
        assert result.flushed and result.rebases == 1
        assert [r["label"] for r in h.rows(table)] == ["a"]
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE IF EXISTS "{table}"')


# --- fencing ------------------------------------------------------------------------------


def test_a_newer_host_fences_the_older_which_writes_nothing_and_closes(room):
    old = host(room)
    old.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    old.flush()
    old.mutate("c1", 2, "put", {"id": "r1", "label": "stale"})
    new = host(room)
    assert new.epoch == old.epoch + 1
    with pytest.raises(RoomClosed) as err:
        old.flush()
    assert err.value.code == "room_closed" and old.pending == 0 and old.rows(TABLE) == []
    with pytest.raises(RoomClosed):
        old.mutate("c1", 3, "put", {"id": "r1", "label": "x"})
    assert db_rows()[0]["label"] == "a"
    assert room.room_lmids(DOC, ["c1"]) == {"c1": 1}
    # the new host absorbs the old host's durable mutation and takes the next mid
    assert new.mutate("c1", 1, "put", {"id": "r1", "label": "again"}).verdict == "replay"
    assert new.mutate("c1", 2, "put", {"id": "r1", "label": "b"}).verdict == "applied"
    assert new.flush().flushed and db_rows()[0]["label"] == "b"


# --- bounds ------------------------------------------------------------------------------


def test_a_full_buffer_flushes_before_it_takes_the_next_mutation(room, settings):
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "ROOM_MAX_PENDING": 2}
    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.mutate("c1", 2, "put", {"id": "r2", "label": "a"})
    third = h.mutate("c1", 3, "put", {"id": "r3", "label": "a"})
    assert third.flush is not None and third.flush.flushed and third.flush.mutations == 2
    assert h.pending == 1 and [r["id"] for r in db_rows()] == ["r1", "r2"]


def test_a_full_buffer_that_cannot_flush_refuses_with_room_busy(room, settings, monkeypatch):
    from rindle_app.exceptions import Unavailable

    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "ROOM_MAX_PENDING": 1}
    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})

    def down(*args, **kwargs):
        raise Unavailable("database is down")

    monkeypatch.setattr(room, "commit_room_flush", down)
    with pytest.raises(RoomBusy) as err:
        h.mutate("c1", 2, "put", {"id": "r2", "label": "a"})
    assert err.value.code == "room_busy" and err.value.retryable
    assert h.pending == 1 and len(h.rows(TABLE)) == 1
    monkeypatch.undo()
    assert h.mutate("c1", 2, "put", {"id": "r2", "label": "a"}).flush.flushed
    assert same_rows(h) is False  # r2 is pending, not yet durable
    h.flush()
    assert same_rows(h)


def test_a_batch_that_keeps_missing_stays_pending_after_the_bounded_rebases(room, monkeypatch):
    from rindle_app.realtime import room_host

    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.flush()
    h.mutate("c1", 2, "inc", {"id": "r1"})
    real = room.commit_room_flush

    def racing(*args, **kwargs):  # another writer edits r1 before every attempt
        external(room, f'UPDATE "{TABLE}" SET label = label || %s WHERE id = %s', ["!", "r1"])
        return real(*args, **kwargs)

    monkeypatch.setattr(room, "commit_room_flush", racing)
    result = h.flush()
    assert not result.flushed and result.rebases == room_host.MAX_REBASES + 1
    assert h.pending == 1 and room.room_lmids(DOC, ["c1"]) == {"c1": 1}
    assert [(c["old"]["label"], c["new"]["label"]) for c in result.corrections] == [
        ("a", "a" + "!" * (room_host.MAX_REBASES + 1))
    ]
    monkeypatch.undo()
    again = h.flush()
    assert again.flushed and again.corrections == [] and same_rows(h)
    assert db_rows()[0]["n"] == 1


def test_a_flush_whose_outcome_is_unknown_closes_the_host(room, monkeypatch):
    from rindle_app.exceptions import TIMEOUT, Unavailable

    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})

    def timed_out(*args, **kwargs):
        raise Unavailable("the write timed out", code=TIMEOUT)

    monkeypatch.setattr(room, "commit_room_flush", timed_out)
    with pytest.raises(RoomClosed):
        h.flush()
    assert h.closed and h.pending == 0


def test_a_database_failure_that_wrote_nothing_keeps_the_batch_for_the_next_flush(
    room, monkeypatch
):
    from rindle_app.exceptions import Unavailable

    h = host(room)
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})

    def down(*args, **kwargs):
        raise Unavailable("database is down")

    monkeypatch.setattr(room, "commit_room_flush", down)
    result = h.flush()
    assert not result.flushed and isinstance(result.error, Unavailable) and h.pending == 1
    monkeypatch.undo()
    assert h.flush().flushed and same_rows(h) and h.durable_lmid("c1") == 1


def test_a_rebase_reruns_a_mutation_on_the_args_as_they_arrived(room):
    def greedy(tx, args):
        row = tx.get(TABLE, args["id"])
        tx.edit(TABLE, args["id"], {"label": row["label"] + args.pop("suffix")})

    h = RoomHost(room, DOC, mutators={**MUTATORS, "greedy": greedy}, load=load_prefix(""))
    h.boot()
    h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})
    h.flush()
    h.mutate("c1", 2, "greedy", {"id": "r1", "suffix": "+"})
    external(room, f'UPDATE "{TABLE}" SET label = %s WHERE id = %s', ["b", "r1"])
    result = h.flush()
    assert result.flushed and result.verdicts == [] and db_rows()[0]["label"] == "b+"


@pytest.mark.parametrize(
    "envelope, code",
    [
        (("", 1, "put", {}), "invalid_client_id"),
        (("c1", 0, "put", {}), "invalid_mid"),
        (("c1", True, "put", {}), "invalid_mid"),
        (("c1", 1, "", {}), "invalid_name"),
        (("c1", 1, "put", {"x": object()}), "invalid_args"),
        (("c1", 1, "put", {"x": float("nan")}), "invalid_args"),
    ],
)
def test_a_bad_envelope_is_refused_and_consumes_no_mid(room, envelope, code):
    from rindle_app.engine.errors import InvalidInput

    h = host(room)
    with pytest.raises(InvalidInput) as err:
        h.mutate(*envelope)
    assert err.value.code == code
    assert h.pending == 0
    assert h.mutate("c1", 1, "put", {"id": "r1", "label": "a"}).verdict == "applied"


def test_a_host_takes_no_mutation_before_boot_and_a_failed_load_closes_it(room):
    from rindle_app.engine.errors import InvalidInput

    h = RoomHost(room, DOC, mutators=MUTATORS, load=load_prefix(""))
    with pytest.raises(InvalidInput):
        h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})

    def broken(engine):
        raise RuntimeError("no footprint")

    h = RoomHost(room, DOC, mutators=MUTATORS, load=broken)
    with pytest.raises(RuntimeError):
        h.boot()
    with pytest.raises(RoomClosed):
        h.mutate("c1", 1, "put", {"id": "r1", "label": "a"})


# --- properties ----------------------------------------------------------------------------

CLIENTS = 3
KEYS = 3
NAMES = ("put", "inc", "drop", "half", "unknown")

mutation = st.tuples(
    st.just("mutate"),
    st.integers(0, CLIENTS - 1),
    st.sampled_from(NAMES),
    st.integers(0, KEYS - 1),
    st.sampled_from("abo"),  # "o" is the loaded rows' label: a put can undo a put
)
outside = st.tuples(
    st.just("external"), st.sampled_from(("label", "n", "delete")), st.integers(0, 9)
)
# A mutation then an outside write to a row of the batch: a CAS miss at the next flush.
race = st.tuples(st.just("race"), mutation, outside)
step = st.one_of(
    mutation,
    mutation,
    race,
    race,
    outside,
    st.tuples(st.just("replay"), st.integers(0, CLIENTS - 1), st.integers(0, 5)),
    st.tuples(st.just("gap"), st.integers(0, CLIENTS - 1), st.integers(2, 4)),
    st.just(("flush",)),
    # A flush split as the room transport runs it: mutations arrive after it began,
    # before and after its write, then it ends, and a flush takes the newcomers.
    st.tuples(st.just("flight"), st.lists(mutation, max_size=4), st.integers(0, 4)),
    st.just(("reboot",)),
)

EXAMPLES = [0]


@hsettings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(step, min_size=8, max_size=40))
def test_random_rooms_keep_outcomes_sound_and_the_database_equal_to_the_host(room, steps):
    """
    Over random mutations (some rejecting, some unknown), replays, gaps, outside
    writes to the batch's rows, reboots, flushes and split flushes with mutations
    arriving while they are in flight: after every flush the database
    holds the host's rows, "no outcome row" under the room lmid is exactly "applied",
    lmids only go up and the slow-path ledger is untouched.
    """
    EXAMPLES[0] += 1
    n = EXAMPLES[0]
    doc, prefix = f"prop/{n}", f"e{n}-"
    clients = [f"{prefix}c{i}" for i in range(CLIENTS)]
    keys = [f"{prefix}k{i}" for i in range(KEYS)]
    for key in keys[:2]:  # rows the room loads, so outside writes can meet the batch
        external(room, f'INSERT INTO "{TABLE}" (id, label, n) VALUES (%s, %s, 0)', [key, "o"])
    model = Model(room, doc, prefix, clients)
    for s in steps:
        kind, after = s[0], None
        if kind == "race":
            s, after = s[1], s[2]
            kind = s[0]
        if kind == "mutate":
            _, c, name, k, label = s
            model.mutate(clients[c], name, {"id": keys[k], "label": label})
            if after is not None:
                model.external(after[1], k)
        elif kind == "replay":
            model.replay(clients[s[1]], s[2])
        elif kind == "gap":
            model.gap(clients[s[1]], s[2])
        elif kind == "external":
            model.external(s[1], s[2])
        elif kind == "flush":
            model.flush()
        elif kind == "flight":
            model.flight(
                [(clients[c], n, {"id": keys[k], "label": lb}) for _, c, n, k, lb in s[1]], s[2]
            )
        else:
            model.reboot()
    model.flush()


class Model:
    """What the host told its callers, checked against the database after each flush."""

    def __init__(self, engine, doc, prefix, clients):
        self.engine, self.doc, self.prefix, self.clients = engine, doc, prefix, clients
        self.host = self.boot()
        self.verdicts = {}  # (client, mid) -> the verdict the host last gave it
        self.next = {c: 1 for c in clients}
        self.unflushed = []  # (client, mid, name, args) consumed since the last flush
        self.touched = set()  # keys the unflushed mutations wrote
        self.lmids = {}

    def boot(self):
        h = RoomHost(self.engine, self.doc, mutators=MUTATORS, load=load_prefix(self.prefix))
        h.boot()
        return h

    def mutate(self, client, name, args):
        mid = self.next[client]
        result = self.host.mutate(client, mid, name, args)
        if result.flush is not None:
            self.flushed(result.flush)
        assert result.verdict in ("applied", "rejected", "deopt")
        assert (result.verdict == "deopt") == (name == "unknown")
        assert result.verdict != "applied" or name in ("put", "inc", "drop")
        self.verdicts[(client, mid)] = result.verdict
        self.next[client] = mid + 1
        self.unflushed.append((client, mid, name, args))
        self.touched.update(c["row" if c["op"] != "edit" else "new"]["id"] for c in result.changes)

    def replay(self, client, back):
        mid = self.next[client] - 1 - back
        if mid < 1:
            return
        before = (self.host.pending, self.host.rows(TABLE))
        result = self.host.mutate(client, mid, "put", {"id": f"{self.prefix}k0", "label": "r"})
        assert (result.verdict, result.changes) == ("replay", [])
        assert (self.host.pending, self.host.rows(TABLE)) == before

    def gap(self, client, skip):
        before = (self.host.pending, self.host.rows(TABLE))
        with pytest.raises(MutationGap):
            self.host.mutate(client, self.next[client] + skip - 1, "inc", {"id": "x"})
        assert (self.host.pending, self.host.rows(TABLE)) == before

    def external(self, what, pick):
        present = {r["id"] for r in db_rows()}
        targets = sorted(k for k in self.touched if k in present)
        targets = [k for k in targets if k.endswith(f"k{pick}")] or targets
        if not targets:
            return
        key = targets[pick % len(targets)]
        if what == "delete":
            external(self.engine, f'DELETE FROM "{TABLE}" WHERE id = %s', [key])
        elif what == "n":
            external(self.engine, f'UPDATE "{TABLE}" SET n = (n + 1) %% 3 WHERE id = %s', [key])
        else:
            external(self.engine, f'UPDATE "{TABLE}" SET label = %s WHERE id = %s', ["ext", key])

    def flush(self):
        before = [r for r in db_rows() if r["id"].startswith(self.prefix)]
        result = self.host.flush()
        if self.unflushed:
            assert result.flushed, result
            self.flushed(result, before)
        else:
            assert not result.flushed

    def flight(self, during, split):
        before = [r for r in db_rows() if r["id"].startswith(self.prefix)]
        flight = self.host.begin_flush()
        if flight is None:
            return
        for client, name, args in during[:split]:
            self.mutate(client, name, args)
        self.host.send(flight)
        for client, name, args in during[split:]:
            self.mutate(client, name, args)
        first = self.host.end_flush(flight)
        assert first.flushed != bool(first.rebases), first  # durable, or rebased
        self.rejudged(first)
        rest = self.host.flush() if self.host.pending else first
        assert rest.flushed, rest
        self.flushed(rest if rest is not first else FlushResult(True), before)

    def rejudged(self, result):
        for change in result.verdicts:
            assert self.verdicts[(change.client_id, change.mid)] == change.before
            self.verdicts[(change.client_id, change.mid)] = change.after

    def flushed(self, result, before=None):
        for change in result.verdicts:
            assert self.verdicts[(change.client_id, change.mid)] == change.before
            self.verdicts[(change.client_id, change.mid)] = change.after
        if before is not None:
            # Outside writes only met rows of the batch, which CAS checks: the flushed
            # state and verdicts are the batch run in order on the database's rows.
            rows, verdicts = reference(before, self.unflushed)
            assert [r for r in db_rows() if r["id"].startswith(self.prefix)] == rows
            assert [self.verdicts[(c, mid)] for c, mid, _, _ in self.unflushed] == verdicts
        self.unflushed, self.touched = [], set()
        self.check()

    def reboot(self):
        old, had = self.host, self.host.pending
        self.host = self.boot()
        if had:
            with pytest.raises(RoomClosed):
                old.flush()
        for client, mid, _, _ in self.unflushed:  # lost with the old host: resent later
            del self.verdicts[(client, mid)]
        durable = self.engine.room_lmids(self.doc, self.clients)
        self.next = {c: durable.get(c, 0) + 1 for c in self.clients}
        self.unflushed, self.touched = [], set()
        assert same_rows(self.host, self.prefix)

    def check(self):
        assert same_rows(self.host, self.prefix)
        lmids = self.engine.room_lmids(self.doc, self.clients)
        assert all(lmids.get(c, 0) >= self.lmids.get(c, 0) for c in self.clients)
        self.lmids = lmids
        stored = {(c, mid): kind for c, mid, kind, _ in outcomes(self.doc)}
        keep = 1000
        for client in self.clients:
            lmid = lmids.get(client, 0)
            assert lmid == self.next[client] - 1
            for mid in range(max(1, lmid - keep + 1), lmid + 1):
                verdict = self.verdicts[(client, mid)]
                assert stored.get((client, mid)) == (None if verdict == "applied" else verdict)
        marks = ", ".join(["%s"] * len(self.clients))
        slow = all_rows(
            f"SELECT count(*) FROM _rindle_client_mutations WHERE client_id IN ({marks})",
            self.clients,
        )
        assert slow == [(0,)]


class ReferenceTx:
    """RoomTx's contract over a plain dict, for the property's oracle."""

    def __init__(self, rows):
        self.rows = rows

    def get(self, table, key):
        row = self.rows.get(key)
        return None if row is None else dict(row)

    def add(self, table, row):
        if row["id"] in self.rows:
            raise RoomReject("exists")
        self.rows[row["id"]] = {"id": None, "label": None, "n": None, **row}

    def edit(self, table, key, fields):
        if key not in self.rows:
            raise RoomReject("missing")
        self.rows[key] = {**self.rows[key], **fields}

    def remove(self, table, key):
        if self.rows.pop(key, None) is None:
            raise RoomReject("missing")


def reference(rows, batch):
    """The rows and verdicts of ``batch`` run in order on ``rows``, all or none each."""
    state = {r["id"]: r for r in rows}
    verdicts = []
    for _, _, name, args in batch:
        fn = MUTATORS.get(name)
        if fn is None:
            verdicts.append("deopt")
            continue
        tx = ReferenceTx(dict(state))
        try:
            fn(tx, args)
        except Exception:
            verdicts.append("rejected")
            continue
        state = tx.rows
        verdicts.append("applied")
    return sorted(state.values(), key=lambda r: r["id"]), verdicts


# --- the transport's flush: the room's lock is free while the batch is written -------------


class Socket:
    """A room socket that keeps what the room delivers."""

    def __init__(self):
        self.frames = []

    def deliver(self, frames):
        self.frames.extend(frames)

    def close_later(self, code):
        self.frames.append(("closed", code))


def test_a_mutation_reaches_peers_while_a_flush_is_being_written(room, monkeypatch):
    """
    A room's flush writes without the room's lock: a mutation that arrives meanwhile
    is applied and broadcast at once, not after the commit, and the next flush makes
    it durable on top of the first.
    """
    import threading
    import time

    from rindle_app.realtime.room_server import LiveRoom

    live = LiveRoom(room, DOC, RoomHost(room, DOC, mutators=MUTATORS, load=load_prefix("")))
    live.boot([TABLE])
    peer = Socket()
    live.sockets.add(peer)
    live.mutate(
        Socket(), {"clientID": "c1", "mid": 1, "name": "put", "args": {"id": "r1", "label": "a"}}
    )
    real, writing, release = room.commit_room_flush, threading.Event(), threading.Event()

    def slow(*args, **kwargs):  # a commit that takes as long as the test says
        writing.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(room, "commit_room_flush", slow)
    flusher = threading.Thread(target=live.flush)
    flusher.start()
    assert writing.wait(10)
    started = time.monotonic()
    before = len(peer.frames)
    envelope = {"clientID": "c2", "mid": 1, "name": "put", "args": {"id": "r2", "label": "b"}}
    assert live.mutate(Socket(), envelope).verdict == "applied"
    assert time.monotonic() - started < 0.5 and len(peer.frames) > before  # broadcast now
    assert live.host.in_flight and live.host.pending == 2
    release.set()
    flusher.join(10)
    assert live.host.pending == 1 and db_rows() == [{"id": "r1", "label": "a", "n": 0}]
    monkeypatch.undo()
    assert live.flush().flushed and live.host.pending == 0
    assert db_rows() == [{"id": "r1", "label": "a", "n": 0}, {"id": "r2", "label": "b", "n": 0}]
    assert room.room_lmids(DOC, ["c1", "c2"]) == {"c1": 1, "c2": 1}


# --- outside writes: the footprint's changes fed in ---------------------------------------


class Feed:
    """The hub's feed of one prefix's rows, from the outbox: net changes per batch."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.fed = all_rows("SELECT COALESCE(MAX(seq), 0) FROM _rindle_change_events")[0][0]

    def _tail(self):
        import json

        out = []
        for seq, old, new in all_rows(
            'SELECT seq, old, new FROM _rindle_change_events WHERE seq > %s AND "table" = %s '
            "ORDER BY seq",
            [self.fed, TABLE],
        ):
            old, new = (json.loads(v) if isinstance(v, str) else v for v in (old, new))
            if (old or new)["id"].startswith(self.prefix):
                out.append((seq, old, new))
        return out

    def since(self, floors):
        """
        Per key, every image it had at the fed version or after, and at or after its
        floor (the seq of the host's last flush of it): what the host may show.
        """
        now = {r["id"]: r for r in db_rows() if r["id"].startswith(self.prefix)}
        seen = {key: [row] for key, row in now.items()}
        fed, self.fed = self.fed, min([self.fed, *floors.values()])
        try:
            tail = self._tail()
        finally:
            self.fed = fed
        for seq, old, new in reversed(tail):
            key = (old or new)["id"]
            if seq > max(fed, floors.get(key, 0)):
                seen.setdefault(key, [None]).append(old)
        return seen

    def behind(self):
        """True while a captured row is not fed yet."""
        return bool(self._tail())

    def next(self, take=None):
        """``(ops, version)`` of the next ``take`` captured rows (all: None), or None."""
        tail = self._tail()
        if not tail:
            return None
        tail = tail[: take or len(tail)]
        first, last = {}, {}
        for _seq, old, new in tail:
            key = (old or new)["id"]
            first.setdefault(key, old)
            last[key] = new
        ops = []
        for key, old in first.items():
            new = last[key]
            if old is None and new is not None:
                ops.append({"table": TABLE, "op": "add", "row": new})
            elif new is None and old is not None:
                ops.append({"table": TABLE, "op": "remove", "row": old})
            elif old is not None:
                ops.append({"table": TABLE, "op": "edit", "old": old, "new": new})
        self.fed = tail[-1][0]
        return ops, self.fed


def test_an_outside_write_is_absorbed_and_the_echo_of_a_flush_is_not(room):
    h = host(room, prefix="ab-")
    feed = Feed("ab-")
    h.mutate("c1", 1, "put", {"id": "ab-1", "label": "room"})
    h.flush()
    h.mutate("c1", 2, "put", {"id": "ab-1", "label": "newer"})
    h.flush()
    # The echoes of both flushes, split: the older one must not put "room" back.
    ops, version = feed.next(1)
    assert h.absorb(ops, version).corrections == [] and h.rows(TABLE)[0]["label"] == "newer"
    assert h.absorb(*feed.next()).corrections == []
    external(room, f'UPDATE "{TABLE}" SET n = 2 WHERE id = %s', ["ab-1"])
    external(room, f'INSERT INTO "{TABLE}" (id, label, n) VALUES (%s, %s, 1)', ["ab-2", "ext"])
    peers = h.absorb(*feed.next()).corrections
    assert sorted((c["op"], (c.get("new") or c["row"])["n"]) for c in peers) == [
        ("add", 1),
        ("edit", 2),
    ]
    assert same_rows(h, "ab-")
    # A row a pending mutation wrote: the batch rebases on the outside image at once,
    # and the peers are shown the difference (here, the mutation now capped).
    h.mutate("c1", 3, "inc", {"id": "ab-1"})  # n 2 -> capped: rejected
    h.mutate("c1", 4, "inc", {"id": "ab-2"})  # n 1 -> 2
    external(room, f'UPDATE "{TABLE}" SET label = %s, n = 2 WHERE id = %s', ["ext2", "ab-2"])
    result = h.absorb(*feed.next())
    assert [(v.mid, v.before, v.after) for v in result.verdicts] == [(4, "applied", "rejected")]
    assert [(c["old"]["label"], c["new"]["label"]) for c in result.corrections] == [("ext", "ext2")]
    flushed = h.flush()
    assert flushed.flushed and flushed.rebases == 0
    assert feed.next() is None  # both rejected now: the flush wrote outcomes, no row
    assert same_rows(h, "ab-")
    # A key added and removed in one batch sends nothing, yet an outside insert of it
    # between the two is not lost.
    h.mutate("c1", 5, "put", {"id": "ab-3", "label": "room"})
    external(room, f'INSERT INTO "{TABLE}" (id, label, n) VALUES (%s, %s, 0)', ["ab-3", "x"])
    h.absorb(*feed.next())
    h.mutate("c1", 6, "drop", {"id": "ab-3"})
    h.flush()
    h.absorb(*feed.next())
    assert same_rows(h, "ab-")


FEED_EXAMPLES = [0]
feed_step = st.one_of(
    st.tuples(st.just("mutate"), st.sampled_from(("put", "inc", "drop")), st.integers(0, 3)),
    st.tuples(
        st.just("external"), st.sampled_from(("label", "n", "delete", "insert")), st.integers(0, 3)
    ),  # fmt: skip
    st.just(("flush",)),
    st.tuples(st.just("feed"), st.integers(1, 4)),
)


@hsettings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(feed_step, min_size=5, max_size=30))
def test_a_room_fed_its_footprint_ends_equal_to_the_database(room, steps):
    """
    Room mutations, outside writes to any row (touched by the room or not, new or
    deleted), flushes and the footprint's changes fed in batches of any size, in
    any interleaving: once everything is flushed and fed, the room holds exactly
    the database's rows, and whenever nothing is pending after a feed of all that
    committed, too.
    """
    FEED_EXAMPLES[0] += 1
    prefix = f"fd{FEED_EXAMPLES[0]}-"
    keys = [f"{prefix}{i}" for i in range(4)]
    external(room, f'INSERT INTO "{TABLE}" (id, label, n) VALUES (%s, %s, 0)', [keys[0], "o"])
    h = host(room, doc=f"feed/{FEED_EXAMPLES[0]}", prefix=prefix)
    feed = Feed(prefix)
    mid, floors = 0, {}
    for s in steps:
        if s[0] == "mutate":
            mid += 1
            h.mutate("c1", mid, s[1], {"id": keys[s[2]], "label": "m"})
        elif s[0] == "external":
            what, key = s[1], keys[s[2]]
            if what == "insert":
                sql = f'INSERT INTO "{TABLE}" (id, label, n) VALUES (%s, %s, 0) '
                sql += "ON CONFLICT DO NOTHING"
                external(room, sql, [key, "x"])
            elif what == "delete":
                external(room, f'DELETE FROM "{TABLE}" WHERE id = %s', [key])
            elif what == "n":
                external(room, f'UPDATE "{TABLE}" SET n = (n + 1) %% 3 WHERE id = %s', [key])
            else:
                external(room, f'UPDATE "{TABLE}" SET label = %s WHERE id = %s', ["e", key])
        elif s[0] == "flush":
            before = feed.fed
            feed.fed = all_rows("SELECT COALESCE(MAX(seq), 0) FROM _rindle_change_events")[0][0]
            h.flush()
            for seq, old, new in feed._tail():  # only the flush writes meanwhile
                floors[(old or new)["id"]] = seq
            feed.fed = before
        else:
            batch = feed.next(s[1])
            if batch is not None:
                h.absorb(*batch)
            if not h.pending:  # never older than what was fed (say, an old echo)
                images = feed.since(floors)
                mine = {r["id"]: r for r in h.rows(TABLE)}
                for key in set(images) | set(mine):
                    assert mine.get(key) in images.get(key, [None]), key
            if not h.pending and not feed.behind():
                assert same_rows(h, prefix)
    for _ in range(5):
        h.flush()
        batch = feed.next()
        if batch is not None:
            h.absorb(*batch)
        if not h.pending:
            break
    assert not h.pending
    assert same_rows(h, prefix)
