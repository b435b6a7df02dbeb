"""`PhaseChart`: memory over a calibration run, with one coloured band per phase and a
label row; `phase_legend` names the bands' colours, `phase_kind` and `phase_label` say
what colour and name a phase gets.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from supervisor.calibration.record import run_of

from .. import fmt

PHASE_KINDS = ("load", "settle", "predict", "shutdown")
PHASE_BG = {"load": "#2e2748", "settle": "#16303d", "predict": "#453410", "shutdown": "#47201f",
            "end": "#1a1a1a"}
PHASE_FG = {"load": "#b7a6ff", "settle": "#86c6e6", "predict": "#ffd27a", "shutdown": "#ff9b9b",
            "end": "#8a8a8a"}
BAR_COLOUR = "#8ae234"  # the chart's columns (the memory used)
_SHORT = {"initialize": "init", "settle-load": "settle", "shutdown": "stop", "exited": "exit",
          "start": "go"}


def phase_kind(phase: str) -> str:
    """The band colour of a phase: load, settle, predict, shutdown, or end."""
    if phase in ("start", "initialize"):
        return "load"
    if phase.startswith("predict"):
        return "predict"
    if phase.startswith("settle"):
        return "settle"
    if phase in ("shutdown", "exited"):
        return "shutdown"
    return "end"


def phase_label(phase: str, width: int) -> str:
    """The longest name of ``phase`` that fits ``width`` cells with a space to spare
    (``predict-2`` -> ``p2``); empty when not even that fits."""
    run = run_of(phase)
    names = [phase, _SHORT.get(phase, "")]
    if run is not None:
        names.append(f"{run[0][0]}{run[1]}")
    names.append(phase[0])
    for name in names:
        if name and len(name) < width:
            return name
    return phase[0] if width == 1 else ""


def _styles() -> dict[tuple[str, str], Style]:
    out: dict[tuple[str, str], Style] = {}
    for kind, bg in (*PHASE_BG.items(), ("none", "")):
        bgcolor = bg or None
        out[(kind, "bar")] = Style(color=BAR_COLOUR, bgcolor=bgcolor)
        out[(kind, "label")] = Style(color=PHASE_FG.get(kind, "#8a8a8a"), bgcolor=bgcolor,
                                     bold=True)
        out[(kind, "peak")] = Style(color="yellow", bgcolor=bgcolor)
    out[("axis", "axis")] = Style(color="#7f7f7f")
    out[("axis", "peak")] = Style(color="yellow", bold=True)
    return out


_STYLES = _styles()


def nice_top(value: int) -> int:
    """An axis top a little above ``value`` (MiB), on a round step."""
    if value <= 0:
        return 1024
    target = value * 1.08
    step = 64 if target <= 1024 else 256 if target <= 4096 else 1024 if target <= 32768 \
        else 4096
    return int(math.ceil(target / step) * step)


def live_span(elapsed: float) -> float:
    """The live chart's time axis: the elapsed time and some room, on 5 s steps."""
    return max(10.0, math.ceil(elapsed * 1.15 / 5.0) * 5.0)


@dataclass(frozen=True)
class _Model:
    """Everything one drawing of the chart depends on (compared to skip redraws)."""

    width: int
    height: int
    label_w: int
    plot_w: int
    rows: int
    label_row: bool
    axis_row: bool
    top: int
    span: float
    levels: tuple[int | None, ...]  # per column, in eighths of a row
    kinds: tuple[str, ...]  # per column, the band's kind ("none" before the first band)
    labels: tuple[tuple[int, str, str], ...]  # (column, text, kind)
    peak: int | None
    peak_row: int | None


class PhaseChart(Widget):
    """Memory over a calibration run, 0..top, with one coloured band per phase and a label row.

    ``show()`` folds the samples into one column each (the highest reading in the column's
    time slice, carried over slices with no reading) and redraws only when a column, a band
    or the size changed; the strips are built once per change, on the next render.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._series: Sequence[tuple[float, int]] = ()
        self._bands: tuple[tuple[float, str], ...] = ()
        self._span = 10.0
        self._now: float | None = None
        self._peak: int | None = None
        self._model: _Model | None = None
        self._built: _Model | None = None
        self._strips: list[Strip] = []
        self.builds = 0

    def show(self, series: Sequence[tuple[float, int]], bands: Sequence[tuple[float, str]],
             span: float, peak: int | None = None, now: float | None = None) -> None:
        """``span``: the time axis (s); ``peak``: a line at the measured peak; ``now``: where
        the run is (live), the last band ends there."""
        self._series, self._bands = series, tuple(bands)
        self._span, self._peak, self._now = max(span, 1e-3), peak, now
        model = self._make_model(self.size)
        if model != self._model:
            self._model = model
            self.refresh()

    def on_resize(self) -> None:
        self.show(self._series, self._bands, self._span, self._peak, self._now)

    @property
    def columns(self) -> tuple[int | None, ...]:
        return self._model.levels if self._model is not None else ()

    def _make_model(self, size: Size) -> _Model:
        width, height = size.width, size.height
        values = [v for _t, v in self._series]
        top = nice_top(max([*values, self._peak or 0, 0]))
        label_w = max(len(fmt.mib(top, compact=True)),
                      len(fmt.mib(self._peak, compact=True)) if self._peak else 0) + 1
        label_row = height >= 3
        axis_row = height >= 5
        rows = max(1, height - label_row - axis_row)
        plot_w = max(1, width - label_w)
        span = self._span
        dt = span / plot_w
        cols: list[int | None] = [None] * plot_w
        last = -1
        for t, v in self._series:
            i = min(plot_w - 1, max(0, int(t / dt)))
            cur = cols[i]
            cols[i] = v if cur is None or v > cur else cur
            last = max(last, i)
        carry: int | None = None
        for i in range(last + 1):  # carry readings over slices with none
            c = cols[i]
            if c is None:
                cols[i] = carry
            else:
                carry = c
        levels = tuple(None if c is None else round(c / top * rows * 8) for c in cols)
        starts = [t for t, _p in self._bands]
        now = span if self._now is None else min(span, self._now)
        kinds: list[str] = []
        j = -1
        for i in range(plot_w):
            mid = (i + 0.5) * dt
            while j + 1 < len(starts) and starts[j + 1] <= mid:
                j += 1
            kinds.append("none" if j < 0 or i * dt > now else phase_kind(self._bands[j][1]))
        labels: list[tuple[int, str, str]] = []
        for k, (start, phase) in enumerate(self._bands):
            end = self._bands[k + 1][0] if k + 1 < len(self._bands) else max(now, start + dt)
            c0 = min(plot_w, int(start / dt + 0.5))
            c1 = min(plot_w, int(end / dt + 0.5))
            text = phase_label(phase, c1 - c0)
            if text:
                labels.append((c0, text, phase_kind(phase)))
        peak_row = None
        if self._peak is not None:
            peak_row = min(rows - 1, max(0, math.ceil(self._peak / top * rows) - 1))
        return _Model(width, height, label_w, plot_w, rows, label_row, axis_row, top, span,
                      levels, tuple(kinds), tuple(labels), self._peak, peak_row)

    def render_line(self, y: int) -> Strip:
        model = self._model
        if model is None or (model.width, model.height) != (self.size.width,
                                                            self.size.height):
            self._model = model = self._make_model(self.size)
        if model is not self._built:
            self._strips = self._build(model)
            self._built = model
        return self._strips[y] if y < len(self._strips) else Strip.blank(self.size.width)

    def _build(self, m: _Model) -> list[Strip]:
        self.builds += 1
        if m.width <= 0 or m.height <= 0:
            return []
        axis = _STYLES[("axis", "axis")]
        strips: list[Strip] = []

        def line(pieces: list[tuple[str, Style]]) -> list[Segment]:
            segs: list[Segment] = []
            run: list[str] = []
            style: Style | None = None
            for ch, st in pieces:
                if st is not style and run:
                    segs.append(Segment("".join(run), style))
                    run = []
                style = st
                run.append(ch)
            if run:
                segs.append(Segment("".join(run), style))
            return segs

        if m.label_row:
            chars = [" "] * m.plot_w
            kinds = list(m.kinds)
            for c0, text, kind in m.labels:
                for k, ch in enumerate(text):
                    if c0 + k < m.plot_w:
                        chars[c0 + k] = ch
                        kinds[c0 + k] = kind
            head = Segment(" " * m.label_w, axis)
            strips.append(Strip([head, *line([(ch, _STYLES[(kd, "label")])
                                              for ch, kd in zip(chars, kinds, strict=True)])],
                                m.width))
        mid_row = (m.rows - 1) // 2 if m.rows >= 5 else None
        for y in range(m.rows):
            r = m.rows - 1 - y
            if y == 0:
                lab = fmt.mib(m.top, compact=True)
            elif y == m.rows - 1:
                lab = "0"
            elif y == mid_row:
                lab = fmt.mib(m.top // 2, compact=True)
            else:
                lab = ""
            lab_style = axis
            if m.peak_row is not None and r == m.peak_row and 0 < y < m.rows - 1:
                lab, lab_style = fmt.mib(m.peak, compact=True), _STYLES[("axis", "peak")]
            pieces: list[tuple[str, Style]] = []
            for lv, kind in zip(m.levels, m.kinds, strict=True):
                n = 0 if lv is None else min(8, max(0, lv - r * 8))
                if n == 0 and r == m.peak_row:
                    pieces.append(("╌", _STYLES[(kind, "peak")]))
                else:
                    pieces.append((fmt.BLOCKS[n], _STYLES[(kind, "bar")]))
            strips.append(Strip([Segment(lab.rjust(m.label_w - 1), lab_style),
                                 Segment("┤", axis), *line(pieces)], m.width))
        if m.axis_row:
            marks = list("─" * m.plot_w)
            for pos, text in ((0, "0s"), (m.plot_w // 2 - 2, fmt.dur(m.span / 2)),
                              (m.plot_w - len(fmt.dur(m.span)), fmt.dur(m.span))):
                for k, ch in enumerate(text):
                    if 0 <= pos + k < m.plot_w:
                        marks[pos + k] = ch
            strips.append(Strip([Segment(" " * (m.label_w - 1) + "└", axis),
                                 Segment("".join(marks), axis)], m.width))
        return strips


def phase_legend(extra: Text | None = None) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    if extra is not None:
        t.append_text(extra)
        t.append("   ")
    for kind in PHASE_KINDS:
        t.append(f" {kind} ", style=Style(color=PHASE_FG[kind], bgcolor=PHASE_BG[kind], bold=True))
        t.append(" ")
    return t
