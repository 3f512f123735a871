"""
The variants a ``FamilyWorkload`` times on its write script: L (commits only), IVM
(inline, every or every 10th commit), IVM through a hub, IVM in a second process,
and the B1/B2 re-query baselines.
"""

import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

from bench.common import ROOT, BenchError, dumps
from bench.ivm_base import GateFailure, apply_ops, commit_total, diff_nodes, latencies, perf


class Variants:
    """The timed runs of a ``FamilyWorkload`` (a mixin of it)."""

    def run_limit(self, script):
        """L: the script through engine.write, nothing maintained. Per-commit seconds."""
        engine, times = self.engine, []
        gc.collect()
        for ops in script:
            t0 = perf()
            engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
            times.append(perf() - t0)
        return times

    def run_ivm(self, scripts, check=None, profile=None, poll_every=1):
        """
        IVM: engine.write, then LiveQueries.poll() and the fan-out after each commit
        (after every ``poll_every``-th commit and the last one of each script if > 1).
        Returns per script a list of (write, poll, catalog.commit, fanout) seconds,
        plus counters. ``check`` (a Checker) makes this an untimed checked pass.
        """
        live, keys = self.start_live()
        catalog, engine = live.catalog, self.engine
        binding_of = {k: b for b, k in keys.items()}
        spent = [0.0]
        real_commit = catalog.commit

        def timed_commit(version, changes):
            t = perf()
            try:
                return real_commit(version, changes)
            finally:
                spent[0] += perf() - t

        catalog.commit = timed_commit
        counts = Counter()
        changed = []  # per commit: bindings whose ops were not empty
        out = []
        if check is not None:
            check.begin(live, keys)
        gc.collect()
        profile = profile or {}  # {script index: cProfile.Profile} enabled during that script
        i = -1  # the commit's index over all scripts
        no_poll = (0, {}, [])
        for s_index, script in enumerate(scripts):
            if s_index in profile:
                profile[s_index].enable()
            times = []
            wall = perf()
            for j, ops in enumerate(script):
                i += 1
                spent[0] = 0.0
                before = check.before(i) if check is not None else None
                t0 = perf()
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
                t1 = perf()
                if poll_every == 1 or (j + 1) % poll_every == 0 or j + 1 == len(script):
                    _version, outputs, faults = live.poll()
                else:
                    _version, outputs, faults = no_poll
                t2 = perf()
                delivered = 0
                for key, key_ops in outputs.items():
                    message = dumps(key_ops)
                    n = len(catalog.queries[key].subscribers)
                    delivered += n
                    counts["bytes"] += n * len(message)
                t3 = perf()
                times.append((t1 - t0, t2 - t1, spent[0], t3 - t2))
                counts["messages"] += delivered
                counts["views_changed"] += len(outputs)
                counts["ops"] += sum(len(o) for o in outputs.values())
                changed.append(frozenset(binding_of.get(k) for k in outputs))
                if faults:
                    counts["faults"] += len(faults)
                    raise GateFailure(f"{self.key}: queries faulted: {faults}")
                if check is not None:
                    check.after(i, ops, outputs, before)
            wall = perf() - wall
            if s_index in profile:
                profile[s_index].disable()
            # The parts cannot add up to more than the loop took (a double count would).
            if sum(commit_total(t) for t in times) > wall:
                raise GateFailure(f"{self.key}: per-commit times exceed the loop's wall time")
            out.append(times)
        catalog.commit = real_commit
        live.stop()  # no handoff read in the other variants' commits
        return out, counts, changed, live

    def run_ivm_hub(self, script, inline=True):
        """
        IVM through a hub, as ``realtime.hub.Hub`` runs it: this thread commits the
        script through ``engine.write`` back to back. After each commit, the commit
        listener runs ``LiveQueries.poll()`` and the fan-out (one step) right there
        when the hub's lock is free, as the server does on SQLite (``inline``);
        otherwise, and always when ``inline`` is False (the server before it did
        this, and on Postgres), it wakes a hub thread that runs the step. A step
        applies every commit since the last one, so a busy hub coalesces. Returns
        (seconds from the first write to the last commit's delta ready, per commit
        commit->ready latency, counters (steps that applied commits, and how many
        of those ran on the committing thread), live).
        """
        live, _keys = self.start_live()
        catalog, engine = live.catalog, self.engine
        wake, stop, lock = threading.Event(), threading.Event(), threading.Lock()
        ready = []  # (version, perf()) after each step's fan-out
        counts = Counter()
        failure = []

        def step():  # under ``lock``
            version, outputs, faults = live.poll()
            for key, key_ops in outputs.items():
                message = dumps(key_ops)
                n = len(catalog.queries[key].subscribers)
                counts["messages"] += n
                counts["bytes"] += n * len(message)
            if not ready or version > ready[-1][0]:
                counts["polls"] += 1  # a step that applied commits
                ready.append((version, perf()))
            if faults:
                raise GateFailure(f"{self.key}: queries faulted: {faults}")

        def hub():
            try:
                while True:
                    wake.wait()
                    wake.clear()
                    with lock:
                        step()
                    if stop.is_set() and live.version >= last[0]:
                        return
            except BaseException as exc:  # reported by the committing thread
                failure.append(exc)

        def committed(cv):
            commits.append((cv, perf()))  # right after the COMMIT, before any step
            if inline and lock.acquire(blocking=False):
                try:
                    step()
                    counts["inline"] += 1
                    return
                finally:
                    lock.release()
            wake.set()

        last, commits = [None], []  # commits: (cv, perf()) as each commit's listener runs
        engine.add_commit_listener(committed)
        thread = threading.Thread(target=hub, name="bench-hub", daemon=True)
        gc.collect()
        thread.start()
        t_start = perf()
        try:
            for ops in script:
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
        finally:
            engine.remove_commit_listener(committed)
        last[0] = commits[-1][0]
        stop.set()
        wake.set()
        thread.join(60)
        live.stop()
        if failure:
            raise failure[0]
        if thread.is_alive() or live.version < last[0]:
            raise GateFailure(f"{self.key}: the hub did not catch up")
        return ready[-1][1] - t_start, latencies(commits, ready), counts, live

    def run_ivm_process(self, script):
        """
        IVM in a second process (bench/ivm_follower.py), as a Daphne process keeps the
        views while other processes make the writes: it tails the outbox every
        ``POLL_INTERVAL`` and fans out, on the other core, while this process commits
        the script back to back through ``engine.write``, as in L. Returns (seconds
        from the first write to the last commit's delta ready there, the writes'
        seconds, per commit commit->ready latency, the follower's report).
        """
        config = {
            "database_url": os.environ["DATABASE_URL"],
            "tables": list(self.TABLES),
            "template": self.template,
            "family": self.family,
            "bindings": self.bindings,
            "subscribers": list(self.subscribers.items()),
        }
        path = Path(tempfile.mkdtemp(prefix="rindle-bench-follower-")) / "config.json"
        path.write_text(json.dumps(config))
        child = subprocess.Popen(
            [sys.executable, "-m", "bench.ivm_follower", str(path)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            line = child.stdout.readline()
            if not line.startswith("ready"):
                raise BenchError(f"{self.key}: the follower process did not start ({line!r})")
            engine, commits = self.engine, []
            gc.collect()
            t_start = perf()
            for ops in script:
                cv = engine.write(lambda tx, ops=ops: apply_ops(ops, tx)).cv
                commits.append((cv, perf()))
            written = perf() - t_start
            child.stdin.write(f"{commits[-1][0]}\n")
            child.stdin.flush()
            line = child.stdout.readline()
            if child.wait(60) != 0 or not line:
                raise BenchError(f"{self.key}: the follower process failed")
        finally:
            if child.poll() is None:
                child.kill()
            shutil.rmtree(path.parent, ignore_errors=True)
        report = json.loads(line)
        ready = report["ready"]
        return ready[-1][1] - t_start, written, latencies(commits, ready), report

    def run_requery(self, script, per, cap):
        """
        B1 (per="subscriber") / B2 (per="binding"): after each commit re-run the SQL of
        each subscriber / distinct binding, diff it with the last result, emit if it
        changed. Returns per-commit seconds, counters and the changed bindings.
        """
        from django.db import connection

        engine = self.engine
        groups = self.by_binding()
        if per == "subscriber":
            askers = [(sub, b, 1) for sub, b in self.subscribers.items()]
        else:
            askers = [(b, b, len(groups[b])) for b in self.bindings]
        counts, changed, times = Counter(), [], []
        with connection.cursor() as cursor:
            last = {who: self.requery(cursor, b) for who, b, _n in askers}
            gc.collect()
            for ops in script[:cap]:
                t0 = perf()
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
                hit = set()
                for who, b, fanout in askers:
                    now = self.requery(cursor, b)
                    if now != last[who]:
                        message = dumps(diff_nodes(last[who], now, self.node_pk))
                        counts["messages"] += fanout
                        counts["bytes"] += fanout * len(message)
                        last[who] = now
                        hit.add(b)
                times.append(perf() - t0)
                changed.append(frozenset(hit))
        counts["queries_per_commit"] = len(askers)
        return times, counts, changed

    # --- the gate ---------------------------------------------------------------------------
