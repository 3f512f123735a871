"""
The IVM bench's correctness checks: the gate after every run, the per-commit checks
of the untimed checked pass, and the refill counters. The oracle itself (a fresh
evaluation over a snapshot) is ``rindle_app.testing``'s, shared with the tests.
"""

import json
from collections import Counter

from bench.ivm_base import first_difference, perf, print_gate_failure
from rindle_app.testing import store_differences


class Gates:
    """The correctness gate of a ``FamilyWorkload`` (a mixin of it)."""

    def gate(self, live, keys, label, literal=0):
        """Every view against a fresh snapshot (evaluator), a SQL re-query and a sample."""
        t0 = perf()
        catalog = live.catalog
        tables = [self.engine.tables.get(t) for t in self.TABLES]
        version, fresh, failures = self._fresh(tables, catalog.version)
        failures.extend(store_differences(catalog.store, fresh))
        views = []
        for b in self.bindings:
            view = catalog.queries[keys[b]].view
            views.append((b, catalog.queries[keys[b]].query, view.result(), view.footprint_rows()))
        self._check_views(views, fresh, failures)
        sample = []
        if literal:
            from rindle_app.ivm.evaluate import evaluate

            rows = fresh  # the database at the catalog's version: what the store reads
            sample = self.rng.sample(self.bindings, min(literal, len(self.bindings)))
            for b in sample:
                shared = catalog.queries[keys[b]]
                if shared.view.result() != evaluate(shared.query, rows, self.engine.tables):
                    failures.append(f"{self.family}[{b!r}]: view != evaluate() over the database")
        return self._record_gate(label, failures, len(sample), t0)

    def gate_follower(self, report, label):
        """The gate for views kept in another process: its results and footprints, as sent."""
        from rindle_app.ivm.ast import parse
        from rindle_app.ivm.catalog import FamilyTemplate

        t0 = perf()
        tables = [self.engine.tables.get(t) for t in self.TABLES]
        _version, fresh, failures = self._fresh(tables, report["version"])
        template, views = FamilyTemplate(self.template), []
        for b in self.bindings:
            sent = report["views"].get(json.dumps(b))
            if sent is None:
                failures.append(f"{self.family}[{b!r}]: no view in the follower's report")
                continue
            query = parse(template.instantiate(b), self.engine.tables)
            views.append((b, query, sent["result"], [tuple(p) for p in sent["footprint"]]))
        self._check_views(views, fresh, failures)
        return self._record_gate(label, failures, 0, t0)

    def _fresh(self, tables, version):
        """A fresh snapshot of the workload's tables, and a failure if not at ``version``."""
        from rindle_app.testing import fresh_rows

        at, fresh = fresh_rows(self.engine, tables)
        failures = []
        if at != version:
            failures.append(f"views at version {version}, database at {at}")
        return at, fresh, failures

    def _check_views(self, views, fresh, failures):
        """(binding, query, result, footprint pairs): each against the evaluator and SQL."""
        from django.db import connection

        from rindle_app.testing import IndexedSource, reference_view, row_set

        source, schema = IndexedSource(fresh), self.engine.tables
        with connection.cursor() as cursor:
            for b, query, got, footprint in views:
                want, seen = reference_view(query, source, schema)
                if got != want:
                    failures.append(
                        f"{self.family}[{b!r}]: view != reference evaluator "
                        f"{first_difference(got, want)}"
                    )
                sql = self.requery(cursor, b)
                if got != sql:
                    failures.append(
                        f"{self.family}[{b!r}]: view != SQL re-query {first_difference(got, sql)}"
                    )
                shown = row_set(footprint)
                if shown != seen:
                    failures.append(
                        f"{self.family}[{b!r}]: footprint != rendered rows "
                        f"({len(shown)} vs {len(seen)})"
                    )

    def _record_gate(self, label, failures, sample, t0):
        result = {
            "label": label,
            "views": len(self.bindings),
            "literal_evaluate_sample": sample,
            "seconds": round(perf() - t0, 3),
            "failures": failures[:20],
            "failure_count": len(failures),
            "pass": not failures,
        }
        self.bench.gates.append({"workload": self.key, **result})
        if failures:
            print_gate_failure(f"{self.key} {label}", failures)
        return result


class Checker:
    """
    The untimed checked pass: after each commit, the views of the bindings it touched
    are compared with the SQL re-query (all views every 50 commits); each view's ops
    are folded into a client replica that must end equal to its footprint; and a
    view whose result changed while its ops were empty (or the reverse) is counted.
    """

    EVERY = 50

    def __init__(self, workload):
        self.w = workload
        self.mismatches = []
        self.compared = 0
        self.silent_changes = Counter()  # result changed, no ops emitted
        self.noisy = 0  # ops emitted, result unchanged
        self.outside = 0  # ops for a binding the commit did not touch
        self.examples = []
        self.commits = 0

    def begin(self, live, keys):
        from django.db import connection

        from rindle_app.testing import row_set

        self.live, self.keys = live, keys
        self.cursor = connection.cursor()
        catalog = live.catalog
        self.replicas = {}
        for k in keys.values():
            self.replicas[k] = row_set(catalog.queries[k].view.footprint_rows())

    def watched(self, i):
        """The bindings commit ``i`` can change (all of them for a rename)."""
        touched = self.w.touched_bindings(i)
        return self.w.bindings if touched is None else [b for b in touched if b in self.keys]

    def before(self, i):
        queries = self.live.catalog.queries
        return {b: queries[self.keys[b]].view.result() for b in self.watched(i)}

    def after(self, i, ops, outputs, before):
        """Fold commit ``i``'s ops into the replicas; compare the views it could change."""
        self.commits += 1
        self._fold(outputs)
        self._silences(i, ops, outputs, before)
        self._compare(i, list(before))

    def _fold(self, outputs):
        """Each view's ops into its client replica, as a client applies them."""
        from rindle_app.testing import row_set

        for k, key_ops in outputs.items():
            replica = self.replicas[k]
            for op in key_ops:
                t = op["table"]
                if op["op"] == "add":
                    replica |= row_set([(t, op["row"])])
                elif op["op"] == "remove":
                    replica -= row_set([(t, op["row"])])
                else:
                    replica -= row_set([(t, op["old"])])
                    replica |= row_set([(t, op["new"])])

    def _silences(self, i, ops, outputs, before):
        """Count ops for untouched bindings, and results changed without ops (or the reverse)."""
        catalog = self.live.catalog
        binding_of = {k: b for b, k in self.keys.items()}
        outside = [binding_of[k] for k in outputs if binding_of[k] not in before]
        if outside and len(self.examples) < 3:
            self.examples.append({"commit": i, "ops_for_untouched_bindings": outside})
        self.outside += len(outside)
        for b, was in before.items():
            k = self.keys[b]
            now = catalog.queries[k].view.result()
            if now != was and k not in outputs:
                kind = self.w.kind_of(i)
                self.silent_changes[kind] += 1
                if len(self.examples) < 3:
                    self.examples.append(
                        {
                            "commit": i,
                            "kind": kind,
                            "binding": b,
                            "ops": ops,
                            "change": first_difference(now, was),
                        }
                    )
            elif now == was and k in outputs:
                self.noisy += 1

    def _compare(self, i, touched):
        """The touched views (all of them every ``EVERY`` commits) against the SQL re-query."""
        catalog = self.live.catalog
        if (i + 1) % self.EVERY == 0:
            touched = self.w.bindings
        for b in touched:
            got = catalog.queries[self.keys[b]].view.result()
            want = self.w.requery(self.cursor, b)
            self.compared += 1
            if got != want and len(self.mismatches) < 10:
                self.mismatches.append(
                    f"commit {i} ({self.w.kind_of(i)}): {self.w.family}[{b!r}] != SQL "
                    f"{first_difference(got, want)}"
                )

    def summary(self):
        """The pass's counters; its gate entry (failed loudly, or passed) is recorded."""
        from rindle_app.testing import row_set

        catalog = self.live.catalog
        bad_replicas = 0
        for k, replica in self.replicas.items():
            if replica != row_set(catalog.queries[k].view.footprint_rows()):
                bad_replicas += 1
        self.cursor.close()
        if self.mismatches or bad_replicas:
            failures = list(self.mismatches)
            if bad_replicas:
                failures.append(f"{bad_replicas} client replicas (seq 0 + ops) != footprint")
            self.w.bench.gates.append(
                {
                    "workload": self.w.key,
                    "label": "checked pass, per commit",
                    "failures": failures,
                    "failure_count": len(failures),
                    "pass": False,
                }
            )
            print(f"\n!!!!!!!! CORRECTNESS GATE FAILED: {self.w.key} per-commit check !!!!!!!!")
            for f in failures:
                print(f"!!   {f}")
            print("!!!!!!!!\n", flush=True)
        else:
            self.w.bench.gates.append(
                {
                    "workload": self.w.key,
                    "label": "checked pass, per commit",
                    "views_compared": self.compared,
                    "replicas": len(self.replicas),
                    "failure_count": 0,
                    "pass": True,
                }
            )
        return {
            "commits": self.commits,
            "views_compared_with_sql": self.compared,
            "mismatches": self.mismatches,
            "replicas_checked": len(self.replicas),
            "replicas_wrong": bad_replicas,
            "result_changed_without_ops": dict(self.silent_changes),
            "ops_without_result_change": self.noisy,
            "ops_for_untouched_bindings": self.outside,
            "examples": self.examples,
        }


# --- W1: the top-k family ----------------------------------------------------------------


# --- refill instrumentation (checked passes only) ----------------------------------------


class RefillCounter:
    """
    Counts, while installed, the window scans of ``View._scan`` (hydration: after is
    None; refill: after a bound), the root rows each examined, and the calls of
    ``View.apply`` (how many views a commit was routed to), by wrapping the class
    attributes; removed before any timed run.
    """

    def __init__(self):
        self.stats = Counter()

    def __enter__(self):
        from rindle_app.ivm.evaluate import Evaluator
        from rindle_app.ivm.view import View

        self._view, self._evaluator = View, Evaluator
        self._scan, self._holds = View._scan, Evaluator.holds
        stats, orig_scan, orig_holds = self.stats, self._scan, self._holds
        state = {"where": None, "kind": None}

        def scan(view, after, need):
            kind = "hydrate" if after is None else "refill"
            stats[f"{kind}_scans"] += 1
            outer = state["where"], state["kind"]
            state["where"], state["kind"] = view.query.where, kind
            try:
                for row in orig_scan(view, after, need):
                    stats[f"{kind}_rows_out"] += 1
                    state["where"], state["kind"] = outer
                    yield row
                    state["where"], state["kind"] = view.query.where, kind
            finally:
                state["where"], state["kind"] = outer

        def holds(evaluator, condition, row):
            if condition is state["where"] and condition is not None:
                stats[f"{state['kind']}_rows_examined"] += 1
            return orig_holds(evaluator, condition, row)

        orig_apply = self._apply = View.apply

        def apply(view, changes, affected=None):
            ops = orig_apply(view, changes, affected)
            stats["apply_calls"] += 1
            stats["apply_calls_with_ops"] += bool(ops)
            return ops

        View._scan, Evaluator.holds, View.apply = scan, holds, apply
        return self

    def __exit__(self, *exc):
        self._view._scan, self._evaluator.holds = self._scan, self._holds
        self._view.apply = self._apply
        return False
