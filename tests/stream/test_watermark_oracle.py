"""
The watermark's oracle property: for every publication (t, safe_seq), no row
with seq <= safe_seq commits after t. Checked two ways: a Hypothesis state
machine that interleaves writers' inserts, commits, rollbacks and watermark steps
exactly; and writer threads racing a looping watermarker, every event timed on
the DATABASE clock (RINDLE_SOAK=N runs it N times longer).
"""

import random
import threading
import time

from django.db import connection, connections
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rindle_app.stream.watermark import Watermarker

from ..conftest import SOAK, examples
from .watermark_support import last_seq, max_seq, pg, raw, write_user

__all__ = ["pg"]

WRITERS = 3


class Interleavings(RuleBasedStateMachine):
    """Writers and watermark steps in any order Hypothesis picks."""

    def __init__(self):
        super().__init__()
        self.conns = [raw(autocommit=False) for _ in range(WRITERS)]
        self.open = {}  # writer -> seqs its open transaction drew
        self.committed = set()
        self.published = 0
        self.wm = Watermarker(fence_lock_timeout=0.02)

    @rule(w=st.integers(0, WRITERS - 1), rows=st.integers(1, 3))
    def insert(self, w, rows):
        for _ in range(rows):
            write_user(self.conns[w])
            self.open.setdefault(w, set()).add(last_seq(self.conns[w]))

    @precondition(lambda self: self.open)
    @rule(data=st.data(), commit=st.booleans())
    def end(self, data, commit):
        w = data.draw(st.sampled_from(sorted(self.open)))
        seqs = self.open.pop(w)
        if commit:
            self.conns[w].commit()
            self.committed |= seqs
        else:
            self.conns[w].rollback()

    @rule()
    def step(self):
        progress = self.wm.step()
        assert progress.safe_seq >= self.published, "safe_seq went back"
        self.published = progress.safe_seq
        if self.open:
            assert progress.fence_timed_out and not progress.advanced
        else:  # nobody in flight: everything committed is published, holes included
            assert progress.safe_seq == max_seq()

    @invariant()
    def nothing_open_is_below_the_watermark(self):
        for seqs in self.open.values():
            assert min(seqs) > self.published

    def teardown(self):
        self.wm.close()
        for conn in self.conns:
            conn.rollback()
            conn.close()


def test_no_interleaving_publishes_a_seq_that_can_still_commit(pg):
    """In every interleaving, an open writer's seqs stay above safe_seq and it never regresses."""
    run = Interleavings.TestCase
    run.settings = hypothesis_settings(
        max_examples=examples(8), stateful_step_count=20, deadline=None
    )
    run().runTest()


def test_racing_writers_never_commit_below_a_published_watermark(pg):
    """
    Writer threads (random transaction lengths, one in four rolled back) race a
    looping watermarker. Every publication is timed on the database clock right
    after it commits, every writer's transaction just before its COMMIT; no
    committed row with seq <= safe_seq was still uncommitted after the publication,
    and a writer never sees the watermark at or above its own open seq.
    """
    publications = []

    def observe(progress):
        if progress.advanced:
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT clock_timestamp()")
                publications.append((cursor.fetchone()[0], progress.safe_seq))

    wm = Watermarker(refresh_interval=0.01, fence_lock_timeout=0.02, observer=observe).start()
    stop = threading.Event()
    commits, open_violations = [], []

    def write(seed):
        rnd = random.Random(seed)
        conn = raw(autocommit=False)
        try:
            while not stop.is_set():
                for _ in range(rnd.randint(1, 3)):
                    write_user(conn)
                mine = last_seq(conn)
                time.sleep(rnd.choice((0, 0, 0.001, 0.005, 0.03)))
                (safe,) = conn.execute(
                    "SELECT COALESCE((SELECT safe_seq FROM _rindle_stream), 0)"
                ).fetchone()
                if safe >= mine:
                    open_violations.append((mine, safe))
                (before_commit,) = conn.execute("SELECT clock_timestamp()").fetchone()
                seqs = [
                    r[0]
                    for r in conn.execute(
                        "SELECT seq FROM _rindle_change_events "
                        "WHERE txid = pg_current_xact_id()::text::bigint"
                    )
                ]
                if rnd.random() < 0.25:
                    conn.rollback()
                else:
                    conn.commit()
                    commits.append((before_commit, seqs))
        finally:
            conn.rollback()
            conn.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    time.sleep(2.0 * SOAK)
    stop.set()
    for t in threads:
        t.join(30)
    time.sleep(0.3)
    wm.close()
    assert open_violations == []
    assert len(publications) > 5 and len(commits) > 20
    late = [
        (seq, at, published_at, safe)
        for at, seqs in commits
        for seq in seqs
        for published_at, safe in publications
        if seq <= safe and at > published_at
    ]
    assert late == []
    with connection.cursor() as cursor:
        cursor.execute("SELECT safe_seq FROM _rindle_stream")
        assert cursor.fetchone()[0] == max_seq()
