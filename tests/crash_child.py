"""
Child process of ``tests/test_crash.py``: applies client mutations until done or killed.

Run with ``child_env()`` so Django uses the parent test run's database. Usage::

    python tests/crash_child.py TABLE CLIENTS MIDS RACERS SEED

For each of CLIENTS clients (ids ``TABLE-c<n>``) the child re-sends every
envelope from mid 1 to MIDS through ``get_engine()``: mutation ``crash_fx``
inserts one row into the effect table TABLE (a fresh random id, so a mutation
run twice leaves two rows), and every 7th mid writes its row and then raises
``MutationRejected``. Each client has one sender thread, except the first
RACERS clients, which get three threads sending the same client's envelopes
concurrently from different starting mids, resending from the stored lmid + 1
after a ``MutationGap``. All clients run at once, so their envelopes interleave
in the writer's group commits.

Protocol on stdout, one line each: ``STARTED`` once the engine runs and the
effect table is registered, ``ANOMALY <text>`` for an outcome the lmid rule
forbids, ``DONE`` when every envelope has been answered. The exit code is 0 only
if every envelope was answered without anomaly.
"""

import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.db import connections  # noqa: E402

from rindle_app.engine import (  # noqa: E402
    MutationGap,
    MutationRejected,
    Unavailable,
    get_engine,
    mutator,
)

MUTATOR = "crash_fx"
REJECT_EVERY = 7
# Upper bound of a sender's random pause after each envelope that ran, in seconds:
# it stretches a fresh run past a second, so the parent's kills land mid-work.
PACE = 0.006
COLUMNS = (["id", "client", "mid"], [0], ["string", "string", "int64"])

_out_lock = threading.Lock()
anomalies = []


def say(line):
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def anomaly(text):
    anomalies.append(text)
    say(f"ANOMALY {text}")


def rejected(mid):
    """Whether the mutator refuses ``mid`` (after writing its effect row)."""
    return mid % REJECT_EVERY == 0


@mutator(MUTATOR)
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


def main():
    table, clients, mids, racers, seed = sys.argv[1:6]
    clients, mids, racers = int(clients), int(mids), int(racers)
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


if __name__ == "__main__":
    sys.exit(main())
