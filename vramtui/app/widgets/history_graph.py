"""`HistoryGraph`: a GPU's used memory over the last 1 or 10 minutes.

A small line-API widget that builds its rows once per update (fixed 0..total axis, block
characters, the budget line) — the stock ``Sparkline`` re-scales to its data and costs
~13 ms a frame.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from .. import fmt

_GRAPH_STYLES = {
    "ok": Style.parse("green"),
    "high": Style.parse("yellow"),
    "over": Style.parse("bold #ff3b3b"),
    "budget": Style.parse("yellow"),
    "axis": Style.parse("#7f7f7f"),
    "empty": Style.parse(""),
}


class HistoryGraph(Widget):
    """Used memory over the last 1 or 10 minutes on a fixed 0..total axis, with the budget line.

    Time is cut into fixed buckets (one per column, aligned to the clock, not to the newest
    sample), so a new sample only touches the newest bucket: ``show()`` folds in the samples
    it has not seen, and the rows are rebuilt (once, on the next render) and repainted only
    when a column's height or colour really changes.
    """

    MIN_REDRAW_S = 1.0  # the graph scrolls at most once a second (a column is >= 0.8 s)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._drawn_at = 0.0
        self._total = 1
        self._budget = 1
        self._window = 60.0
        self._buckets: dict[int, int] = {}
        self._geom: object = None
        self._last_t: float | None = None
        self._last_bucket: int | None = None
        self._scale: tuple[int, int] | None = None
        self._points: Sequence[tuple[float, int]] = ()
        self._cols: list[int | None] = []
        self._key: object = None
        self._built_key: object = None
        self._strips: list[Strip] = []
        self.builds = 0

    def _layout(self, width: int, height: int) -> tuple[int, int, int, bool]:
        """(label width, plot width, plot rows, has a time axis row)."""
        labels = [fmt.mib(self._total, compact=True), fmt.mib(self._total // 2, compact=True)]
        label_w = max(len(x) for x in labels) + 1
        axis_row = height >= 5
        return label_w, max(1, width - label_w), max(1, height - 1 if axis_row else height), \
            axis_row

    def show(self, points: Sequence[tuple[float, int]], total: int, budget: int,
             window_s: float) -> None:
        self._points = points
        self._total, self._budget, self._window = total, budget, window_s
        width, height = self.size
        if width <= 0 or height <= 0:
            return
        _, plot_w, rows, _ = self._layout(width, height)
        step = window_s / plot_w
        geom = (plot_w, step)
        fresh = (geom != self._geom or not points or self._last_t is None
                 or points[-1][0] < self._last_t)
        if fresh:
            self._buckets = {}
            self._geom = geom
            new = points
        else:
            n = 0
            for t, _v in reversed(points):
                if t <= self._last_t:  # type: ignore[operator]
                    break
                n += 1
            new = points[len(points) - n:] if n else ()
        buckets = self._buckets
        changed = fresh
        for t, v in new:
            b = int(t // step)
            if v > buckets.get(b, -1):
                buckets[b] = v
                changed = True
        if points:
            self._last_t = points[-1][0]
            last = int(points[-1][0] // step)
            changed = changed or last != self._last_bucket
            self._last_bucket = last
            if not changed and (total, budget) == self._scale:
                return  # same columns as before: nothing to redraw
            first = last - plot_w + 1
            for b in [b for b in buckets if b < first]:
                del buckets[b]
            cols: list[int | None] = [buckets.get(b) for b in range(first, last + 1)]
            carry: int | None = None
            for i, c in enumerate(cols):  # carry values over gaps between samples
                if c is None:
                    cols[i] = carry
                else:
                    carry = c
        else:
            cols = [None] * plot_w
        self._scale = (total, budget)
        self._cols = cols
        levels = tuple(None if c is None else (round(c / max(1, total) * rows * 8),
                                               self._colour(c)) for c in cols)
        key = (levels, total, budget, window_s, width, height)
        if key != self._key:
            now = time.monotonic()
            if not fresh and now - self._drawn_at < self.MIN_REDRAW_S:
                self._last_bucket = None  # not drawn yet: look again on the next snapshot
                return
            self._drawn_at = now
            self._key = key
            self.refresh()

    def _colour(self, value: int) -> str:
        budget = min(self._total, self._budget)
        return "over" if value > budget else "high" if value > 0.85 * budget else "ok"

    def on_resize(self) -> None:
        self._geom = None
        self.show(self._points, self._total, self._budget, self._window)

    def render_line(self, y: int) -> Strip:
        size = self.size
        if (self._key, size) != self._built_key:
            self._strips = self._build(size)
            self._built_key = (self._key, size)
        return self._strips[y] if y < len(self._strips) else Strip.blank(size.width)

    def columns(self, plot_w: int) -> list[int | None]:
        """The maximum used MiB in each time bucket, oldest first (None: no data yet)."""
        cols = list(self._cols)
        if len(cols) != plot_w:
            cols = ([None] * plot_w + cols)[-plot_w:]
        return cols

    def _build(self, size: Size) -> list[Strip]:
        self.builds += 1
        width, height = size.width, size.height
        if width <= 0 or height <= 0:
            return []
        total = max(1, self._total)
        labels = [fmt.mib(total, compact=True), fmt.mib(total // 2, compact=True), "0"]
        label_w, plot_w, rows, axis_row = self._layout(width, height)
        cols = self.columns(plot_w)
        budget = min(total, self._budget)
        budget_row = min(rows - 1, int(budget / total * rows - 1e-9))
        levels = [None if c is None else round(c / total * rows * 8) for c in cols]
        col_style = [_GRAPH_STYLES["empty"] if c is None else _GRAPH_STYLES[self._colour(c)]
                     for c in cols]
        axis = _GRAPH_STYLES["axis"]
        strips: list[Strip] = []
        for y in range(rows):
            r = rows - 1 - y  # row index from the bottom
            if y == 0:
                lab = labels[0]
            elif y == rows - 1:
                lab = labels[2]
            elif y == (rows - 1) // 2 and rows >= 5:
                lab = labels[1]
            else:
                lab = ""
            segs = [Segment(lab.rjust(label_w - 1) + "┤", axis)]
            run_chars: list[str] = []
            run_style: Style | None = None
            for i in range(plot_w):
                lv = levels[i]
                n = 0 if lv is None else min(8, max(0, lv - r * 8))
                if n == 0 and r == budget_row:
                    ch, st = "╌", _GRAPH_STYLES["budget"]
                else:
                    ch, st = fmt.BLOCKS[n], col_style[i]
                if st is not run_style and run_chars:
                    segs.append(Segment("".join(run_chars), run_style))
                    run_chars = []
                run_style = st
                run_chars.append(ch)
            if run_chars:
                segs.append(Segment("".join(run_chars), run_style))
            strips.append(Strip(segs, width))
        if axis_row:
            minutes = self._window / 60
            left = f"-{minutes:g}m"
            mid = f"-{minutes / 2:g}m"
            line = list("─" * plot_w)
            for pos, text in ((0, left), (plot_w // 2 - len(mid) // 2, mid),
                              (plot_w - 3, "now")):
                for k, ch in enumerate(text):
                    if 0 <= pos + k < plot_w:
                        line[pos + k] = ch
            strips.append(Strip([Segment(" " * (label_w - 1) + "└", axis),
                                 Segment("".join(line), axis)], width))
        return strips
