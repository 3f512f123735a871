"""W2's write script: comments, labels, bumps, close/reopen, renames and new issues."""

from collections import Counter, defaultdict

from bench.ivm_base import by_share, random_key, sample_set


class W2Script:
    """
    The issue tracker as the script leaves it, commit by commit: each commit is
    applied here so the next can aim at a project's window. Every row written is
    marked touched on the workload, so its restore puts it back. A commit is
    ``(kind, ops, projects it can change)``; None: any project (a rename).
    """

    def __init__(self, workload):
        w = workload
        self.w, self.sz, self.rng, self.limit = w, w.sz, w.rng, w.limit
        self.issues = {pk[0]: dict(r) for pk, r in w.seed_rows["w2_issue"].items()}
        self.comments = {pk[0]: dict(r) for pk, r in w.seed_rows["w2_comment"].items()}
        self.labels = set(w.seed_rows["w2_label"])
        self.users = {pk[0]: dict(r) for pk, r in w.seed_rows["w2_user"].items()}
        self.by_project = defaultdict(set)
        for i in self.issues.values():
            self.by_project[i["project_id"]].add(i["id"])
        self.by_issue = defaultdict(set)
        for c in self.comments.values():
            self.by_issue[c["issue_id"]].add(c["id"])
        self.clock = 1e6
        self.ids = {"issue": max(self.issues) + 1, "comment": max(self.comments) + 1}
        self.pw = [w.project_weight[p] for p in w.bindings]
        self.renames = Counter()

    def make(self):
        """``(script, kinds, touched projects)``: one list entry per commit."""
        script, kinds, touched = [], [], []
        for _ in range(self.sz["w2_commits"]):
            kind, ops, projects = self.one_commit()
            script.append(ops)
            kinds.append(kind)
            touched.append(projects)
        return script, kinds, touched

    # --- reading the state -------------------------------------------------------------------

    def tick(self):
        self.clock += 1.0
        return self.clock

    def qualifies(self, i):
        return not self.issues[i]["closed"] and (i, "bug") in self.labels

    def window(self, p):
        found = [i for i in self.by_project[p] if self.qualifies(i)]
        found.sort(key=lambda i: (-self.issues[i]["updated_at"], i))
        return found[: self.limit]

    def top3(self, i):
        found = sorted(self.by_issue[i], key=lambda c: (-self.comments[c]["created_at"], c))
        return found[:3]

    def project(self):
        return self.rng.choices(self.w.bindings, self.pw)[0]

    def windowed_issue(self):
        for _ in range(20):
            w = self.window(self.project())
            if w:
                return self.rng.choice(w)
        return self.rng.choice(list(self.issues))

    def touch(self, table, pk):
        self.w.touched[table].add(pk)

    def new_comment(self, i):
        cid = self.ids["comment"]
        self.ids["comment"] += 1
        row = {
            "id": cid,
            "issue_id": i,
            "author_id": self.rng.randrange(self.sz["w2_users"]),
            "body": f"comment {cid}",
            "created_at": self.tick(),
        }
        self.comments[cid] = row
        self.by_issue[i].add(cid)
        self.touch("w2_comment", (cid,))
        return ("i", "w2_comment", dict(row))

    # --- one commit, by kind -----------------------------------------------------------------

    def one_commit(self):
        """A commit of a kind drawn by its share of the script."""
        shares = (
            (0.20, self.comment_add),
            (0.32, self.comment_delete),
            (0.40, self.label_add),
            (0.48, self.label_remove),
            (0.75, self.bump),
            (0.85, self.close_or_reopen),
            (0.95, self.rename),
        )
        return by_share(self.rng.random(), shares, self.new_issue)()

    def comment_add(self):
        i = self.windowed_issue() if self.rng.random() < 0.7 else self.any_issue()
        return "comment_add", [self.new_comment(i)], {self.issues[i]["project_id"]}

    def any_issue(self):
        return self.rng.choice(list(self.issues))

    def comment_delete(self):
        rng, cid = self.rng, None
        if rng.random() < 0.5:
            for _ in range(10):
                top = self.top3(self.windowed_issue())
                if top:
                    cid = rng.choice(top)
                    break
        if cid is None:
            cid = random_key(self.comments, rng)
        row = self.comments.pop(cid)
        self.by_issue[row["issue_id"]].discard(cid)
        self.touch("w2_comment", (cid,))
        issue = self.issues.get(row["issue_id"])
        projects = {issue["project_id"]} if issue is not None else set()
        return "comment_delete", [("d", "w2_comment", {"id": cid})], projects

    def label_add(self):
        rng, labels = self.rng, self.labels
        if rng.random() < 0.6:
            p = self.project()
            cands = [
                i
                for i in self.by_project[p]
                if not self.issues[i]["closed"] and (i, "bug") not in labels
            ]
            if cands:
                i = rng.choice(cands)
                return self._label("i", "label_add_bug", i, "bug", {p})
        i = self.any_issue()
        free = [n for n in self.w.OTHER_LABELS if (i, n) not in labels]
        name = rng.choice(free) if free else None
        if name is None:
            return self.one_commit()
        return self._label("i", "label_add_other", i, name, {self.issues[i]["project_id"]})

    def label_remove(self):
        if self.rng.random() < 0.6:
            i = self.windowed_issue()
            if (i, "bug") in self.labels:
                project = {self.issues[i]["project_id"]}
                return self._label("d", "label_remove_bug", i, "bug", project)
        others = [lb for lb in sample_set(self.labels, self.rng, 30) if lb[1] != "bug"]
        if not others:
            return self.one_commit()
        i, name = others[0]
        return self._label("d", "label_remove_other", i, name, {self.issues[i]["project_id"]})

    def _label(self, op, kind, i, name, projects):
        """Add (``op`` "i") or remove ("d") label ``name`` of issue ``i``: the commit."""
        if op == "i":
            self.labels.add((i, name))
        else:
            self.labels.discard((i, name))
        self.touch("w2_label", (i, name))
        return kind, [(op, "w2_label", {"issue_id": i, "name": name})], projects

    def bump(self):
        i = self.windowed_issue() if self.rng.random() < 0.6 else self.any_issue()
        at = self.tick()
        self.issues[i]["updated_at"] = at
        self.touch("w2_issue", (i,))
        return (
            "bump",
            [("u", "w2_issue", {"id": i}, {"updated_at": at})],
            {self.issues[i]["project_id"]},
        )

    def close_or_reopen(self):
        issues = self.issues
        if self.rng.random() < 0.5:
            i = self.windowed_issue()
            if not issues[i]["closed"]:
                return self._set_closed("close", i, True)
        closed = [i for i in self.by_project[self.project()] if issues[i]["closed"]]
        if not closed:
            return self.one_commit()
        return self._set_closed("reopen", self.rng.choice(closed), False)

    def _set_closed(self, kind, i, closed):
        self.issues[i]["closed"] = closed
        self.touch("w2_issue", (i,))
        return (
            kind,
            [("u", "w2_issue", {"id": i}, {"closed": closed})],
            {self.issues[i]["project_id"]},
        )

    def rename(self):
        if self.rng.random() < 0.7:
            u = self.issues[self.windowed_issue()]["author_id"]
        else:
            u = self.rng.randrange(self.sz["w2_users"])
        self.renames[u] += 1
        name = f"user {u} v{self.renames[u]}"
        self.users[u]["name"] = name
        self.touch("w2_user", (u,))
        return "rename", [("u", "w2_user", {"id": u}, {"name": name})], None

    def new_issue(self):
        """A new issue with its bug label and a first comment, in one commit."""
        p = self.project()
        i = self.ids["issue"]
        self.ids["issue"] += 1
        row = {
            "id": i,
            "project_id": p,
            "title": f"issue {i}",
            "updated_at": self.tick(),
            "closed": False,
            "author_id": self.rng.randrange(self.sz["w2_users"]),
        }
        self.issues[i] = row
        self.by_project[p].add(i)
        self.labels.add((i, "bug"))
        self.touch("w2_issue", (i,))
        self.touch("w2_label", (i, "bug"))
        ops = [
            ("i", "w2_issue", dict(row)),
            ("i", "w2_label", {"issue_id": i, "name": "bug"}),
            self.new_comment(i),
        ]
        return "new_issue", ops, {p}
