"""
Concurrency and failure handling of the single writer.

Many threads share one engine: each client's mutations apply exactly once whether
one thread or several race to send them; a request that fails rolls back only
itself while the rest of its group commits; and a database failure inside the
writer is retryable, advances no lmid, writes nothing, and the re-sent envelope
then applies exactly once.
"""

import random
import sqlite3
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, connections
from django.test import override_settings

from rindle_app.engine import MutationGap, MutationRejected, Unavailable, mutator
from rindle_app.models import ChangeEvent
from rindle_app.testing import outbox_high_water, running

REJECT_EVERY = 7
FX_COLUMNS = (["id", "client", "mid"], [0], ["string", "string", "int64"])

# (client, mid) pairs whose next run fails inside the writer; see conc_flaky.
_fail_once = set()
_fail_lock = threading.Lock()


def _take_fault(args):
    with _fail_lock:
        key = (args["client"], args["mid"])
        if key in _fail_once:
            _fail_once.discard(key)
            return True
        return False


def _insert_effect(tx, args):
    row = {"id": uuid.uuid4().hex, "client": args["client"], "mid": args["mid"]}
    tx.insert(args["table"], row)


@mutator("conc_fx")
def conc_fx(tx, args, user):
    """One effect row per mid; every 7th mid writes its row, then is rejected."""
    _insert_effect(tx, args)
    if args["mid"] % REJECT_EVERY == 0:
        raise MutationRejected(f"mid {args['mid']} is a multiple of {REJECT_EVERY}")


@mutator("conc_flaky")
def conc_flaky(tx, args, user):
    """One effect row; an armed (client, mid) then fails once as the database would."""
    _insert_effect(tx, args)
    if _take_fault(args):
        raise OperationalError("database is locked")


@mutator("conc_kill_session")
def conc_kill_session(tx, args, user):
    """One effect row; an armed (client, mid) then has Postgres end the writer's session."""
    _insert_effect(tx, args)
    if _take_fault(args):
        tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")


def envelope(table, client, mid):
    return {"table": table, "client": client, "mid": mid}


def outcome(mid):
    return "rejected" if mid % REJECT_EVERY == 0 else "applied"


def make_fx_table(engine):
    table = f"fx_conc_{uuid.uuid4().hex[:12]}"
    engine.register_table(table, *FX_COLUMNS)
    return table


def drop_table(table):
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE IF EXISTS "{table}"')


@pytest.fixture
def fx(engine):
    """A fresh effect table (id, client, mid) registered with ``engine``."""
    table = make_fx_table(engine)
    yield table
    drop_table(table)


def effect_rows(table):
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT id, client, mid FROM "{table}"')
        return cursor.fetchall()


def assert_effects(table, lmids, skip=REJECT_EVERY):
    """
    Each client's effects are exactly its mids 1..lmid except multiples of ``skip``,
    once each, and the outbox holds exactly one ``add`` per effect row.
    """
    rows = effect_rows(table)
    per_client = {client: Counter() for client in lmids}
    for _, client, mid in rows:
        assert client in per_client, f"effect of an unexpected client {client!r}"
        per_client[client][mid] += 1
    for client, lmid in lmids.items():
        counts = per_client[client]
        doubled = sorted(mid for mid, n in counts.items() if n > 1)
        assert not doubled, f"{client}: mids applied twice: {doubled}"
        want = {mid for mid in range(1, lmid + 1) if not skip or mid % skip}
        assert set(counts) == want, (
            f"{client} at lmid {lmid}: extra {sorted(set(counts) - want)}, "
            f"missing {sorted(want - set(counts))}"
        )
    events = list(ChangeEvent.objects.filter(table=table).values_list("op", "key"))
    assert {op for op, _ in events} <= {"add"}
    assert Counter(key[0] for _, key in events) == Counter(row[0] for row in rows)


def run_all(fn, items, workers=None):
    """Run ``fn(item)`` for every item on its own thread; return results in order."""

    def task(item):
        try:
            return fn(item)
        finally:
            connections.close_all()  # this thread's own connections, if any

    with ThreadPoolExecutor(max_workers=workers or len(items)) as pool:
        return list(pool.map(task, items, timeout=120))


class Gate:
    """Holds the writer inside one request until opened, so that what follows queues."""

    def __init__(self, engine):
        self.engine = engine
        self.entered = threading.Event()
        self.opened = threading.Event()
        self.request = engine.submit(self._hold)
        assert self.entered.wait(10), "the writer did not pick up the gate"

    def _hold(self, tx):
        self.entered.set()
        self.opened.wait(30)

    def wait_queued(self, n, timeout=10):
        """Wait until ``n`` requests queue behind the gate ."""
        deadline = time.monotonic() + timeout
        while self.engine.queue_depth < n:
            assert time.monotonic() < deadline, f"only {self.engine.queue_depth} queued"
            time.sleep(0.005)

    def open(self):
        self.opened.set()
        self.engine.wait(self.request)


# --- many senders ----------------------------------------------------------------------


@pytest.mark.slow
def test_one_thread_per_client_applies_every_mid_exactly_once(engine, fx):
    """
    Eight threads, one client each, send mids 1..200 in order at the same time: every
    answer is applied (or rejected, for multiples of 7) with lmid == mid and commit
    versions never go back; each client ends at lmid 200 with exactly one effect per
    non-rejected mid, none for rejected ones, and one outbox event per effect.
    """
    threads, mids = 8, 200

    def send_all(n):
        client = f"{fx}-c{n}"
        return client, [
            engine.mutate(client, mid, "conc_fx", envelope(fx, client, mid))
            for mid in range(1, mids + 1)
        ]

    results = run_all(send_all, range(threads))

    high_water = outbox_high_water()
    for client, answers in results:
        assert [(r.status, r.lmid) for r in answers] == [
            (outcome(mid), mid) for mid in range(1, mids + 1)
        ]
        assert {r.code for r in answers if r.status == "rejected"} == {"rejected"}
        cvs = [r.cv for r in answers]
        assert cvs == sorted(cvs) and cvs[-1] <= high_water
        assert engine.client_lmid(client) == mids
    assert_effects(fx, {client: mids for client, _ in results})


@pytest.mark.slow
def test_racing_senders_of_one_client_apply_each_mid_exactly_once(engine, fx):
    """
    Four threads send the same client's envelopes at once, starting at different mids
    and now and then skipping ahead; a MutationGap sends them back to the stored
    lmid + 1. Exactly one answer per mid is applied (or rejected), all others are
    absorbed; the client ends at lmid 150 and no effect is doubled or missing.
    """
    clients, racers, mids = 2, 4, 150
    answers = Counter()  # (client, mid, status) -> how many senders were told so
    gaps = Counter()
    lock = threading.Lock()

    def race(job):
        client_no, k = job
        client = f"{fx}-c{client_no}"
        rng = random.Random(f"{client_no}-{k}")
        mid = 1 + k * mids // racers
        while mid <= mids:
            try:
                result = engine.mutate(client, mid, "conc_fx", envelope(fx, client, mid))
            except MutationGap as gap:
                assert gap.lmid + 1 < mid, f"mid {mid} refused as a gap at lmid {gap.lmid}"
                with lock:
                    gaps[client] += 1
                # Resume after the stored lmid: from the refusal, or read afresh.
                mid = (gap.lmid if k % 2 else engine.client_lmid(client)) + 1
                continue
            if result.status == "absorbed":
                assert result.lmid >= mid
            else:
                assert (result.status, result.lmid) == (outcome(mid), mid)
            with lock:
                answers[client, mid, result.status] += 1
            mid += 1
            if rng.random() < 0.03:
                mid = min(mid + rng.randint(1, 15), mids)

    run_all(race, [(c, k) for c in range(clients) for k in range(racers)])

    lmids = {f"{fx}-c{c}": mids for c in range(clients)}
    for client in lmids:
        assert engine.client_lmid(client) == mids
        for mid in range(1, mids + 1):
            ran = answers[client, mid, "applied"] + answers[client, mid, "rejected"]
            assert ran == 1, f"{client} mid {mid} was run {ran} times"
            assert answers[client, mid, outcome(mid)] == 1
    assert sum(gaps.values()) > 0, "no sender ever hit a gap"
    assert_effects(fx, lmids)


def test_a_failing_write_rolls_back_only_itself_while_its_group_commits(engine, fx):
    """
    Twenty writes queued behind a held writer commit as one group. The one raising
    ValueError and the one hitting a duplicate key get their own exception back and
    leave no row (nor outbox event); the eighteen others land, all with one cv.
    """
    n, raises, duplicates = 20, 7, 13
    gate = Gate(engine)
    queued = threading.Semaphore(0)

    def write(i):
        row = {"id": f"w{i}", "client": "w", "mid": i}

        def fn(tx):
            tx.insert(fx, row)
            if i == raises:
                raise ValueError("request 7 fails")
            if i == duplicates:
                tx.insert(fx, row)
            return i

        request = engine.submit(fn)
        queued.release()
        try:
            return engine.wait(request)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=n) as pool:
        futures = [pool.submit(write, i) for i in range(n)]
        for _ in range(n):
            assert queued.acquire(timeout=10)
        gate.open()
        results = [f.result(timeout=30) for f in futures]

    assert isinstance(results[raises], ValueError) and str(results[raises]) == "request 7 fails"
    assert isinstance(results[duplicates], IntegrityError)
    landed = [r for i, r in enumerate(results) if i not in (raises, duplicates)]
    assert [c.value for c in landed] == [i for i in range(n) if i not in (raises, duplicates)]
    assert len({c.cv for c in landed}) == 1, "the group did not commit as one"
    want = {f"w{i}" for i in range(n) if i not in (raises, duplicates)}
    assert {row[0] for row in effect_rows(fx)} == want
    events = ChangeEvent.objects.filter(table=fx).order_by("seq")
    assert sorted(e.key[0] for e in events) == sorted(want)
    assert landed[0].cv == events.last().seq


# --- database failures inside the writer ---------------------------------------------------


@pytest.mark.parametrize("grouped", [False, True], ids=["alone", "in-a-group"])
def test_a_database_error_in_a_mutation_is_retryable_and_writes_nothing(engine, fx, grouped):
    """
    A mutator whose database work fails with OperationalError (after writing its
    effect) makes the call raise Unavailable (code "unavailable", retryable): the
    lmid stays, the effect is rolled back, and mutations of other clients committed
    in the same group land. Re-sending the envelope then applies it exactly once, and
    once more is absorbed.
    """
    victim = f"{fx}-victim"
    assert engine.mutate(victim, 1, "conc_flaky", envelope(fx, victim, 1)).status == "applied"
    others = [f"{fx}-other{n}" for n in range(5)] if grouped else []
    with _fail_lock:
        _fail_once.add((victim, 2))

    def send(client):
        mid = 2 if client == victim else 1
        try:
            return engine.mutate(client, mid, "conc_flaky", envelope(fx, client, mid))
        except Unavailable as exc:
            return exc

    if grouped:
        gate = Gate(engine)
        with ThreadPoolExecutor(max_workers=len(others) + 1) as pool:
            futures = {c: pool.submit(send, c) for c in [*others, victim]}
            gate.wait_queued(len(futures))
            gate.open()
            results = {c: f.result(timeout=30) for c, f in futures.items()}
    else:
        results = {victim: send(victim)}

    failure = results[victim]
    assert isinstance(failure, Unavailable), failure
    assert failure.code == "unavailable" and failure.retryable and failure.status == 503
    assert (victim, 2) not in _fail_once, "the fault never fired"
    assert engine.client_lmid(victim) == 1
    assert_effects(fx, {victim: 1, **{c: 1 for c in others}}, skip=None)
    assert {(r.status, r.lmid) for c, r in results.items() if c != victim} <= {("applied", 1)}
    assert len({r.cv for c, r in results.items() if c != victim}) <= 1

    again = engine.mutate(victim, 2, "conc_flaky", envelope(fx, victim, 2))
    assert (again.status, again.lmid) == ("applied", 2)
    assert engine.mutate(victim, 2, "conc_flaky", envelope(fx, victim, 2)).status == "absorbed"
    assert engine.client_lmid(victim) == 2
    assert_effects(fx, {victim: 2, **{c: 1 for c in others}}, skip=None)


@pytest.mark.django_db(transaction=True)
def test_sqlite_write_lock_held_elsewhere_makes_the_mutation_unavailable():
    """
    SQLite: while another connection holds the write lock past the writer's busy
    timeout, a mutation raises Unavailable and changes nothing; once the lock is
    released the same envelope applies exactly once.
    """
    if connection.vendor != "sqlite":
        pytest.skip("SQLite write-lock contention")
    rindle = {**settings.RINDLE, "SQLITE_BUSY_TIMEOUT_MS": 200}
    with override_settings(RINDLE=rindle), running() as engine:
        fx = make_fx_table(engine)
        client = f"{fx}-c"
        assert engine.mutate(client, 1, "conc_flaky", envelope(fx, client, 1)).status == "applied"
        holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            started = time.monotonic()
            with pytest.raises(Unavailable) as failure:
                engine.mutate(client, 2, "conc_flaky", envelope(fx, client, 2))
            assert time.monotonic() - started < 10
            assert failure.value.code == "unavailable" and failure.value.retryable
            assert "locked" in str(failure.value)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert engine.client_lmid(client) == 1
        assert_effects(fx, {client: 1}, skip=None)
        result = engine.mutate(client, 2, "conc_flaky", envelope(fx, client, 2))
        assert (result.status, result.lmid) == ("applied", 2)
        assert engine.mutate(client, 2, "conc_flaky", envelope(fx, client, 2)).status == "absorbed"
        assert_effects(fx, {client: 2}, skip=None)
    drop_table(fx)


def test_postgres_session_killed_mid_mutation_is_unavailable_and_recovers(engine, fx):
    """
    Postgres: the server ends the writer's session in the middle of a mutation (after
    its effect row) while other clients' mutations share the group. That call raises
    Unavailable and leaves no effect nor lmid; the others land on a new session, and
    the re-sent envelope applies exactly once.
    """
    if connection.vendor != "postgresql":
        pytest.skip("Postgres session termination")
    victim, others = f"{fx}-victim", [f"{fx}-other{n}" for n in range(4)]
    with _fail_lock:
        _fail_once.add((victim, 1))

    def send(client):
        try:
            return engine.mutate(client, 1, "conc_kill_session", envelope(fx, client, 1))
        except Unavailable as exc:
            return exc

    gate = Gate(engine)
    with ThreadPoolExecutor(max_workers=len(others) + 1) as pool:
        futures = {c: pool.submit(send, c) for c in [victim, *others]}
        gate.wait_queued(len(futures))
        gate.open()
        results = {c: f.result(timeout=30) for c, f in futures.items()}

    assert isinstance(results[victim], Unavailable), results[victim]
    assert results[victim].code == "unavailable" and results[victim].retryable
    assert (victim, 1) not in _fail_once, "the fault never fired"
    assert {(results[c].status, results[c].lmid) for c in others} == {("applied", 1)}
    assert engine.client_lmid(victim) == 0
    assert_effects(fx, {victim: 0, **{c: 1 for c in others}}, skip=None)

    again = engine.mutate(victim, 1, "conc_kill_session", envelope(fx, victim, 1))
    assert (again.status, again.lmid) == ("applied", 1)
    assert_effects(fx, {victim: 1, **{c: 1 for c in others}}, skip=None)


@pytest.mark.django_db(transaction=True)
def test_a_mutation_that_timed_out_still_lands_once_and_its_resend_is_absorbed():
    """
    A caller whose write times out (Unavailable, code "timeout") cannot know whether
    the mutation ran: the queued request still runs once the writer is free. The
    re-sent envelope is then absorbed, so the effect exists exactly once.
    """
    rindle = {**settings.RINDLE, "WRITE_TIMEOUT": 0.3}
    with override_settings(RINDLE=rindle), running() as engine:
        fx = make_fx_table(engine)
        client = f"{fx}-c"
        gate = Gate(engine)
        try:
            with pytest.raises(Unavailable) as failure:
                engine.mutate(client, 1, "conc_fx", envelope(fx, client, 1))
            assert failure.value.code == "timeout" and failure.value.retryable
        finally:
            gate.opened.set()
        deadline = time.monotonic() + 10
        while engine.client_lmid(client) != 1:
            assert time.monotonic() < deadline, "the timed-out mutation never ran"
            time.sleep(0.01)
        result = engine.mutate(client, 1, "conc_fx", envelope(fx, client, 1))
        assert (result.status, result.lmid) == ("absorbed", 1)
        assert_effects(fx, {client: 1})
    drop_table(fx)
