"""
The figures of the usage ledger: what a transfer reports (``Transfer``), what a
node keeps per namespace and UTC day (``Row``), what the readers answer
(``FlowDay``, ``Glance``, ``Fleet``), the closed set of refusal reasons, and the
validation every edge applies once so the counting path never re-checks.

Plain values only: nothing here holds state or touches the database, so the store,
the quotas, the admin and the charts import it without the live counters.
"""

from dataclasses import dataclass, field
from datetime import date, timedelta
from enum import StrEnum
from typing import NamedTuple

from ..engine.errors import InvalidInput
from ..exceptions import (
    FLOW_INVALID_NAMESPACE,
    FLOW_INVALID_TIME,
    FLOW_INVALID_TRANSFER,
    FLOW_INVALID_WINDOW,
)
from . import sessions as sketches

__all__ = [
    "DAY_MS",
    "MAX_NAMESPACE_LENGTH",
    "MAX_SESSION_LENGTH",
    "MAX_TRANSFER_BYTES",
    "REASONS",
    "Fleet",
    "FlowDay",
    "Glance",
    "Refusal",
    "Row",
    "Transfer",
    "check_days",
    "check_namespace",
    "check_time",
    "day_date",
    "merge_rows",
    "utc_day",
]

DAY_MS = 86_400_000
_EPOCH = date(1970, 1, 1)
# Largest byte count one transfer may report (8 PiB): anything larger is a bug in
# the caller, and refusing it keeps every stored counter far from BIGINT overflow.
MAX_TRANSFER_BYTES = 2**53
MAX_NAMESPACE_LENGTH = 200
MAX_SESSION_LENGTH = 256


class Refusal(StrEnum):
    """Why a tenant was refused: the closed set of reasons the ledger counts."""

    RATE_LIMIT = "rate_limit"
    QUOTA = "quota"
    PERMISSION = "permission"
    FENCED = "fenced"
    TOO_LARGE = "too_large"
    BAD_REQUEST = "bad_request"
    UNAVAILABLE = "unavailable"
    OTHER = "other"


REASONS = tuple(reason.value for reason in Refusal)
# A StrEnum member hashes and compares as its value: both spellings look up here.
REASON_INDEX = {reason: i for i, reason in enumerate(REASONS)}


def utc_day(unix_ms):
    """The UTC day number (days since 1970-01-01) of a Unix time in milliseconds."""
    return unix_ms // DAY_MS


def day_date(day):
    """The ``datetime.date`` of a UTC day number."""
    return _EPOCH + timedelta(days=day)


@dataclass(frozen=True, slots=True)
class Transfer:
    """
    One finished transfer, as the transport counts it.

    ``bytes_in``/``bytes_out`` are the wire bytes; ``bulk_bytes_in``/``bulk_bytes_out``
    are the part of them that was bulk payload (snapshots, large blobs): they are
    INSIDE the wire bytes, never added to them. ``session`` is the id of the
    session the transfer belongs to, for the distinct-sessions count (optional).
    Construction validates every field, so the record path does not.
    """

    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    session: str | None = None

    def __post_init__(self):
        for name in ("bytes_in", "bytes_out", "bulk_bytes_in", "bulk_bytes_out"):
            value = getattr(self, name)
            if type(value) is not int or not 0 <= value <= MAX_TRANSFER_BYTES:
                raise InvalidInput(
                    f"Transfer.{name} must be an integer in 0..{MAX_TRANSFER_BYTES}, not {value!r}",
                    code=FLOW_INVALID_TRANSFER,
                    field=name,
                )
        for bulk, wire in (("bulk_bytes_in", "bytes_in"), ("bulk_bytes_out", "bytes_out")):
            if getattr(self, bulk) > getattr(self, wire):
                raise InvalidInput(
                    f"Transfer.{bulk} is part of {wire} and cannot exceed it",
                    code=FLOW_INVALID_TRANSFER,
                    field=bulk,
                )
        session = self.session
        if session is not None and (
            type(session) is not str or not 0 < len(session) <= MAX_SESSION_LENGTH
        ):
            raise InvalidInput(
                f"Transfer.session must be a non-empty string of at most "
                f"{MAX_SESSION_LENGTH} characters, or None",
                code=FLOW_INVALID_TRANSFER,
                field="session",
            )


class Row(NamedTuple):
    """
    One node's figure for one namespace and UTC day: what a flush copies and the
    store keeps. ``refusals`` is aligned with ``REASONS``; ``sessions`` is a sketch
    (see ``rindle_app.flow.sessions``); ``last_seen_ms`` is 0 when never seen;
    ``gen`` is the namespace's forget generation the figure belongs to.
    """

    namespace: str
    day: int
    node: str
    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    transfers: int = 0
    refusals: tuple = (0,) * len(REASONS)
    auth_failures: int = 0
    sessions: tuple = ()
    last_seen_ms: int = 0
    gen: int = 0


@dataclass(frozen=True)
class FlowDay:
    """
    One namespace's flow over one UTC day, summed over every process.

    ``moved`` (wire bytes in + out) is what quotas count: the bulk bytes are already
    inside it. ``sessions`` is the distinct session count (exact for small counts,
    see ``rindle_app.flow.sessions``). ``last_seen_ms`` is the latest transfer or
    refusal of the day (None if there was none: a day of auth failures only).
    """

    namespace: str
    day: int
    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    transfers: int = 0
    refusals: dict = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    auth_failures: int = 0
    sessions: int = 0
    last_seen_ms: int | None = None

    @property
    def moved(self):
        return self.bytes_in + self.bytes_out

    @property
    def refused(self):
        return sum(self.refusals.values())

    @property
    def date(self):
        return day_date(self.day)


@dataclass(frozen=True)
class Glance:
    """
    Today's flow beside when the namespace was last seen over the WHOLE kept window.

    The two answer different questions and are never derived from each other: a
    tenant idle for six weeks has a ``today`` of zeroes and a ``last_seen_ms`` six
    weeks ago (None if not seen within the kept window).
    """

    namespace: str
    today: FlowDay
    last_seen_ms: int | None


@dataclass(frozen=True)
class Fleet:
    """
    Every namespace's flow today, folded, and how many tenants have gone quiet.

    ``namespaces`` counts the namespaces with any figure in the kept window;
    ``active`` those seen (a transfer or a refusal) today; ``silent`` those not seen
    on any of the last ``silent_after_days`` UTC days, today included (a namespace
    with only auth failures in the window is silent). ``sessions`` sums each
    namespace's distinct sessions.
    """

    day: int
    silent_after_days: int
    namespaces: int = 0
    active: int = 0
    silent: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    bulk_bytes_in: int = 0
    bulk_bytes_out: int = 0
    transfers: int = 0
    refusals: dict = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    auth_failures: int = 0
    sessions: int = 0

    @property
    def moved(self):
        return self.bytes_in + self.bytes_out

    @property
    def date(self):
        return day_date(self.day)


# --- validation (edges and slow paths only) ---------------------------------------------


def check_namespace(namespace):
    """Refuse a namespace that is not a short printable string."""
    if (
        type(namespace) is not str
        or not 0 < len(namespace) <= MAX_NAMESPACE_LENGTH
        or not namespace.isprintable()
    ):
        raise InvalidInput(
            f"a namespace must be a non-empty printable string of at most "
            f"{MAX_NAMESPACE_LENGTH} characters, not {namespace!r:.80}",
            code=FLOW_INVALID_NAMESPACE,
        )
    try:
        namespace.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            "a namespace must be valid Unicode text (no lone surrogates)",
            code=FLOW_INVALID_NAMESPACE,
        ) from None
    return namespace


def check_time(unix_ms, name="at"):
    """Refuse a time that is not a non-negative integer of milliseconds."""
    if type(unix_ms) is not int or not 0 <= unix_ms < 2**53:
        raise InvalidInput(
            f"{name} must be a Unix time in integer milliseconds, not {unix_ms!r:.80}",
            code=FLOW_INVALID_TIME,
        )
    return unix_ms


def check_days(days, name="days"):
    """Refuse a day count that is not a non-negative integer."""
    if type(days) is not int or days < 0:
        raise InvalidInput(
            f"{name} must be a non-negative integer, not {days!r:.80}",
            code=FLOW_INVALID_WINDOW,
        )
    return days


def merge_rows(namespace, day, rows):
    """One FlowDay from several nodes' rows of the same namespace and day."""
    refusals = [0] * len(REASONS)
    bytes_in = bytes_out = bulk_in = bulk_out = transfers = auth = last = 0
    sketch_parts = []
    for row in rows:
        bytes_in += row.bytes_in
        bytes_out += row.bytes_out
        bulk_in += row.bulk_bytes_in
        bulk_out += row.bulk_bytes_out
        transfers += row.transfers
        auth += row.auth_failures
        last = max(last, row.last_seen_ms)
        for i, n in enumerate(row.refusals):
            refusals[i] += n
        sketch_parts.append(row.sessions)
    return FlowDay(
        namespace=namespace,
        day=day,
        bytes_in=bytes_in,
        bytes_out=bytes_out,
        bulk_bytes_in=bulk_in,
        bulk_bytes_out=bulk_out,
        transfers=transfers,
        refusals=dict(zip(REASONS, refusals)),
        auth_failures=auth,
        sessions=sketches.estimate(sketches.merge(*sketch_parts)),
        last_seen_ms=last or None,
    )
