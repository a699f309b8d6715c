"""Inside the jail: the data of a matplotlib figure a cell leaves open, as a chart (the shape
E2B's code interpreter returns, so its SDK reads it): line and scatter plots give their points,
bar charts their bars, pie charts their wedges; a figure of several axes is a `superchart` of
one chart per axes; any other kind of axes is `unknown`, with no elements.

It reads the figure after it was drawn (tick labels exist only then) and never changes it.
Standard library only; matplotlib is imported only when a cell has made a figure.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

MIME = "application/vnd.execbox.chart+json"  # the output a figure's chart comes as
MAX_POINTS = 20_000  # points, bars and wedges of one figure: past it, no chart (the PNG stays)
_UNIT = re.compile(r"\s\((.*?)\)|\[(.*?)\]")


class TooLarge(Exception):
    """The figure has more data than a chart carries."""


def chart(figure: Any) -> dict[str, Any] | None:
    """The figure's chart, or None for a figure with no data (or too much of it)."""
    axes = figure.get_axes()
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    budget = [MAX_POINTS]
    try:
        if len(axes) > 1:
            return {
                "type": "superchart",
                "title": _text(figure.get_suptitle()),
                "elements": [_axes_chart(ax, budget) for ax in axes],
            }
        return _axes_chart(axes[0], budget)
    except TooLarge:
        return None


def _axes_chart(ax: Any, budget: list[int]) -> dict[str, Any]:
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Rectangle, Wedge

    lines = [line for line in ax.get_lines() if not _rule(line)]
    collections, patches = list(ax.collections), list(ax.patches)
    if lines and not collections and not patches:
        return _points(ax, "line", [(_line_label(line), line) for line in lines], budget)
    if collections and not lines and not patches:
        if all(isinstance(c, PathCollection) for c in collections):
            return _points(ax, "scatter", [(c.get_label(), c) for c in collections], budget)
    if patches and not lines and not collections:
        if all(isinstance(p, Wedge) for p in patches):
            return _pie(ax, patches, budget)
        bars = [c for c in ax.containers if isinstance(c, BarContainer)]
        if bars and all(isinstance(p, Rectangle) for p in patches):
            return _bars(ax, bars, budget)
    return {"type": "unknown", "title": _text(ax.get_title()), "elements": []}


def _rule(line: Any) -> bool:
    """A horizontal or vertical rule (axhline, axvline) drawn over a chart of another kind."""
    xs, ys = line.get_xdata(), line.get_ydata()
    return len(xs) == 2 and len(ys) == 2 and (xs[0] == xs[1] or ys[0] == ys[1])


def _line_label(line: Any) -> str:
    label = str(line.get_label())
    return f"Line {label[6:]}" if label.startswith("_child") else label


def _spend(budget: list[int], n: int) -> None:
    budget[0] -= n
    if budget[0] < 0:
        raise TooLarge


def _frame(ax: Any, swap: bool = False) -> dict[str, Any]:
    """Title, axis labels and the units named in them ("Time (s)", "Mass [kg]")."""
    x_label, y_label = _text(ax.get_xlabel()), _text(ax.get_ylabel())
    if swap:
        x_label, y_label = y_label, x_label
    return {
        "title": _text(ax.get_title()),
        "x_label": x_label,
        "y_label": y_label,
        "x_unit": _unit(x_label),
        "y_unit": _unit(y_label),
    }


def _points(ax: Any, kind: str, series: list[tuple[str, Any]], budget: list[int]) -> dict[str, Any]:
    elements = []
    for label, artist in series:
        # Counted before the points are copied: a figure of millions would not fit beside them.
        if kind == "line":
            xs, ys = artist.get_xdata(), artist.get_ydata()
            _spend(budget, min(len(xs), len(ys)))
            pairs = list(zip(xs, ys, strict=False))
        else:
            offsets = artist.get_offsets()
            _spend(budget, len(offsets))
            pairs = [tuple(xy) for xy in offsets]
        elements.append({"label": str(label), "points": [[_value(x), _value(y)] for x, y in pairs]})
    found: dict[str, Any] = {"type": kind, **_frame(ax)}
    for name, axis, ticks in (("x", ax.xaxis, ax.get_xticks()), ("y", ax.yaxis, ax.get_yticks())):
        labels = [t.get_text() for t in axis.get_ticklabels()]
        dated = _dated(axis)
        found[f"{name}_ticks"] = [_tick(t, dated) for t in ticks]
        found[f"{name}_tick_labels"] = labels
        found[f"{name}_scale"] = _scale(axis, dated)
    found["elements"] = elements
    return found


def _bars(ax: Any, containers: list[Any], budget: list[int]) -> dict[str, Any]:
    horizontal = all(getattr(c, "orientation", "vertical") == "horizontal" for c in containers)
    axis = ax.yaxis if horizontal else ax.xaxis
    names = {
        float(t): lab.get_text()
        for t, lab in zip(axis.get_ticklocs(), axis.get_ticklabels(), strict=False)
    }
    elements = []
    for number, container in enumerate(containers):
        group = str(container.get_label())
        if group.startswith("_container"):
            group = f"Group {number}"
        _spend(budget, len(container))
        for rect in container:
            where = (
                rect.get_y() + rect.get_height() / 2
                if horizontal
                else rect.get_x() + rect.get_width() / 2
            )
            value = rect.get_width() if horizontal else rect.get_height()
            label = next(
                (n for t, n in names.items() if math.isclose(t, where, abs_tol=1e-9)), None
            )
            elements.append(
                {
                    "label": label if label is not None else f"{where:g}",
                    "group": group,
                    "value": _number(value),
                }
            )
    return {"type": "bar", **_frame(ax, swap=horizontal), "elements": elements}


def _pie(ax: Any, wedges: list[Any], budget: list[int]) -> dict[str, Any]:
    _spend(budget, len(wedges))
    elements = [
        {
            "label": str(w.get_label()),
            "angle": _number(abs(w.theta2 - w.theta1)),
            "radius": _number(w.r),
        }
        for w in wedges
    ]
    return {"type": "pie", "title": _text(ax.get_title()), "elements": elements}


def _dated(axis: Any) -> bool:
    converter = axis.get_converter() if hasattr(axis, "get_converter") else None
    return type(converter).__module__ == "matplotlib.dates"


def _scale(axis: Any, dated: bool) -> str:
    if dated:
        return "datetime"
    scale = str(axis.get_scale())
    if scale == "linear" and type(axis.get_units()).__module__ == "matplotlib.category":
        return "categorical"
    return scale


def _tick(tick: Any, dated: bool) -> Any:
    if dated:
        from matplotlib.dates import num2date

        return num2date(float(tick)).isoformat()
    return _value(tick)


def _value(v: Any) -> Any:
    """A plotted value as JSON: numbers as floats (NaN and infinities as null), dates in ISO
    8601, anything else (categories) as text."""
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    if type(v).__name__ == "datetime64":
        return str(v.astype("datetime64[s]"))
    if isinstance(v, str):
        return v
    try:
        return _number(float(v))
    except (TypeError, ValueError):
        return str(v)


def _number(v: Any) -> float | None:
    f = float(v)
    return f if math.isfinite(f) else None


def _text(s: Any) -> str | None:
    return str(s) if s else None


def _unit(label: str | None) -> str | None:
    match = _UNIT.search(label) if label else None
    return (match.group(1) or match.group(2)) if match else None
