"""
Singleton leases on the database clock (``_rindle_stream_leases``, model
``StreamLease``): which process of the fleet runs a singleton loop (the
watermarker, retention), with an epoch as its fencing token.

The rules, each where a shipped system got it wrong:

- The DATABASE decides, with ``clock_timestamp()`` (the wall time of the call;
  ``now()`` is frozen at transaction start), never an app host's clock: hosts
  disagree, and the lease must mean one thing to every contender.
- Acquiring and renewing are one conditional UPDATE: it takes the row when this
  holder already has it or when it has expired. A change of holder adds one to
  ``epoch`` (and to ``transitions``); a renewal by the same holder keeps it.
- The epoch is a fencing token. A holder can be paused (a GC, a stopped VM,
  SIGSTOP) past its expiry and then act; so every write the holder makes re-checks
  ``holder = me AND epoch = e AND expires_at > clock_timestamp()`` with FOR SHARE
  inside that write's own transaction (``check``). A takeover's UPDATE then waits
  for the write to commit, or the write sees the new holder and is refused.
- The holder also stops acting on its own, at ``expires_at`` minus a margin by its
  monotonic clock (``held``): a holder that can no longer reach the database does
  not go on believing it leads.
- The lease is an efficiency lock, not the safety argument: what a holder writes
  is monotonic (``GREATEST``), so two holders at once waste work and corrupt
  nothing.

PostgreSQL only: on SQLite one process owns the database and there is nothing
to elect. ``clock_offset`` (seconds added to the database clock in every lease
statement) exists for tests of a clock that jumps.
"""

import time

from ..exceptions import LeaseHeld

TABLE = "_rindle_stream_leases"
_NOW = "(clock_timestamp() + make_interval(secs => %(offset)s::float8))"

_ACQUIRE = f"""
WITH c AS (SELECT {_NOW} AS now),
got (epoch, transitions, remaining) AS (
    UPDATE {TABLE} AS l SET
        holder = %(me)s,
        epoch = CASE WHEN l.holder = %(me)s THEN l.epoch ELSE l.epoch + 1 END,
        transitions = CASE WHEN l.holder = %(me)s THEN l.transitions ELSE l.transitions + 1 END,
        acquired_at = CASE WHEN l.holder = %(me)s THEN l.acquired_at ELSE c.now END,
        renewed_at = c.now,
        expires_at = c.now + make_interval(secs => %(ttl)s::float8)
    FROM c
    WHERE l.name = %(name)s
      AND (l.holder = %(me)s OR l.expires_at IS NULL OR l.expires_at <= c.now)
    RETURNING l.epoch, l.transitions, EXTRACT(EPOCH FROM l.expires_at - c.now)::float8
)
SELECT true, epoch, transitions, remaining, NULL FROM got
UNION ALL
SELECT false, l.epoch, l.transitions, NULL, l.holder FROM {TABLE} AS l
WHERE l.name = %(name)s AND NOT EXISTS (SELECT 1 FROM got)
"""

_CREATE = (
    f"INSERT INTO {TABLE} (name, holder, epoch, transitions) VALUES (%(name)s, '', 0, 0) "
    "ON CONFLICT (name) DO NOTHING"
)

_CHECK = (
    f"SELECT 1 FROM {TABLE} WHERE name = %(name)s AND holder = %(me)s AND epoch = %(epoch)s "
    f"AND expires_at > {_NOW} FOR SHARE"
)

_RELEASE = (
    f"UPDATE {TABLE} SET holder = '', expires_at = {_NOW}, renewed_at = {_NOW} "
    "WHERE name = %(name)s AND holder = %(me)s AND epoch = %(epoch)s"
)


class Lease:
    """
    The lease ``name`` as seen by the contender ``holder`` (a string unique to it),
    lasting ``ttl`` seconds past each renewal.

    ``acquire(cursor)`` takes or renews it (``LeaseHeld`` when another holder's is
    unexpired) and returns the epoch; ``check(cursor)`` re-checks it inside a write
    transaction; ``release(cursor)`` gives it up. Every method runs one statement
    on the cursor it is given, so the caller chooses the transaction: acquire and
    release in autocommit, check inside the write it guards. ``margin`` (seconds,
    default a quarter of ``ttl``) is how long before the database's expiry this
    holder stops acting by its own clock.

    Threading model: one Lease belongs to one thread at a time (its caller's).
    """

    def __init__(self, name, holder, ttl, *, margin=None, clock_offset=0.0):
        if not isinstance(name, str) or not name:
            raise ValueError("a lease name must be a non-empty string")
        if not isinstance(holder, str) or not holder:
            raise ValueError("a lease holder must be a non-empty string")
        ttl = float(ttl)
        if not ttl > 0:
            raise ValueError(f"a lease ttl must be positive seconds, not {ttl!r}")
        margin = ttl / 4 if margin is None else float(margin)
        if not 0 <= margin < ttl:
            raise ValueError(f"a lease margin must be in [0, ttl), not {margin!r}")
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.margin = margin
        self.clock_offset = float(clock_offset)
        self.epoch = None  # the epoch this holder holds, None while it does not
        self.transitions = 0  # the row's count of holder changes, as last seen
        self._deadline = 0.0  # monotonic time this holder stops acting

    def __repr__(self):
        return f"<Lease {self.name!r} {self.holder!r} epoch {self.epoch}>"

    def _params(self, **extra):
        return {"name": self.name, "me": self.holder, "offset": self.clock_offset, **extra}

    def acquire(self, cursor):
        """
        Take or renew the lease; return its epoch. Raises ``LeaseHeld`` (holding
        nothing) while another holder's lease is unexpired on the database clock.
        """
        started = time.monotonic()
        for _attempt in range(2):
            cursor.execute(_ACQUIRE, self._params(ttl=self.ttl))
            row = cursor.fetchone()
            if row is not None:
                break
            cursor.execute(_CREATE, self._params())  # a fresh or flushed database
        else:  # pragma: no cover - the row was deleted between the two statements
            row = (False, 0, 0, None, "")
        won, epoch, transitions, remaining, other = row
        self.transitions = int(transitions)
        if not won:
            self.epoch = None
            self._deadline = 0.0
            raise LeaseHeld(self.name, other)
        self.epoch = int(epoch)
        # Measured from before the statement was sent: the database's expiry can
        # only be later than this holder's estimate of it.
        self._deadline = started + float(remaining) - self.margin
        return self.epoch

    def held(self):
        """Whether this holder may still act, by its own monotonic clock."""
        return self.epoch is not None and time.monotonic() < self._deadline

    def check(self, cursor):
        """
        Inside a write transaction: whether this holder still holds the epoch it
        acquired, unexpired on the database clock. It locks the row FOR SHARE, so a
        takeover waits until this transaction ends; on False, roll the write back.
        """
        if self.epoch is None:
            return False
        cursor.execute(_CHECK, self._params(epoch=self.epoch))
        return cursor.fetchone() is not None

    def release(self, cursor):
        """Give the lease up now (if this holder still has it); True when it did."""
        if self.epoch is None:
            return False
        cursor.execute(_RELEASE, self._params(epoch=self.epoch))
        released = cursor.rowcount > 0
        self.epoch = None
        self._deadline = 0.0
        return released

    def forget(self):
        """Stop acting as the holder without telling the database (a lost connection)."""
        self.epoch = None
        self._deadline = 0.0


def read(cursor, name):
    """
    ``{"holder", "epoch", "transitions", "expires_in"}`` of the lease ``name`` on
    the database clock (``expires_in`` in seconds, negative once expired), or None.
    """
    cursor.execute(
        f"SELECT holder, epoch, transitions, "
        f"EXTRACT(EPOCH FROM expires_at - clock_timestamp())::float8 FROM {TABLE} "
        "WHERE name = %s",
        [name],
    )
    row = cursor.fetchone()
    if row is None:
        return None
    return {"holder": row[0], "epoch": row[1], "transitions": row[2], "expires_in": row[3]}
