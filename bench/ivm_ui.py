"""
The UI workload: each of six views alone in a catalog, timed per add+remove pair fed
to ``Catalog.commit`` directly (the IVM alone, as the original measured), and per pair
end to end (``engine.write`` + ``LiveQueries.poll()`` twice); then gated.
"""

import gc

from bench.common import median, pct
from bench.ivm_base import first_difference, log, perf, print_gate_failure
from bench.ivm_ui_data import UIData

# The views also checked against ``evaluate()`` over the store rows.
LITERAL_VIEWS = ("newest 50 open", "+ author", "issue detail + comments")


class UIViews(UIData):
    """The timed pairs and the gate of the UI views."""

    def run(self):
        from django.db import connection

        from rindle_app.ivm.catalog import Catalog
        from rindle_app.ivm.live import LiveQueries
        from rindle_app.testing import IndexedSource, fresh_rows

        sz = self.sz
        t0 = perf()
        self.setup()
        tables = [self.engine.tables.get(t) for t in ("user", "issue", "comment")]
        version, fresh = fresh_rows(self.engine, tables)
        catalog = Catalog(self.engine.tables)
        catalog.load(version, fresh)
        live = LiveQueries(self.engine).start()
        setup_s = perf() - t0
        log(
            f"ui: setup {setup_s:.1f}s ({sz['ui_users']} users, {sz['ui_issues']} issues, "
            f"{sz['ui_comments']} comments)"
        )
        self.source, self.tables = IndexedSource(fresh), tables
        self.failures, self.serial = [], 0
        results = []
        with connection.cursor() as cursor:
            for name, ast, how in self.views():
                r = self.measure_view(catalog, live, cursor, name, ast, how)
                results.append(r)
                log(
                    f"ui: {name:<32} pair {r['pair_ms_median']:.3f} ms, "
                    f"e2e {r['e2e_pair_ms_median'] or 0:.3f} ms"
                )
        self.check_net_zero(fresh, catalog.store)
        self.record_gate(len(results))
        return {
            "sizes": {
                "users": sz["ui_users"],
                "issues": sz["ui_issues"],
                "comments": sz["ui_comments"],
                "pairs_per_view": sz["ui_pairs"],
                "e2e_pairs_per_view": sz["ui_e2e_pairs"],
            },
            "setup_s": setup_s,
            "views": results,
        }

    def pair_changes(self, how):
        self.serial += 1
        return self.pair_rows(how, self.serial)

    def measure_view(self, catalog, live, cursor, name, ast, how):
        """One view: hydrate, the direct pairs, the checks, the end-to-end pairs."""
        gc.collect()
        h0 = perf()
        shared = catalog.register(ast)
        hydrate_ms = (perf() - h0) * 1e3
        pairs, empty = self.direct_pairs(catalog, shared.key, name, how)
        sql = self.requery(cursor, name)
        literal = self.check_view(catalog.store, shared, name, sql)
        if empty:
            self.failures.append(f"{name}: {empty} pairs did not change the view")
        catalog.destroy(shared.key)
        e2e = self.e2e_pairs(live, name, ast, how, sql)
        pair_ms = [(a + b) * 1e3 for a, b in pairs]
        return {
            "view": name,
            "pairs": len(pairs),
            "hydrate_ms": hydrate_ms,
            "pair_ms_median": median(pair_ms),
            "pair_ms_p90": pct(pair_ms, 0.9),
            "add_ms_median": median([a * 1e3 for a, _ in pairs]),
            "remove_ms_median": median([b * 1e3 for _, b in pairs]),
            "e2e_pairs": len(e2e),
            "e2e_pair_ms_median": median([e * 1e3 for e in e2e]),
            "literal_evaluate": literal,
            "pair": "comment add+remove" if how == "comment" else "issue add+remove",
        }

    def direct_pairs(self, catalog, key, name, how):
        """``Catalog.commit`` fed the insert, then the delete: (timed pairs, empty pairs)."""
        pairs, empty = [], 0
        for n in range(10 + self.sz["ui_pairs"]):
            table, row = self.pair_changes(how)
            v = catalog.version
            a0 = perf()
            out_add, f1 = catalog.commit(v + 1, [(table, None, row)])
            a1 = perf()
            out_del, f2 = catalog.commit(v + 2, [(table, row, None)])
            a2 = perf()
            if f1 or f2:
                self.failures.append(f"{name}: faulted {f1 or f2}")
                break
            if key not in out_add or key not in out_del:
                empty += 1
            if n >= 10:  # the first 10 are warm-up
                pairs.append((a1 - a0, a2 - a1))
        return pairs, empty

    def check_view(self, store, shared, name, sql):
        """The view against the oracle, the SQL re-query, its footprint, and ``evaluate()``."""
        from rindle_app.ivm.evaluate import evaluate
        from rindle_app.testing import reference_view, row_set

        failures, schema = self.failures, self.engine.tables
        got = shared.view.result()
        want, seen = reference_view(shared.query, self.source, schema)
        if got != want:
            failures.append(f"{name}: view != reference evaluator {first_difference(got, want)}")
        if got != sql:
            failures.append(f"{name}: view != SQL re-query {first_difference(got, sql)}")
        if row_set(shared.view.footprint_rows()) != seen:
            failures.append(f"{name}: footprint != rendered rows")
        literal = None
        if name in LITERAL_VIEWS:
            rows = self.source.rows  # the database at the catalog's version
            literal = got == evaluate(shared.query, rows, schema)
            if not literal:
                failures.append(f"{name}: view != evaluate() over the database")
        return literal

    def e2e_pairs(self, live, name, ast, how, sql):
        """End to end: engine.write + poll, insert then delete. Seconds per pair."""
        lshared = live.catalog.register(ast)
        e2e = []
        for n in range(3 + self.sz["ui_e2e_pairs"]):
            table, row = self.pair_changes(how)
            pk = {"id": row["id"]}
            e0 = perf()
            self.engine.write(lambda tx, t=table, r=row: tx.insert(t, r))
            _v, out_add, f1 = live.poll()
            self.engine.write(lambda tx, t=table, pk=pk: tx.delete(t, pk))
            _v, out_del, f2 = live.poll()
            e1 = perf()
            if f1 or f2 or lshared.key not in out_add or lshared.key not in out_del:
                self.failures.append(f"{name}: end-to-end pair {n} did not change the view")
                break
            if n >= 3:
                e2e.append(e1 - e0)
        if lshared.view.result() != sql:
            self.failures.append(f"{name}: end-to-end view != SQL re-query")
        live.catalog.destroy(lshared.key)
        return e2e

    def check_net_zero(self, fresh, store):
        """The database must be back where it started (every pair is net zero)."""
        from rindle_app.testing import fresh_rows

        _v2, again = fresh_rows(self.engine, self.tables)
        for t in self.tables:
            a = {store.pk(t.name, r): r for r in fresh[t.name]}
            b = {store.pk(t.name, r): r for r in again[t.name]}
            if a != b:
                self.failures.append(f"{t.name}: the database changed across the pairs")

    def record_gate(self, views):
        failures = self.failures
        gate = {
            "workload": "ui",
            "label": "after the pairs",
            "views": views,
            "failures": failures[:20],
            "failure_count": len(failures),
            "pass": not failures,
        }
        self.bench.gates.append(gate)
        if failures:
            print_gate_failure("ui", failures)
