"""
Wake-ups for SQLite commits this process's engine did not make: a plain ORM
``save()`` of this process, another process, a shell.

The engine hands its own commits to its readers in process; everything else used to
be noticed only by an outbox poll every ``POLL_INTERVAL``. ``CommitWatcher`` notices
it as it happens instead: in WAL mode every commit appends its pages to the
database's ``-wal`` file, whoever makes it, so the watcher asks Linux's inotify to
report writes to that file (and, on its directory, the file's re-creation, since the
last connection to close deletes it). The three system calls are made through
``ctypes`` on libc (``inotify_init1``, ``inotify_add_watch``; the descriptor is read
with ``os.read``), so there is nothing to install.

When the file was written, the watcher reads the outbox's greatest seq on a
connection of its own (one read of the table's last page, no Django) and calls
``on_commit()`` only when it is above ``since()``, the reader's version. So a write
that captured nothing (the usage ledger's flush, a session) and a commit the reader
already applied (the engine's own) wake nobody; and readers write nothing to the
file, so a reader woken here cannot wake itself again: there is no loop, and no
polling (the thread sleeps in ``select`` until the kernel reports a write).

A commit writes its pages to the file one by one and becomes visible to readers just
after the last (SQLite updates the WAL index then), so the watcher reads once the
writes have been quiet for a moment (``QUIET_SECONDS``), sleeping rather than being
woken by every page, and the read is repeated a few times (``LATE_READS``), in case
the writer was preempted between its last write and the index update: a commit
always wakes its reader, even when the watcher ran in between. That holds when the
first read found a commit too: the pages it drained may be the next commit's, the
last of a burst, which the kernel reports only once. A late read that finds a
commit ends the schedule: SQLite has one writer at a time, so only the newest of
the drained commits can still be invisible, and any later one writes pages anew.

The engine's own commits are applied by the hub on the committing thread; their
pages would wake the watcher for nothing, so each one ``hold()``s it for a moment
(``HOLD_SECONDS``), after which it reads the outbox once: someone else's commit
meanwhile waits at most that long.

``disarm()`` stops reading the events (the kernel keeps at most one pending per
file: identical events merge), so writes cost this process nothing while nobody
needs them soon; ``arm()`` reads again, at once. The reader's own poll stays as the
safety net for whatever this misses (a platform without inotify, a file system that
does not report writes, such as some network mounts).

``watch(using, since, on_commit)`` is the entry point: it returns a started watcher,
or None when the mechanism is off (``RINDLE["SQLITE_WAKE"] = "poll"``) or
unavailable (not Linux, an in-memory database, inotify refused), and the caller
polls as before.
"""

import ctypes
import ctypes.util
import errno
import logging
import os
import select
import sqlite3
import struct
import sys
import threading
import time

from django.db import connections

from ..conf import rindle_settings
from ..engine.capture import OUTBOX

logger = logging.getLogger("rindle.stream")

MODES = ("inotify", "poll")
# A commit writes its pages to the -wal file one by one and becomes visible just after
# the last (SQLite updates the WAL index then). So the watcher reads the outbox once
# the writes have been quiet for QUIET_SECONDS (at most BURST_MAX_SECONDS after the
# first), and again LATE_READS seconds after it, in case the writer was preempted
# between its last write and the index update (then by about a scheduler time slice).
# A new write restarts the schedule.
QUIET_SECONDS = 0.0001
BURST_MAX_SECONDS = 0.002
LATE_READS = (0.001, 0.005, 0.02)
# How long ``hold()`` leaves the events unread by default: the longest an ORM write
# right after an engine commit waits for its read (unless an engine commit after it
# hands it over first).
HOLD_SECONDS = 0.002

_IN_MODIFY = 0x00000002
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE_SELF = 0x00000400
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then name)


class Unavailable(OSError):
    """The platform or the database cannot be watched; the caller polls."""


def settings_problem(settings):
    """What is wrong with SQLITE_WAKE or WAKE_POLL_INTERVAL (a ``rindle_settings``), or None."""
    value = settings.SQLITE_WAKE
    if not isinstance(value, str) or value not in MODES:
        return f"SQLITE_WAKE must be one of {', '.join(map(repr, MODES))}, not {value!r}"
    interval = settings.WAKE_POLL_INTERVAL
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
        return f"WAKE_POLL_INTERVAL must be a positive number of seconds, not {interval!r}"
    return None


def mode():
    """``RINDLE["SQLITE_WAKE"]``: "inotify" or "poll"; ``ValueError`` for anything else."""
    problem = settings_problem(rindle_settings)
    if problem is not None:
        raise ValueError(f"invalid rindle wake-up settings: {problem}")
    return rindle_settings.SQLITE_WAKE


def database_path(using):
    """The file of SQLite database ``using``, or None for an in-memory or URI database."""
    conn = connections[using]
    if conn.vendor != "sqlite":
        return None
    name = str(conn.settings_dict["NAME"])
    if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
        return None
    return os.path.realpath(name)


def watch(using, since, on_commit):
    """A started ``CommitWatcher`` of ``using``, or None: the caller polls (see the module)."""
    if mode() != "inotify":
        return None
    path = database_path(using)
    if path is None:
        logger.info("rindle wake: %r is not a database file; polling the outbox", using)
        return None
    try:
        return CommitWatcher(path, since, on_commit).start()
    except Unavailable as exc:
        logger.info("rindle wake: inotify unavailable (%s); polling the outbox", exc)
        return None


class _Inotify:
    """The three calls, through ctypes on libc (Linux only)."""

    _libc = None

    @classmethod
    def libc(cls):
        if cls._libc is None:
            if not sys.platform.startswith("linux"):
                raise Unavailable(errno.ENOSYS, "inotify is Linux's")
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                init, add = libc.inotify_init1, libc.inotify_add_watch
            except (OSError, AttributeError) as exc:
                raise Unavailable(errno.ENOSYS, f"libc has no inotify: {exc}") from None
            init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
            add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            add.restype = ctypes.c_int
            cls._libc = libc
        return cls._libc

    def __init__(self):
        fd = self.libc().inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise Unavailable(err, f"inotify_init1: {os.strerror(err)}")
        self.fd = fd

    def add(self, path, mask):
        """The watch descriptor of ``path``, or None when it does not exist."""
        wd = self.libc().inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            err = ctypes.get_errno()
            if err == errno.ENOENT:
                return None
            raise Unavailable(err, f"inotify_add_watch {path}: {os.strerror(err)}")
        return wd

    def read(self):
        """The pending events as (wd, mask, name); [] when there are none."""
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        events, at = [], 0
        while at + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
            at += _EVENT.size
            name = data[at : at + length].rstrip(b"\0")
            at += length
            events.append((wd, mask, name))
        return events

    def close(self):
        os.close(self.fd)


class CommitWatcher:
    """
    Calls ``on_commit()`` on its own thread when an outbox seq above ``since()`` is
    committed to the SQLite database at ``path`` (see the module). Created disarmed;
    ``arm()`` it while a prompt wake-up matters. Counters (plain ints, for the
    benchmarks and /metrics): ``events`` (reads of the descriptor), ``checks`` (outbox
    reads), ``wakes`` (calls of ``on_commit``), ``late_wakes`` (found by the settle
    re-read). ``newest`` is the greatest seq the read before the last wake found
    (None when that read failed), for an ``on_commit`` that wants the value.
    """

    def __init__(self, path, since, on_commit):
        self.path = path
        self.wal = path + "-wal"
        self.since = since
        self.on_commit = on_commit
        self.events = self.checks = self.wakes = self.late_wakes = 0
        self.newest = None  # the outbox's greatest seq as of the last wake (None: unread)
        self._inotify = _Inotify()
        self._dir = os.path.dirname(path) or "."
        self._names = {os.fsencode(os.path.basename(self.wal))}
        self._dir_wd = None
        self._wal_wd = None
        self._control_r, self._control_w = os.pipe()
        os.set_blocking(self._control_w, False)
        self._lock = threading.Lock()
        self._armed = False
        self._stopping = False
        self._held_until = 0.0  # monotonic; see ``hold``
        self._thread = None
        self._conn = None
        try:
            self._dir_wd = self._inotify.add(self._dir, _IN_CREATE | _IN_MOVED_TO)
            if self._dir_wd is None:
                raise Unavailable(errno.ENOENT, f"no directory {self._dir}")
            self._wal_wd = self._inotify.add(self.wal, _IN_MODIFY)
        except BaseException:
            self._close_fds()
            raise

    # --- control (any thread) ------------------------------------------------------

    def start(self):
        self._thread = threading.Thread(target=self._run, name="rindle-wake", daemon=True)
        self._thread.start()
        return self

    @property
    def armed(self):
        return self._armed

    def arm(self):
        """Report commits from now on; True when it was disarmed (the caller catches up)."""
        with self._lock:
            was, self._armed = self._armed, True
        if not was:
            self._signal()
        return not was

    def disarm(self):
        """Stop reading the events until ``arm()``; the kernel keeps at most one per file."""
        with self._lock:
            self._armed = False
        self._signal()

    def hold(self, seconds=HOLD_SECONDS):
        """
        Leave the events unread for ``seconds`` from now (each call extends it), then
        read the outbox once: for a caller that just committed and applied its own
        commit, whose page writes would otherwise wake this thread for nothing. A
        commit of someone else meanwhile is found by that read (a plain attribute
        write: cheap enough for every commit).
        """
        until = time.monotonic() + seconds
        if until > self._held_until:
            self._held_until = until

    def close(self):
        with self._lock:
            self._stopping = True
        self._signal()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        if self._thread is None or not self._thread.is_alive():
            self._close_fds()  # else the thread closes them as it ends

    def _signal(self):
        try:
            os.write(self._control_w, b"x")
        except (BlockingIOError, OSError):  # full (a signal is pending anyway) or closed
            pass

    # --- the thread ----------------------------------------------------------------

    def _run(self):
        late = []  # the late reads still due (monotonic times)
        armed = held = False
        try:
            while True:
                now = time.monotonic()
                held = armed and now < self._held_until
                if held:
                    fds, timeout = [self._control_r], self._held_until - now
                elif armed:
                    fds = [self._control_r, self._inotify.fd]
                    timeout = max(0.0, late[0] - now) if late else None
                else:
                    fds, timeout = [self._control_r], None
                ready, _, _ = select.select(fds, [], [], timeout)
                if self._control_r in ready:
                    os.read(self._control_r, 4096)
                    with self._lock:
                        if self._stopping:
                            return
                        was, armed = armed, self._armed
                    if armed and not was:  # what was written while disarmed: read it now
                        held = True
                if not armed:
                    late = []
                elif held:  # the hold ended (or the watcher was just armed): read once
                    if time.monotonic() >= self._held_until:  # (else it was extended)
                        written = self._drain()
                        self._check(False)
                        # late reads only for writes made during the hold (an earlier
                        # commit is visible by now), even when this read found one:
                        # the last commit of a burst may not be visible yet
                        late = self._late_reads() if written else []
                elif self._inotify.fd in ready:
                    if self._drain():  # each write restarts the schedule
                        if self._quiet():
                            continue  # the writer holds the events: its hold ends with a read
                        # Late reads even when this one found a commit: the pages
                        # just drained may be a later commit's, not visible yet, and
                        # they will not be reported again.
                        self._check(False)
                        late = self._late_reads()
                elif late and time.monotonic() >= late[0]:
                    late.pop(0)
                    if self._check(True):
                        late = []
        except Exception:
            logger.exception("rindle wake: the watcher stopped; the outbox poll goes on")
        finally:
            if self._conn is not None:
                self._conn.close()
            with self._lock:
                stopping = self._stopping
            if stopping:
                self._close_fds()

    def _quiet(self):
        """
        Let a commit's burst of page writes end (sleeping, not woken by each page);
        True when a hold began meanwhile (the engine's own commit: nothing to read).
        """
        deadline = time.monotonic() + BURST_MAX_SECONDS
        while True:
            time.sleep(QUIET_SECONDS)
            now = time.monotonic()
            if now < self._held_until:
                return True
            if not self._drain() or now >= deadline:
                return False

    @staticmethod
    def _late_reads():
        now = time.monotonic()
        return [now + delay for delay in LATE_READS]

    def _drain(self):
        """Read the pending events; True when the database may have changed."""
        changed = False
        for wd, mask, name in self._inotify.read():
            if mask & _IN_Q_OVERFLOW:
                changed = True
            elif wd == self._dir_wd:
                if name in self._names:  # the -wal file was (re)created: watch it again
                    self._wal_wd = self._inotify.add(self.wal, _IN_MODIFY)
                    changed = True
            elif wd == self._wal_wd:
                if mask & (_IN_IGNORED | _IN_DELETE_SELF):
                    self._wal_wd = None
                else:
                    changed = True
        if changed:
            self.events += 1
        return changed

    def _check(self, late):
        """Call ``on_commit()`` if the outbox holds a seq above ``since()``; True if so."""
        self.checks += 1
        try:
            newest = self._newest()
        except sqlite3.Error as exc:  # wake the reader: its read reports what is wrong
            logger.debug("rindle wake: outbox read failed: %s", exc)
            if self._conn is not None:
                self._conn.close()
            self._conn = None
            newest = None
        if newest is not None and newest <= self.since():
            return False
        self.newest = newest
        self.wakes += 1
        if late:
            self.late_wakes += 1
        self.on_commit()
        return True

    def _newest(self):
        if self._conn is None:
            self._conn = sqlite3.connect(self.path, timeout=1.0, isolation_level=None)
        row = self._conn.execute(f"SELECT MAX(seq) FROM {OUTBOX}").fetchone()
        return row[0] or 0

    def _close_fds(self):
        with self._lock:
            if self._control_r < 0:
                return
            fds, self._control_r, self._control_w = (self._control_r, self._control_w), -1, -1
        for fd in fds:
            os.close(fd)
        self._inotify.close()
