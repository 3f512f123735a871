"""
The usage ledger's SVG charts as plain numbers: bar geometry, axes and byte labels.

Pure functions of figures (no database, no request), so the admin's templates only
place what these compute and the geometry is unit-tested on its own.
"""

from .figures import day_date

_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def humanize_bytes(n):
    """``n`` bytes in binary units, three significant figures: ``"12.3 MiB"``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in _BYTE_UNITS:
        value /= 1024
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            break
    text = f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{text.removesuffix('.0')} {unit}"


def nice_scale(peak, ticks=4):
    """
    ``(top, step)`` of an axis from 0 that holds ``peak`` bytes: ``step`` is 1, 2 or
    5 times a power of ten of a binary unit (KiB, MiB ...), so every tick label is a
    round number.
    """
    if peak <= 0:
        return 1, 1
    raw = peak / ticks
    unit = 1
    while unit * 1024 <= raw:
        unit *= 1024
    for factor in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1024):
        step = factor * unit
        if step >= raw:
            break
    step = max(1, int(step))
    return -(-peak // step) * step, step


# Geometry of the charts, in SVG user units (the SVG scales to the page width).
_FLEET = {"label": 200, "plot": 640, "total": 110, "row": 42, "bar": 32, "top": 30, "foot": 44}
_DETAIL = {"left": 80, "plot": 800, "right": 20, "height": 220, "top": 16, "foot": 48}


def _day_bars(series, days, left, slot, bar_w, base, scale, namespace=None):
    """One bar per day of ``days`` that moved bytes; ``scale``: pixels per byte."""
    bars = []
    for i, d in enumerate(days):
        b_in, b_out = series.get(d, (0, 0))
        if not b_in + b_out:
            continue
        day = day_date(d).isoformat()
        title = (
            f"{namespace + ' · ' if namespace else ''}{day}: {humanize_bytes(b_in + b_out)} "
            f"(in {humanize_bytes(b_in)}, out {humanize_bytes(b_out)})"
        )
        x = left + slot * i + (slot - bar_w) / 2
        bar = _bar(x, bar_w, base, scale * (b_in + b_out), b_in, b_out, title)
        bar["day"] = day
        bar["bytes"] = b_in + b_out
        bars.append(bar)
    return bars


def _bar(x, width, base, height, bytes_in, bytes_out, title):
    """One stacked bar (bytes in below, bytes out above); a day that moved bytes
    is at least two units tall, so activity never rounds away."""
    total = bytes_in + bytes_out
    if total and height < 2:
        height = 2.0
    h_in = height * bytes_in / total if total else 0.0
    return {
        "x": f"{x:.2f}",
        "width": f"{width:.2f}",
        "in_y": f"{base - h_in:.2f}",
        "in_h": f"{h_in:.2f}",
        "out_y": f"{base - height:.2f}",
        "out_h": f"{height - h_in:.2f}",
        "title": title,
    }


def _day_labels(days):
    """Indexes of the days that get a date label: about seven, the last always."""
    every = max(1, -(-len(days) // 7))
    last = len(days) - 1
    return {i for i in range(len(days)) if (last - i) % every == 0}


def fleet_chart(days, rows):
    """
    The fleet's bytes per day as small multiples: one row per namespace, every
    row on ONE scale (so rows compare), with a date axis and the scale printed.
    ``rows`` is ``[(namespace, {day: (bytes_in, bytes_out)}, url)]``.
    """
    g = _FLEET
    peak = max((i + o for _ns, series, _url in rows for i, o in series.values()), default=0)
    top, _step = nice_scale(peak)
    slot = g["plot"] / len(days)
    bar_w = max(1.0, slot * 0.8)
    labelled = _day_labels(days)
    width = g["label"] + g["plot"] + g["total"]
    height = g["top"] + g["row"] * len(rows) + g["foot"]
    axis = [
        {"x": f"{g['label'] + slot * (i + 0.5):.2f}", "text": day_date(d).strftime("%b %d")}
        for i, d in enumerate(days)
        if i in labelled
    ]
    chart_rows = []
    for n, (namespace, series, url) in enumerate(rows):
        y0 = g["top"] + g["row"] * n
        base = y0 + g["row"] - 4
        bars = _day_bars(series, days, g["label"], slot, bar_w, base, g["bar"] / top, namespace)
        total = sum(i + o for i, o in series.values())
        chart_rows.append(
            {
                "namespace": namespace,
                "label": namespace if len(namespace) <= 26 else namespace[:25] + "…",
                "url": url,
                "y": y0,
                "text_y": base - g["bar"] / 2 + 4,
                "base": base,
                "ceiling": base - g["bar"],
                "total": humanize_bytes(total),
                "bars": bars,
            }
        )
    return {
        "width": width,
        "height": height,
        "plot_x0": g["label"],
        "plot_x1": g["label"] + g["plot"],
        "total_x": width - 4,
        "axis_y": g["top"] - 10,
        "legend_y": height - g["foot"] + 22,
        "scale": humanize_bytes(top),
        "rows": chart_rows,
        "axis": axis,
        "days": len(days),
        # A faint band behind today's column: today is still counting.
        "today_x": f"{g['label'] + slot * (len(days) - 1):.2f}",
        "today_w": f"{slot:.2f}",
        "today_h": g["row"] * len(rows),
        "rows_y": g["top"],
    }


def namespace_chart(namespace, days, series):
    """One namespace's bytes per day as a bar chart with a labelled byte axis.
    ``series`` is ``{day: (bytes_in, bytes_out)}``."""
    g = _DETAIL
    peak = max((i + o for i, o in series.values()), default=0)
    top, step = nice_scale(peak)
    slot = g["plot"] / len(days)
    bar_w = max(1.0, slot * 0.75)
    base = g["top"] + g["height"]
    ticks = [
        {"y": f"{base - g['height'] * value / top:.2f}", "text": humanize_bytes(value)}
        for value in range(0, top + 1, step)
    ]
    bars = _day_bars(series, days, g["left"], slot, bar_w, base, g["height"] / top)
    labelled = _day_labels(days)
    return {
        "namespace": namespace,
        "width": g["left"] + g["plot"] + g["right"],
        "height": g["top"] + g["height"] + g["foot"],
        "plot_x0": g["left"],
        "plot_x1": g["left"] + g["plot"],
        "tick_x": g["left"] - 6,
        "base": base,
        "label_y": base + 18,
        "legend_y": base + 40,
        "ticks": ticks,
        "bars": bars,
        "axis": [
            {"x": f"{g['left'] + slot * (i + 0.5):.2f}", "text": day_date(d).strftime("%b %d")}
            for i, d in enumerate(days)
            if i in labelled
        ],
        "days": len(days),
    }
