"""
The base of the W1 and W2 workloads: tables seeded once, a family of live queries,
subscribers, and a write script that every variant replays from the seed state.
"""

from collections import defaultdict

from bench.common import BenchError, rotated
from bench.ivm_base import commit_total, db_value, log, perf, q, rate
from bench.ivm_checks import Checker, Gates, RefillCounter
from bench.ivm_summary import summarize
from bench.ivm_variants import Variants


class FamilyWorkload(Variants, Gates):
    """
    Base of W1 and W2: tables seeded once, a family bound for some bindings, subscribers
    spread over them, and a write script replayed from the restored seed state by each
    variant. Subclasses define the tables, the seed, the script and the SQL re-query.
    """

    key = None
    family = None
    node_pk = "id"

    def __init__(self, bench, rng):
        self.bench = bench
        self.engine = bench.engine
        self.sz = bench.sizes
        self.rng = rng
        self.seed_rows = {}  # table -> {pk tuple: row dict}
        self.touched = defaultdict(set)  # table -> {pk tuple} written by any script
        self.subscribers = {}  # subscriber id -> binding
        self.bindings = []
        self.template = None
        self.stats = {}

    # --- tables -------------------------------------------------------------------------

    TABLES = {}  # name -> (columns, pk columns, wire types)
    INDEXES = []

    def create_tables(self):
        for name, (columns, pk, types) in self.TABLES.items():
            self.engine.register_table(name, columns, [columns.index(c) for c in pk], types)
        for sql in self.INDEXES:
            self.engine.write(lambda tx, sql=sql: tx.execute(sql))

    def insert_sql(self, table):
        columns = self.TABLES[table][0]
        marks = ", ".join(["%s"] * len(columns))
        return f"INSERT INTO {q(table)} ({', '.join(q(c) for c in columns)}) VALUES ({marks})"

    def pk_of(self, table, row):
        return tuple(row[c] for c in self.TABLES[table][1])

    def load_seed(self, rows_by_table):
        """Insert the seed (one transaction) and remember it for restores."""
        for table, rows in rows_by_table.items():
            self.seed_rows[table] = {self.pk_of(table, r): r for r in rows}

        def seed(tx):
            for table, rows in rows_by_table.items():
                columns = self.TABLES[table][0]
                tx.cursor.executemany(
                    self.insert_sql(table), [[r[c] for c in columns] for r in rows]
                )

        self.engine.write(seed)

    def restore(self):
        """Put every row any script touched back to its seed value; verify the tables."""

        def fn(tx):
            for table, pks in self.touched.items():
                pk_cols = self.TABLES[table][1]
                where = " AND ".join(f"{q(c)} = %s" for c in pk_cols)
                tx.cursor.executemany(f"DELETE FROM {q(table)} WHERE {where}", list(pks))
                seed = self.seed_rows[table]
                columns = self.TABLES[table][0]
                again = [[seed[pk][c] for c in columns] for pk in pks if pk in seed]
                if again:
                    tx.cursor.executemany(self.insert_sql(table), again)

        self.engine.write(fn)
        self.verify_seed_state()

    def verify_seed_state(self):
        from django.db import connection

        with connection.cursor() as cursor:
            for table, (columns, _pk, _types) in self.TABLES.items():
                cols = ", ".join(q(c) for c in columns)
                cursor.execute(f"SELECT {cols} FROM {q(table)}")
                got = {
                    self.pk_of(table, dict(zip(columns, r))): tuple(r) for r in cursor.fetchall()
                }
                want = {
                    k: tuple(db_value(r[c]) for c in columns)
                    for k, r in self.seed_rows[table].items()
                }
                if got != want:
                    raise BenchError(f"{self.key}: restoring {table} did not give the seed back")

    # --- subscribers ----------------------------------------------------------------------

    def spread_subscribers(self, n, weight):
        """One subscriber per binding, the rest by ``weight(binding)``."""
        subs = list(self.bindings)
        w = [weight(b) for b in self.bindings]
        subs += self.rng.choices(self.bindings, w, k=max(0, n - len(self.bindings)))
        self.subscribers = {f"{self.key}-s{i:05d}": b for i, b in enumerate(subs)}

    def by_binding(self):
        out = defaultdict(list)
        for sub, b in self.subscribers.items():
            out[b].append(sub)
        return out

    # --- the live queries -----------------------------------------------------------------

    def start_live(self):
        from rindle_app.ivm.catalog import FamilyTemplate
        from rindle_app.ivm.live import LiveQueries

        t0 = perf()
        # As in the server: the engine hands each commit's outbox rows to the live
        # queries in process (read in its own transaction), so a poll reads nothing.
        live = LiveQueries(self.engine, handoff=True).start()
        t1 = perf()
        template = FamilyTemplate(self.template)
        keys = {b: live.catalog.bind(self.family, template, b).key for b in self.bindings}
        self.live_keys = keys
        t2 = perf()
        for sub, b in self.subscribers.items():
            live.catalog.attach(keys[b], sub)
        t3 = perf()
        self.stats["start_s"] = t1 - t0
        self.stats["bind_ms_per_binding"] = (t2 - t1) * 1e3 / max(1, len(self.bindings))
        self.stats["attach_us_per_subscriber"] = (t3 - t2) * 1e6 / max(1, len(self.subscribers))
        return live, keys

    # --- variants ---------------------------------------------------------------------------

    def kind_of(self, i):
        """The kind of commit ``i`` of the script (``"?"`` past its end)."""
        return self._kinds[i] if i < len(self._kinds) else "?"

    def touched_bindings(self, i):
        """The bindings commit ``i`` can change; None: any (a rename)."""
        return self._touched[i] if i < len(self._touched) else None

    # --- running it all --------------------------------------------------------------------

    VARIANTS = ("limit", "ivm", "ivm10", "hub", "hubthread", "proc")

    def run(self):
        """Set up, the checked pass, the timed repeats, the baselines: the results dict."""
        t_setup = perf()
        self.setup()
        script, tail = self.make_scripts()
        self.stats["setup_s"] = perf() - t_setup
        n = len(script)
        log(
            f"{self.key}: setup {self.stats['setup_s']:.1f}s; {n} commits + "
            f"{len(tail)} batch commits"
        )
        changed_checked = self.checked_pass(script, tail)
        samples, detail, ivm_counts = self.timed_repeats(script, tail)
        b1, b2, b2_changed = self.baselines(script)
        return summarize(self, n, samples, detail, ivm_counts, b1, b2, changed_checked, b2_changed)

    def checked_pass(self, script, tail):
        """
        Untimed, also the warm-up: after each commit the views of the touched bindings
        are compared with SQL, every view every 50 commits. The changed bindings per commit.
        """
        checker = Checker(self)
        with RefillCounter() as refills:
            _times, _counts, changed_checked, live = self.run_ivm([script, tail], check=checker)
        self.stats["refills"] = dict(refills.stats)
        self.stats["checked"] = checker.summary()
        literal = self.LITERAL_SAMPLE if not self.bench.args.quick or self.key == "w1" else 0
        self.gate(live, self.live_keys, "checked pass", literal=literal)
        del live
        self.restore()
        log(f"{self.key}: checked pass done (untimed; per-commit SQL checks, gate)")
        return changed_checked

    def timed_repeats(self, script, tail):
        """Timed repeats of every variant, rotated: (samples, detail, IVM counters) by variant."""
        variants = list(self.VARIANTS)
        if hasattr(self, "run_floor"):
            variants.append("floor")
        samples = {v: [] for v in variants}
        detail = {v: [] for v in variants}
        ivm_counts = []
        repeats = self.sz[f"{self.key}_repeats"]
        for rep in range(repeats):
            for variant in rotated(variants, rep):
                sample, info, counts = self.time_variant(variant, rep, script, tail)
                detail[variant].append(info)
                samples[variant].append(sample)
                if variant == "ivm":
                    ivm_counts.append(counts)
                self.restore()
            log(
                f"{self.key}: repeat {rep + 1}/{repeats}: L {samples['limit'][-1]:,.0f}/s, "
                f"IVM {samples['ivm'][-1]:,.0f}/s, IVM poll/10 {samples['ivm10'][-1]:,.0f}/s, "
                f"IVM hub {samples['hub'][-1]:,.0f}/s, "
                f"IVM hub thread {samples['hubthread'][-1]:,.0f}/s, "
                f"IVM second process {samples['proc'][-1]:,.0f}/s"
                + (f", inline floor {samples['floor'][-1]:,.0f}/s" if samples.get("floor") else "")
            )
        return samples, detail, ivm_counts

    def time_variant(self, variant, rep, script, tail):
        """One timed run of ``variant`` (views gated after): (commits/s, its detail, counters)."""
        n = len(script)
        if variant == "floor":
            times = self.run_floor(script)
            return rate(n, sum(times)), {"times": times}, None
        if variant == "proc":
            elapsed, written, latencies, report = self.run_ivm_process(script)
            self.gate_follower(report, f"repeat {rep + 1}, second process")
            info = {
                "latencies": latencies,
                "polls": report["polls"],
                "busy": report["busy"],
                "written": written,
                "poll_interval": report["poll_interval"],
            }
            return rate(n, elapsed), info, None
        if variant in ("hub", "hubthread"):
            inline = variant == "hub"
            elapsed, latencies, counts, live = self.run_ivm_hub(script, inline=inline)
            label = "hub" if inline else "hub thread"
            self.gate(live, self.live_keys, f"repeat {rep + 1}, {label}", literal=0)
            del live
            info = {"latencies": latencies, "polls": counts["polls"], "inline": counts["inline"]}
            return rate(n, elapsed), info, None
        if variant == "limit":
            times = self.run_limit(script)
            tail_times = self.run_limit(tail)
            return rate(n, sum(times)), {"times": times, "tail": tail_times}, None
        if variant == "ivm10":
            (times,), _counts, _chg, live = self.run_ivm([script], poll_every=10)
            self.gate(live, self.live_keys, f"repeat {rep + 1}, poll/10", literal=0)
            del live
            return rate(n, sum(commit_total(t) for t in times)), {"times": times}, None
        (times, tail_times), counts, _chg, live = self.run_ivm([script, tail])
        self.gate(live, self.live_keys, f"repeat {rep + 1}", literal=0)
        del live
        info = {"times": times, "tail": tail_times}
        return rate(n, sum(commit_total(t) for t in times)), info, counts

    def baselines(self, script):
        """B2 then B1, once each, on a prefix of the same script."""
        key, sz = self.key, self.sz
        b2_times, b2_counts, b2_changed = self.run_requery(script, "binding", sz[f"{key}_b2_cap"])
        self.restore()
        log(f"{key}: B2 {rate(len(b2_times), sum(b2_times)):,.1f}/s over {len(b2_times)} commits")
        b1_times, b1_counts, _b1_changed = self.run_requery(
            script, "subscriber", sz[f"{key}_b1_cap"]
        )
        self.restore()
        log(f"{key}: B1 {rate(len(b1_times), sum(b1_times)):,.1f}/s over {len(b1_times)} commits")
        return (b1_times, b1_counts), (b2_times, b2_counts), b2_changed
