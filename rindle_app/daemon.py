"""
Raw-AST materializations: what the original daemon's ``/materialize`` hands out.

The original's api-server resolves and authorizes a named query itself, then asks
the daemon (with the database token) to materialize the AST it built; the browser
gets only the lease. Here ``/materialize`` (token scope ``daemon``) validates the
AST and mints a lease on the reserved system query ``_rindle/ast`` whose arguments
carry the AST and a **grant**: a signature over the AST (``SECRET_KEY``, salt
``"rindle.ast"``). ``named.resolve`` resolves ``_rindle/ast`` only with a valid
grant, so a socket cannot subscribe an AST of its own by name: only an AST a
daemon-scope token admitted reaches the hub. No read rules are compiled in: the
daemon token sees every table, and the api-server in front of it authorized the
query, as in the original.

The lease is minted for no principal (as the original's, it is a bearer capability
for one query until it expires), so it is redeemed on a socket without credentials
of its own, the way a browser of an ``@rindle/api-server`` app connects.

``Materializations`` is the process's record of what ``/materialize`` handed out,
for ``/dematerialize`` and ``/stats``. It is memory only, like the original
daemon's ("rindled keeps no durable materializations"): the boot id changes with
the process, and the api-server re-asserts its pins when it does.

Policies. A ``whileSubscribed`` materialization (the default) is a record that
expires with its lease: its query lives while a socket subscribes it. A ``pinned``
one is kept warm: the hub keeps its shared query registered and maintained with no
subscriber (``Hub.pin``), so the next subscriber's seq 0 is the view as it stands,
not a rebuild. A pin is viewer-independent and idempotent (a re-assert of one name
keeps its id and answers ``reused``), lives until ``/dematerialize`` removes it or
the process ends, and is bounded: at most ``DAEMON_MAX_PINS`` per process, past
which a new one is ``too_many_pins``.
"""

import hashlib
import json
import threading
import time
from dataclasses import dataclass

from django.core import signing

from .conf import rindle_settings
from .exceptions import INVALID_ARGS, UNAUTHORIZED, QueryRefused

AST_QUERY_NAME = "_rindle/ast"
SALT = "rindle.ast"


def settings_problem(settings):
    """What is wrong with DAEMON_MAX_PINS (of a ``rindle_settings``), or None."""
    value = settings.DAEMON_MAX_PINS
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"DAEMON_MAX_PINS must be a positive integer, not {value!r}"
    return None


def _digest(ast):
    text = json.dumps(ast, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def grant(ast):
    """The arguments of a ``_rindle/ast`` lease on ``ast`` (already validated)."""
    return {"ast": ast, "grant": signing.dumps(_digest(ast), salt=SALT)}


def resolve_ast(args):
    """The AST a ``_rindle/ast`` lease grants; ``QueryRefused`` without a valid grant."""
    if not isinstance(args, dict) or set(args) != {"ast", "grant"}:
        raise QueryRefused(f"{AST_QUERY_NAME} is leased by POST /materialize only", INVALID_ARGS)
    try:
        digest = signing.loads(args["grant"], salt=SALT, max_age=int(rindle_settings.LEASE_TTL))
    except (signing.BadSignature, TypeError):
        raise QueryRefused(
            f"{AST_QUERY_NAME} needs a grant from POST /materialize", UNAUTHORIZED
        ) from None
    if digest != _digest(args["ast"]):
        raise QueryRefused(f"the grant is for another AST than {AST_QUERY_NAME}'s", UNAUTHORIZED)
    return args["ast"]


@dataclass(frozen=True)
class Materialization:
    """One record: its query, its pin name, when it expires, its idle linger (seconds)."""

    key: str
    name: str | None
    expires: float
    idle: float = 0.0

    @property
    def pinned(self):
        return self.expires == float("inf")


class Materializations:
    """
    What ``/materialize`` handed out in this process: ``materializationId`` ->
    ``Materialization``. Thread-safe; expired entries are dropped as they are looked at.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}
        # Held by the daemon views across a pin's or an unpin's two steps (the hub's
        # pins, then this record), so concurrent requests cannot leave a pin the
        # record does not hold, which nothing could let go of.
        self.changing = threading.Lock()

    def add(self, query_key, name=None, *, pinned=False, idle=0.0):
        """
        ``(materializationId, reused)``. A pin keeps one id per name (or per query
        when unnamed) and never expires; any other entry expires with its lease, and
        asks its query to linger ``idle`` seconds after its last subscriber left.
        """
        if pinned:
            mid = f"pin:{name}" if name else f"pin:{query_key}"
            entry = Materialization(query_key, name, float("inf"))
        else:
            mid = f"mat:{query_key}"
            expires = time.monotonic() + int(rindle_settings.LEASE_TTL)
            with self._lock:
                old = self._entries.get(mid)
            idle = max(idle, old.idle) if old is not None and not old.pinned else idle
            entry = Materialization(query_key, None, expires, idle)
        with self._lock:
            self._expire()
            reused = mid in self._entries
            self._entries[mid] = entry
        return mid, reused

    def get(self, materialization_id):
        """The ``Materialization`` of an id, or None."""
        with self._lock:
            self._expire()
            return self._entries.get(materialization_id)

    def remove(self, materialization_id=None, query_key=None, name=None):
        """
        The query keys of the pins removed, and whether any entry matched (and was
        removed): ``(pins, removed)``. A key still pinned by another entry is not
        among them.
        """
        with self._lock:
            self._expire()
            gone = [
                mid
                for mid, entry in self._entries.items()
                if mid == materialization_id
                or (query_key is not None and entry.key == query_key)
                or (name is not None and entry.name == name)
            ]
            removed = [self._entries.pop(mid) for mid in gone]
            keys = {entry.key for entry in removed if entry.pinned}
        return sorted(keys - self.pinned()), bool(gone)

    def pinned(self):
        """The query keys some pin holds."""
        with self._lock:
            return {entry.key for entry in self._entries.values() if entry.pinned}

    def idle_ttl(self, query_key):
        """
        Seconds the query of ``query_key`` lingers after its last subscriber left:
        the longest ``idleTtlMs`` of its unexpired ``whileSubscribed`` records, 0 when
        none asked (the hub calls it, under its lock).
        """
        with self._lock:
            self._expire()
            return max(
                (e.idle for e in self._entries.values() if e.key == query_key and not e.pinned),
                default=0.0,
            )

    def __len__(self):
        with self._lock:
            self._expire()
            return len(self._entries)

    def _expire(self):
        now = time.monotonic()
        for mid in [m for m, entry in self._entries.items() if entry.expires <= now]:
            del self._entries[mid]


def materializations():
    """The ``Materializations`` of the default runtime (``RINDLE["DATABASE"]``)."""
    from .runtime import get_runtime

    return get_runtime(None).materializations
