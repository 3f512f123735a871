"""W1, the top-k family: ``post WHERE board = ? ORDER BY score DESC LIMIT 20``."""

import bisect
import gc
import json
from collections import Counter, defaultdict

from bench.common import dumps, median
from bench.ivm_base import GateFailure, apply_ops, perf, weights
from bench.ivm_family import FamilyWorkload
from bench.ivm_w1_script import W1Script


class W1(FamilyWorkload):
    key = "w1"
    family = "board_top"
    TABLES = {
        "post": (
            ["id", "board", "score", "created_at", "title"],
            ["id"],
            ["int64", "int64", "int64", "number", "string"],
        )
    }
    INDEXES = [
        'CREATE INDEX IF NOT EXISTS "post_board_score" ON "post" ("board", "score" DESC, "id")'
    ]
    LITERAL_SAMPLE = 8
    SQL = (
        'SELECT "id", "board", "score", "created_at", "title" FROM "post" '
        'WHERE "board" = %s ORDER BY "score" DESC, "id" ASC LIMIT {limit}'
    )
    COLUMNS = ("id", "board", "score", "created_at", "title")

    def setup(self):
        sz, rng = self.sz, self.rng
        self.limit = sz["w1_window"]
        self.sql = self.SQL.format(limit=self.limit)
        self.template = {
            "table": "post",
            "where": {
                "type": "simple",
                "op": "=",
                "left": {"type": "column", "name": "board"},
                "right": {"type": "parameter"},
            },
            "orderBy": [["score", "desc"]],
            "limit": self.limit,
        }
        self.create_tables()
        boards = list(range(sz["w1_boards"]))
        self.board_weight = dict(zip(boards, weights(len(boards), 0.8)))
        rows = []
        picks = rng.choices(boards, [self.board_weight[b] for b in boards], k=sz["w1_posts"])
        for i, board in enumerate(picks):
            rows.append(
                {
                    "id": i,
                    "board": board,
                    "score": rng.randrange(1_000_000),
                    "created_at": float(i),
                    "title": f"post {i}",
                }
            )
        self.load_seed({"post": rows})
        self.bindings = sorted(rng.sample(boards, sz["w1_bound"]))
        self.spread_subscribers(sz["w1_subs"], lambda b: self.board_weight[b])

    def describe_sizes(self):
        sz = self.sz
        sizes = Counter(r["board"] for r in self.seed_rows["post"].values())
        bound = [sizes.get(b, 0) for b in self.bindings]
        return {
            "posts": sz["w1_posts"],
            "boards": sz["w1_boards"],
            "bindings": len(self.bindings),
            "posts_per_bound_board_min_median_max": [min(bound), median(bound), max(bound)],
            "window": self.limit,
            "subscribers": len(self.subscribers),
            "commits": sz["w1_commits"],
            "batch_tail": f"{sz['w1_batches']} x {sz['w1_batch_rows']} rows",
        }

    def requery(self, cursor, board):
        cursor.execute(self.sql, [board])
        cols = self.COLUMNS
        return [dict(zip(cols, r)) for r in cursor.fetchall()]

    def make_scripts(self):
        script, tail, kinds, touched_b = W1Script(self).make()
        self.kinds = Counter(kinds[: len(script)])
        self.kinds["batch"] = len(tail)
        self._kinds = kinds
        self._touched = touched_b
        self.script, self.tail = script, tail
        self.all_ops = script + tail
        return script, tail

    def run_floor(self, script):
        """
        The inline floor, W1 only: the least work any Python pipeline on this thread
        could do per commit, with no rindle IVM code. The writer hands each commit's
        outbox rows over as for IVM; they are decoded with ``json.loads``; each board
        keeps a plain sorted list of (-score, id) kept with ``bisect``; a change at a
        bound board's position < 20 becomes ops, JSON-encoded once per board. No
        store, routing, footprint or edit consolidation. Per-commit seconds.
        """
        from rindle_app.stream.reader import snapshot

        engine, limit, bound = self.engine, self.limit, set(self.bindings)
        parts, rows = defaultdict(list), {}
        for r in self.seed_rows["post"].values():
            rows[r["id"]] = r
            parts[r["board"]].append((-r["score"], r["id"]))
        for part in parts.values():
            part.sort()
        head, handed = [snapshot(engine.using, [])[0]], []

        def deliver(_start, feed):
            handed.extend(feed)
            if feed:
                head[0] = feed[-1][0]

        engine.add_change_listener(lambda: head[0], deliver)
        times = []
        gc.collect()
        try:
            for ops in script:
                t0 = perf()
                engine.write(lambda tx, ops=ops: apply_ops(ops, tx))
                out = {}
                for _seq, _table, old, new in handed:
                    for image, removed in ((old, True), (new, False)):
                        if image is not None:
                            _floor_apply(json.loads(image), removed, parts, rows, bound, out, limit)
                handed.clear()
                for board_ops in out.values():
                    dumps(board_ops)
                times.append(perf() - t0)
        finally:
            engine.remove_change_listener(deliver)
        from django.db import connection

        with connection.cursor() as cursor:
            for b in self.bindings:
                want = [r["id"] for r in self.requery(cursor, b)]
                if [pk for _key, pk in parts[b][:limit]] != want:
                    raise GateFailure(f"{self.key}: the inline floor's board {b} != SQL")
        return times


def _floor_apply(row, removed, parts, rows, bound, out, limit):
    """One row image into the floor's sorted board lists; ops for a bound board's window."""
    board, part = row["board"], parts[row["board"]]
    i = bisect.bisect_left(part, (-row["score"], row["id"]))
    if removed:
        del part[i]
        del rows[row["id"]]
    else:
        part.insert(i, (-row["score"], row["id"]))
        rows[row["id"]] = row
    if i < limit and board in bound:
        edge = limit - 1 if removed else limit
        ops_out = out.setdefault(board, [])
        ops_out.append({"op": "remove" if removed else "add", "row": row})
        if len(part) > edge:
            moved = rows[part[edge][1]]
            ops_out.append({"op": "add" if removed else "remove", "row": moved})
