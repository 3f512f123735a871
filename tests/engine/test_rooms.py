"""
Rooms' write authority: placement epochs fence older flushes, a room flush's
ledger co-edits go to the room ledger and never to the slow-path one, CAS under the
identity comparator rolls the whole batch back with the current images, outcomes
and the downgrade watermark ride the flush's transaction.
"""

import threading

import pytest
from django.db import connection

from rindle_app.engine.errors import InvalidInput
from rindle_app.engine.sources import SourceHashMismatch
from rindle_app.exceptions import RoomConflict, RoomFenced
from rindle_app.testing import outbox_high_water

from .conftest import scratch_table

TABLE = "room_doc_rows"
DOC = "notes/42"


@pytest.fixture
def room(engine):
    yield from scratch_table(engine, TABLE)


def add(i, label="x", n=None, meta=None):
    return {
        "table": TABLE,
        "op": "add",
        "row": {"id": f"r{i}", "label": label, "n": n, "meta": meta},
    }


def edit(i, old, new):
    return {"table": TABLE, "op": "edit", "old": {"id": f"r{i}", **old}, "row": new}


def remove(i, **old):
    return {"table": TABLE, "op": "remove", "old": {"id": f"r{i}", **old}}


def lmid(client, value):
    row = {"client_id": client, "last_mutation_id": value}
    return {"table": "_rindle_client_mutations", "op": "add", "row": row}


def outcome(client, mid, kind="rejected", reason="no"):
    row = {
        "client_id": client,
        "mid": mid,
        "kind": kind,
        "reason": reason,
        "name": "m",
        "args": [1],
    }
    return {"table": "_rindle_room_mutation_outcomes", "op": "add", "row": row}


def rows():
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id, label, n FROM "{TABLE}" ORDER BY id')
        return cursor.fetchall()


def scalar(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def flush(engine, offset, changes, epoch, **kw):
    return engine.commit_room_flush(changes, f"room:{DOC}", str(offset), doc=DOC, epoch=epoch, **kw)


# --- placement ------------------------------------------------------------------------


def test_each_claim_bumps_the_epoch_once_and_a_doc_never_claimed_has_none(room):
    assert room.room_epoch(DOC) is None
    assert [room.claim_room_epoch(DOC) for _ in range(3)] == [1, 2, 3]
    assert room.room_epoch(DOC) == 3
    assert room.room_epoch("other") is None


def test_concurrent_claims_each_win_exactly_one_bump(room):
    won, errors = [], []

    def claim():
        try:
            won.append(room.claim_room_epoch(DOC))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert sorted(won) == list(range(1, 9))
    assert room.room_epoch(DOC) == 8


def test_a_compared_claim_goes_through_only_from_the_epoch_read(room):
    """Processes racing to host a doc: of claims from one epoch read, exactly one wins."""
    assert room.claim_room_epoch(DOC, "p1", None) == 1
    assert room.claim_room_epoch(DOC, "p2", None) is None  # came second
    assert room.room_placement(DOC) == (1, "p1")
    won = []
    threads = [
        threading.Thread(target=lambda h=h: won.append(room.claim_room_epoch(DOC, h, 1)))
        for h in ("p2", "p3", "p4")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(won, key=str) == [2, None, None]
    assert room.room_placement(DOC)[0] == 2
    assert room.claim_room_epoch(DOC) == 3  # an unconditional claim (HTTP) clears the host
    assert room.room_placement(DOC) == (3, None)


def test_a_flush_from_every_earlier_epoch_is_fenced_and_writes_nothing(room):
    for _ in range(3):
        room.claim_room_epoch(DOC)
    before = outbox_high_water()
    for stale in (1, 2, 4):
        with pytest.raises(RoomFenced) as err:
            flush(room, stale, [add(stale)], epoch=stale)
        assert err.value.status == 409 and err.value.code == "fenced"
        assert err.value.details["epoch"] == 3
    assert outbox_high_water() == before and rows() == []
    assert flush(room, 1, [add(1)], epoch=3).applied
    assert rows() == [("r1", "x", None)]


def test_a_doc_never_claimed_fences_every_flush(room):
    with pytest.raises(RoomFenced):
        flush(room, 1, [add(1)], epoch=1)
    assert rows() == []


# --- identity, ledger isolation --------------------------------------------------------


def test_a_replay_is_absorbed_and_another_batch_under_its_offset_is_refused(room):
    epoch = room.claim_room_epoch(DOC)
    assert flush(room, 7, [add(1)], epoch, batch_hash="h7").applied
    again = flush(room, 7, [add(1)], epoch, batch_hash="h7")
    assert not again.applied
    with pytest.raises(SourceHashMismatch):
        flush(room, 7, [add(2)], epoch, batch_hash="other")
    assert rows() == [("r1", "x", None)]


def test_a_room_flush_never_touches_the_slow_path_ledger(room):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO _rindle_client_mutations (client_id, last_mutation_id) VALUES ('c1', 5)"
        )
    epoch = room.claim_room_epoch(DOC)
    flush(room, 1, [add(1), lmid("c1", 9), lmid("c2", 3)], epoch)
    assert scalar("SELECT last_mutation_id FROM _rindle_client_mutations WHERE client_id='c1'") == 5
    assert scalar("SELECT count(*) FROM _rindle_client_mutations WHERE client_id='c2'") == 0
    assert room.room_lmids(DOC, ["c1", "c2", "c3"]) == {"c1": 9, "c2": 3}
    assert room.room_lmids("other-doc", ["c1"]) == {}
    assert room.client_lmid("c1") == 5


def test_the_room_ledger_never_goes_down_and_replays_dedupe_by_doc_and_client(room):
    epoch = room.claim_room_epoch(DOC)
    flush(room, 1, [lmid("c1", 9)], epoch)
    flush(room, 2, [lmid("c1", 4)], epoch)  # a late, lower co-edit
    flush(room, 2, [lmid("c1", 99)], epoch)  # a replay of offset 2: absorbed
    assert room.room_lmids(DOC, ["c1"]) == {"c1": 9}
    count = scalar("SELECT count(*) FROM _rindle_room_client_mutations WHERE doc = %s", [DOC])
    assert count == 1


# --- CAS ------------------------------------------------------------------------------


def test_cas_hits_apply_and_a_miss_rolls_the_whole_batch_back_with_current_images(room):
    epoch = room.claim_room_epoch(DOC)
    flush(room, 1, [add(1, "a", 1), add(2, "b", 2)], epoch)
    hit = flush(room, 2, [edit(1, {"label": "a"}, {"label": "A"}), add(3, "c")], epoch, cas=True)
    assert hit.applied
    before = outbox_high_water()
    batch = [
        edit(1, {"label": "A"}, {"label": "AA"}),  # would hit
        edit(2, {"label": "stale"}, {"label": "B"}),  # misses
        add(3, "dup"),  # misses: r3 exists
        lmid("c1", 5),
    ]
    with pytest.raises(RoomConflict) as err:
        flush(room, 3, batch, epoch, cas=True)
    assert err.value.status == 409 and err.value.code == "conflict"
    conflicts = err.value.details["conflicts"]
    assert [(c["index"], c["op"], c["key"]) for c in conflicts] == [
        (1, "edit", {"id": "r2"}),
        (2, "add", {"id": "r3"}),
    ]
    assert conflicts[0]["current"]["label"] == "b" and conflicts[1]["current"]["label"] == "c"
    assert outbox_high_water() == before
    assert rows() == [("r1", "A", 1), ("r2", "b", 2), ("r3", "c", None)]
    assert room.room_lmids(DOC, ["c1"]) == {}
    assert room.source_checkpoint(f"room:{DOC}").offset == "2"


def test_cas_compares_by_identity_null_equals_null_and_one_number_domain(room):
    epoch = room.claim_room_epoch(DOC)
    flush(room, 1, [add(1, None, 1, {"k": [1, 2]})], epoch)
    # null == null (SQL's = would say unknown), 1 == 1.0, JSON by value
    old = {"label": None, "n": 1.0, "meta": {"k": [1, 2]}}
    assert flush(room, 2, [edit(1, old, {"label": "set"})], epoch, cas=True).applied
    with pytest.raises(RoomConflict):
        flush(room, 3, [edit(1, {"label": None}, {"label": "again"})], epoch, cas=True)
    with pytest.raises(RoomConflict):
        flush(room, 3, [edit(1, {"n": 2}, {"label": "again"})], epoch, cas=True)
    assert rows() == [("r1", "set", 1)]


def test_cas_checks_each_change_against_what_the_batch_left(room):
    epoch = room.claim_room_epoch(DOC)
    batch = [
        add(1, "a"),
        edit(1, {"label": "a"}, {"label": "b"}),
        remove(1, label="b"),
        add(1, "c"),
    ]
    assert flush(room, 1, batch, epoch, cas=True).applied
    assert rows() == [("r1", "c", None)]
    with pytest.raises(RoomConflict) as err:
        flush(
            room,
            2,
            [remove(1, label="c"), edit(1, {"label": "c"}, {"label": "d"})],
            epoch,
            cas=True,
        )
    assert [c["index"] for c in err.value.details["conflicts"]] == [1]
    assert err.value.details["conflicts"][0]["current"] is None


def test_a_remove_of_a_missing_row_is_a_cas_miss(room):
    epoch = room.claim_room_epoch(DOC)
    with pytest.raises(RoomConflict):
        flush(room, 1, [remove(9)], epoch, cas=True)


# --- the lifecycle: outcomes and the downgrade watermark --------------------------------


def test_outcomes_and_the_watermark_co_commit_with_the_flush(room):
    epoch = room.claim_room_epoch(DOC)
    flush(room, 5, [add(1), lmid("c1", 3), outcome("c1", 2)], epoch)
    assert scalar("SELECT flush_seq FROM _rindle_room_watermark WHERE doc = %s", [DOC]) == "5"
    got = scalar(
        "SELECT kind FROM _rindle_room_mutation_outcomes WHERE doc=%s AND client_id='c1' AND mid=2",
        [DOC],
    )
    assert got == "rejected"
    # a replayed outcome upserts by (doc, client, mid): still one row
    flush(room, 6, [outcome("c1", 2, reason="again")], epoch)
    assert scalar("SELECT count(*) FROM _rindle_room_mutation_outcomes") == 1
    assert scalar("SELECT flush_seq FROM _rindle_room_watermark WHERE doc = %s", [DOC]) == "6"


def test_a_failed_flush_moves_neither_the_watermark_nor_the_outcomes(room):
    epoch = room.claim_room_epoch(DOC)
    flush(room, 1, [add(1)], epoch)
    with pytest.raises(RoomConflict):
        flush(room, 2, [add(1), outcome("c1", 1), lmid("c1", 1)], epoch, cas=True)
    assert scalar("SELECT flush_seq FROM _rindle_room_watermark WHERE doc = %s", [DOC]) == "1"
    assert scalar("SELECT count(*) FROM _rindle_room_mutation_outcomes") == 0


def test_outcomes_are_pruned_by_lmid_distance_for_the_clients_a_flush_advanced(room, settings):
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "ROOM_OUTCOME_RETENTION_LMIDS": 10}
    epoch = room.claim_room_epoch(DOC)
    flush(room, 1, [outcome("c1", 1), outcome("c1", 15), outcome("c2", 1), lmid("c1", 15)], epoch)
    flush(room, 2, [lmid("c1", 30)], epoch)
    left = [
        tuple(r)
        for r in _all("SELECT client_id, mid FROM _rindle_room_mutation_outcomes ORDER BY 1, 2")
    ]
    # c1's lmid went to 30: mids <= 20 are pruned; c2 did not advance: kept
    assert left == [("c2", 1)]


def test_with_the_lifecycle_off_outcomes_are_accepted_and_discarded(room, settings):
    settings.RINDLE = {**getattr(settings, "RINDLE", {}), "REALTIME_LIFECYCLE": False}
    epoch = room.claim_room_epoch(DOC)
    assert flush(room, 1, [add(1), outcome("c1", 1), lmid("c1", 1)], epoch).applied
    assert scalar("SELECT count(*) FROM _rindle_room_mutation_outcomes") == 0
    assert scalar("SELECT count(*) FROM _rindle_room_watermark") == 0
    assert room.room_lmids(DOC, ["c1"]) == {"c1": 1}


def _all(sql):
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"doc": "", "epoch": 1}, "invalid_doc"),
        ({"doc": DOC, "epoch": 0}, "invalid_epoch"),
        ({"doc": DOC, "epoch": True}, "invalid_epoch"),
        ({"doc": None, "epoch": 1}, "invalid_epoch"),
    ],
)
def test_bad_fences_are_refused_and_change_nothing(room, kwargs, code):
    room.claim_room_epoch(DOC)
    with pytest.raises(InvalidInput) as err:
        room.commit_room_flush([add(1)], "room:x", "1", **kwargs)
    assert err.value.code == code
    assert rows() == []


@pytest.mark.parametrize(
    "change",
    [
        {"table": "_rindle_client_mutations", "op": "remove", "old": {"client_id": "c"}},
        {"table": "_rindle_client_mutations", "op": "add", "row": {"client_id": "c"}},
        {
            "table": "_rindle_client_mutations",
            "op": "add",
            "row": {"client_id": "", "last_mutation_id": 1},
        },
        {
            "table": "_rindle_room_mutation_outcomes",
            "op": "add",
            "row": {"client_id": "c", "mid": -1, "kind": "x"},
        },
        {
            "table": "_rindle_room_mutation_outcomes",
            "op": "add",
            "row": {"client_id": "c", "mid": 1, "doc": "d"},
        },
        {"table": "_rindle_room_placement", "op": "add", "row": {"doc": DOC, "epoch": 99}},
    ],
)
def test_bad_co_edits_are_refused_and_change_nothing(room, change):
    epoch = room.claim_room_epoch(DOC)
    with pytest.raises(InvalidInput):
        flush(room, 1, [add(1), change], epoch)
    assert rows() == [] and room.room_epoch(DOC) == epoch


def test_room_lmids_refuses_a_bad_client_list(room):
    for clients in ("c1", [1], [""], ["c"] * 1001):
        with pytest.raises(InvalidInput) as err:
            room.room_lmids(DOC, clients)
        assert err.value.code == "invalid_clients"


def test_cas_reads_composite_keys_and_batches_past_one_statement(room):
    from rindle_app.engine import rooms

    room.register_table("room_pairs", ["a", "b", "v"], [0, 1], ["string", "int64", "string"])
    try:
        epoch = room.claim_room_epoch(DOC)
        pair = {"table": "room_pairs", "op": "add", "row": {"a": "x", "b": 2, "v": "one"}}
        flush(room, 1, [pair], epoch)
        hit = {"table": "room_pairs", "op": "edit", "old": {"a": "x", "b": 2.0, "v": "one"}}
        hit["row"] = {"v": "two"}
        assert flush(room, 2, [hit], epoch, cas=True).applied
        # more keys than one read statement takes: the existing row is found in a later one
        many = [add(i) for i in range(rooms.CAS_READ_KEYS + 100)]
        flush(room, 3, [add(rooms.CAS_READ_KEYS + 50, "old")], epoch)
        with pytest.raises(RoomConflict) as err:
            flush(room, 4, many, epoch, cas=True)
        assert [c["key"] for c in err.value.details["conflicts"]] == [
            {"id": f"r{rooms.CAS_READ_KEYS + 50}"}
        ]
        stale = {"table": "room_pairs", "op": "remove", "old": {"a": "x", "b": 2, "v": "one"}}
        with pytest.raises(RoomConflict) as err:
            flush(room, 4, [stale], epoch, cas=True)
        assert err.value.details["conflicts"][0]["current"] == {"a": "x", "b": 2, "v": "two"}
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE IF EXISTS "room_pairs"')


def test_co_edits_and_effects_may_be_positional(room):
    epoch = room.claim_room_epoch(DOC)
    batch = [
        {"table": TABLE, "op": "add", "row": ["r1", "a", 1, None]},
        {"table": "_rindle_client_mutations", "op": "add", "row": ["c1", 4]},
        {
            "table": "_rindle_room_mutation_outcomes",
            "op": "add",
            "row": ["c1", 3, "rejected", "no", "m", None],
        },
    ]
    assert flush(room, 1, batch, epoch, cas=True).applied
    assert rows() == [("r1", "a", 1)]
    assert room.room_lmids(DOC, ["c1"]) == {"c1": 4}
    assert scalar("SELECT reason FROM _rindle_room_mutation_outcomes WHERE mid = 3") == "no"
    with pytest.raises(InvalidInput):
        flush(room, 2, [{"table": "_rindle_client_mutations", "op": "add", "row": ["c1"]}], epoch)
