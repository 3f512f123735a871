"""W2, the issue list: open bug-labelled issues of a project, with author and comments."""

from collections import Counter

from bench.common import median
from bench.ivm_base import weights
from bench.ivm_family import FamilyWorkload
from bench.ivm_w2_script import W2Script


def w2_template(limit):
    """The family's query, bound by ``project_id``."""
    return {
        "table": "w2_issue",
        "where": {
            "type": "and",
            "conditions": [
                {
                    "type": "simple",
                    "op": "=",
                    "left": {"type": "column", "name": "project_id"},
                    "right": {"type": "parameter"},
                },
                {
                    "type": "simple",
                    "op": "=",
                    "left": {"type": "column", "name": "closed"},
                    "right": {"type": "literal", "value": False},
                },
                {
                    "type": "correlatedSubquery",
                    "op": "EXISTS",
                    "related": {
                        "correlation": {"parentField": ["id"], "childField": ["issue_id"]},
                        "subquery": {
                            "table": "w2_label",
                            "where": {
                                "type": "simple",
                                "op": "=",
                                "left": {"type": "column", "name": "name"},
                                "right": {"type": "literal", "value": "bug"},
                            },
                        },
                    },
                },
            ],
        },
        "orderBy": [["updated_at", "desc"]],
        "limit": limit,
        "related": [
            {
                "correlation": {"parentField": ["author_id"], "childField": ["id"]},
                "subquery": {"table": "w2_user", "alias": "author", "one": True},
            },
            {
                "correlation": {"parentField": ["id"], "childField": ["issue_id"]},
                "subquery": {
                    "table": "w2_comment",
                    "alias": "comments",
                    "orderBy": [["created_at", "desc"]],
                    "limit": 3,
                },
            },
            {
                "correlation": {"parentField": ["id"], "childField": ["issue_id"]},
                "subquery": {
                    "table": "w2_comment",
                    "alias": "commentCount",
                    "aggregate": "count",
                },
            },
        ],
    }


class W2(FamilyWorkload):
    key = "w2"
    family = "project_issues"
    TABLES = {
        "w2_user": (["id", "name"], ["id"], ["int64", "string"]),
        "w2_issue": (
            ["id", "project_id", "title", "updated_at", "closed", "author_id"],
            ["id"],
            ["int64", "int64", "string", "number", "boolean", "int64"],
        ),
        "w2_comment": (
            ["id", "issue_id", "author_id", "body", "created_at"],
            ["id"],
            ["int64", "int64", "int64", "string", "number"],
        ),
        "w2_label": (["issue_id", "name"], ["issue_id", "name"], ["int64", "string"]),
    }
    INDEXES = [
        'CREATE INDEX IF NOT EXISTS "w2_issue_list" ON "w2_issue" '
        '("project_id", "closed", "updated_at" DESC, "id")',
        'CREATE INDEX IF NOT EXISTS "w2_comment_issue" ON "w2_comment" '
        '("issue_id", "created_at" DESC, "id")',
        'CREATE INDEX IF NOT EXISTS "w2_label_name" ON "w2_label" ("name", "issue_id")',
    ]
    LITERAL_SAMPLE = 1
    OTHER_LABELS = ("feature", "ui", "docs", "perf", "p1")

    def setup(self):
        sz, rng = self.sz, self.rng
        self.limit = sz["w2_window"]
        self.template = w2_template(self.limit)
        self.create_tables()
        projects = list(range(sz["w2_projects"]))
        self.project_weight = dict(zip(projects, weights(len(projects), 0.5)))
        users = [{"id": u, "name": f"user {u}"} for u in range(sz["w2_users"])]
        issues, labels, comments = [], [], []
        picks = rng.choices(projects, [self.project_weight[p] for p in projects], k=sz["w2_issues"])
        for i, p in enumerate(picks):
            issues.append(
                {
                    "id": i,
                    "project_id": p,
                    "title": f"issue {i}",
                    "updated_at": rng.random() * 1e6,
                    "closed": rng.random() < 0.2,
                    "author_id": rng.randrange(sz["w2_users"]),
                }
            )
            if rng.random() < 0.55:
                labels.append({"issue_id": i, "name": "bug"})
            for name in rng.sample(self.OTHER_LABELS, rng.randint(0, 2)):
                labels.append({"issue_id": i, "name": name})
        hot = weights(sz["w2_issues"], 0.3)
        rng.shuffle(hot)
        for c, i in enumerate(rng.choices(range(sz["w2_issues"]), hot, k=sz["w2_comments"])):
            comments.append(
                {
                    "id": c,
                    "issue_id": i,
                    "author_id": rng.randrange(sz["w2_users"]),
                    "body": f"comment {c}",
                    "created_at": rng.random() * 1e6,
                }
            )
        self.load_seed(
            {"w2_user": users, "w2_issue": issues, "w2_comment": comments, "w2_label": labels}
        )
        self.bindings = projects
        self.spread_subscribers(sz["w2_subs"], lambda p: self.project_weight[p])

    def describe_sizes(self):
        sz = self.sz
        issues = self.seed_rows["w2_issue"].values()
        labels = self.seed_rows["w2_label"]
        qual = Counter(
            r["project_id"] for r in issues if not r["closed"] and (r["id"], "bug") in labels
        )
        per = [qual.get(p, 0) for p in self.bindings]
        return {
            "users": sz["w2_users"],
            "projects": sz["w2_projects"],
            "issues": sz["w2_issues"],
            "comments": sz["w2_comments"],
            "labels": len(labels),
            "bindings": len(self.bindings),
            "qualifying_issues_per_project_min_median_max": [min(per), median(per), max(per)],
            "window": self.limit,
            "subscribers": len(self.subscribers),
            "commits": sz["w2_commits"],
        }

    ISSUE_COLS = ("id", "project_id", "title", "updated_at", "closed", "author_id")
    COMMENT_COLS = ("id", "issue_id", "author_id", "body", "created_at")

    def requery(self, cursor, project):
        """The view in plain SQL: one statement for the issues, one for the top-3 comments."""
        cursor.execute(
            'SELECT i."id", i."project_id", i."title", i."updated_at", i."closed", '
            'i."author_id", u."id", u."name", '
            '(SELECT COUNT(*) FROM "w2_comment" c WHERE c."issue_id" = i."id") '
            'FROM "w2_issue" i LEFT JOIN "w2_user" u ON u."id" = i."author_id" '
            'WHERE i."project_id" = %s AND i."closed" = 0 AND EXISTS (SELECT 1 FROM "w2_label" l '
            'WHERE l."issue_id" = i."id" AND l."name" = \'bug\') '
            f'ORDER BY i."updated_at" DESC, i."id" ASC LIMIT {self.limit}',
            [project],
        )
        nodes, by_id = [], {}
        for r in cursor.fetchall():
            node = dict(zip(self.ISSUE_COLS, r[:6]))
            node["closed"] = bool(node["closed"])
            node["author"] = {"id": r[6], "name": r[7]} if r[6] is not None else None
            node["comments"] = []
            node["commentCount"] = r[8]
            nodes.append(node)
            by_id[node["id"]] = node
        if by_id:
            marks = ", ".join(["%s"] * len(by_id))
            cursor.execute(
                'SELECT "id", "issue_id", "author_id", "body", "created_at" FROM ('
                'SELECT c.*, ROW_NUMBER() OVER (PARTITION BY c."issue_id" '
                'ORDER BY c."created_at" DESC, c."id" ASC) AS rn FROM "w2_comment" c '
                f'WHERE c."issue_id" IN ({marks})) WHERE rn <= 3 ORDER BY "issue_id", rn',
                list(by_id),
            )
            for r in cursor.fetchall():
                by_id[r[1]]["comments"].append(dict(zip(self.COMMENT_COLS, r)))
        return nodes

    def make_scripts(self):
        script, kinds, touched = W2Script(self).make()
        self.kinds = Counter(kinds)
        self._kinds, self._touched = kinds, touched
        self.script, self.tail = script, []
        self.all_ops = script
        return script, []
