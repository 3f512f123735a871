"""
The issue tracker's tables, keeping the original's table and column names
(``issue.ownerId``, ``createdAt``...) so rows on the wire match what the original
rindle clients expect. Every column is NOT NULL; an unassigned owner is the user
``"unassigned"``. References are declared (for the foreign-key audit and the ORM)
but not enforced by the database, like the original.
"""

from django.db import models

STATUSES = ["backlog", "todo", "in-progress", "review", "done"]
PRIORITIES = ["urgent", "high", "medium", "low"]


def _ref(to, column, related_name):
    return models.ForeignKey(
        to,
        on_delete=models.DO_NOTHING,
        db_column=column,
        db_constraint=False,
        db_index=False,
        related_name=related_name,
    )


class User(models.Model):
    id = models.TextField(primary_key=True)
    name = models.TextField()

    class Meta:
        db_table = "user"

    def __str__(self):
        return self.name


class Issue(models.Model):
    id = models.TextField(primary_key=True)
    title = models.TextField()
    status = models.TextField(choices=[(s, s) for s in STATUSES])
    priority = models.TextField(choices=[(p, p) for p in PRIORITIES])
    owner = _ref(User, "ownerId", "owned_issues")
    created_at = models.FloatField(db_column="createdAt")
    updated_at = models.FloatField(db_column="updatedAt")

    class Meta:
        db_table = "issue"
        indexes = [
            models.Index(models.F("created_at").desc(), "id", name="issue_created"),
            models.Index(fields=["owner"], name="issue_owner"),
        ]

    def __str__(self):
        return self.title


class Tag(models.Model):
    id = models.TextField(primary_key=True)
    issue = _ref(Issue, "issueId", "tags")
    name = models.TextField()

    class Meta:
        db_table = "tag"
        indexes = [
            models.Index(fields=["issue", "name"], name="tag_issue"),
            models.Index(fields=["name"], name="tag_name"),
        ]

    def __str__(self):
        return self.name


class Comment(models.Model):
    id = models.TextField(primary_key=True)
    issue = _ref(Issue, "issueId", "comments")
    author = _ref(User, "authorId", "comments")
    body = models.TextField()
    created_at = models.FloatField(db_column="createdAt")

    class Meta:
        db_table = "comment"
        indexes = [
            models.Index(fields=["issue", "created_at"], name="comment_issue"),
            models.Index(models.F("created_at").desc(), "id", name="comment_created"),
            models.Index(fields=["author"], name="comment_author"),
        ]

    def __str__(self):
        return self.body[:40]
