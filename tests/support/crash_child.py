"""
The crash tests' child process: one kind of write, sent until done or killed.

Run as ``python -m tests.support.crash_child MODE ARGS...`` (``processes.command``),
with ``child_env()`` so Django uses the parent test run's database. It prints
``STARTED`` once the engine runs and ``DONE`` if it finishes. The modes:

``mutations TABLE CLIENTS MIDS RACERS SEED`` (tests/engine/test_crash.py)
    For each of CLIENTS clients (ids ``TABLE-c<n>``) re-send every envelope from
    mid 1 to MIDS through ``get_engine()``: mutation ``crash_fx`` inserts one row
    into the effect table TABLE (a fresh random id, so a mutation run twice leaves
    two rows), and every 7th mid writes its row and then raises
    ``MutationRejected``. Each client has one sender thread, except the first
    RACERS clients, which get three threads sending the same client's envelopes
    concurrently from different starting mids, resending from the stored lmid + 1
    after a ``MutationGap``. All clients run at once, so their envelopes interleave
    in the writer's group commits. ``ANOMALY <text>`` reports an outcome the lmid
    rule forbids; the exit code is 0 only if every envelope was answered without one.

``journal DIR SEED`` (tests/engine/journal/test_crash.py)
    Run ``rindle_migrate DIR``, each statement of each migration followed by a random
    pause of up to ``JOURNAL_PACE`` seconds inside the migration's transaction (a
    step effect), so the parent's SIGKILL lands between the statements of a
    migration as often as between migrations. The command's own lines come between
    ``STARTED`` and ``DONE``.

``public_sql TABLE WRITES STEP AT`` (tests/engine/public_sql/test_crash.py)
    One-shot public SQL writes: write n (1..WRITES) is ``INSERT INTO TABLE (id,
    label) VALUES ('r<n>', 'n')`` under idempotency key ``k<n>``. STEP is where the
    process SIGKILLs itself on the AT-th write reaching it: ``effects`` (the
    statement ran, its outcome not stored yet), ``outcome`` (outcome stored, not
    committed), ``committed`` (committed, nobody answered) or ``none``. A write that
    landed must be answered from its stored outcome, never run twice; ``DONE
    replayed=<n>`` counts those.

``producer|source TABLE WRITES STEP AT`` (tests/engine/test_ingest_crash.py)
    Producer writes (producers ``P0``..``P2``, seq 1..WRITES each) or change-source
    batches (sources ``S0``..``S2``, offsets 1..WRITES each). Every write adds one
    row ``<name>-<n>`` labelled ``<name>:<n>``; a producer's replay must carry the
    same payload, so a write applied twice would collide on the key and fail the
    child. STEP names where the process SIGKILLs itself on the AT-th write that
    reaches it: ``admitted`` (stored position read, no effects yet), ``effects``
    (effects written, cursor not), ``cursor`` (cursor upserted, not committed),
    ``committed`` (committed, nobody told), or ``none``.

``room TABLE WRITES STEP AT`` (tests/engine/test_rooms_crash.py)
    A room host for three docs: it claims each doc's next epoch, checks that a flush
    of the epoch before is fenced, reads the room ledger (the boot probe), re-sends
    the last durable flush (absorbed) and flushes the rest, one mid per batch. STEP
    is where it SIGKILLs itself on the AT-th flush reaching it: ``admitted``,
    ``effects``, ``ledger`` (room lmid upserted), ``cursor``, ``committed`` or ``none``.

``room_host TABLE WRITES STEP AT`` (tests/realtime/test_room_host_crash.py)
    The same three docs driven through ``RoomHost`` (rindle_app.realtime.room_host):
    each doc's host boots (the next epoch, the doc's rows loaded), its client
    re-sends mids 1..WRITES, and the host flushes every ROOM_HOST_BATCH mids. Mid n
    adds a row with a fresh random id labelled ``D<k>:<n>`` (so a mutation applied
    twice leaves two rows), and every REJECT_ROOM_EVERY-th mid writes its row and
    then raises ``RoomReject``. A mid at or below the room lmid read at boot must be
    a replay and no other may be. STEP and AT as for ``room``, counted over flushes.

Every mode starts again from the first write: what already landed must be absorbed.
"""

import random
import sys
import threading
import time
import uuid
from types import SimpleNamespace

from tests.support.children import KillAt, boot, say

boot()

from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

from rindle_app.engine import (  # noqa: E402
    MutationGap,
    MutationRejected,
    Unavailable,
    get_engine,
    journal,
    mutator,
    outcomes,
    producers,
    public_sql,
    rooms,
    sources,
)
from rindle_app.exceptions import RoomReject  # noqa: E402

# --- mutations: client envelopes under the lmid rule ---------------------------------

MUTATOR = "crash_fx"
REJECT_EVERY = 7
# Upper bound of a sender's random pause after each envelope that ran, in seconds:
# it stretches a fresh run past a second, so the parent's kills land mid-work.
PACE = 0.006
COLUMNS = (["id", "client", "mid"], [0], ["string", "string", "int64"])

anomalies = []


def anomaly(text):
    anomalies.append(text)
    say(f"ANOMALY {text}")


def rejected(mid):
    """Whether the mutator refuses ``mid`` (after writing its effect row)."""
    return mid % REJECT_EVERY == 0


def crash_fx(tx, args, user):
    tx.insert(args["table"], {"id": uuid.uuid4().hex, "client": args["client"], "mid": args["mid"]})
    if rejected(args["mid"]):
        raise MutationRejected(f"mid {args['mid']} is a multiple of {REJECT_EVERY}")


def send(engine, table, client, mid):
    """Send one envelope, retrying while the database is unavailable."""
    args = {"table": table, "client": client, "mid": mid}
    while True:
        try:
            return engine.mutate(client, mid, MUTATOR, args)
        except Unavailable as exc:
            say(f"RETRY {client} {mid}: {exc}")
            time.sleep(0.01)


def check_outcome(client, mid, result):
    """Applied/rejected must match the mutator's rule and report lmid == mid."""
    if result.status == "absorbed":
        if result.lmid < mid:
            anomaly(f"{client} mid {mid} absorbed with lmid {result.lmid}")
        return
    if result.lmid != mid:
        anomaly(f"{client} mid {mid} {result.status} with lmid {result.lmid}")
    want = "rejected" if rejected(mid) else "applied"
    if result.status != want:
        anomaly(f"{client} mid {mid} {result.status}, expected {want} ({result.reason})")
    if want == "rejected" and result.code != "rejected":
        anomaly(f"{client} mid {mid} rejected with code {result.code}: {result.reason}")


def solo_sender(engine, table, client, mids, rng):
    """The only sender of ``client``: mids 1..lmid are absorbed, the rest run."""
    try:
        start_lmid = engine.client_lmid(client)
        for mid in range(1, mids + 1):
            try:
                result = send(engine, table, client, mid)
            except MutationGap as exc:
                anomaly(f"{client} mid {mid} refused by a gap at lmid {exc.lmid}")
                return
            if mid <= start_lmid and result.status != "absorbed":
                anomaly(f"{client} mid {mid} <= lmid {start_lmid} was {result.status}")
            if mid <= start_lmid and result.lmid != start_lmid:
                anomaly(f"{client} mid {mid} absorbed with lmid {result.lmid} != {start_lmid}")
            check_outcome(client, mid, result)
            if result.status != "absorbed":
                time.sleep(rng.uniform(0, PACE))
    except Exception as exc:
        anomaly(f"{client} sender failed: {exc!r}")
    finally:
        connections.close_all()


def racing_sender(engine, table, client, mids, first, rng):
    """One of several senders of ``client``; a gap resumes from the stored lmid + 1."""
    try:
        mid = first
        while mid <= mids:
            try:
                result = send(engine, table, client, mid)
            except MutationGap as exc:
                if exc.lmid + 1 >= mid:
                    anomaly(f"{client} mid {mid} refused as a gap at lmid {exc.lmid}")
                    return
                mid = exc.lmid + 1
                continue
            check_outcome(client, mid, result)
            if result.status != "absorbed":
                time.sleep(rng.uniform(0, PACE))
            mid += 1
            if rng.random() < 0.02:  # now and then run ahead of the others
                mid = min(mid + rng.randint(1, 20), mids)
    except Exception as exc:
        anomaly(f"{client} sender failed: {exc!r}")
    finally:
        connections.close_all()


def run_mutations(table, clients, mids, racers, seed):
    clients, mids, racers = int(clients), int(mids), int(racers)
    mutator(MUTATOR)(crash_fx)
    rng = random.Random(int(seed))
    engine = get_engine()
    engine.register_table(table, *COLUMNS)
    say("STARTED")

    threads = []
    for n in range(clients):
        client = f"{table}-c{n}"
        if n < racers:
            for k in range(3):
                first = 1 + k * mids // 4
                args = (engine, table, client, mids, first, random.Random(rng.random()))
                threads.append(threading.Thread(target=racing_sender, args=args))
        else:
            args = (engine, table, client, mids, random.Random(rng.random()))
            threads.append(threading.Thread(target=solo_sender, args=args))
    rng.shuffle(threads)
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    for n in range(clients):
        client = f"{table}-c{n}"
        lmid = engine.client_lmid(client)
        if lmid != mids:
            anomaly(f"{client} ends at lmid {lmid}, expected {mids}")
    say("DONE")
    return 1 if anomalies else 0


# --- journal: a folder of migrations, paced inside each transaction ------------------

JOURNAL_PACE = 0.02


def run_journal(folder, seed):
    rng = random.Random(int(seed))
    apply = journal.apply

    def paced(engine, migration, *, on_step=None):
        return apply(
            engine, migration, on_step=lambda tx, step: time.sleep(rng.random() * JOURNAL_PACE)
        )

    journal.apply = paced
    get_engine()
    say("STARTED")
    call_command("rindle_migrate", folder, stdout=sys.stdout)
    say("DONE")
    return 0


# --- public_sql: one-shot writes with idempotency keys -------------------------------


def scratch_engine(table):
    engine = get_engine()
    engine.register_table(table, ["id", "label"], [0], ["string", "string"])
    return engine


def run_public_sql(table, writes, step, at):
    engine = scratch_engine(table)
    principal = public_sql.Principal(user=None, token=SimpleNamespace(pk=1, tables=[table]))
    die = KillAt(step, int(at))
    store = outcomes.store

    def store_then_die(tx, key, record, now):
        die("effects")
        store(tx, key, record, now)
        die("outcome")

    outcomes.store = store_then_die
    engine.add_commit_listener(lambda cv: die("committed"))
    say("STARTED")
    replayed = 0
    for n in range(1, int(writes) + 1):
        sql = f'INSERT INTO "{table}" (id, label) VALUES (?, ?)'
        statements = public_sql.parse_statements(
            {"sql": sql, "args": [f"r{n}", str(n)]}, engine.vendor, many=False
        )
        answer = public_sql.run_once(engine, principal, "execute", statements, f"k{n}")
        replayed += answer.replayed
        if answer.status != 200 or answer.body["result"]["rows_affected"] != 1:
            say(f"ANOMALY {n}: {answer}")
            return 1
    say(f"DONE replayed={replayed}")
    return 0


# --- producer / source: the ingest plane's two write paths ---------------------------

NAMES = 3


def run_ingest(mode, table, writes, step, at):
    engine = scratch_engine(table)
    module = producers if mode == "producer" else sources
    die = KillAt(step, int(at), armed=False)
    apply, store = module.apply_changes, module._store

    def apply_changes(tx, changes):
        die("admitted")
        rows = apply(tx, changes)
        die("effects")
        return rows

    def _store(tx, *args):
        store(tx, *args)
        die("cursor")

    module.apply_changes, module._store = apply_changes, _store
    engine.add_commit_listener(lambda cv: die("committed"))
    die.armed = True
    say("STARTED")
    for n in range(1, int(writes) + 1):
        for k in range(NAMES):
            name = f"{'P' if mode == 'producer' else 'S'}{k}"
            row = {"id": f"{name}-{n}", "label": f"{name}:{n}"}
            change = {"table": table, "op": "add", "row": row}
            if mode == "producer":
                engine.producer_write(name, n, [change])
            else:
                engine.apply_source_batch(name, str(n), [change])
    say("DONE")
    return 0


# --- room: a room host flushing, killed, replaced by a host of the next epoch --------

REJECT_ROOM_EVERY = 5


def arm_room_kill(engine, step, at):
    """A disarmed ``KillAt`` wired into every step of a room flush's transaction."""
    die = KillAt(step, int(at), armed=False)
    apply, store, ledger = rooms.apply_changes, rooms._store, rooms._upsert_ledger

    def apply_changes(tx, changes):
        die("admitted")
        rows = apply(tx, changes)
        die("effects")
        return rows

    def upsert_ledger(tx, doc, lmids):
        advanced = ledger(tx, doc, lmids)
        die("ledger")
        return advanced

    def _store(tx, *args):
        store(tx, *args)
        die("cursor")

    rooms.apply_changes, rooms._store, rooms._upsert_ledger = apply_changes, _store, upsert_ledger
    engine.add_commit_listener(lambda cv: die("committed"))
    return die


def run_room(table, writes, step, at):
    """
    A room host for docs ``D0``..``D2``, one client each (``c<k>``): it claims the
    next epoch of each doc (what fences the host before it), reads the room ledger
    (the boot probe) and flushes mid lmid + 1 .. WRITES, one batch per mid at offset
    mid, after re-sending the last durable one (absorbed). Mid n adds row
    ``D<k>-<n>`` unless n is a multiple of REJECT_ROOM_EVERY: then it is rejected and
    the batch carries its outcome row instead. Each batch carries the lmid co-edit.
    It also sends a flush under the epoch before its own, which must be fenced.
    """
    engine = scratch_engine(table)
    die = arm_room_kill(engine, step, at)
    docs = [f"D{k}" for k in range(NAMES)]
    epochs = {doc: engine.claim_room_epoch(doc) for doc in docs}
    for doc in docs:
        if epochs[doc] > 1:
            try:
                engine.commit_room_flush([], f"room:{doc}", "0", doc=doc, epoch=epochs[doc] - 1)
                say(f"ANOMALY {doc}: a flush of epoch {epochs[doc] - 1} was not fenced")
            except rooms.RoomFenced:
                pass
    start = {}
    for k, doc in enumerate(docs):
        lmid = engine.room_lmids(doc, [f"c{k}"]).get(f"c{k}", 0)
        start[doc] = lmid + 1
        if lmid:  # the last durable flush again: absorbed by its (source, offset)
            again = engine.commit_room_flush(
                batch(table, doc, k, lmid), f"room:{doc}", str(lmid), doc=doc, epoch=epochs[doc]
            )
            if again.applied:
                say(f"ANOMALY {doc}: the replay of {lmid} applied again")
    die.armed = True
    say("STARTED")
    for n in range(1, int(writes) + 1):
        for k, doc in enumerate(docs):
            if n < start[doc]:
                continue
            changes = batch(table, doc, k, n)
            engine.commit_room_flush(changes, f"room:{doc}", str(n), doc=doc, epoch=epochs[doc])
    say("DONE")
    return 0


def batch(table, doc, k, mid):
    client = f"c{k}"
    lmid = {"client_id": client, "last_mutation_id": mid}
    changes = [{"table": "_rindle_client_mutations", "op": "add", "row": lmid}]
    if mid % REJECT_ROOM_EVERY == 0:
        outcome = {"client_id": client, "mid": mid, "kind": "rejected", "reason": "every 5th"}
        changes.append({"table": "_rindle_room_mutation_outcomes", "op": "add", "row": outcome})
    else:
        row = {"id": f"{doc}-{mid}", "label": f"{doc}:{mid}"}
        changes.append({"table": table, "op": "add", "row": row})
    return changes


ROOM_HOST_BATCH = 3


def room_note(tx, args):
    tx.add(args["table"], {"id": uuid.uuid4().hex, "label": f"{args['doc']}:{args['mid']}"})
    if args["mid"] % REJECT_ROOM_EVERY == 0:
        raise RoomReject(f"mid {args['mid']} is a multiple of {REJECT_ROOM_EVERY}")


def run_room_host(table, writes, step, at):
    from rindle_app.realtime.room_host import RoomHost

    engine = scratch_engine(table)
    die = arm_room_kill(engine, step, at)

    def loader(doc):
        def load(engine):
            with connections["default"].cursor() as cursor:
                cursor.execute(f'SELECT id, label FROM "{table}" WHERE label LIKE %s', [f"{doc}:%"])
                return {table: [{"id": i, "label": label} for i, label in cursor.fetchall()]}

        return load

    docs = [f"D{k}" for k in range(NAMES)]
    hosts = {}
    for doc in docs:
        hosts[doc] = RoomHost(engine, doc, mutators={"note": room_note}, load=loader(doc))
        hosts[doc].boot()
    start = {doc: engine.room_lmids(doc, [f"c{k}"]).get(f"c{k}", 0) for k, doc in enumerate(docs)}
    die.armed = True
    say("STARTED")
    for n in range(1, int(writes) + 1):
        for k, doc in enumerate(docs):
            args = {"table": table, "doc": doc, "mid": n}
            result = hosts[doc].mutate(f"c{k}", n, "note", args)
            if (result.verdict == "replay") != (n <= start[doc]):
                say(f"ANOMALY {doc} mid {n} was {result.verdict} at boot lmid {start[doc]}")
        if n % ROOM_HOST_BATCH == 0 or n == int(writes):
            for doc in docs:
                if hosts[doc].pending:
                    hosts[doc].flush()
    say("DONE")
    return 0


MODES = {
    "room": run_room,
    "room_host": run_room_host,
    "mutations": run_mutations,
    "journal": run_journal,
    "public_sql": run_public_sql,
    "producer": lambda *args: run_ingest("producer", *args),
    "source": lambda *args: run_ingest("source", *args),
}


if __name__ == "__main__":
    sys.exit(MODES[sys.argv[1]](*sys.argv[2:]))
