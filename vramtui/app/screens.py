"""Screens: the dashboard, job and backend details, help, the submit and confirm dialogs.

Screens render from the snapshot the app hands them (``show_snapshot``) and never call the
engine themselves: every command goes through the app's ``request_*`` methods, which confirm
when asked to and run the facade call in a thread worker.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.screen import ModalScreen, Screen
from textual.widgets import (
    Button,
    Footer,
    Input,
    Label,
    RichLog,
    Select,
    Static,
    TextArea,
)
from textual.widgets._footer import FooterKey

from supervisor.jobs import JobState, JobView
from supervisor.snapshot import BackendView, EngineSnapshot
from vramtui.peaks import size_to_declare, suggested_peak_mib

from . import fmt
from .table import RowTable
from .widgets import (
    BackendsTable,
    EngineHeader,
    EventLog,
    GpuPanel,
    JobsTable,
    MemBar,
    RewrapLog,
    job_time,
    titles,
)

if TYPE_CHECKING:
    from .app import VramApp


class KeyFooter(Footer):
    """The footer, with the less common keys marked ``-minor`` (hidden when narrow)."""

    MINOR = frozenset({"zero", "calibrate", "details", "graph_window", "follow", "backend"})

    def __init__(self, *, minor: frozenset[str] = MINOR, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.minor = minor

    def compose(self) -> ComposeResult:
        for widget in super().compose():
            if isinstance(widget, FooterKey) and widget.action in self.minor:
                widget.add_class("-minor")
            yield widget


class SnapshotScreen(Screen[None]):
    """A screen that renders snapshots; the app calls ``show_snapshot`` only on the top one."""

    @property
    def vapp(self) -> VramApp:
        return self.app  # type: ignore[return-value]

    def header(self) -> EngineHeader:
        return EngineHeader(self.vapp.mode, self.vapp.clocks, id="header")

    def show_snapshot(self, snap: EngineSnapshot | None) -> None:
        self.query_one(EngineHeader).show(snap, self.vapp.gone, self.vapp.readonly)

    def on_screen_resume(self) -> None:
        self.refresh_snapshot()

    def on_resize(self) -> None:
        self.refresh_snapshot()

    def refresh_snapshot(self) -> None:
        """Show the app's latest snapshot now (if this screen's widgets are there yet)."""
        with contextlib.suppress(NoMatches):
            self.show_snapshot(self.vapp.snap)


# =============================================================================== dashboard


def _b(key: str, action: str, description: str, tooltip: str, **kw: Any) -> Binding:
    return Binding(key, action, description, tooltip=tooltip, id=action, **kw)


DASHBOARD_BINDINGS = [
    _b("e", "evict", "Evict", "Stop the selected backend's worker and free its memory"),
    _b("r", "respawn", "Respawn", "Restart the selected backend's worker (a new process)"),
    _b("c", "cancel_job", "Cancel", "Cancel the selected job (queued or running)"),
    _b("p", "preload", "Preload", "Start the selected backend's worker now, before any job"),
    _b("z", "zero", "Evict idle", "Evict every idle backend (frees all memory not in use)"),
    _b("k", "calibrate", "Calibrate", "Measure the selected backend's real peak memory"),
    _b("s", "submit", "Submit", "Submit a job: backend, payload, priority"),
    _b("d", "demo", "Demo", "Submit a demo workload to the simulated demo backends"),
    _b("enter", "details", "Details", "Details of the selected backend or job"),
    _b("slash", "filter", "Filter", "Filter backends, jobs and events by text",
       key_display="/"),
    _b("g", "graph_window", "1m/10m", "Switch the memory graphs between 1 and 10 minutes"),
    Binding("escape", "clear_filter", "Clear filter", show=False, id="clear_filter",
            tooltip="Clear the filter"),
]


class Dashboard(SnapshotScreen):
    """GPUs, backends, jobs and the event log at a glance."""

    BINDINGS = DASHBOARD_BINDINGS

    def __init__(self) -> None:
        super().__init__()
        self._gpu_count = -1
        self._gpu_layout: object = None
        self._demo_hinted = False

    def compose(self) -> ComposeResult:
        yield self.header()
        yield Static("", id="banner")
        yield Vertical(id="gpus")
        yield BackendsTable(id="backends")
        with Horizontal(id="lower"):
            yield JobsTable(id="jobs")
            yield EventLog(self.vapp.clocks, id="log")
        yield Input(placeholder="filter: backend, job id or state (esc clears)", id="filter")
        # narrow, "d Demo" takes the place of "p Preload" (also in the palette and help)
        yield KeyFooter(compact=True, minor=KeyFooter.MINOR | {"preload"})

    def on_mount(self) -> None:
        backends = self.query_one(BackendsTable)
        backends.border_title = "Backends"
        jobs = self.query_one(JobsTable)
        jobs.border_title = "Jobs"
        self.query_one(EventLog).border_title = "Events"
        self.query_one("#filter", Input).display = False
        backends.focus()

    # -- rendering ------------------------------------------------------------------------
    @property
    def narrow(self) -> bool:
        return self.size.width < 120

    def show_snapshot(self, snap: EngineSnapshot | None) -> None:
        super().show_snapshot(snap)
        app = self.vapp
        banner = self.query_one("#banner", Static)
        banner.display = app.gone is not None
        if app.gone is not None:
            seen = app.last_ok_wall
            age = "never" if seen is None else fmt.ago(app.clocks.wall() - seen)
            banner.update(Text.assemble(
                ("The engine is gone: ", "bold"), app.gone,
                f" — retrying every {app.retry_s:g} s; the data below is from {age}."))
        if snap is None:
            return
        self._show_gpus(snap)
        narrow = self.narrow
        query = app.filter_text
        backends = self.query_one(BackendsTable)
        sim = snap.simulated
        labels = {"res": "Res SIM" if narrow else "Resident SIM",
                  "peak": "Peak SIM"} if sim else {}
        backends.set_columns(narrow, labels)
        backends.sync(backends.rows_for(snap, query, app.clocks))
        sub = f"{len(snap.backends)} configured"
        if sim:
            sub += " · [b #d7afff]memory figures are SIMULATED[/]"
        if app.demo_mode and not app.readonly:
            sub += " · demo: [b]d[/] runs a demo workload"
        titles(backends, subtitle=sub)
        jobs = self.query_one(JobsTable)
        jobs.set_columns(narrow)
        jobs.sync(jobs.rows_for(snap, query, app.clocks, recent=8 if narrow else 20))
        titles(jobs, subtitle=f"{len(snap.running)} running · {len(snap.queued)} queued · "
                                f"{len(snap.recent)} finished")
        log = self.query_one(EventLog)
        if log.display:
            log.show(snap.log, query, wrap=not narrow)
            if app.demo_mode and not app.readonly and not self._demo_hinted:
                self._demo_hinted = True  # once, on the first start in demo mode
                log.add(Text.assemble((app.clocks.hms(app.clocks.wall()) + " ", "dim"),
                                      ("▸ Simulated demo: press ", "bold cyan"),
                                      ("d", "bold reverse cyan"),
                                      (" to run a demo workload (12 jobs)", "bold cyan")))
        titles(backends, f"Backends · filter [b]{query}[/]" if query else "Backends")

    def _show_gpus(self, snap: EngineSnapshot) -> None:
        box = self.query_one("#gpus", Vertical)
        n = len(snap.gpus)
        if n != self._gpu_count:
            box.remove_children()
            box.mount_all([GpuPanel(g.index) for g in snap.gpus])
            self._gpu_count = n
            self._gpu_layout = None
            self.call_after_refresh(self.show_snapshot, snap)
            return
        w, h = self.size
        layout = (n, w, h)
        narrow = self.narrow
        if layout != self._gpu_layout:
            self._gpu_layout = layout
            cols = 1 if narrow or n == 1 else 2
            box.set_class(cols == 2, "-grid")
            grid_rows = math.ceil(n / cols) if n else 1
            share = h * (0.25 if narrow and h < 36 else 0.3 if h < 36 else 0.4)
            per = int(share / grid_rows)
            graph_h = per - 4  # border(s), bar, legend
            for panel in box.query(GpuPanel):
                panel.graph.display = graph_h >= 2
                panel.legend.display = per >= 3 or not narrow
                if graph_h >= 2:
                    panel.graph.styles.height = min(graph_h, 12)
        short = narrow
        for panel, g in zip(box.query(GpuPanel), snap.gpus, strict=False):
            panel.show(g, self.vapp.graph_window, short)

    # -- selection ------------------------------------------------------------------------
    def selected_backend(self) -> str | None:
        return self.query_one(BackendsTable).selected_key()

    def selected_job(self) -> str | None:
        return self.query_one(JobsTable).selected_key()

    def _need(self, value: str | None, what: str) -> str | None:
        if value is None:
            self.notify(f"Select a {what} first (arrow keys or click; tab switches tables)",
                        severity="warning")
        return value

    # -- actions ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "demo" and not self.vapp.demo_mode:
            return False  # only with the simulated demo backends: not shown
        if self.vapp.readonly and action in MUTATING:
            return None  # shown disabled in the footer
        return True

    def action_demo(self) -> None:
        self.vapp.request_demo_workload()

    def action_evict(self) -> None:
        if name := self._need(self.selected_backend(), "backend"):
            self.vapp.request_evict(name)

    def action_respawn(self) -> None:
        if name := self._need(self.selected_backend(), "backend"):
            self.vapp.request_respawn(name)

    def action_preload(self) -> None:
        if name := self._need(self.selected_backend(), "backend"):
            self.vapp.request_preload(name)

    def action_cancel_job(self) -> None:
        if job := self._need(self.selected_job(), "job"):
            self.vapp.request_cancel(job)

    def action_zero(self) -> None:
        self.vapp.request_zero()

    def action_calibrate(self) -> None:
        self.vapp.request_calibrate(self.selected_backend())

    def action_submit(self) -> None:
        self.vapp.open_submit(self.selected_backend())

    def action_graph_window(self) -> None:
        self.vapp.toggle_graph_window()

    def action_details(self) -> None:
        focused = self.focused
        if isinstance(focused, JobsTable):
            if job := self._need(self.selected_job(), "job"):
                self.vapp.open_job(job)
        elif name := self._need(self.selected_backend(), "backend"):
            self.vapp.open_backend(name)

    @on(RowTable.Selected)
    def _row_selected(self, event: RowTable.Selected) -> None:
        key = event.key
        if isinstance(event.table, JobsTable):
            self.vapp.open_job(key)
        else:
            self.vapp.open_backend(key)

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.value or box.display:
            box.value = ""
            box.display = False
            self.vapp.set_filter("")
            self.query_one(BackendsTable).focus()

    @on(Input.Changed, "#filter")
    def _filter_changed(self, event: Input.Changed) -> None:
        self.vapp.set_filter(event.value.strip())

    @on(Input.Submitted, "#filter")
    def _filter_done(self, event: Input.Submitted) -> None:
        box = self.query_one("#filter", Input)
        if not box.value:
            box.display = False
        self.query_one(BackendsTable).focus()

    def key_escape(self) -> None:
        self.action_clear_filter()


MUTATING = frozenset({"evict", "respawn", "cancel_job", "preload", "zero", "submit",
                      "calibrate", "cancel_this", "demo", "cancel_run"})


# =============================================================================== log tail


class LogTail:
    """The tail of a worker's log file, read incrementally (call from a thread)."""

    def __init__(self, path: str, first_bytes: int = 32768) -> None:
        self.path = path
        self.offset: int | None = None
        self.first_bytes = first_bytes
        self._partial = b""
        # Two reads may overlap (a worker thread per snapshot; an "exclusive" worker's thread
        # is not stopped): one at a time, or both would hand over the same lines.
        self._lock = threading.Lock()

    def read(self) -> tuple[list[str], str | None]:
        """New complete lines since the last call, and a note when the file is missing."""
        with self._lock:
            return self._read()

    def _read(self) -> tuple[list[str], str | None]:
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return [], f"(no log yet: {self.path})"
        if self.offset is not None and size == self.offset:
            return [], None
        first = self.offset is None or size < self.offset
        start = max(0, size - self.first_bytes) if first else self.offset or 0
        if first:
            self._partial = b""
        with open(self.path, "rb") as f:
            f.seek(start)
            data = f.read(size - start)
        self.offset = start + len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if first and start > 0 and lines:
            lines = lines[1:]  # the first line was cut in the middle
        return [ln.decode(errors="replace") for ln in lines], None


# =============================================================================== details


def kv(rows: Iterable[tuple[str, Any]]) -> Table:
    table = Table.grid(padding=(0, 1))
    table.add_column(style="dim", no_wrap=True)
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, v if isinstance(v, Text) else Text(str(v)))
    return table


class DetailScreen(SnapshotScreen):
    """Shared parts of the job and backend screens: header, back key, a followed log tail."""

    BINDINGS = [
        Binding("escape,backspace", "back", "Back", id="back", tooltip="Back to the dashboard"),
        Binding("f", "follow", "Follow log", id="follow",
                tooltip="Keep the log at its end as it grows (toggle)"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.tail: LogTail | None = None
        self.follow = True

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_follow(self) -> None:
        self.follow = not self.follow
        log = self.query_one("#worker-log", RichLog)
        log.auto_scroll = self.follow
        if self.follow:
            log.scroll_end(animate=False)
        self._log_title()
        self.notify("following the log" if self.follow else "log paused at this point")

    def _log_title(self) -> None:
        log = self.query_one("#worker-log", RichLog)
        name = Path(self.tail.path).name if self.tail else "?"
        titles(log, f"Worker log · {name}",
               "following (f)" if self.follow else "paused (f to follow)")

    def read_log(self, path: str) -> None:
        if self.tail is None or self.tail.path != path:
            self.tail = LogTail(path)
            self.query_one("#worker-log", RewrapLog).reset()
            self._log_title()
        if self.follow or self.tail.offset is None:
            self._read_tail(self.tail)

    @work(thread=True, exclusive=True, group="tail")
    def _read_tail(self, tail: LogTail) -> None:
        lines, note = tail.read()
        if lines or note:
            self.vapp.ui(self._append_log, lines, note)

    def _append_log(self, lines: list[str], note: str | None) -> None:
        if not self.is_mounted:
            return
        log = self.query_one("#worker-log", RewrapLog)
        if note is not None:
            if not getattr(self, "_noted", False):
                log.add(Text(note, style="dim"))
                self._noted = True
            return
        for line in lines:
            log.add(Text(line))


class JobDetail(DetailScreen):
    """One job: metadata, progress history, result or error, the worker's log tail."""

    BINDINGS = [
        _b("c", "cancel_this", "Cancel job", "Cancel this job"),
        _b("b", "backend", "Backend", "Details of this job's backend"),
    ]

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id
        self.view: JobView | None = None

    def compose(self) -> ComposeResult:
        yield self.header()
        with VerticalScroll(id="detail"):
            with Horizontal(classes="cols"):
                yield Static(id="meta", classes="box")
                yield Static(id="timeline", classes="box")
            yield Static(id="result", classes="box")
        yield RewrapLog(id="worker-log", max_lines=1000, classes="box")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one("#meta").border_title = f"Job {self.job_id}"
        self.query_one("#timeline").border_title = "Progress"
        self.query_one("#result").border_title = "Result"
        self.query_one("#worker-log", RichLog).border_title = "Worker log"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_this":
            if self.vapp.readonly:
                return None
            return None if self.view is not None and self.view.finished else True
        return True

    def action_cancel_this(self) -> None:
        self.vapp.request_cancel(self.job_id)

    def action_backend(self) -> None:
        if self.view is not None:
            self.vapp.open_backend(self.view.backend)

    def show_snapshot(self, snap: EngineSnapshot | None) -> None:
        super().show_snapshot(snap)
        if snap is None:
            return
        view = next((j for j in (*snap.running, *snap.queued, *snap.recent)
                     if j.id == self.job_id), None)
        if view is None and self.view is None:
            self._fetch()
            return
        if view is not None:
            self.show_job(view, snap)

    @work(thread=True, exclusive=True, group="fetch")
    def _fetch(self) -> None:
        try:
            view = self.vapp.api.job(self.job_id)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.vapp.ui(self._fetch_failed, exc)
            return
        self.vapp.ui(self.show_job, view, self.vapp.snap)

    def _fetch_failed(self, exc: Exception) -> None:
        if self.is_mounted:
            self.query_one("#meta", Static).update(Text(str(exc), style="red"))

    def show_job(self, j: JobView, snap: EngineSnapshot | None) -> None:
        if not self.is_mounted:
            return
        first = self.view is None
        changed = first or j != self.view
        self.view = j
        if first:
            self.refresh_bindings()
        clocks = self.vapp.clocks
        now = clocks.mono()
        if changed or not j.finished:
            rows: list[tuple[str, Any]] = [
                ("id", j.id),
                ("backend", j.backend),
                ("state", fmt.state_text(j.state.value, fmt.JOB_STATE_STYLE)),
                ("priority", j.priority),
                ("GPU", "–" if j.gpu is None else f"GPU{j.gpu}"),
                ("submitted", f"{fmt.dur(now - j.submitted_at)} ago"),
            ]
            if j.started_at is not None:
                rows.append(("started", f"after {fmt.dur(j.started_at - j.submitted_at)} "
                                        "in the queue"))
            rows.append(("time", job_time(j, now)))
            if j.state is JobState.QUEUED:
                rows += [("position", j.position), ("waiting", j.waiting or "–"),
                         ("passed by", f"{j.passed} (affinity)")]
            elif j.passed:
                rows.append(("passed by", f"{j.passed} (affinity)"))
            if j.peak_mib is not None:
                sim = " (simulated)" if snap is not None and snap.simulated else ""
                rows.append(("peak memory", fmt.mib(j.peak_mib) + sim))
            meta = json.dumps(j.metadata, ensure_ascii=False) if j.metadata else "–"
            rows.append(("metadata", meta))
            self.query_one("#meta", Static).update(kv(rows))
            self.query_one("#timeline", Static).update(self._timeline(j))
            self.query_one("#result", Static).update(self._result(j))
        if snap is not None:
            b = snap.backend(j.backend)
            if b is not None:
                self.read_log(b.log_path)

    def _timeline(self, j: JobView) -> Group:
        bar = fmt.progress_bar(j.progress, 24)
        bar.append(f"  {j.progress_text}", style="")
        lines = Table.grid(padding=(0, 1))
        lines.add_column(style="dim", justify="right")
        lines.add_column()
        for t, state, note in j.history:
            lines.add_row(f"+{t - j.submitted_at:.2f}s",
                          Text.assemble((state, fmt.JOB_STATE_STYLE.get(state, "")),
                                        (f"  {note}" if note else "", "dim")))
        samples = self.vapp.progress.get(j.id)
        if samples:
            t0 = samples[0][0]
            shown = list(samples)[-12:]
            if len(samples) > len(shown):
                lines.add_row("…", Text(f"{len(samples) - len(shown)} earlier updates",
                                        style="dim"))
            for t, frac, text in shown:
                pct = "?" if frac is None else f"{frac * 100:.0f}%"
                lines.add_row(f"+{t - t0:.2f}s", Text(f"{pct:>4} {text}", style="cyan"))
        return Group(bar, Text(""), lines)

    def _result(self, j: JobView) -> Text | Group:
        if not j.finished:
            return Text("not finished yet", style="dim")
        parts: list[Any] = []
        head = Text()
        head.append(j.state.value, style=fmt.JOB_STATE_STYLE.get(j.state.value, ""))
        if j.status_code is not None:
            head.append(f"  status {j.status_code}", style="bold")
        parts.append(head)
        if j.headers:
            parts.append(kv((k, str(v)) for k, v in j.headers.items()))
        if j.error:
            parts.append(Text(j.error, style="red"))
        if j.data is not None:
            parts.append(Text(fmt.payload_preview(j.data)))
        if j.chunks:
            parts.append(Text(f"{len(j.chunks)} streamed chunks, "
                              f"{sum(len(c) for c in j.chunks)} bytes", style="dim"))
        return Group(*parts)


class BackendDetail(DetailScreen):
    """One backend: descriptor, footprint, calibration report, its worker's log (follow)."""

    BINDINGS = [
        _b("e", "evict", "Evict", "Stop this backend's worker"),
        _b("r", "respawn", "Respawn", "Restart this backend's worker"),
        _b("p", "preload", "Preload", "Start this backend's worker now"),
        _b("k", "calibrate", "Calibrate", "Measure this backend's real peak memory"),
        _b("s", "submit", "Submit", "Submit a job to this backend"),
    ]

    def __init__(self, name: str) -> None:
        super().__init__()
        self.backend_name = name
        self.view: BackendView | None = None
        self._static_loaded = False
        self.static_shown = False  # the descriptor and calibration boxes are filled

    def compose(self) -> ComposeResult:
        yield self.header()
        with VerticalScroll(id="detail"):
            with Horizontal(classes="cols"):
                yield Static(id="about", classes="box")
                with Vertical(id="footprint", classes="box"):
                    yield MemBar(id="fp-bar")
                    yield Static(id="fp-text")
            with Horizontal(classes="cols"):
                yield Static(id="descriptor", classes="box")
                yield Static(id="calibration", classes="box")
        yield RewrapLog(id="worker-log", max_lines=2000, classes="box")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one("#about").border_title = f"Backend {self.backend_name}"
        self.query_one("#footprint").border_title = "Footprint"
        self.query_one("#descriptor").border_title = "Descriptor"
        self.query_one("#calibration").border_title = "Calibration"
        self.query_one("#worker-log", RichLog).border_title = "Worker log"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if self.vapp.readonly and action in MUTATING:
            return None
        return True

    def action_evict(self) -> None:
        self.vapp.request_evict(self.backend_name)

    def action_respawn(self) -> None:
        self.vapp.request_respawn(self.backend_name)

    def action_preload(self) -> None:
        self.vapp.request_preload(self.backend_name)

    def action_calibrate(self) -> None:
        self.vapp.request_calibrate(self.backend_name)

    def action_submit(self) -> None:
        self.vapp.open_submit(self.backend_name)

    def on_screen_resume(self) -> None:
        self._static_loaded = False  # back from a calibration: read the reports again
        super().on_screen_resume()

    def show_snapshot(self, snap: EngineSnapshot | None) -> None:
        super().show_snapshot(snap)
        if snap is None:
            return
        b = snap.backend(self.backend_name)
        if b is None:
            self.query_one("#about", Static).update(
                Text(f"no backend named {self.backend_name!r}", style="red"))
            return
        self.view = b
        clocks = self.vapp.clocks
        sim = snap.simulated
        state = fmt.state_text(b.state, fmt.BACKEND_STATE_STYLE)
        rows: list[tuple[str, Any]] = [
            ("description", b.description or "–"),
            ("state", state),
            ("pid", b.pid or "–"),
            ("GPU", "–" if b.gpu is None else f"GPU{b.gpu}"),
            ("priority", b.priority),
            ("jobs", f"{b.jobs_served} served · {b.running} running · {b.queued} queued"),
            ("last use", fmt.ago(clocks.wall() - b.last_used) if b.last_used else "never"),
            ("keep-alive", "pinned" if b.pinned else (
                fmt.dur(b.keep_alive_left_s) + " left" if b.keep_alive_left_s is not None
                else "–")),
            ("features", ", ".join(b.features) or "–"),
            ("init failures", b.init_failures),
            ("last error", Text(b.last_error or "–", style="red" if b.last_error else "")),
            ("source", b.source or "–"),
        ]
        if b.simulated:
            rows.insert(1, ("kind", Text.assemble((" SIMULATED ", fmt.SIM_BADGE), " model")))
        self.query_one("#about", Static).update(kv(rows))
        self._footprint(b, snap, sim)
        if not self._static_loaded:
            self._static_loaded = True
            self._load_static(b)
        self.read_log(b.log_path)

    def _footprint(self, b: BackendView, snap: EngineSnapshot, sim: bool) -> None:
        tag = " (SIMULATED)" if sim else ""
        gpu = next((g for g in snap.gpus if g.index == b.gpu), None)
        bar = self.query_one("#fp-bar", MemBar)
        bar.display = gpu is not None
        if gpu is not None:
            bar.show(gpu)
        peak_src = "declared" if b.declared_peak_mib is not None else (
            "learned in production" if b.learned_peak_mib is not None else "unknown")
        rows: list[tuple[str, Any]] = [
            ("resident now", fmt.mib(b.observed_mib) + tag if b.observed_mib is not None
             else "– (no worker)"),
            ("reserved", fmt.mib(b.reserved_mib) + tag),
            ("peak", f"{fmt.mib(b.peak_mib)} ({peak_src})"),
            ("declared", fmt.mib(b.declared_peak_mib)),
            ("learned", fmt.mib(b.learned_peak_mib)),
            ("observed p95", fmt.mib(b.observed_p95_mib) + tag
             if b.observed_p95_mib is not None else "– (no job measured yet)"),
        ]
        rows += learned_rows(b)
        if gpu is not None:
            rows.append(("on GPU", f"GPU{gpu.index}: {fmt.mib(gpu.used_mib)} of "
                                   f"{fmt.mib(gpu.total_mib)} used"))
        self.query_one("#fp-text", Static).update(kv(rows))

    @work(thread=True, exclusive=True, group="static")
    def _load_static(self, b: BackendView) -> None:
        descriptor = read_descriptor(b.source, b.name)
        calibration = read_calibration(b.log_path, b.name, self.vapp.clocks.localtime)
        self.vapp.ui(self._show_static, descriptor, calibration)

    def _show_static(self, descriptor: Text, calibration: Text) -> None:
        if not self.is_mounted:
            return
        self.query_one("#descriptor", Static).update(descriptor)
        self.query_one("#calibration", Static).update(calibration)
        self.static_shown = True


def read_descriptor(source: str, name: str) -> Text:
    """This backend's entry in its descriptor file, as YAML (best effort)."""
    if not source:
        return Text("(built in)", style="dim")
    path = Path(source.split(":")[0]) if not os.path.exists(source) else Path(source)
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return Text(f"{source}\n(cannot read it here: {exc.__class__.__name__})", style="dim")
    entries = doc.get("backends", []) if isinstance(doc, dict) else doc
    entry = next((e for e in entries or [] if isinstance(e, dict) and e.get("name") == name),
                 None)
    if entry is None:
        return Text(f"{path}\n(no entry named {name!r}: it may come from an overlay)",
                    style="dim")
    text = Text(f"# {path}\n", style="dim")
    text.append(yaml.safe_dump(entry, sort_keys=False, allow_unicode=True).rstrip())
    return text


def learned_rows(b: BackendView) -> list[tuple[str, Any]]:
    """Learning in production: the observed p95 against the declared peak, and the peak to
    declare instead when jobs use more (the same suggestion as ``vramtui backends``)."""
    declared, p95 = b.declared_peak_mib, b.observed_p95_mib
    if declared is None or p95 is None:
        return []
    suggested = suggested_peak_mib(b)
    if suggested is None:
        share = p95 / declared * 100 if declared else 0.0
        return [("vs declared", Text(f"p95 is {share:.0f} % of the declared peak: it holds",
                                     style="green"))]
    over = p95 - declared
    return [
        ("vs declared", Text(f"jobs use {fmt.mib(over)} ({over / declared * 100:.0f} %) more "
                             "than the declared peak", style="bold red")),
        ("suggested", Text.assemble((f"vram.peak: {size_to_declare(suggested)}",
                                     "bold yellow"),
                                    (" (p95 + 5 %, rounded up), or m to calibrate",
                                     "dim"))),
    ]


REPORT_NAME = re.compile(r"^(?P<backend>.+)-(?P<stamp>\d{8}-\d{6})\.json$")


def latest_report(directory: Path, name: str) -> tuple[Path | None, int]:
    """The newest ``<name>-<YYYYmmdd-HHMMSS>.json`` the engine wrote, and how many there are."""
    found: list[tuple[str, Path]] = []
    with contextlib.suppress(OSError):
        for path in directory.iterdir():
            m = REPORT_NAME.match(path.name)
            if m is not None and m.group("backend") == name:
                found.append((m.group("stamp"), path))
    if not found:
        return None, 0
    return max(found)[1], len(found)


def read_calibration(log_path: str, name: str,
                     localtime: Callable[[float], time.struct_time] = time.localtime) -> Text:
    """The headline of the backend's latest calibration report in the state directory."""
    directory = Path(log_path).parent.parent / "calibration"
    path, count = latest_report(directory, name)
    if path is None:
        return Text.assemble(
            ("not calibrated yet.\n", "bold"),
            ("The peak comes from the descriptor (declared) or from jobs measured in "
             "production (learned). ", "dim"), ("k", "bold cyan"),
            (" measures it: a fresh worker alone on a GPU, sampled at 20 Hz.", "dim"))
    from supervisor.calibration.record import CalibrationError
    from supervisor.calibration.report import load_report

    text = Text()
    text.append(fmt.short_path(path), style="dim")
    if count > 1:
        text.append(f"  (latest of {count})", style="dim")
    text.append("\n")
    try:
        record, report = load_report(path)
    except CalibrationError as exc:
        text.append(str(exc), style="red")
        return text
    when = time.strftime("%Y-%m-%d %H:%M", localtime(record.started_wall))
    text.append(f"{when} · {record.outcome} · ", style="dim")
    text.append(report.headline(), style="bold")
    text.append("\n")
    refusal = report.overlay_refusal
    if refusal is None:
        text.append("overlay: ", style="dim")
        text.append(f"zz-calibrated-{name}.yaml in backends.d", style="green")
    else:
        text.append("no overlay: ", style="dim")
        text.append(refusal, style="yellow")
    text.append("\n")
    text.append("k", style="bold cyan")
    text.append(" calibrates again", style="dim")
    return text


# =============================================================================== dialogs


class ConfirmDialog(ModalScreen[bool]):
    """Yes or no, for destructive commands (turn off with --no-confirm)."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="yes", tooltip="Do it"),
        Binding("n,escape", "answer(False)", "No", id="no", tooltip="Leave it"),
    ]

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.title_text = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="confirm"):
            yield Label(self.title_text, id="dialog-title")
            yield Static(self.body, id="dialog-body")
            with Horizontal(id="dialog-buttons"):
                yield Button("Yes (y)", variant="error", id="yes", compact=True)
                yield Button("No (n)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


@dataclass(frozen=True)
class SubmitRequest:
    backend: str
    payload: bytes
    priority: int | None


class SubmitDialog(ModalScreen[SubmitRequest | None]):
    """Submit a job: backend, payload (sent as UTF-8 bytes), priority."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="submit_cancel", tooltip="Close the dialog"),
        Binding("ctrl+s", "ok", "Submit", id="submit_ok", tooltip="Submit the job"),
    ]

    def __init__(self, backends: list[BackendView], selected: str | None) -> None:
        super().__init__()
        self.backends = backends
        self.selected = selected

    def compose(self) -> ComposeResult:
        names = [b.name for b in self.backends]
        value = self.selected if self.selected in names else (names[0] if names else None)
        with Vertical(id="dialog", classes="submit"):
            yield Label("Submit a job", id="dialog-title")
            yield Label("Backend", classes="field")
            yield Select([(f"{b.name}  ({b.state})", b.name) for b in self.backends],
                         value=value if value is not None else Select.NULL,
                         allow_blank=False, id="backend", compact=True)
            yield Label("Payload (UTF-8; the demo models read JSON)", classes="field")
            yield TextArea('{"steps": 10}', id="payload", compact=True,
                           soft_wrap=True, show_line_numbers=False)
            yield Label("Priority (empty: the backend's)", classes="field")
            yield Input(placeholder=self._default_priority(value), id="priority",
                        type="integer", compact=True)
            yield Static("", id="dialog-error")
            with Horizontal(id="dialog-buttons"):
                yield Button("Submit (ctrl+s)", variant="primary", id="ok", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def _default_priority(self, name: str | None) -> str:
        b = next((b for b in self.backends if b.name == name), None)
        return f"default: {b.priority}" if b is not None else "default"

    def on_mount(self) -> None:
        self.query_one("#payload", TextArea).focus()

    @on(Select.Changed, "#backend")
    def _backend_changed(self, event: Select.Changed) -> None:
        self.query_one("#priority", Input).placeholder = self._default_priority(
            str(event.value))

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_ok(self) -> None:
        backend = self.query_one("#backend", Select).value
        if backend is Select.NULL or not isinstance(backend, str):
            self.query_one("#dialog-error", Static).update("choose a backend")
            return
        raw = self.query_one("#priority", Input).value.strip()
        try:
            priority = int(raw) if raw else None
        except ValueError:
            self.query_one("#dialog-error", Static).update("priority must be a whole number")
            return
        payload = self.query_one("#payload", TextArea).text.encode()
        self.dismiss(SubmitRequest(backend, payload, priority))

    @on(Input.Submitted, "#priority")
    def _priority_entered(self) -> None:
        self.action_ok()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self.action_ok()
        else:
            self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    """Every key (also in the command palette, ctrl+p), the colours, the current modes."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close", id="help_close",
                        tooltip="Close help")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(self._content(), id="help-body")

    def _content(self) -> Group:
        app: VramApp = self.app  # type: ignore[assignment]
        keys = Table(box=None, padding=(0, 1), show_header=True, header_style="bold")
        keys.add_column("Key", style="bold cyan", no_wrap=True)
        keys.add_column("Does")
        keys.add_column("", style="dim", no_wrap=True)
        for b in DASHBOARD_BINDINGS:
            if not b.show:
                continue
            note = ""
            if b.action == "demo" and not app.demo_mode:
                note = "demo backends only"
            elif b.action in MUTATING and app.readonly:
                note = "read-only: off"
            elif b.action in CONFIRMED and app.confirm:
                note = "asks first"
            keys.add_row(b.key_display or b.key, b.tooltip, note)
        for key, does in (("?", "this help"), ("ctrl+p", "command palette: every action, "
                          "and each backend and job to act on"),
                          ("tab", "switch between the backends and jobs tables"),
                          ("q", "quit (an embedded engine stops its workers)")):
            keys.add_row(key, does, "")
        detail = Text.assemble(
            ("In details: ", "bold"), "esc back · f follow the log · c cancel the job · "
            "b its backend · e r p k s act on the backend\n",
            ("In a calibration: ", "bold"), "the live chart with its phase bands, then the "
            "results · c cancel the run · w save the report as…")
        bars = Text()
        for char, style, what in (("█", fmt.SEG_OURS, "used by our workers' processes"),
                                  ("▒", fmt.SEG_RESERVED, "reserved by admission, not used"),
                                  ("█", fmt.SEG_OVER, "used beyond the reservation"),
                                  ("█", fmt.SEG_FOREIGN, "used by processes not ours"),
                                  ("░", fmt.SEG_FREE, "free"),
                                  ("╌", "yellow", "graph: the budget line (total - reserve)")):
            bars.append(f" {char} ", style=style)
            bars.append(what + "\n")
        states = Text(" backends: ")
        for s, st in fmt.BACKEND_STATE_STYLE.items():
            states.append(s, style=st)
            states.append(" ")
        states.append("\n jobs:     ")
        for s, st in fmt.JOB_STATE_STYLE.items():
            states.append(s, style=st)
            states.append(" ")
        mode = Text.assemble(
            ("Engine: ", "bold"), app.mode,
            ("   Read-only" if app.readonly else "", "bold blue"),
            ("   Confirmations " + ("on" if app.confirm else "off (--no-confirm)"), ""))
        sim = Text.assemble((" SIMULATED ", fmt.SIM_BADGE),
                            " marks a simulated GPU: its memory figures come from simulated "
                            "workers, not from a driver.")
        return Group(Text("vramtui — keys", style="bold"), keys, detail, Text(""),
                     Text("Memory bars", style="bold"), bars,
                     Text("States", style="bold"), states, Text(""), sim, Text(""), mode,
                     Text("esc closes", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)

    def on_click(self, event: events.Click) -> None:
        if event.widget is self:  # a click outside the help box closes it
            self.dismiss(None)


CONFIRMED = frozenset({"evict", "respawn", "cancel_job", "zero", "calibrate"})
