"""
The SQLite commit watcher (``rindle_app.stream.wake``) on a database file of its own:
a commit of an outbox row by another connection wakes it, and nothing else does; it
reads nothing while disarmed or held, and it never spins.
"""

import sqlite3
import sys
import threading
import time

import pytest

from rindle_app.stream import wake

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")

OUTBOX = "_rindle_change_events"


class Database:
    """A WAL database with an outbox and an uncaptured table, and a writer connection."""

    def __init__(self, path):
        self.path = str(path)
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"CREATE TABLE {OUTBOX} (seq INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)")
        self.conn.execute("CREATE TABLE other (id INTEGER PRIMARY KEY, v TEXT)")

    def capture(self, value="x"):
        self.conn.execute(f"INSERT INTO {OUTBOX} (v) VALUES (?)", [value])
        return self.conn.execute(f"SELECT MAX(seq) FROM {OUTBOX}").fetchone()[0]

    def uncaptured(self, value="x"):
        self.conn.execute("INSERT INTO other (v) VALUES (?)", [value])

    def close(self):
        self.conn.close()


class Recorder:
    """``on_commit`` for a watcher: counts its calls; ``since`` is set by the test."""

    def __init__(self):
        self.calls = 0
        self.version = 0
        self.event = threading.Event()

    def since(self):
        return self.version

    def __call__(self):
        self.calls += 1
        self.event.set()

    def wait(self, timeout=2.0):
        ok = self.event.wait(timeout)
        self.event.clear()
        return ok


def applied(db, watcher, recorder):
    """A captured commit the reader has applied already (since() covers it); settled."""
    recorder.version = 10**9
    recorder.version = db.capture()
    before = settled(watcher)
    recorder.event.clear()
    return before


def settled(watcher, seconds=0.1):
    """Wait until the watcher's read counter stood still for ``seconds`` (at most 2 s)."""
    deadline = time.monotonic() + 2.0
    last = watcher.checks
    while time.monotonic() < deadline:
        time.sleep(seconds)
        if watcher.checks == last:
            return last
        last = watcher.checks
    raise AssertionError(f"the watcher kept reading: {watcher.checks} reads")


@pytest.fixture
def db(tmp_path):
    database = Database(tmp_path / "wake.sqlite3")
    yield database
    database.close()


@pytest.fixture
def watched(db):
    recorder = Recorder()
    watcher = wake.CommitWatcher(db.path, recorder.since, recorder).start()
    yield db, watcher, recorder
    watcher.close()


def test_a_captured_commit_of_another_connection_wakes_an_armed_watcher(watched):
    db, watcher, recorder = watched
    assert watcher.arm() is True  # it starts disarmed
    settled(watcher)
    assert recorder.calls == 0  # arming read the empty outbox: nothing above since()
    started = time.monotonic()
    db.capture()
    assert recorder.wait(), "a captured commit did not wake the watcher"
    assert time.monotonic() - started < 0.5
    assert watcher.events >= 1


def test_an_uncaptured_write_or_an_applied_commit_reads_a_few_times_and_wakes_nobody(watched):
    db, watcher, recorder = watched
    watcher.arm()
    before = applied(db, watcher, recorder)
    calls = recorder.calls
    db.uncaptured()
    after = settled(watcher)
    # one read after the write, then the late reads: a bounded number, then nothing
    assert 1 <= after - before <= 1 + len(wake.LATE_READS)
    applied(db, watcher, recorder)
    assert recorder.calls == calls
    time.sleep(0.3)
    assert watcher.checks == settled(watcher)  # idle: no reads at all


def test_a_disarmed_watcher_reads_nothing_and_arming_reports_what_it_missed(watched):
    db, watcher, recorder = watched
    watcher.arm()
    applied(db, watcher, recorder)
    watcher.disarm()
    time.sleep(0.05)
    checks, events = watcher.checks, watcher.events
    for _ in range(20):
        db.capture()
    time.sleep(0.2)
    assert (watcher.checks, watcher.events) == (checks, events)
    assert watcher.arm() is True
    assert recorder.wait(), "arming did not report the commits made while disarmed"
    assert watcher.arm() is False  # already armed


def test_a_hold_leaves_the_events_unread_and_ends_with_one_read(watched):
    db, watcher, recorder = watched
    watcher.arm()
    before = applied(db, watcher, recorder)
    watcher.hold(0.5)
    db.capture()  # someone else's commit, during the hold
    time.sleep(0.3)
    assert watcher.checks == before and not recorder.event.is_set()
    assert recorder.wait(1.0), "the read at the end of the hold did not find the commit"


def test_the_last_commit_of_a_burst_wakes_even_when_the_first_read_found_an_earlier_one(watched):
    """
    Two commits written during a hold, the second not yet visible to the read that
    ends it (its writer preempted before the WAL index update): its pages were
    drained, so no event will report it again, and a late read must.
    """
    db, watcher, recorder = watched
    watcher.arm()
    applied(db, watcher, recorder)
    real, seen = watcher._newest, []
    watcher.hold(0.3)
    first = db.capture()
    last = db.capture()

    def newest():
        seen.append(first if not seen else real())
        return seen[-1]

    def apply():  # the reader applies what the read saw
        recorder.version = seen[-1]
        recorder()

    watcher._newest, watcher.on_commit = newest, apply
    assert recorder.wait(1.0), "the read at the end of the hold found nothing"
    assert recorder.wait(1.0), "the burst's last commit was left for the next write"
    assert recorder.version == last


def test_a_hold_with_nothing_written_meanwhile_costs_one_read(watched):
    """The engine's own commit: its pages were read before the hold; one read after."""
    db, watcher, recorder = watched
    watcher.arm()
    before = applied(db, watcher, recorder)
    watcher.hold(0.05)
    watcher._signal()  # (a hold needs no signal; this makes the watcher look at it now)
    time.sleep(0.2)
    assert settled(watcher) == before + 1
    assert not recorder.event.is_set()  # nothing new: nobody woken


def test_a_wal_file_that_appears_after_the_watcher_started_is_watched(tmp_path):
    db = Database(tmp_path / "late.sqlite3")
    db.close()  # the last connection: SQLite checkpoints and deletes the -wal file
    wal = tmp_path / "late.sqlite3-wal"
    assert not wal.exists()
    recorder = Recorder()
    watcher = wake.CommitWatcher(db.path, recorder.since, recorder).start()
    try:
        assert watcher._wal_wd is None  # nothing to watch yet but the directory
        db.conn = sqlite3.connect(db.path, isolation_level=None, check_same_thread=False)
        watcher.arm()
        db.capture()  # the first commit creates the -wal file
        assert wal.exists()
        assert recorder.wait(), "a commit into a -wal file created later did not wake"
        assert watcher._wal_wd is not None
        applied(db, watcher, recorder)
        calls = recorder.calls
        db.capture()
        assert recorder.wait() and recorder.calls == calls + 1  # and the file is watched now
    finally:
        watcher.close()
        db.close()


def test_closing_stops_the_thread_and_releases_the_descriptors(db):
    watcher = wake.CommitWatcher(db.path, lambda: 0, lambda: None).start()
    watcher.arm()
    watcher.close()
    assert not watcher._thread.is_alive()
    assert watcher._control_r == -1


def test_watch_is_off_by_setting_and_for_databases_it_cannot_watch(settings, monkeypatch):
    settings.RINDLE = {**settings.RINDLE, "SQLITE_WAKE": "poll"}
    assert wake.watch("default", lambda: 0, lambda: None) is None
    settings.RINDLE = {**settings.RINDLE, "SQLITE_WAKE": "inotify"}
    monkeypatch.setattr(wake, "database_path", lambda using: None)  # say, in memory
    assert wake.watch("default", lambda: 0, lambda: None) is None


def test_an_in_memory_database_has_no_file_to_watch(settings):
    from django.db import connections

    if connections["default"].vendor != "sqlite":
        pytest.skip("SQLite only")
    conn = connections["default"]
    for name in (":memory:", "file:memorydb_default?mode=memory&cache=shared"):
        monkeyed = dict(conn.settings_dict, NAME=name)
        conn.settings_dict, real = monkeyed, conn.settings_dict
        try:
            assert wake.database_path("default") is None
        finally:
            conn.settings_dict = real


def test_without_inotify_watch_returns_none_and_the_caller_polls(monkeypatch, tmp_path):
    def refused(cls):
        raise wake.Unavailable(38, "inotify is Linux's")

    monkeypatch.setattr(wake._Inotify, "libc", classmethod(refused))
    monkeypatch.setattr(wake, "database_path", lambda using: str(tmp_path / "x.sqlite3"))
    assert wake.watch("default", lambda: 0, lambda: None) is None


@pytest.mark.parametrize(
    "rindle",
    [{"SQLITE_WAKE": "inotfy"}, {"SQLITE_WAKE": None}, {"WAKE_POLL_INTERVAL": 0}],
)
def test_a_bad_setting_is_a_clear_error(settings, rindle):
    settings.RINDLE = {**settings.RINDLE, **rindle}
    with pytest.raises(ValueError, match="SQLITE_WAKE|WAKE_POLL_INTERVAL"):
        wake.mode()
