"""
The stream epoch (``state.check_identity``): a restored database gets a new epoch,
so a cursor of the old one can never alias the seqs the restored one hands out.
"""

import pytest
from django.db import connection, transaction

from rindle_app.engine.capture import OUTBOX
from rindle_app.stream import state
from rindle_app.stream.retention import Retention

from .retention_support import DAY, T0, Clock, add_events, publish, read_state

pytestmark = pytest.mark.django_db(transaction=True)


def check(seen=None):
    with transaction.atomic(), connection.cursor() as cursor:
        return state.check_identity(cursor, seen)


def stored_identity():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT identity FROM {state.TABLE} WHERE name = %s", [state.STREAM])
        return cursor.fetchone()[0]


def set_identity(text):
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {state.TABLE} SET identity = %s WHERE name = %s", [text, state.STREAM]
        )


def test_a_fresh_stream_records_its_identity_and_keeps_its_epoch():
    """The first check records what the epoch is for; checks after it change nothing."""
    before = read_state()
    current, minted = check()
    assert not minted and current.epoch == before.epoch
    recorded = stored_identity()
    assert recorded
    if connection.vendor == "postgresql":
        assert {"database", "table", "timeline", "system"} <= set(state._decode(recorded))
    else:
        assert set(state._decode(recorded)) == {"file"}
    assert check() == (current, False)
    assert stored_identity() == recorded


def test_a_database_with_another_identity_gets_a_new_epoch():
    """
    A restore into another database (simulated: the recorded identity names another
    database oid, or another SQLite file) mints a new epoch; the old one is gone.
    """
    old, _ = check()
    part = "database" if connection.vendor == "postgresql" else "file"
    parts = state._decode(stored_identity())
    set_identity(state._encode({**parts, part: "1"}))
    current, minted = check()
    assert minted and current.epoch != old.epoch
    assert read_state().epoch == current.epoch
    assert state._decode(stored_identity())[part] == parts[part]
    assert check() == (current, False)


def test_an_identity_part_the_role_cannot_read_mints_nothing():
    """A part missing on one side (unreadable, or recorded before) is not a restore."""
    old, _ = check()
    parts = state._decode(stored_identity())
    dropped = sorted(parts)[0]
    set_identity(state._encode({k: v for k, v in parts.items() if k != dropped}))
    current, minted = check()
    assert not minted and current.epoch == old.epoch
    assert state._decode(stored_identity()) == parts


def test_numbering_reset_below_safe_seq_mints_and_moves_the_numbering_past_it():
    """
    The outbox's sequence reset below safe_seq (rows restored without it): a new
    epoch, and the next seq is above the old safe_seq, never a re-issued one.
    """
    seqs = add_events([T0] * 3)
    publish()
    Retention(age=7 * DAY, now=Clock(T0)).run_once()  # records identity and safe_seq
    old = read_state()
    assert old.safe_seq == seqs[-1]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'seq')", [OUTBOX])
            cursor.execute("SELECT setval(%s, 1)", [cursor.fetchone()[0]])
        else:
            cursor.execute(f"DELETE FROM {OUTBOX}")
            cursor.execute("UPDATE sqlite_sequence SET seq = 1 WHERE name = %s", [OUTBOX])
    current, minted = check()
    assert minted and current.epoch != old.epoch
    assert current.safe_seq == old.safe_seq
    [fresh] = add_events([T0])
    assert fresh > old.safe_seq


def test_a_database_swapped_for_an_older_copy_under_a_running_pruner_mints():
    """
    Same epoch but a lower safe_seq and horizon than this process's pruning saw (an
    older copy put in place while it ran): a new epoch at its next run, also when
    that run is a new ``Retention`` (a beat task builds one per run).
    """
    from rindle_app.runtime import get_runtime

    seqs = add_events([T0 - 30 * DAY] * 4 + [T0])
    publish()
    runtime = get_runtime("default")
    assert runtime.retention(now=Clock(T0)).run_once().horizon == seqs[4]
    retention = runtime.retention(now=Clock(T0))
    before = read_state()
    with connection.cursor() as cursor:  # the "older copy": the state of an earlier moment
        cursor.execute(
            f"UPDATE {state.TABLE} SET horizon = %s, safe_seq = %s WHERE name = %s",
            [seqs[1], seqs[3], state.STREAM],
        )
        cursor.execute(f"DELETE FROM {OUTBOX} WHERE seq > %s", [seqs[3]])
    run = retention.run_once()
    assert run.minted and read_state().epoch != before.epoch
    assert retention.stats.epochs_minted == 1


def test_two_checkers_mint_one_epoch_for_one_restore():
    """A checker that read the epoch another just replaced writes nothing over it."""
    check()
    parts = state._decode(stored_identity())
    part = "database" if connection.vendor == "postgresql" else "file"
    set_identity(state._encode({**parts, part: "1"}))
    stale = read_state().epoch
    first, minted = check()
    assert minted
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {state.TABLE} SET epoch = %s, identity = '' WHERE name = %s AND epoch = %s",
            ["ffffffffffffffff", state.STREAM, stale],
        )
        assert cursor.rowcount == 0  # the compare-and-set check_identity writes with
    assert read_state().epoch == first.epoch


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_role_refused_the_control_functions_still_gets_the_other_parts():
    """Where pg_control_system() is revoked (managed services), the other parts remain."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
        cursor.execute("CREATE ROLE rindle_ret_probe NOLOGIN")
        cursor.execute("SET LOCAL ROLE rindle_ret_probe")
        parts = state.identity(cursor)
        transaction.set_rollback(True)
    assert "system" not in parts
    assert {"database", "table", "timeline"} <= set(parts)
