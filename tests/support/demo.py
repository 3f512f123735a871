"""
The demo app's rows (``project.demo``) as the tests build them, written once: an issue
with the defaults a test does not care about, and the row count of each demo table.
"""

from project.demo import models as demo


def issue(id, *, owner="u1", created=1.0, updated=None, **values):
    """
    An unsaved demo Issue: ``title`` "t", ``status`` "todo" and ``priority`` "low"
    unless ``values`` say otherwise; ``updated`` defaults to ``created``.
    """
    fields = {"title": "t", "status": "todo", "priority": "low", **values}
    return demo.Issue(
        id=id,
        owner_id=owner,
        created_at=created,
        updated_at=created if updated is None else updated,
        **fields,
    )


def create_issue(id, **kwargs):
    """``issue(...)`` inserted, as ``Issue.objects.create`` inserts (one INSERT)."""
    row = issue(id, **kwargs)
    row.save(force_insert=True)
    return row


def counts():
    """The number of rows in each demo table, by table name."""
    return {
        "user": demo.User.objects.count(),
        "issue": demo.Issue.objects.count(),
        "tag": demo.Tag.objects.count(),
        "comment": demo.Comment.objects.count(),
    }
