"""The engine starts on the test database and captures its own writes."""

from rindle_app.testing import outbox_high_water, outbox_since


def test_write_returns_the_commit_version_of_its_captured_change(engine):
    before = outbox_high_water()
    commit = engine.write(lambda tx: tx.insert("user", {"id": "u1", "name": "Ann"}))
    events = outbox_since(before)
    assert [(e["table"], e["op"], e["pk"]) for e in events] == [("user", "add", ["u1"])]
    assert commit.cv == events[-1]["seq"]
