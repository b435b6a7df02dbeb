"""The dashboard's widgets: header, GPU panels (memory bar + history graph), tables, event log.

Every widget renders from immutable engine snapshots handed to it by the app; none of them
calls the engine.  The history graph is a small line-API widget that builds its rows once per
update (fixed 0..total axis, block characters, the budget line) — the stock ``Sparkline``
re-scales to its data and costs ~13 ms a frame.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Sequence

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.containers import Vertical
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import RichLog

from supervisor.jobs import JobState, JobView
from supervisor.snapshot import BackendView, EngineSnapshot, GpuView, LogLine
from vramtui.peaks import size_to_declare, suggested_peak_mib

from . import fmt
from .fmt import Clocks
from .table import Col, RowTable

# ----------------------------------------------------------------------------- helpers --


def titles(widget: Widget, title: str | None = None, subtitle: str | None = None) -> None:
    """Set border titles only when they change (each assignment repaints the whole widget)."""
    last: dict[str, str] = widget.__dict__.setdefault("_vt_titles", {})
    if title is not None and last.get("title") != title:
        widget.border_title = last["title"] = title
    if subtitle is not None and last.get("subtitle") != subtitle:
        widget.border_subtitle = last["subtitle"] = subtitle


# ----------------------------------------------------------------------------- header ---


class EngineHeader(Widget):
    """One line: engine mode, GPU source (SIMULATED unmissable), uptime, queue depth, clock."""

    def __init__(self, mode: str, clocks: Clocks, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.mode = mode
        self.clocks = clocks
        self.snap: EngineSnapshot | None = None
        self.gone: str | None = None
        self.readonly = False

    def show(self, snap: EngineSnapshot | None, gone: str | None, readonly: bool) -> None:
        self.snap, self.gone, self.readonly = snap, gone, readonly
        text = self._text()
        if self._shown is None or text.plain != self._shown.plain or text.spans != \
                self._shown.spans:
            self._shown = text
            self.refresh()

    _shown: Text | None = None

    def render(self) -> Text:
        if self._shown is None:
            self._shown = self._text()
        return self._shown

    def on_resize(self) -> None:
        self._shown = self._text()

    def _text(self) -> Text:
        width = self.size.width
        snap = self.snap
        short = 0 < width < 100  # 80 columns: the same facts, in fewer cells
        t = Text(no_wrap=True, overflow="ellipsis")
        sep = (" │ " if short else "  │  ", "dim")
        t.append(" vramtui ", style="bold reverse")
        t.append("  ")
        t.append("embedded" if self.mode == "embedded" else "attached", style="bold")
        if snap is not None:  # from each snapshot: an engine that restarted has a new pid
            t.append(f" pid {snap.pid}", style="dim")
        if self.readonly:
            t.append("  ")
            t.append(" READ-ONLY ", style="bold reverse blue")
        t.append(*sep)
        if snap is None:
            t.append("connecting…", style="dim")
        elif snap.simulated:
            t.append(" SIM GPU " if short else " SIMULATED GPU ", style=fmt.SIM_BADGE)
        else:
            drv = f" driver {snap.driver_version}" if snap.driver_version else ""
            t.append(f"{(snap.source or 'GPU').upper()}{drv}", style="bold green")
        if self.gone is not None:
            t.append("  ")
            t.append(f" ENGINE GONE: {self.gone} ", style="bold reverse red")
        if snap is not None:
            t.append(*sep)
            t.append(f"{'' if short else 'up '}{fmt.dur(snap.uptime_s)}", style="")
            draining = [g.index for g in snap.gpus if g.draining]
            if draining:
                t.append("  ")
                t.append(" DRAINING " + ",".join(f"GPU{i}" for i in draining) + " ",
                         style="bold reverse yellow")
            running = len(snap.running)
            t.append("  queue " if not short else "  queued ", style="dim")
            t.append(str(len(snap.queued)), style="bold yellow" if snap.queued else "bold")
            t.append("  running " if not short else " running ", style="dim")
            t.append(str(running), style="bold cyan" if running else "bold")
            if snap.descriptor_errors:
                n = len(snap.descriptor_errors)
                t.append(f"  ⚠ {n}" + ("" if short else
                                       f" descriptor error{'s' if n > 1 else ''}"),
                         style="bold red")
            if snap.stopping:
                t.append("  stopping…", style="bold #c678dd")
        clock = self.clocks.hms(self.clocks.wall())
        pad = width - t.cell_len - len(clock) - 1
        if pad > 0:
            t.append(" " * pad)
            t.append(clock + " ", style="dim")
        return t


# ----------------------------------------------------------------------------- memory ---


def bar_segments(g: GpuView) -> list[tuple[str, str, int, str]]:
    """The memory bar's parts: (label, char, MiB, style), in the order they are drawn."""
    ours = g.ours_mib
    reserved = g.reserved_mib
    foreign = g.foreign_mib or 0
    parts = [
        ("ours", "█", min(ours, reserved) if reserved else ours, fmt.SEG_OURS),
        ("reserved", "▒", max(0, reserved - ours), fmt.SEG_RESERVED),
        ("over", "▓", max(0, ours - reserved) if reserved else 0, fmt.SEG_OVER),
        ("foreign", "▞", foreign, fmt.SEG_FOREIGN),
    ]
    used = sum(p[2] for p in parts)
    parts.append(("free", "░", max(0, g.total_mib - used), fmt.SEG_FREE))
    return parts


class MemBar(Widget):
    """A bar of the GPU's total memory: ours, reserved-but-unused, over, foreign, free."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.gpu: GpuView | None = None

    def show(self, gpu: GpuView) -> None:
        old = self.gpu
        self.gpu = gpu
        if old is None or (old.ours_mib, old.reserved_mib, old.foreign_mib, old.total_mib,
                           old.used_mib) != (gpu.ours_mib, gpu.reserved_mib, gpu.foreign_mib,
                                             gpu.total_mib, gpu.used_mib):
            self.refresh()

    def render(self) -> Text:
        g = self.gpu
        if g is None:
            return Text("")
        used = g.used_mib if g.used_mib is not None else g.ours_mib + (g.foreign_mib or 0)
        label = f" {fmt.mib(used)} / {fmt.mib(g.total_mib)}"
        width = max(1, self.size.width - len(label))
        text = Text(no_wrap=True)
        cum = 0
        pos = 0
        total = max(1, g.total_mib)
        for _name, char, value, style in bar_segments(g):
            cum += value
            end = min(width, round(cum / total * width))
            if end > pos:
                text.append(char * (end - pos), style=style)
                pos = end
        if pos < width:
            text.append("░" * (width - pos), style=fmt.SEG_FREE)
        text.append(label, style="bold")
        return text


def legend(g: GpuView, *, short: bool = False) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    for name, char, value, style in bar_segments(g):
        if name == "over" and value == 0:
            continue
        if name == "foreign" and g.foreign_mib is None:
            t.append(f"{char} foreign n/a  ", style="dim")
            continue
        t.append(char, style=style)
        t.append(f" {name} ", style="dim")
        t.append(fmt.mib(value, compact=short), style="bold")
        t.append("  ")
    t.append("budget " if short else "budget left ", style="dim")
    t.append(fmt.mib(g.budget_mib, compact=short), style="bold yellow")
    return t


def gpu_stats(g: GpuView) -> str:
    if g.simulated:
        return "[b yellow on #8b008b] SIMULATED [/] no util/temp/power"
    parts = []
    parts.append(f"util {g.util_pct}%" if g.util_pct is not None else "util n/a")
    parts.append(f"{g.temp_c} °C" if g.temp_c is not None else "temp n/a")
    parts.append(f"{g.power_w:.0f} W" if g.power_w is not None else "power n/a")
    return " · ".join(parts)


# ----------------------------------------------------------------------------- graph ----

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


class Line(Widget):
    """One line of rich text that repaints without a layout pass (unlike Static.update)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.text = Text("")

    def set(self, text: Text) -> None:
        self.text = text
        self.refresh()

    def render(self) -> Text:
        return self.text


class GpuPanel(Vertical):
    """One GPU: title with util/temp/power, the memory bar, its legend, the history graph."""

    def __init__(self, index: int, **kwargs: object) -> None:
        super().__init__(id=f"gpu-{index}", classes="gpu-panel", **kwargs)  # type: ignore[arg-type]
        self.index = index
        self.bar = MemBar(classes="membar")
        self.legend = Line(classes="legend")
        self.graph = HistoryGraph(classes="graph")
        self._legend_key: object = None

    def compose(self):  # type: ignore[no-untyped-def]
        yield self.bar
        yield self.legend
        yield self.graph

    def show(self, g: GpuView, window_s: float, short: bool) -> None:
        sim = " [b yellow on #8b008b] SIM [/]" if g.simulated else ""
        drain = " [b reverse yellow] DRAINING [/]" if g.draining else ""
        titles(self, f"GPU{g.index} · {g.name}{sim}{drain}", gpu_stats(g))
        self.bar.show(g)
        key = (g.ours_mib, g.reserved_mib, g.foreign_mib, g.total_mib, g.budget_mib, short)
        if key != self._legend_key:
            self._legend_key = key
            self.legend.set(legend(g, short=short))
        if self.graph.display:
            self.graph.show(g.history, g.total_mib, g.total_mib - g.reserve_mib, window_s)


# ----------------------------------------------------------------------------- tables ---


_MIB = re.compile(r"\b(\d{4,}) MiB\b")


def compact_sizes(text: str) -> str:
    """``needs 13056 MiB`` -> ``needs 12.8G`` (a number and its unit are never cut apart)."""
    return _MIB.sub(lambda m: fmt.mib(int(m.group(1)), compact=True), text)


def _trim(text: str | None, n: int) -> str:
    """``text`` in ``n`` cells: cut at a word boundary when it can be, with an ellipsis."""
    if not text:
        return ""
    text = " ".join(text.split())
    if len(text) <= n:
        return text
    cut = text[: n - 1]
    space = cut.rfind(" ")
    if space >= n // 2:
        cut = cut[:space].rstrip(" ;,:")
    return cut + "…"


def over_declared_note(b: BackendView, narrow: bool) -> Text:
    """(``narrow``: the short form, for a Note column under 40 cells.)"""
    """For a backend whose jobs use more than its declared peak: the peak to declare (observed
    p95 + 5 %, rounded up to 64 MiB, as ``vramtui backends`` suggests); else empty."""
    suggested = suggested_peak_mib(b)
    if suggested is None:
        return Text("")
    new = size_to_declare(suggested).replace(" GiB", "G").replace(" MiB", "M")
    if narrow:
        return Text(f"peak→{new}", style="bold yellow")
    return Text(f"p95 {fmt.mib(b.observed_p95_mib, compact=True)} > declared "
                f"{fmt.mib(b.declared_peak_mib, compact=True)}: set peak {new}",
                style="bold yellow")


class BackendsTable(RowTable):
    COLUMNS = (
        Col("name", "Backend", 14, narrow_width=12),
        Col("state", "State", 13, narrow_width=12),
        Col("pid", "PID", 7, narrow_width=6),
        Col("gpu", "GPU", 3),
        Col("res", "Resident", 12, narrow_width=7),
        Col("peak", "Peak", 8, narrow_width=8),
        Col("prio", "Pri", 3, narrow=False),
        Col("jobs", "Jobs", 9, narrow=False),
        Col("last", "Last use", 9, narrow=False),
        Col("keep", "Keep", 6),
        Col("error", "Note", None),
    )

    def rows_for(self, snap: EngineSnapshot, query: str, clocks: Clocks
                 ) -> list[tuple[str, dict[str, object]]]:
        rows = []
        now = clocks.wall()
        mem_style = fmt.SIM_FIGURE if snap.simulated else ""
        err_w = self.last_width()
        for b in snap.backends:
            if not fmt.matches(query, b.name, b.state, b.description):
                continue
            last = fmt.ago(now - b.last_used) if b.last_used is not None else "never"
            sig = (b, last, mem_style, err_w, self.narrow)
            rows.append((b.name, self.memo(b.name, sig, lambda b=b, last=last: self._row(
                b, last, mem_style, err_w))))
        return rows

    def _row(self, b: BackendView, last: str, mem_style: str, err_w: int
             ) -> dict[str, object]:
        name = Text(b.name)
        state = fmt.state_text(b.state, fmt.BACKEND_STATE_STYLE)
        room = self.column_width("state")
        for extra, style in ((f" ▸{b.running}" if b.running else "", "cyan"),
                             (f" +{b.queued}q" if b.queued else "", "yellow")):
            if extra and state.cell_len + len(extra) <= room:  # the state is never cut
                state.append(extra, style=style)
        peak = b.peak_mib
        peak_t = Text(fmt.mib(peak, compact=True), style=mem_style)
        if b.declared_peak_mib is None and b.learned_peak_mib is not None:
            peak_t.append("~", style="dim")  # learned, not declared
        if b.over_declared:
            peak_t = Text(fmt.mib(b.observed_p95_mib, compact=True) + "!", style="bold red")
        note = over_declared_note(b, self.narrow or err_w < 40)
        if b.last_error:
            if note.plain:
                note.append(" · ")
            note.append(_trim(b.last_error, max(4, err_w - note.cell_len)), style="red")
        jobs = Text(str(b.jobs_served))
        keep = "pinned" if b.pinned else (
            fmt.dur(b.keep_alive_left_s) if b.keep_alive_left_s is not None else "")
        return {
            "name": name,
            "state": state,
            "pid": str(b.pid) if b.pid else "",
            "gpu": str(b.gpu) if b.gpu is not None else "",
            "res": Text(fmt.mib(b.observed_mib, compact=True)
                        if b.observed_mib is not None else "", style=mem_style),
            "peak": peak_t,
            "prio": str(b.priority),
            "jobs": jobs,
            "last": last,
            "keep": keep,
            "error": note,
        }


def job_time(j: JobView, now: float) -> str:
    """How long it ran (finished: its last run only), runs or has waited; ``now`` is wall
    clock, like every time a view carries."""
    if j.state.finished:
        ran = j.ran_s
        return fmt.dur(ran) if ran is not None else "–"
    if j.state is JobState.RUNNING and j.started_at is not None:
        return fmt.dur(now - j.started_at)
    return fmt.dur(now - j.submitted_at)


class JobsTable(RowTable):
    MARKS = True
    BINDINGS = [Binding("space", "toggle_mark", "Mark", show=False, id="mark",
                        tooltip="Mark the job (c then cancels every marked one)")]
    COLUMNS = (
        Col("id", "Job", 12),
        Col("backend", "Backend", 12, narrow_width=11),
        Col("state", "State", 10),
        Col("progress", "Progress", 13, narrow_width=10),
        Col("time", "Time", 6, narrow_width=5),
        Col("prio", "Pri", 3, narrow=False),
        Col("pos", "Pos", 3, narrow=False),
        Col("passed", "Pass", 4, narrow=False),
        Col("gpu", "GPU", 3, narrow=False),
        Col("note", "Note", None),
    )

    def rows_for(self, snap: EngineSnapshot, query: str, clocks: Clocks, recent: int
                 ) -> list[tuple[str, dict[str, object]]]:
        now = clocks.wall()
        rows = []
        bar_w = 5 if self.narrow else 8
        note_w = self.last_width()
        jobs = [*snap.running, *snap.queued, *snap.recent[:recent]]
        for j in jobs:
            if not fmt.matches(query, j.id, j.backend, j.state.value):
                continue
            t = job_time(j, now)
            sig = (j.state, j.progress, j.progress_text, j.position, j.passed, j.gpu,
                   j.waiting, j.error, j.status_code, j.priority, t, bar_w, note_w)
            rows.append((j.id, self.memo(j.id, sig, lambda j=j, t=t: self._row(
                j, t, bar_w, note_w))))
        return rows

    def _row(self, j: JobView, t: str, bar_w: int, note_w: int) -> dict[str, object]:
        state = fmt.state_text(j.state.value, fmt.JOB_STATE_STYLE)
        if j.state is JobState.QUEUED and j.position is not None:
            state.append(f" #{j.position}", style="yellow")
        if j.state in (JobState.RUNNING, JobState.STARTING):
            progress = fmt.progress_bar(j.progress, bar_w)
            note = Text(_trim(j.progress_text, note_w))
        elif j.state is JobState.QUEUED:
            progress = Text("")
            note = Text(_trim(compact_sizes(j.waiting), note_w), style="dim")
        else:  # finished: its last progress text is history (the job screen keeps it)
            progress = Text(f"HTTP {j.status_code}" if j.status_code else "",
                            style="green" if j.state is JobState.SUCCEEDED else "red")
            note = Text(_trim(j.error, note_w), style="red") if j.error else Text("")
        return {
            "id": j.id,
            "backend": j.backend,
            "state": state,
            "progress": progress,
            "time": t,
            "prio": str(j.priority),
            "pos": str(j.position) if j.position is not None else "",
            "passed": str(j.passed) if j.passed else "",
            "gpu": str(j.gpu) if j.gpu is not None else "",
            "note": note,
        }


class ProcessTable(RowTable):
    """Every process on each GPU (as nvitop lists them): ours named by backend, or foreign."""

    COLUMNS = (
        Col("gpu", "GPU", 3),
        Col("pid", "PID", 7),
        Col("user", "User", 8),
        Col("mem", "Memory", 7),
        Col("owner", "Backend", None),
    )

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self._owners: dict[str, str | None] = {}

    def owner(self, key: str) -> str | None:
        return self._owners.get(key)

    def rows_for(self, snap: EngineSnapshot, query: str) -> list[tuple[str, dict[str, object]]]:
        rows = []
        self._owners = {}
        style = fmt.SIM_FIGURE if snap.simulated else ""
        for g in snap.gpus:
            for p in g.processes:
                owner = p.backend
                if not fmt.matches(query, str(p.pid), p.user, owner or "foreign"):
                    continue
                key = f"{g.index}:{p.pid}"
                self._owners[key] = owner
                rows.append((key, {
                    "gpu": str(g.index), "pid": str(p.pid), "user": p.user,
                    "mem": Text(fmt.mib(p.used_mib, compact=True), style=style),
                    "owner": Text(owner) if owner else Text("foreign", style=fmt.SEG_FOREIGN),
                }))
        return rows


# ----------------------------------------------------------------------------- event log -


# The story of the queue at a glance: a mark for what each note says happened.
_MARKS = (("admitted", "▶ ", "green"), ("starting", "↑ ", "cyan"), ("evicting", "↓ ", "#c678dd"),
          ("finished", "✓ ", "green"), ("succeeded", "✓ ", "green"), ("calibrat", "◆ ", "cyan"),
          ("retrying", "↻ ", "cyan"), ("descriptors reloaded", "↻ ", "cyan"))


def log_text(line: LogLine, clocks: Clocks) -> Text:
    t = Text(no_wrap=False)
    t.append(clocks.hms(line.t) + " ", style="dim")
    marker = {"error": "✖ ", "warning": "▲ "}.get(line.level)
    if marker is None:
        head = line.text[:40].lower()
        found = next(((m, st) for word, m, st in _MARKS if word in head), None)
        if found is not None:
            t.append(found[0], style=found[1])
            t.append(line.text, style=fmt.LEVEL_STYLE.get(line.level, ""))
            return t
        marker = "· "
    style = fmt.LEVEL_STYLE.get(line.level, "")
    t.append(marker, style=style or "dim")
    t.append(line.text, style=style)
    return t


class RewrapLog(RichLog):
    """A RichLog that keeps what it was given and wraps it again when its width changes
    (a RichLog wraps each line once, at the width it had when the line came)."""

    def __init__(self, max_lines: int = 1000, **kwargs: object) -> None:
        super().__init__(wrap=True, markup=False, highlight=False, max_lines=max_lines,
                         min_width=20, **kwargs)  # type: ignore[arg-type]
        self._source: deque[Text] = deque(maxlen=max_lines)
        self._wrapped_at = 0

    def add(self, text: Text) -> None:
        self._source.append(text)
        self._write(text)

    HANG = 0  # cells of hanging indent for the lines a long entry wraps onto

    def _write(self, text: Text) -> None:
        width = self.scrollable_content_region.width
        if self.wrap and self._size_known and width > 0:
            if self.HANG and text.cell_len > width > self.HANG + 10:
                head, rest = text[: self.HANG], text[self.HANG:]
                lines = rest.wrap(self.app.console, width - self.HANG)
                out = Text()
                for i, line in enumerate(lines):
                    out.append_text(head if i == 0 else Text(" " * self.HANG))
                    out.append_text(line)
                    if i + 1 < len(lines):
                        out.append("\n")
                self.write(out, width=width)
            else:
                self.write(text, width=width)
        else:
            self.write(text)

    def reset(self) -> None:
        self._source.clear()
        self.clear()

    def on_resize(self) -> None:
        self.call_after_refresh(self._rewrap)

    def _rewrap(self) -> None:
        width = self.scrollable_content_region.width
        if width and width != self._wrapped_at:
            self._wrapped_at = width
            self.clear()
            for text in self._source:
                self._write(text)


class EventLog(RewrapLog):
    """The engine's log (admissions, evictions, crashes, refusals), appended as it grows;
    a long entry wraps under its text, never under its time."""

    HANG = 11  # "HH:MM:SS · "

    def __init__(self, clocks: Clocks, **kwargs: object) -> None:
        super().__init__(max_lines=500, **kwargs)
        self.clocks = clocks
        self._last: tuple[float, str] | None = None
        self._query = ""

    def show(self, lines: Sequence[LogLine], query: str, wrap: bool = True) -> None:
        if query != self._query or wrap != self.wrap:
            self._query = query
            self.wrap = wrap
            self._last = None
            self.reset()
        start = 0
        if self._last is not None:
            for i in range(len(lines) - 1, -1, -1):
                if (lines[i].t, lines[i].text) == self._last:
                    start = i + 1
                    break
            else:
                start = next((i for i, x in enumerate(lines) if x.t > self._last[0]),
                             len(lines))
        for line in lines[start:]:
            if fmt.matches(query, line.text, line.backend, line.level):
                self.add(log_text(line, self.clocks))
        if lines:
            self._last = (lines[-1].t, lines[-1].text)
