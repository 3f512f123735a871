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
"""

import hashlib
import json
import threading
import time

from django.core import signing

from .conf import rindle_settings
from .exceptions import INVALID_ARGS, UNAUTHORIZED, QueryRefused

AST_QUERY_NAME = "_rindle/ast"
SALT = "rindle.ast"


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


class Materializations:
    """
    What ``/materialize`` handed out in this process: ``materializationId`` ->
    ``(queryKey, name, expires_at)``. Thread-safe; expired entries are dropped as
    they are looked at.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = {}

    def add(self, query_key, name=None):
        """``(materializationId, reused)``: a pinned name keeps one id per name."""
        mid = f"pin:{name}" if name else f"mat:{query_key}"
        expires = time.monotonic() + int(rindle_settings.LEASE_TTL)
        with self._lock:
            self._expire()
            reused = mid in self._entries
            self._entries[mid] = (query_key, name, expires)
        return mid, reused

    def remove(self, materialization_id=None, query_key=None, name=None):
        """Whether any entry matched (and was removed)."""
        with self._lock:
            self._expire()
            gone = [
                mid
                for mid, (key, pinned, _exp) in self._entries.items()
                if mid == materialization_id
                or (query_key is not None and key == query_key)
                or (name is not None and pinned == name)
            ]
            for mid in gone:
                del self._entries[mid]
        return bool(gone)

    def __len__(self):
        with self._lock:
            self._expire()
            return len(self._entries)

    def _expire(self):
        now = time.monotonic()
        for mid in [m for m, entry in self._entries.items() if entry[2] <= now]:
            del self._entries[mid]


_materializations = Materializations()


def materializations():
    """The process's ``Materializations``."""
    return _materializations
