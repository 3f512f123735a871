"""The usage ledger's chart geometry, computed without a database or a request."""

from rindle_app.flow.charts import fleet_chart, humanize_bytes, namespace_chart, nice_scale

DAY = 20_000  # 2024-10-04, a UTC day number
MIB = 1024**2


def _bar_height(bar):
    return float(bar["in_h"]) + float(bar["out_h"])


def test_every_fleet_row_is_drawn_on_one_scale():
    """Two namespaces' equal days are equally tall, and the taller day is the peak."""
    days = list(range(DAY - 6, DAY + 1))
    rows = [
        ("big", {DAY: (3 * MIB, MIB), DAY - 1: (MIB, 0)}, "/big"),
        ("small", {DAY - 1: (MIB, 0)}, "/small"),
    ]
    chart = fleet_chart(days, rows)
    big, small = chart["rows"]
    assert [bar["day"] for bar in big["bars"]] == ["2024-10-03", "2024-10-04"]
    assert _bar_height(big["bars"][0]) == _bar_height(small["bars"][0])
    assert _bar_height(big["bars"][1]) == 4 * _bar_height(big["bars"][0])
    assert chart["scale"] == humanize_bytes(nice_scale(4 * MIB)[0])
    assert big["total"] == "5 MiB" and small["url"] == "/small"


def test_a_day_that_moved_a_byte_is_never_rounded_away():
    """Beside a day of a GiB, a day of one byte is still two units tall; idle days get no bar."""
    days = [DAY - 1, DAY, DAY + 1]
    chart = namespace_chart("acme", days, {DAY - 1: (1024**3, 0), DAY: (0, 1)})
    tiny = next(bar for bar in chart["bars"] if bar["bytes"] == 1)
    assert _bar_height(tiny) == 2.0 and float(tiny["in_h"]) == 0.0
    assert [bar["day"] for bar in chart["bars"]] == ["2024-10-03", "2024-10-04"]


def test_the_namespace_axis_ticks_are_round_byte_figures_from_zero():
    """The byte axis runs from 0 to the scale's top in equal round steps, top drawn highest."""
    chart = namespace_chart("acme", [DAY], {DAY: (3 * MIB + 130 * 1024, 0)})
    top, step = nice_scale(3 * MIB + 130 * 1024)
    assert [t["text"] for t in chart["ticks"]] == [
        humanize_bytes(n) for n in range(0, top + 1, step)
    ]
    ys = [float(t["y"]) for t in chart["ticks"]]
    assert ys == sorted(ys, reverse=True) and ys[0] == chart["base"]


def test_a_long_window_labels_about_seven_days_and_always_the_last():
    """Ninety days get a date label every thirteenth day, counted back from today."""
    days = list(range(DAY - 89, DAY + 1))
    axis = namespace_chart("acme", days, {})["axis"]
    assert 6 <= len(axis) <= 8
    assert axis[-1]["text"] == "Oct 04"
