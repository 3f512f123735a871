"""
The wire encoding of a synced model's values (``engine.values``, docs/protocol.md
"Value encoding"): one form per field type on both backends, the same for a row
read at hydration and for the same row arriving as an incremental change, and
round-trippable to the model field.
"""

import base64
import datetime
import decimal
import uuid
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, models
from django.test.utils import isolate_apps
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rindle_app.engine.values import from_wire
from rindle_app.ivm.live import LiveQueries
from rindle_app.ivm.sql import run_query
from rindle_app.stream.reader import read_query
from rindle_app.testing import publish_watermark
from tests.conftest import examples

pytestmark = pytest.mark.django_db(transaction=True)

UTC = datetime.UTC

with isolate_apps("project.demo"):

    class Typed(models.Model):
        """One field of each type a synced model may have."""

        id = models.IntegerField(primary_key=True)
        at = models.DateTimeField(null=True)
        day = models.DateField(null=True)
        clock = models.TimeField(null=True)
        amount = models.DecimalField(max_digits=12, decimal_places=2, null=True)
        uid = models.UUIDField(null=True)
        span = models.DurationField(null=True)
        blob = models.BinaryField(null=True)
        flag = models.BooleanField(null=True)
        doc = models.JSONField(null=True)
        ratio = models.FloatField(null=True)
        label = models.TextField(null=True)
        count = models.BigIntegerField(null=True)

        class Meta:
            app_label = "demo"
            db_table = "wire_typed"
            managed = False

    class Keyed(models.Model):
        """A UUID primary key (32 hex digits in SQLite's outbox key) and a datetime."""

        uid = models.UUIDField(primary_key=True)
        at = models.DateTimeField()

        class Meta:
            app_label = "demo"
            db_table = "wire_keyed"
            managed = False


FIELDS = [f for f in Typed._meta.concrete_fields if not f.primary_key]


def spec(field, value):
    """The documented wire form of a Python value, written from the table in the docs."""
    if value is None:
        return None
    kind = field.get_internal_type()
    if kind == "DateTimeField":
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if kind == "DateField":
        return value.strftime("%Y-%m-%d")
    if kind == "TimeField":
        return value.strftime("%H:%M:%S.%f")
    if kind == "DecimalField":
        return float(value)
    if kind == "UUIDField":
        return str(value)
    if kind == "DurationField":
        return value // datetime.timedelta(microseconds=1)
    if kind == "BinaryField":
        return base64.b64encode(bytes(value)).decode()
    return value


def same_value(field, a, b):
    """Equal as the database keeps them (bytes for a BinaryField's memoryview)."""
    if isinstance(a, memoryview) or isinstance(b, memoryview):
        return bytes(a) == bytes(b)
    return a == b


@pytest.fixture
def typed(engine):
    with connection.cursor() as cursor:
        cursor.execute('DROP TABLE IF EXISTS "wire_typed"')
    with connection.schema_editor() as editor:
        editor.create_model(Typed)
    engine.register_existing_table("wire_typed", model=Typed)
    yield engine
    with connection.cursor() as cursor:
        cursor.execute('DROP TABLE IF EXISTS "wire_typed"')


# Text neither backend refuses: no NUL (PostgreSQL's text and jsonb hold none).
characters = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
text = st.text(characters)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(characters, max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(characters, max_size=3), inner)
    ),
    max_leaves=5,
)
values = st.fixed_dictionaries(
    {
        "at": st.none()
        | st.datetimes(
            datetime.datetime(1900, 1, 1),
            datetime.datetime(2200, 1, 1),
            timezones=st.sampled_from([UTC, ZoneInfo("Europe/Paris"), ZoneInfo("Asia/Tokyo")]),
        ),
        "day": st.none() | st.dates(datetime.date(1000, 1, 1)),
        "clock": st.none() | st.times(),
        "amount": st.none()
        | st.decimals(-(10**10) + 1, 10**10 - 1, places=2, allow_nan=False, allow_infinity=False),
        "uid": st.none() | st.uuids(),
        "span": st.none()
        | st.timedeltas(-datetime.timedelta(days=10**5), datetime.timedelta(days=10**5)),
        "blob": st.none() | st.binary(max_size=12),
        "flag": st.none() | st.booleans(),
        "doc": json_values,
        # SQLite's printf('%!.17g') (capture's float rendering) loses the last digit
        # of some large doubles (1e241 seen): a capture limit, not the encoding's.
        "ratio": st.none() | st.floats(-1e15, 1e15),
        "label": st.none() | text,
        "count": st.none() | st.integers(-(2**63), 2**63 - 1),
    }
)


@settings(
    max_examples=examples(25),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=st.lists(values, min_size=1, max_size=3))
def test_every_field_type_has_one_wire_form_in_snapshots_and_increments(typed, rows):
    """
    A value written through the ORM reaches a live view in the documented form,
    whether the view read it at hydration or received it as a change afterwards; the
    SQL read (the SSR route's) agrees, and ``from_wire`` gives back what the ORM reads.
    """
    Typed.objects.all().delete()
    for i, row in enumerate(rows):
        Typed.objects.create(id=2 * i, **row)
    publish_watermark()
    live = LiveQueries(typed).start()
    shared = live.catalog.register({"table": "wire_typed"})
    hydrated = {r["id"]: r for r in shared.view.result()}
    for i, row in enumerate(rows):
        Typed.objects.create(id=2 * i + 1, **row)
    publish_watermark()
    _version, _outputs, faults = live.poll()
    assert faults == []
    view = shared.view.result()
    assert view == run_query(shared.query, connection, typed.tables)
    _cv, ssr = read_query(typed.using, shared.query, typed.tables)
    assert [r["cols"] for r in ssr] == view
    by_id = {r["id"]: r for r in view}
    for i in range(len(rows)):
        before, after = hydrated[2 * i], by_id[2 * i + 1]
        stored = Typed.objects.get(id=2 * i)
        for field in FIELDS:
            wire = before[field.column]
            assert wire == after[field.column], field.name
            assert type(wire) is type(after[field.column]), field.name
            assert wire == spec(field, getattr(stored, field.attname)), field.name
            assert same_value(field, from_wire(field, wire), getattr(stored, field.attname))


def test_the_wire_forms_of_one_row(typed):
    """The documented forms, value by value, on this backend."""
    Typed.objects.create(
        id=1,
        at=datetime.datetime(2026, 12, 1, 19, 6, 57, tzinfo=UTC),
        day=datetime.date(2026, 12, 1),
        clock=datetime.time(9, 5),
        amount=decimal.Decimal("12.50"),
        uid=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        span=datetime.timedelta(days=1, microseconds=1),
        blob=b"\x00\xff",
        flag=True,
        doc={"a": [1, "x"]},
        ratio=0.1,
        label="x",
        count=2**62,
    )
    publish_watermark()
    live = LiveQueries(typed).start()
    (row,) = live.catalog.register({"table": "wire_typed"}).view.result()
    assert row == {
        "id": 1,
        "at": "2026-12-01T19:06:57.000000Z",
        "day": "2026-12-01",
        "clock": "09:05:00.000000",
        "amount": 12.5,
        "uid": "12345678-1234-5678-1234-567812345678",
        "span": 86_400_000_001,
        "blob": "AP8=",
        "flag": True,
        "doc": {"a": [1, "x"]},
        "ratio": 0.1,
        "label": "x",
        "count": 2**62,
    }


def test_a_room_footprint_renders_the_same_encoding(typed):
    """
    A room's footprint (read by the SQL oracle) and the committed rows a room write
    compares against (read by the driver) hold the values a live view holds.
    """
    from rindle_app import rooms
    from rindle_app.engine import rooms as engine_rooms

    for pk in (1, 2):
        Typed.objects.create(
            id=pk,
            at=datetime.datetime(2026, 12, 1, 19, 6, 57, 785916, tzinfo=UTC),
            day=datetime.date(2026, 12, 1),
            clock=datetime.time(23, 59, 59),
            amount=decimal.Decimal("-0.05"),
            uid=uuid.uuid4(),
            span=datetime.timedelta(days=-2, seconds=5),
            blob=b"\x01\x02",
            flag=pk == 1,
            doc=[1, {"x": None}],
            ratio=2.5,
            label="é",
            count=-1,
        )
    publish_watermark()
    live = LiveQueries(typed).start()
    view = live.catalog.register({"table": "wire_typed", "orderBy": [["id", "asc"]]}).view.result()
    profile = rooms.RoomProfile(
        "typed",
        key=lambda args: str(args["id"]),
        footprint=lambda key, ctx: {
            "table": "wire_typed",
            "where": {
                "type": "simple",
                "op": "<=",
                "left": {"type": "column", "name": "id"},
                "right": {"type": "literal", "value": int(key)},
            },
        },
    )
    footprint = rooms.load_footprint(typed, profile, "2")
    assert sorted(footprint["wire_typed"], key=lambda r: r["id"]) == view
    current = typed.write(
        lambda tx: engine_rooms._read_keys(tx, tx.tables.get("wire_typed"), [[1], [2]])
    ).value
    assert sorted(current, key=lambda r: r["id"]) == view
    assert view[0]["span"] == -2 * 86_400_000_000 + 5_000_000 and view[0]["flag"] is True


WIRE_ROW = {
    "at": "2026-12-01T19:06:57.785916Z",
    "day": "2026-12-01",
    "clock": "09:05:00.000000",
    "amount": 1.5,
    "uid": "12345678-1234-5678-1234-567812345678",
    "span": -86_400_000_001,
    "blob": "AP8=",
    "flag": True,
    "doc": {"a": [1]},
    "ratio": 0.25,
    "label": "x",
    "count": 7,
}


def test_a_machine_writer_sends_wire_values_and_they_are_stored_as_django_stores_them(typed):
    """
    A producer's (or change source's, or room's) row in the wire encoding is stored
    in the form the ORM stores, so one column never holds two forms; the ORM reads
    back the field values and the live view sends the row as it was written.
    """
    from rindle_app.engine.changes import apply_changes, parse_changes

    def write(changes):
        return typed.write(
            lambda tx: apply_changes(tx, parse_changes(tx.tables, changes, limit=10))
        ).value

    assert write([{"table": "wire_typed", "op": "add", "row": {"id": 1, **WIRE_ROW}}]) == 1
    stored = Typed.objects.get(id=1)
    Typed.objects.create(id=2, **{f.attname: getattr(stored, f.attname) for f in FIELDS})
    for field in FIELDS:
        assert same_value(
            field, getattr(stored, field.attname), from_wire(field, WIRE_ROW[field.name])
        )
    with connection.cursor() as cursor:
        # JSON text may differ in spacing between writers; every other column is the
        # very same stored value.
        columns = ", ".join(f'"{f.column}"' for f in FIELDS if f.name != "doc")
        cursor.execute(f'SELECT {columns} FROM "wire_typed" ORDER BY "id"')
        first, second = cursor.fetchall()
    assert first == second
    publish_watermark()
    live = LiveQueries(typed).start()
    view = live.catalog.register({"table": "wire_typed"}).view.result()
    assert view == [{"id": 1, **WIRE_ROW}, {"id": 2, **WIRE_ROW}]
    edit = {
        "table": "wire_typed",
        "op": "edit",
        "old": {"id": 1},
        "row": {"at": "2027-01-01T00:00:00Z"},
    }
    assert write([edit]) == 1
    assert Typed.objects.get(id=1).at == datetime.datetime(2027, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "column, value",
    [("at", "yesterday"), ("uid", "not-a-uuid"), ("span", "1 day"), ("blob", "*"), ("day", 3)],
)
def test_a_written_value_that_is_not_one_of_the_column_is_refused(typed, column, value):
    from rindle_app.engine import InvalidInput
    from rindle_app.engine.changes import apply_changes, parse_changes

    changes = [{"table": "wire_typed", "op": "add", "row": {"id": 1, column: value}}]
    with pytest.raises(InvalidInput) as info:
        typed.write(lambda tx: apply_changes(tx, parse_changes(tx.tables, changes, limit=10)))
    assert info.value.code == "invalid_value" and f"wire_typed.{column}" in str(info.value)
    assert not Typed.objects.exists()


def test_without_use_tz_a_datetime_is_local_time_without_a_zone(engine, settings):
    """USE_TZ=False: the same fixed-width form, naive, without the ``Z``."""
    settings.USE_TZ = False
    with connection.cursor() as cursor:
        cursor.execute('DROP TABLE IF EXISTS "wire_typed"')
    with connection.schema_editor() as editor:
        editor.create_model(Typed)
    try:
        engine.register_existing_table("wire_typed", model=Typed)
        Typed.objects.create(id=1, at=datetime.datetime(2026, 12, 1, 19, 6, 57))
        publish_watermark()
        live = LiveQueries(engine).start()
        (row,) = live.catalog.register({"table": "wire_typed"}).view.result()
        assert row["at"] == "2026-12-01T19:06:57.000000"
        field = Typed._meta.get_field("at")
        assert from_wire(field, row["at"]) == Typed.objects.get(id=1).at
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE IF EXISTS "wire_typed"')


def simple(column, op, value):
    return {
        "type": "simple",
        "op": op,
        "left": {"type": "column", "name": column},
        "right": {"type": "literal", "value": value},
    }


def test_a_client_literal_is_normalized_to_the_column_form_and_both_evaluations_agree(typed):
    """
    ``at >= "2026-12-01T20:00:00+01:00"`` means the UTC instant: the parsed query holds
    the fixed-width form, and the live view and the SQL read select the same rows.
    """
    from rindle_app.ivm.ast import parse

    for pk, hour in enumerate((18, 19, 20)):
        Typed.objects.create(
            id=pk, at=datetime.datetime(2026, 12, 1, hour, tzinfo=UTC), uid=uuid.UUID(int=pk)
        )
    ast = {
        "table": "wire_typed",
        "where": {
            "type": "and",
            "conditions": [
                simple("at", ">=", "2026-12-01T20:00:00+01:00"),
                simple("uid", "IN", [str(uuid.UUID(int=1)).upper(), str(uuid.UUID(int=2))]),
            ],
        },
        "orderBy": [["at", "desc"]],
    }
    query = parse(ast, typed.tables)
    assert query.where.conditions[0].value == "2026-12-01T19:00:00.000000Z"
    assert query.where.conditions[1].value == (str(uuid.UUID(int=1)), str(uuid.UUID(int=2)))
    publish_watermark()
    live = LiveQueries(typed).start()
    view = live.catalog.register(ast).view.result()
    assert [r["id"] for r in view] == [2, 1]
    assert view == run_query(query, connection, typed.tables)


@pytest.mark.parametrize(
    "condition, message",
    [
        (simple("at", ">=", "yesterday"), "'yesterday' is not a datetime value"),
        (simple("uid", "=", "x"), "'x' is not a uuid value"),
        (simple("at", "LIKE", "2026%"), "LIKE on the datetime column wire_typed.at"),
        (simple("day", "LIKE", "2026%"), "LIKE on the date column wire_typed.day"),
        (simple("blob", "=", "AP8="), "the binary column wire_typed.blob can only be tested"),
    ],
)
def test_a_literal_that_is_not_a_value_of_its_column_is_refused(typed, condition, message):
    from rindle_app.ivm.ast import QueryError, parse

    with pytest.raises(QueryError) as info:
        parse({"table": "wire_typed", "where": condition}, typed.tables)
    assert message in str(info.value)


def test_an_order_by_a_binary_column_is_refused(typed):
    """Base64 text and the stored bytes order differently: the view and SQL would disagree."""
    from rindle_app.ivm.ast import QueryError, parse

    with pytest.raises(QueryError) as info:
        parse({"table": "wire_typed", "orderBy": [["blob", "asc"]]}, typed.tables)
    assert info.value.code == "unsupported" and info.value.path == "$.orderBy[0][0]"
    assert "orderBy on the binary column wire_typed.blob" in str(info.value)


def test_the_change_stream_sends_keys_and_images_in_the_wire_encoding(engine):
    """GET /v1/stream's events carry the key and the images as a live view does."""
    from rindle_app.stream.page import read_page

    with connection.cursor() as cursor:
        cursor.execute('DROP TABLE IF EXISTS "wire_keyed"')
    with connection.schema_editor() as editor:
        editor.create_model(Keyed)
    try:
        engine.register_existing_table("wire_keyed", model=Keyed)
        uid = uuid.uuid4()
        Keyed.objects.create(uid=uid, at=datetime.datetime(2026, 12, 1, tzinfo=UTC))
        publish_watermark()
        page = read_page(
            # A Postgres outbox emptied by a flush keeps counting its seqs: scan them all.
            engine.using, tables=["wire_keyed"], limit=10, scan=10**12, schema=engine.tables,
        )  # fmt: skip
        (event,) = page.events
        assert event["key"] == [str(uid)]
        assert event["new"] == {"uid": str(uid), "at": "2026-12-01T00:00:00.000000Z"}
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE IF EXISTS "wire_keyed"')
