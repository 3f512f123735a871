"""
Change sources: effects and cursor in one transaction, positions at or below the
stored one skipped, the run id fence and its compare-and-swap, a replay with a
different batch hash refused loudly, streamed chunks in one open transaction.
"""

import pytest
from django.db import connection

from rindle_app.engine.changes import RowConflict
from rindle_app.engine.errors import InvalidInput
from rindle_app.engine.sources import SourceFenced, SourceHashMismatch, position
from rindle_app.testing import outbox_high_water, outbox_since

from .conftest import scratch_table

TABLE = "ingest_feed"


@pytest.fixture
def feed(engine):
    yield from scratch_table(engine, TABLE)


def add(i, label="x"):
    return {"table": TABLE, "op": "add", "row": {"id": f"r{i}", "label": label}}


def ids():
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id FROM "{TABLE}" ORDER BY id')
        return [r[0] for r in cursor.fetchall()]


def test_a_batch_lands_with_its_cursor_and_a_replay_is_skipped(feed):
    first = feed.apply_source_batch("wiki", "10", [add(1), add(2)], batch_hash="h10")
    assert first.applied and first.rows == 2
    cp = feed.source_checkpoint("wiki")
    assert (cp.offset, cp.chunk_seq, cp.batch_hash) == ("10", -1, "h10")
    assert cp.head["rows"] == 2 and cp.head["batches"] == 1
    before = outbox_high_water()
    again = feed.apply_source_batch("wiki", "10", [add(1), add(2)], batch_hash="h10")
    older = feed.apply_source_batch("wiki", "9", [add(3)])
    assert not again.applied and not older.applied
    assert outbox_high_water() == before and ids() == ["r1", "r2"]
    # Offsets of digits compare as numbers: "9" < "10" < "11".
    assert feed.apply_source_batch("wiki", "11", [add(3)]).applied
    assert ids() == ["r1", "r2", "r3"]
    assert feed.source_checkpoint("wiki").head == {"rows": 3, "batches": 2}


def test_the_same_offset_with_another_hash_is_refused_loudly(feed):
    feed.apply_source_batch("s", "5", [add(1)], batch_hash="aaa")
    before = outbox_high_water()
    with pytest.raises(SourceHashMismatch) as err:
        feed.apply_source_batch("s", "5", [add(9)], batch_hash="bbb")
    assert err.value.status == 409 and err.value.details["stored"]["batchHash"] == "aaa"
    assert outbox_high_water() == before and ids() == ["r1"]


def test_chunks_of_a_run_resume_by_chunk_seq(feed):
    assert feed.apply_source_batch("cdc", "7", [add(1)], chunk_seq=0).applied
    assert feed.apply_source_batch("cdc", "7", [add(2)], chunk_seq=1).applied
    assert not feed.apply_source_batch("cdc", "7", [add(2)], chunk_seq=1).applied
    assert not feed.apply_source_batch("cdc", "7", [add(1)], chunk_seq=0).applied
    # The whole-run checkpoint (-1) of the same offset sorts before its chunks.
    assert not feed.apply_source_batch("cdc", "7", [add(3)]).applied
    assert feed.apply_source_batch("cdc", "8", [add(3)]).applied
    assert ids() == ["r1", "r2", "r3"]


def test_a_stored_run_id_fences_other_runs_until_swapped(feed):
    feed.apply_source_batch("f", "1", [add(1)], run_id="run-a")
    before = outbox_high_water()
    with pytest.raises(SourceFenced):
        feed.apply_source_batch("f", "2", [add(2)], run_id="run-b")
    with pytest.raises(SourceFenced):
        feed.apply_source_batch("f", "2", [add(2)])
    assert outbox_high_water() == before
    # The compare-and-swap: a stale previous id (or a moved cursor) is fenced.
    with pytest.raises(SourceFenced):
        feed.refresh_follower_run_id("f", "1", "run-x", "run-b")
    with pytest.raises(SourceFenced):
        feed.refresh_follower_run_id("f", "0", "run-a", "run-b")
    cp = feed.refresh_follower_run_id("f", "1", "run-a", "run-b")
    assert cp.run_id == "run-b" and cp.offset == "1"
    assert outbox_high_water() == before  # no row changes: no live query sees it
    with pytest.raises(SourceFenced):
        feed.apply_source_batch("f", "2", [add(2)], run_id="run-a")
    assert feed.apply_source_batch("f", "2", [add(2)], run_id="run-b").applied
    assert ids() == ["r1", "r2"]


def test_a_failing_batch_leaves_neither_effects_nor_cursor(feed):
    feed.apply_source_batch("s", "1", [add(1)])
    before = outbox_high_water()
    with pytest.raises(RowConflict):
        feed.apply_source_batch("s", "2", [add(2), add(1)])
    assert outbox_high_water() == before and ids() == ["r1"]
    assert feed.source_checkpoint("s").offset == "1"


def test_the_follower_applies_streamed_chunks_in_one_transaction(feed):
    seen = []

    def chunks():
        for n in range(3):
            seen.append(n)
            yield [add(n * 2), add(n * 2 + 1)]

    result = feed.commit_follower_txn("master", "100", chunks(), run_id="r", head={"lsn": 5})
    assert result.applied and result.rows == 6 and seen == [0, 1, 2]
    assert feed.source_checkpoint("master").head == {"rows": 6, "batches": 1, "source": {"lsn": 5}}
    # All six rows share one commit: one cv covers them.
    events = [e for e in outbox_since(0) if e["table"] == TABLE]
    assert len(events) == 6 and result.cv == max(e["seq"] for e in outbox_since(0))

    def failing():
        yield [add(10)]
        yield [add(0)]  # collides: the whole transaction, cursor included, rolls back

    with pytest.raises(RowConflict):
        feed.commit_follower_txn("master", "101", failing(), run_id="r")
    assert "r10" not in ids() and feed.source_checkpoint("master").offset == "100"


def test_a_follower_carries_replicated_producer_rows_into_the_census(feed):
    assert feed.producer_census.get() == 0
    row = {"producer": "upstream-1", "seq": 3, "digest": None, "owner": None}
    feed.apply_source_batch(
        "master", "1", [{"table": "_rindle_producer_offsets", "op": "add", "row": row}]
    )
    assert feed.producer_census.get() == 1
    assert feed.producer_seq("upstream-1") == 3


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"source": "", "offset": "1"}, "invalid_source"),
        ({"source": "s", "offset": ""}, "invalid_offset"),
        ({"source": "s", "offset": 5}, "invalid_offset"),
        ({"source": "s", "offset": "1", "chunk_seq": -2}, "invalid_chunk_seq"),
        ({"source": "s", "offset": "1", "chunk_seq": "0"}, "invalid_chunk_seq"),
        ({"source": "s", "offset": "1", "run_id": ""}, "invalid_run_id"),
        ({"source": "s", "offset": "1", "head": [1]}, "invalid_head"),
        ({"source": "s", "offset": "1", "changes": [{"table": "auth_user"}]}, "unknown_table"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(feed, kwargs, code):
    kwargs = {"changes": [add(1)], **kwargs}
    before = outbox_high_water()
    with pytest.raises(InvalidInput) as err:
        feed.apply_source_batch(kwargs.pop("source"), kwargs.pop("offset"), **kwargs)
    assert err.value.code == code
    assert outbox_high_water() == before and feed.source_checkpoint("s") is None


def test_positions_sort_numbers_numerically_and_chunks_after_whole_runs():
    assert position("9", -1) < position("10", -1) < position("10", 0) < position("10", 1)
    assert position("a", -1) < position("b", -1)


def test_positional_rows_name_the_wire_columns_in_order(feed):
    """The daemon client's form: a row or old image as one value per column."""
    batch = [
        {"table": TABLE, "op": "add", "row": ["r1", "one", 1, {"k": 1}]},
        {"table": TABLE, "op": "add", "row": ["r2", "two", 2, None]},
        {
            "table": TABLE,
            "op": "edit",
            "old": ["r1", "one", 1, {"k": 1}],
            "row": ["r1", "uno", 1, None],
        },
        {"table": TABLE, "op": "remove", "old": ["r2", "two", 2, None]},
    ]
    assert feed.apply_source_batch("pos", "1", batch).applied
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id, label, n FROM "{TABLE}"')
        assert cursor.fetchall() == [("r1", "uno", 1)]


@pytest.mark.parametrize("row", [["r1", "one", 1], ["r1", "one", 1, None, "extra"], []])
def test_a_positional_row_of_the_wrong_width_is_refused_and_changes_nothing(feed, row):
    before = outbox_high_water()
    with pytest.raises(InvalidInput) as err:
        feed.apply_source_batch("pos", "1", [add(1), {"table": TABLE, "op": "add", "row": row}])
    assert err.value.code == "invalid_row"
    assert outbox_high_water() == before and ids() == []
