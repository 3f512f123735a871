"""
Foreign producers: admission at exactly stored + 1, replays absorbed, gaps and
digest conflicts refused with nothing written, ids bound to their principal, and
the ProducerCensus exact under random replays, gaps and rolled-back attempts.
"""

import random

import pytest
from django.db import connection

from rindle_app.engine.changes import RowConflict
from rindle_app.engine.errors import InvalidInput
from rindle_app.engine.producers import ProducerConflict, ProducerGap, ProducerNotOwned
from rindle_app.testing import outbox_high_water, outbox_since

from .conftest import scratch_table

TABLE = "ingest_item"


@pytest.fixture
def items(engine):
    yield from scratch_table(engine, TABLE)


def add(i, label="x", n=0):
    return {"table": TABLE, "op": "add", "row": {"id": f"i{i}", "label": label, "n": n}}


def rows():
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id, label, n FROM "{TABLE}" ORDER BY id')
        return cursor.fetchall()


def stored(producer):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT seq, digest, owner FROM _rindle_producer_offsets WHERE producer = %s",
            [producer],
        )
        return cursor.fetchone()


def test_writes_apply_in_order_and_the_offset_rides_the_same_commit(items):
    r1 = items.producer_write("p", 1, [add(1)])
    r2 = items.producer_write(
        "p",
        2,
        [
            {"table": TABLE, "op": "edit", "old": {"id": "i1"}, "row": {"label": "y", "n": 5}},
            add(2),
        ],
    )
    assert (r1.applied, r1.seq, r2.applied, r2.seq) == (True, 1, True, 2)
    assert r2.cv > r1.cv
    assert rows() == [("i1", "y", 5), ("i2", "x", 0)]
    assert stored("p")[0] == 2
    assert items.producer_seq("p") == 2
    # The offset row is captured (replicated data), in the same commit as the effects.
    events = outbox_since(r1.cv)
    assert [e["table"] for e in events] == [TABLE, TABLE, "_rindle_producer_offsets"]
    assert events[-1]["new"]["seq"] == 2


def test_a_replay_is_absorbed_and_writes_nothing(items):
    items.producer_write("p", 1, [add(1)])
    items.producer_write("p", 2, [add(2)])
    before = outbox_high_water()
    again = items.producer_write("p", 2, [add(2)])
    older = items.producer_write("p", 1, [add(1)])
    assert (again.applied, again.seq) == (False, 2)
    assert (older.applied, older.seq) == (False, 2)
    assert outbox_high_water() == before
    assert rows() == [("i1", "x", 0), ("i2", "x", 0)]


def test_a_replay_with_another_payload_is_a_conflict(items):
    items.producer_write("p", 1, [add(1)])
    before = outbox_high_water()
    with pytest.raises(ProducerConflict) as err:
        items.producer_write("p", 1, [add(1, label="changed")])
    assert err.value.status == 409 and err.value.details["stored"] == 1
    assert outbox_high_water() == before and rows() == [("i1", "x", 0)]


def test_a_gap_is_refused_with_the_stored_seq(items):
    items.producer_write("p", 1, [add(1)])
    before = outbox_high_water()
    with pytest.raises(ProducerGap) as err:
        items.producer_write("p", 3, [add(3)])
    assert err.value.stored == 1 and err.value.as_dict()["stored"] == 1
    assert outbox_high_water() == before and stored("p")[0] == 1
    with pytest.raises(ProducerGap) as err:
        items.producer_write("fresh", 2, [add(9)])
    assert err.value.stored == 0 and stored("fresh") is None


def test_a_producer_id_is_bound_to_the_principal_that_first_wrote_it(items):
    items.producer_write("shared", 1, [add(1)], owner="user:1")
    before = outbox_high_water()
    with pytest.raises(ProducerNotOwned):
        items.producer_write("shared", 2, [add(2)], owner="user:2")
    with pytest.raises(ProducerNotOwned):
        items.producer_write("shared", 2, [add(2)])  # server code cannot take it either
    with pytest.raises(ProducerNotOwned):
        items.producer_seq("shared", owner="user:2")
    assert outbox_high_water() == before and stored("shared")[0] == 1
    assert items.producer_write("shared", 2, [add(2)], owner="user:1").applied


def test_a_failing_batch_rolls_back_whole_and_does_not_advance(items):
    items.producer_write("p", 1, [add(1)])
    before = outbox_high_water()
    census = items.producer_census.get()
    with pytest.raises(RowConflict):
        items.producer_write("p", 2, [add(2), add(1)])  # i1 exists: the batch fails
    assert rows() == [("i1", "x", 0)] and stored("p")[0] == 1
    assert outbox_high_water() == before and items.producer_census.get() == census
    assert items.producer_write("p", 2, [add(2)]).applied


@pytest.mark.parametrize(
    "producer, seq, changes, code",
    [
        ("", 1, [], "invalid_producer"),
        ("x" * 256, 1, [], "invalid_producer"),
        (None, 1, [], "invalid_producer"),
        ("p", 0, [], "invalid_seq"),
        ("p", True, [], "invalid_seq"),
        ("p", "1", [], "invalid_seq"),
        ("p", 1, {"table": TABLE}, "invalid_changes"),
        ("p", 1, [{"table": "nope", "op": "add", "row": {"id": "a"}}], "unknown_table"),
        ("p", 1, [{"table": "_rindle_client_mutations", "op": "add", "row": {}}], "unknown_table"),
        ("p", 1, [{"table": TABLE, "op": "upsert", "row": {"id": "a"}}], "invalid_op"),
        ("p", 1, [{"table": TABLE, "op": "add", "row": {"label": "a"}}], "no_key"),
        ("p", 1, [{"table": TABLE, "op": "add", "row": {"id": "a", "zzz": 1}}], "unknown_column"),
        ("p", 1, [{"table": TABLE, "op": "add", "row": {"id": "a", "n": [1]}}], "invalid_value"),
        ("p", 1, [{"table": TABLE, "op": "remove", "row": {"id": "a"}}], "invalid_change"),
        ("p", 1, [{"table": TABLE, "op": "edit", "row": {"n": 1}}], "invalid_row"),
        ("p", 1, [{"table": TABLE, "op": "add", "row": {"id": "a"}, "x": 1}], "invalid_change"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(items, producer, seq, changes, code):
    before = outbox_high_water()
    with pytest.raises(InvalidInput) as err:
        items.producer_write(producer, seq, changes)
    assert err.value.code == code
    assert outbox_high_water() == before


def test_json_columns_round_trip(items):
    items.producer_write(
        "p", 1, [{"table": TABLE, "op": "add", "row": {"id": "j", "meta": {"a": [1, "b"]}}}]
    )
    (event,) = [e for e in outbox_since(0) if e["table"] == TABLE]
    assert event["new"]["meta"] == {"a": [1, "b"]}


def test_the_census_is_exact_under_replays_gaps_and_rollbacks(items):
    """1,000 producers, random replays, gaps and failing first writes: census == rows."""
    rng = random.Random(5)
    assert items.producer_census.get() == 0
    next_seq = {}
    for n in range(1000):
        producer = f"prod-{n}"
        for _ in range(rng.randint(1, 4)):
            seq = next_seq.get(producer, 0) + 1
            roll = rng.random()
            if roll < 0.15:  # a gap
                with pytest.raises(ProducerGap):
                    items.producer_write(producer, seq + rng.randint(1, 3), [])
            elif roll < 0.3:  # a write that rolls back (its add collides)
                with pytest.raises(RowConflict):
                    items.producer_write(producer, seq, [add("dup"), add("dup")])
            elif roll < 0.45 and seq > 1:  # a replay of the last applied write
                assert not items.producer_write(producer, seq - 1, []).applied
            else:
                assert items.producer_write(producer, seq, []).applied
                next_seq[producer] = seq
    with connection.cursor() as cursor:
        cursor.execute("SELECT COUNT(*) FROM _rindle_producer_offsets")
        (count,) = cursor.fetchone()
    assert count == len(next_seq)
    assert items.producer_census.get() == count
    # A fresh seed (engine open, restore) agrees with the incremental count.
    items.seed_producer_census()
    assert items.producer_census.get() == count
