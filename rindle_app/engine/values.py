"""
The wire encoding of a synced model's values: one form per Django field type,
identical on SQLite and PostgreSQL, for a row read with SQL and for the same row
arriving as a capture image (docs/protocol.md, "Value encoding").

=================  ====================================  =================================
field              wire value                            back to Python
=================  ====================================  =================================
DateTimeField      ``"YYYY-MM-DDTHH:MM:SS.ffffffZ"``     ``field.to_python(wire)``
                   (UTC, always 6 fractional digits;
                   without ``Z`` when ``USE_TZ=False``)
DateField          ``"YYYY-MM-DD"``                      ``field.to_python(wire)``
TimeField          ``"HH:MM:SS.ffffff"``                 ``field.to_python(wire)``
UUIDField          ``"xxxxxxxx-xxxx-...-xxxxxxxxxxxx"``  ``field.to_python(wire)``
                   (dashed, lowercase)
DecimalField       a JSON number                         ``field.to_python(wire)``
DurationField      integer microseconds                  ``timedelta(microseconds=wire)``
BinaryField        base64 text                           ``field.to_python(wire)``
BooleanField       ``true`` / ``false``                  as is
JSONField          the JSON value                        as is
numbers, text      as stored                             as is
=================  ====================================  =================================

The fixed-width text forms sort bytewise in time order, which is how the IVM
compares strings (``ivm.compare``). A column is typed from its model field (a
foreign key from the field it points to); a table registered without a model
carries what the database gives. Each direction is implemented here once:

- ``decoder(encoding, vendor)``: a stored value, as a capture image or a JSON
  rendering by SQL holds it, to the wire form (None where the stored form is
  already the wire form on that backend, so such columns cost nothing);
- ``to_wire(encoding, value)``: a Python value (a QuerySet literal, a value the
  database driver returned) to the wire form;
- ``canonical(encoding, value)``: a wire literal a client sent, normalized (a
  literal that is not a value of the column is refused);
- ``stored(encoding, vendor, wire)``: a wire literal as the SQL parameter that
  compares with the stored column as Django's own lookups do;
- ``to_stored(encoding, vendor, wire)``: a value a machine writer sent, as the
  parameter that stores it as Django would;
- ``from_wire(field, value)``: a wire value back to the field's Python value.
"""

import base64
import binascii
import datetime
import re
import uuid

from django.conf import settings
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime, parse_time

DATETIME, DATETIME_NAIVE, DATE, TIME = "datetime", "datetime_naive", "date", "time"
UUID, DECIMAL, DURATION, BINARY, BOOLEAN = "uuid", "decimal", "duration", "binary", "boolean"
# Encodings whose wire form is text the IVM compares bytewise (and LIKE would see
# differently from the stored text): comparisons only, no pattern lookups.
TEMPORAL = frozenset({DATETIME, DATETIME_NAIVE, DATE, TIME, UUID})

_UTC = datetime.UTC
_FIELDS = {
    "DateTimeField": DATETIME,
    "DateField": DATE,
    "TimeField": TIME,
    "UUIDField": UUID,
    "DecimalField": DECIMAL,
    "DurationField": DURATION,
    "BinaryField": BINARY,
    "BooleanField": BOOLEAN,
    "NullBooleanField": BOOLEAN,
}


def field_encoding(field):
    """The encoding of a model field's column ("" for values sent as stored)."""
    while field.is_relation and getattr(field, "target_field", None) is not None:
        field = field.target_field  # a foreign key stores what it points to
    encoding = _FIELDS.get(field.get_internal_type(), "")
    if encoding == DATETIME and not settings.USE_TZ:
        return DATETIME_NAIVE
    return encoding


# --- stored -> wire ---------------------------------------------------------------------


def _bool(value):
    return value if value.__class__ is bool else bool(value)


def _datetime(value):
    # Fast paths: SQLite's "YYYY-MM-DD HH:MM:SS[.ffffff]" (naive UTC, as Django
    # stores it) and PostgreSQL's "YYYY-MM-DDTHH:MM:SS[.f...]+00:00" (a UTC session).
    n = len(value)
    if n == 26 and value[10] == " ":
        return f"{value[:10]}T{value[11:]}Z"
    if n == 19 and value[10] == " ":
        return f"{value[:10]}T{value[11:]}.000000Z"
    if n == 32 and value.endswith("+00:00"):
        return value[:26] + "Z"
    return _to_datetime(_parse_datetime(value))


def _datetime_naive(value):
    if len(value) == 26 and value[10] == " ":
        return f"{value[:10]}T{value[11:]}"
    if len(value) == 19 and value[10] == " ":
        return f"{value[:10]}T{value[11:]}.000000"
    return _to_datetime_naive(_parse_datetime(value))


def _time(value):
    if len(value) == 15:
        return value
    if len(value) == 8:
        return value + ".000000"
    parsed = parse_time(value)
    if parsed is None:
        raise ValueError(f"{value!r} is not a time")
    return _to_time(parsed)


def _uuid32(value):
    if len(value) == 32:
        value = value.lower()
        return f"{value[:8]}-{value[8:12]}-{value[12:16]}-{value[16:20]}-{value[20:]}"
    return str(uuid.UUID(value))


def _float(value):
    return value if value.__class__ is float else float(value)


_INTERVAL = re.compile(
    r"^(?:(?P<years>[-+]?\d+) years? ?)?(?:(?P<months>[-+]?\d+) mons? ?)?"
    r"(?:(?P<days>[-+]?\d+) days? ?)?"
    r"(?:(?P<sign>[-+])?(?P<hours>\d+):(?P<minutes>\d\d):(?P<seconds>\d\d)(?:\.(?P<frac>\d+))?)?$"
)


def _interval(value):
    """PostgreSQL's interval text (IntervalStyle ``postgres``) as microseconds."""
    if value.__class__ is int:
        return value
    match = _INTERVAL.match(value)
    if match is None or not value:
        raise ValueError(f"{value!r} is not an interval")
    g = match.groupdict()
    # PostgreSQL's own conversions (EXTRACT(EPOCH ...)): a month is 30 days, a year 365.25.
    days = int(g["days"] or 0) + 30 * int(g["months"] or 0) + int(g["years"] or 0) * 36525 // 100
    clock = (int(g["hours"] or 0) * 60 + int(g["minutes"] or 0)) * 60 + int(g["seconds"] or 0)
    micros = clock * 1_000_000 + int(((g["frac"] or "") + "000000")[:6])
    if g["sign"] == "-":
        micros = -micros
    return days * 86_400_000_000 + micros


def _hex_base64(value):
    """Capture's ``hex()`` (SQLite) or PostgreSQL's ``\\x...`` text as base64."""
    if value.startswith("\\x"):
        value = value[2:]
    return base64.b64encode(binascii.unhexlify(value)).decode("ascii")


_DECODERS = {
    (BOOLEAN, "sqlite"): _bool,
    (BOOLEAN, ""): _bool,  # a table built by hand (no database): 0/1 may still arrive
    (DATETIME, "sqlite"): _datetime,
    (DATETIME, "postgresql"): _datetime,
    (DATETIME_NAIVE, "sqlite"): _datetime_naive,
    (DATETIME_NAIVE, "postgresql"): _datetime_naive,
    (TIME, "sqlite"): _time,
    (TIME, "postgresql"): _time,
    (UUID, "sqlite"): _uuid32,
    (DECIMAL, "sqlite"): _float,
    (DECIMAL, "postgresql"): _float,
    (DURATION, "postgresql"): _interval,
    (BINARY, "sqlite"): _hex_base64,
    (BINARY, "postgresql"): _hex_base64,
}


def decoder(encoding, vendor):
    """A function stored value (not null) -> wire value, or None when they agree."""
    return _DECODERS.get((encoding, vendor))


# --- Python -> wire ---------------------------------------------------------------------


def _parse_datetime(text):
    parsed = parse_datetime(text)
    if parsed is None:
        raise ValueError(f"{text!r} is not a datetime")
    return parsed


def _to_datetime(value):
    if timezone.is_naive(value):  # as Django reads a naive value under USE_TZ
        value = timezone.make_aware(value, timezone.get_default_timezone())
    return value.astimezone(_UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _to_datetime_naive(value):
    if timezone.is_aware(value):
        value = timezone.make_naive(value, timezone.get_default_timezone())
    return value.isoformat(timespec="microseconds")


def _to_time(value):
    return value.replace(tzinfo=None).isoformat(timespec="microseconds")


def _to_duration(value):
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds


def to_wire(encoding, value):
    """The wire form of ``value``, a Python value of a column of ``encoding``."""
    if value is None:
        return None
    if encoding in (DATETIME, DATETIME_NAIVE) and isinstance(value, datetime.datetime):
        return _to_datetime(value) if encoding == DATETIME else _to_datetime_naive(value)
    if encoding == DATE and isinstance(value, datetime.date):
        return value.isoformat()
    if encoding == TIME and isinstance(value, datetime.time):
        return _to_time(value)
    if encoding == UUID and isinstance(value, uuid.UUID):
        return str(value)
    if encoding == DURATION and isinstance(value, datetime.timedelta):
        return _to_duration(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if encoding == DECIMAL and not isinstance(value, bool):
        return float(value)
    if encoding == BOOLEAN and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and encoding in _CANONICAL:
        return _CANONICAL[encoding](value)
    return value


def from_db(encoding, vendor, value):
    """What the database driver returned for a column, in the wire form."""
    if value is None or encoding == "":
        return value
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        fn = decoder(encoding, vendor)
        if encoding == BINARY or fn is None:
            return to_wire(encoding, value)
        return fn(value)
    return to_wire(encoding, value)


# --- literals ---------------------------------------------------------------------------


def _canonical_datetime(text):
    return _to_datetime(_parse_datetime(text))


def _canonical_naive(text):
    return _to_datetime_naive(_parse_datetime(text))


def _canonical_date(text):
    parsed = parse_date(text)
    if parsed is None:
        raise ValueError(f"{text!r} is not a date")
    return parsed.isoformat()


def _canonical_time(text):
    parsed = parse_time(text)
    if parsed is None:
        raise ValueError(f"{text!r} is not a time")
    return _to_time(parsed)


def _canonical_uuid(text):
    return str(uuid.UUID(text))


_CANONICAL = {
    DATETIME: _canonical_datetime,
    DATETIME_NAIVE: _canonical_naive,
    DATE: _canonical_date,
    TIME: _canonical_time,
    UUID: _canonical_uuid,
}
_FORMS = {
    DATETIME: '"YYYY-MM-DDTHH:MM:SS.ffffffZ"',
    DATETIME_NAIVE: '"YYYY-MM-DDTHH:MM:SS.ffffff"',
    DATE: '"YYYY-MM-DD"',
    TIME: '"HH:MM:SS.ffffff"',
    UUID: "a UUID",
}


def canonical(encoding, value):
    """
    A client's literal for a column of ``encoding`` in the wire form; a string that is
    not a value of the column raises ValueError naming the form. Literals of another
    kind (a number against a datetime column) pass: the comparator orders kinds.
    """
    normalize = _CANONICAL.get(encoding)
    if normalize is None or not isinstance(value, str):
        return value
    try:
        return normalize(value)
    except (ValueError, TypeError, AttributeError):
        form = _FORMS[encoding]
        raise ValueError(f"{value!r} is not a {encoding} value; the wire form is {form}") from None


def stored(encoding, vendor, wire):
    """A wire literal (canonical, not null) as the SQL parameter to compare the column with."""
    if not isinstance(wire, str) and encoding != DURATION:
        return wire
    if encoding in (DATETIME, DATETIME_NAIVE):
        value = parse_datetime(wire)
        if encoding == DATETIME:
            value = value.astimezone(_UTC)
            if vendor == "sqlite":  # Django stores naive UTC text on SQLite
                value = value.replace(tzinfo=None)
        return str(value) if vendor == "sqlite" else value
    if encoding == TIME:
        value = parse_time(wire)
        return str(value) if vendor == "sqlite" else value
    if encoding == UUID:
        value = uuid.UUID(wire)
        return value.hex if vendor == "sqlite" else value
    if encoding == DATE and vendor == "postgresql":
        return parse_date(wire)
    if encoding == DURATION and vendor == "postgresql" and isinstance(wire, int):
        return datetime.timedelta(microseconds=wire)
    return wire


def to_stored(encoding, vendor, wire):
    """
    A wire value a machine writer sent (a producer, a change source, a room) as the
    parameter that stores it as Django would, so the stored forms of a column never
    mix; ValueError when it is not a value of the column.
    """
    if wire is None or encoding in ("", BOOLEAN, DECIMAL):
        return wire
    if encoding == BINARY:
        if not isinstance(wire, str):
            raise ValueError(f"{wire!r} is not base64 text")
        try:
            return base64.b64decode(wire, validate=True)
        except binascii.Error:
            raise ValueError(f"{wire!r} is not base64 text") from None
    if encoding == DURATION:
        if not isinstance(wire, int) or isinstance(wire, bool):
            raise ValueError(f"{wire!r} is not a duration in integer microseconds")
        return stored(encoding, vendor, wire)
    if not isinstance(wire, str):
        raise ValueError(f"{wire!r} is not a {encoding} value; the wire form is {_FORMS[encoding]}")
    return stored(encoding, vendor, canonical(encoding, wire))


# --- wire -> Python ---------------------------------------------------------------------


def from_wire(field, value):
    """``field``'s Python value for its wire value (``field.to_python`` but durations)."""
    if value is not None and field_encoding(field) == DURATION and isinstance(value, int):
        return datetime.timedelta(microseconds=value)
    return field.to_python(value)
