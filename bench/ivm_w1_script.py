"""W1's write script: single-row commits on the top-k boards, then a tail of batches."""

from collections import defaultdict

from bench.ivm_base import by_share, random_key


class W1Script:
    """
    The posts as the script leaves them, commit by commit: each op is applied here
    (rows, and per board a sorted ``(-score, id)`` list) so the next one can aim at a
    window, its bound, or just past it. Every row written is marked touched on the
    workload, so its restore puts it back.
    """

    def __init__(self, workload):
        from sortedcontainers import SortedList

        w = workload
        self.w, self.sz, self.rng, self.limit = w, w.sz, w.rng, w.limit
        self.rows = {pk[0]: dict(r) for pk, r in w.seed_rows["post"].items()}
        self.order = defaultdict(SortedList)  # board -> (-score, id)
        for r in self.rows.values():
            self.order[r["board"]].add((-r["score"], r["id"]))
        self.bound_boards = list(w.bindings)
        self.bw = [w.board_weight[b] for b in self.bound_boards]
        self.next_id = max(self.rows) + 1

    def make(self):
        """``(script, tail, kinds, touched boards)``: one list entry per commit."""
        script, kinds, touched_b = [], [], []
        for _ in range(self.sz["w1_commits"]):
            kind, (op, board) = self.one_op()
            script.append([op])
            kinds.append(kind)
            touched_b.append({board})
        tail = []
        for _ in range(self.sz["w1_batches"]):
            ops, boards = self.batch()
            tail.append(ops)
            kinds.append("batch")
            touched_b.append(boards)
        return script, tail, kinds, touched_b

    def batch(self):
        """One multi-row commit, with rows inserted or updated then deleted in it."""
        rng, ops, boards = self.rng, [], set()
        while len(ops) < self.sz["w1_batch_rows"]:
            x = rng.random()
            if x < 0.15:  # insert then delete the same new row in one commit
                b = self.bound_board()
                op1, _ = self.insert(b, rng.randint(0, 1_100_000))
                op2, _ = self.delete(op1[2]["id"])
                ops += [op1, op2]
                boards.add(b)
                continue
            if x < 0.25:  # update then delete the same row
                pid = random_key(self.rows, rng)
                op1, b = self.update(pid, self.new_score(self.rows[pid]["score"]))
                op2, _ = self.delete(pid)
                ops += [op1, op2]
                boards.add(b)
                continue
            _kind, (op, b) = self.one_op()
            ops.append(op)
            boards.add(b)
        return ops, boards

    # --- the ops, applied here as they are written ------------------------------------------

    def new_score(self, avoid):
        s = self.rng.randrange(1_000_000)
        return s if s != avoid else s + 1

    def window(self, b):
        return self.order[b][: self.limit]

    def put(self, row):
        self.rows[row["id"]] = row
        self.order[row["board"]].add((-row["score"], row["id"]))
        self.w.touched["post"].add((row["id"],))

    def drop(self, pid):
        row = self.rows.pop(pid)
        self.order[row["board"]].remove((-row["score"], pid))
        self.w.touched["post"].add((pid,))
        return row

    def update(self, pid, score):
        row = self.drop(pid)
        self.put({**row, "score": score})
        return ("u", "post", {"id": pid}, {"score": score}), row["board"]

    def insert(self, board, score):
        pid = self.next_id
        self.next_id += 1
        row = {
            "id": pid,
            "board": board,
            "score": score,
            "created_at": 1e6 + pid,
            "title": f"post {pid}",
        }
        self.put(row)
        return ("i", "post", dict(row)), board

    def delete(self, pid):
        row = self.drop(pid)
        return ("d", "post", {"id": pid}), row["board"]

    def bound_board(self, min_rows=1):
        for _ in range(50):
            b = self.rng.choices(self.bound_boards, self.bw)[0]
            if len(self.order[b]) >= min_rows:
                return b
        return max(self.bound_boards, key=lambda b: len(self.order[b]))

    # --- one single-row commit, by kind ----------------------------------------------------

    def one_op(self):
        """``(kind, (op, board))``: a score update, insert, delete or edit across a bound."""
        shares = ((0.55, self.score_update), (0.75, self.insert_op), (0.90, self.delete_op))
        return by_share(self.rng.random(), shares, self.cross_op)()

    def score_update(self):
        """Half inside a window, half anywhere."""
        rng, rows = self.rng, self.rows
        if rng.random() < 0.5:
            b = self.bound_board()
            _neg, pid = rng.choice(self.window(b))
            s = max(0, rows[pid]["score"] + rng.randint(-20_000, 20_000))
            s = s if s != rows[pid]["score"] else s + 1
            return "update_window", self.update(pid, s)
        pid = rng.choice(list(rows)) if len(rows) < 64 else random_key(rows, rng)
        return "update_any", self.update(pid, self.new_score(rows[pid]["score"]))

    def insert_op(self):
        """Half into the top range of a bound board."""
        rng, limit = self.rng, self.limit
        if rng.random() < 0.5:
            b = self.bound_board()
            w = self.window(b)
            floor = -w[-1][0] if len(w) >= limit else 0
            return "insert_top", self.insert(b, rng.randint(floor, floor + 50_000))
        b = rng.randrange(self.sz["w1_boards"])
        w = self.window(b)
        ceiling = -w[-1][0] if len(w) >= limit else 1_000_000
        return "insert_low", self.insert(b, rng.randint(0, max(0, ceiling - 1)))

    def delete_op(self):
        """A third the bound row, a third inside a window, a third anywhere."""
        x = self.rng.random()
        if x < 1 / 3:
            b = self.bound_board(self.limit)
            return "delete_bound", self.delete(self.window(b)[-1][1])
        if x < 2 / 3:
            b = self.bound_board()
            return "delete_window", self.delete(self.rng.choice(self.window(b))[1])
        return "delete_any", self.delete(random_key(self.rows, self.rng))

    def cross_op(self):
        """An edit across the bound: out of the window, or into it."""
        rng, limit = self.rng, self.limit
        b = self.bound_board(limit + 1)
        lst = self.order[b]
        if len(lst) <= limit:
            return "update_window", self.update(rng.choice(lst)[1], self.new_score(None))
        bound_score = -lst[limit - 1][0]
        if rng.random() < 0.5:
            pid = rng.choice(lst[:limit])[1]
            after = -lst[limit][0]
            return "cross_out", self.update(pid, max(0, after - rng.randint(1, 1000)))
        pid = rng.choice(lst[limit : limit + 10])[1]
        return "cross_in", self.update(pid, bound_score + rng.randint(1, 1000))
