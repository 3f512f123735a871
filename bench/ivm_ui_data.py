"""
The original's "realistic UI views" over the demo tables: the seed, the six views,
the rows a pair inserts and deletes, and each view in plain SQL.
"""

from collections import Counter, defaultdict

from bench.ivm_base import q

OPEN = {
    "type": "simple",
    "op": "!=",
    "left": {"type": "column", "name": "status"},
    "right": {"type": "literal", "value": "done"},
}
OWNER = {
    "correlation": {"parentField": ["ownerId"], "childField": ["id"]},
    "subquery": {"table": "user", "alias": "owner", "one": True},
}
COUNT = {
    "correlation": {"parentField": ["id"], "childField": ["issueId"]},
    "subquery": {"table": "comment", "alias": "commentCount", "aggregate": "count"},
}
RECENT3 = {
    "correlation": {"parentField": ["id"], "childField": ["issueId"]},
    "subquery": {
        "table": "comment",
        "alias": "recentComments",
        "orderBy": [["createdAt", "desc"]],
        "limit": 3,
    },
}
ALL_COMMENTS = {
    "correlation": {"parentField": ["id"], "childField": ["issueId"]},
    "subquery": {"table": "comment", "alias": "comments", "orderBy": [["createdAt", "asc"]]},
}


class UIData:
    """
    The original's "realistic UI views" on the demo issue tracker's tables: six views,
    each alone in a catalog, timed per add+remove pair fed to ``Catalog.commit``
    directly (the IVM alone, as the original measured), and per pair end to end
    (``engine.write`` + ``LiveQueries.poll()`` twice).
    """

    ISSUE = ("id", "title", "status", "priority", "ownerId", "createdAt", "updatedAt")
    COMMENT = ("id", "issueId", "authorId", "body", "createdAt")

    def __init__(self, bench, rng):
        self.bench, self.engine, self.sz, self.rng = bench, bench.engine, bench.sizes, rng

    def setup(self):
        sz, rng = self.sz, self.rng
        statuses = ["backlog", "todo", "in-progress", "review", "done"]
        priorities = ["urgent", "high", "medium", "low"]
        n_users, n_issues = sz["ui_users"], sz["ui_issues"]
        users = [(f"u{u:05d}", f"user {u}") for u in range(n_users)]
        created = [float(c) * 10.0 for c in range(n_issues)]
        rng.shuffle(created)
        issues = [
            (
                f"i{i:06d}",
                f"issue {i}",
                rng.choice(statuses),
                rng.choice(priorities),
                users[rng.randrange(n_users)][0],
                created[i],
                created[i] + 5.0,
            )
            for i in range(n_issues)
        ]
        comments = [
            (
                f"c{c:07d}",
                issues[rng.randrange(n_issues)][0],
                users[rng.randrange(n_users)][0],
                f"comment {c}",
                float(rng.randrange(10 * n_issues)),
            )
            for c in range(sz["ui_comments"])
        ]
        self.max_created = max(created)

        def seed(tx):
            cur = tx.cursor
            cur.executemany('INSERT INTO "user" ("id", "name") VALUES (%s, %s)', users)
            cur.executemany(
                'INSERT INTO "issue" ("id", "title", "status", "priority", "ownerId", '
                '"createdAt", "updatedAt") VALUES (%s, %s, %s, %s, %s, %s, %s)',
                issues,
            )
            cur.executemany(
                'INSERT INTO "comment" ("id", "issueId", "authorId", "body", "createdAt") '
                "VALUES (%s, %s, %s, %s, %s)",
                comments,
            )

        self.engine.write(seed)
        self.users = [u[0] for u in users]
        by_issue = Counter(c[1] for c in comments)
        open_issues = sorted((i for i in issues if i[2] != "done"), key=lambda i: (-i[5], i[0]))
        self.page_bound = open_issues[49]
        self.page_next = open_issues[50]
        # the detail view: an issue with a few comments
        self.detail_id = next(i[0] for i in issues if 4 <= by_issue[i[0]] <= 8)
        self.max_comment_at = max(c[4] for c in comments)

    def views(self):
        v1 = {"table": "issue", "where": OPEN, "orderBy": [["createdAt", "desc"]], "limit": 50}
        v2 = {**v1, "related": [OWNER]}
        v3 = {**v1, "related": [OWNER, COUNT]}
        v4 = {**v1, "related": [OWNER, COUNT, RECENT3]}
        v5 = {
            "table": "issue",
            "where": {
                "type": "simple",
                "op": "=",
                "left": {"type": "column", "name": "id"},
                "right": {"type": "literal", "value": self.detail_id},
            },
            "one": True,
            "related": [OWNER, ALL_COMMENTS],
        }
        b = self.page_bound
        v6 = {**v4, "start": {"row": {"createdAt": b[5], "id": b[0]}, "exclusive": True}}
        return [
            ("newest 50 open", v1, "issue"),
            ("+ author", v2, "issue"),
            ("+ comment count", v3, "issue"),
            ("+ 3 recent comments", v4, "issue"),
            ("issue detail + comments", v5, "comment"),
            ("page 2 (start after the 50th)", v6, "issue_page2"),
        ]

    def pair_rows(self, how, n):
        """The row a pair inserts then deletes: (table, row)."""
        if how == "comment":
            return "comment", {
                "id": f"cnew{n:06d}",
                "issueId": self.detail_id,
                "authorId": self.users[0],
                "body": "new",
                "createdAt": self.max_comment_at + 1.0 + n,
            }
        if how == "issue_page2":
            at = (self.page_bound[5] + self.page_next[5]) / 2
        else:
            at = self.max_created + 10.0 + n
        return "issue", {
            "id": f"inew{n:06d}",
            "title": "new",
            "status": "todo",
            "priority": "low",
            "ownerId": self.users[n % len(self.users)],
            "createdAt": at,
            "updatedAt": at,
        }

    def requery(self, cursor, name):
        """Each view in plain SQL, in the reference evaluator's shape."""
        issue_cols = ", ".join(f'i."{c}"' for c in self.ISSUE)

        if name == "issue detail + comments":
            cursor.execute(
                f'SELECT {issue_cols}, u."id", u."name" FROM "issue" i LEFT JOIN "user" u '
                'ON u."id" = i."ownerId" WHERE i."id" = %s',
                [self.detail_id],
            )
            r = cursor.fetchone()
            if r is None:
                return None
            node = dict(zip(self.ISSUE, r[:7]))
            node["owner"] = {"id": r[7], "name": r[8]} if r[7] is not None else None
            node["comments"] = self._comments_of(cursor, [node["id"]], None, "ASC").get(
                node["id"], []
            )
            return node
        owner = name != "newest 50 open"
        count = name in ("+ comment count", "+ 3 recent comments", "page 2 (start after the 50th)")
        recent = name in ("+ 3 recent comments", "page 2 (start after the 50th)")
        select = [issue_cols]
        joins = ""
        if owner:
            select.append('u."id", u."name"')
            joins = ' LEFT JOIN "user" u ON u."id" = i."ownerId"'
        if count:
            select.append('(SELECT COUNT(*) FROM "comment" c WHERE c."issueId" = i."id")')
        where, params = "i.\"status\" != 'done'", []
        if name.startswith("page 2"):
            b = self.page_bound
            where += ' AND (i."createdAt" < %s OR (i."createdAt" = %s AND i."id" > %s))'
            params = [b[5], b[5], b[0]]
        cursor.execute(
            f'SELECT {", ".join(select)} FROM "issue" i{joins} WHERE {where} '
            'ORDER BY i."createdAt" DESC, i."id" ASC LIMIT 50',
            params,
        )
        nodes = []
        for r in cursor.fetchall():
            node = dict(zip(self.ISSUE, r[:7]))
            k = 7
            if owner:
                node["owner"] = {"id": r[k], "name": r[k + 1]} if r[k] is not None else None
                k += 2
            if count:
                node["commentCount"] = r[k]
            nodes.append(node)
        if recent:
            top = self._comments_of(cursor, [n["id"] for n in nodes], 3, "DESC")
            for n in nodes:
                n["recentComments"] = top.get(n["id"], [])
        return nodes

    def _comments_of(self, cursor, ids, limit, direction):
        """``{issue id: [comment, ...]}``: the first ``limit`` (or all) comments of each."""
        comment_cols = ", ".join(f'c."{c}"' for c in self.COMMENT)
        if not ids:
            return {}
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(
            f"SELECT {', '.join(q(c) for c in self.COMMENT)} FROM (SELECT {comment_cols}, "
            f'ROW_NUMBER() OVER (PARTITION BY c."issueId" ORDER BY c."createdAt" '
            f'{direction}, c."id" ASC) AS rn FROM "comment" c WHERE c."issueId" IN ({marks})) '
            f'{f"WHERE rn <= {int(limit)} " if limit else ""}ORDER BY "issueId", rn',
            list(ids),
        )
        out = defaultdict(list)
        for r in cursor.fetchall():
            out[r[1]].append(dict(zip(self.COMMENT, r)))
        return out
