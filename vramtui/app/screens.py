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
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
from .widgets.backends_table import BackendsTable
from .widgets.engine_header import EngineHeader
from .widgets.event_log import EventLog
from .widgets.gpu_panel import GpuPanel
from .widgets.jobs_table import JobsTable, job_time
from .widgets.mem_bar import MemBar
from .widgets.process_table import ProcessTable
from .widgets.rewrap_log import RewrapLog
from .widgets.row_table import RowTable
from .widgets.titles import titles

if TYPE_CHECKING:
    from .app import VramApp


class KeyFooter(Footer):
    """The footer, showing the keys that fit its width, most wanted first.

    Each key has a rank (``RANK``; unlisted: 5); keys are kept in rank order while their
    total width fits, and the rest are hidden (they stay in the help and the palette), so the
    footer never runs off the edge at 60, 80 or 120 columns.
    """

    RANK = {"help": 0, "quit": 0, "back": 0, "details": 1, "evict": 2, "cancel_job": 1,
            "submit": 2, "filter": 3, "respawn": 3, "cancel_this": 1, "follow": 3,
            "demo": 2, "cancel_run": 1, "save": 2, "retry": 3, "kill": 4, "preload": 4,
            "calibrate": 4, "reload": 5, "drain": 6, "zero": 6, "priority_up": 6,
            "priority_down": 7, "graph_window": 7, "processes": 5, "backend": 4,
            "save_result": 4}
    PALETTE = 12  # the command palette's key on the right

    def compose(self) -> ComposeResult:
        widgets = list(super().compose())
        self._fit(widgets)
        yield from widgets

    def on_resize(self) -> None:
        self._fit(list(self.query(FooterKey)))

    def _fit(self, widgets: list[Any]) -> None:
        width = self.size.width
        keys = [w for w in widgets if isinstance(w, FooterKey)
                and not w.has_class("-command-palette")]
        if width <= 0:
            return
        room = width - self.PALETTE
        order = sorted(keys, key=lambda w: (self.RANK.get(w.action, 5), keys.index(w)))
        used, shown = 0, set()
        for w in order:
            need = len(w.key_display or w.key) + len(w.description) + 3
            if used + need <= room:
                used += need
                shown.add(id(w))
        for w in keys:
            w.display = id(w) in shown


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


class ReadonlyKeys:
    """A screen mixin: in --readonly, the keys that would change something are not in the
    footer, and pressing one says why nothing happens instead of doing nothing silently."""

    def readonly_key(self, event: events.Key) -> None:
        app: VramApp = self.app  # type: ignore[attr-defined]
        if not app.readonly:
            return
        for binding in type(self).BINDINGS:  # type: ignore[attr-defined]
            if isinstance(binding, Binding) and binding.action in MUTATING and \
                    event.key in binding.key.split(","):
                event.stop()
                app.notify(f"Read-only: {binding.description.lower()} is off (vramtui was "
                           "started with --readonly).", severity="warning", timeout=4)
                return


# =============================================================================== dashboard


def _b(key: str, action: str, description: str, tooltip: str, **kw: Any) -> Binding:
    return Binding(key, action, description, tooltip=tooltip, id=action, **kw)


DASHBOARD_BINDINGS = [
    _b("enter", "details", "Details", "Details of the selected backend or job"),
    _b("e", "evict", "Evict", "Stop the selected backend's worker and free its memory"),
    _b("r", "respawn", "Respawn", "Restart the selected backend's worker (a new process)"),
    _b("c", "cancel_job", "Cancel", "Cancel the selected job, or every marked one "
       "(space marks jobs)"),
    _b("s", "submit", "Submit", "Submit a job: backend, payload, priority"),
    _b("d", "demo", "Demo", "Submit a demo workload to the simulated demo backends"),
    _b("R", "retry", "Retry", "Run the selected finished job's request again, as a new job"),
    _b("plus", "priority_up", "Pri+", "Raise the selected queued job's priority by 1",
       key_display="+"),
    _b("minus", "priority_down", "Pri-", "Lower the selected queued job's priority by 1",
       key_display="-"),
    _b("p", "preload", "Preload", "Start the selected backend's worker now, before any job"),
    _b("m", "calibrate", "Calibrate", "Measure the selected backend's real peak memory "
       "(a calibration run alone on a GPU)"),
    _b("X", "kill", "Kill", "SIGKILL the selected backend's (stuck) worker; its jobs fail"),
    _b("z", "zero", "Evict idle", "Evict every idle backend (frees all memory not in use)"),
    _b("D", "drain", "Drain", "Drain a GPU (running work finishes, nothing new is admitted "
       "there), or open it again"),
    _b("L", "reload", "Reload", "Read the backend descriptors again and show what changed"),
    _b("v", "processes", "Processes", "Show each GPU's processes (pid, user, memory, backend "
       "or foreign) in place of the events, and back"),
    _b("slash", "filter", "Filter", "Filter backends, jobs and events by text",
       key_display="/"),
    _b("t", "graph_window", "1m/10m", "Switch the memory graphs between 1 and 10 minutes"),
    Binding("escape", "clear_filter", "Clear filter", show=False, id="clear_filter",
            tooltip="Clear the filter (and the marks)"),
]


class Dashboard(ReadonlyKeys, SnapshotScreen):
    """GPUs, backends, jobs and the event log (or the GPUs' processes) at a glance."""

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
            yield ProcessTable(id="procs")
        yield Input(placeholder="filter: backend, job id or state (esc clears)", id="filter")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        backends = self.query_one(BackendsTable)
        backends.border_title = "Backends"
        jobs = self.query_one(JobsTable)
        jobs.border_title = "Jobs"
        self.query_one(EventLog).border_title = "Events"
        procs = self.query_one(ProcessTable)
        procs.border_title = "Processes"
        procs.display = False
        self.query_one("#filter", Input).display = False
        backends.focus()

    def on_key(self, event: events.Key) -> None:
        self.readonly_key(event)

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
        backends.set_columns(narrow or backends.size.width < 118, labels)
        backends.sync(backends.rows_for(snap, query, app.clocks))
        sub = f"{len(snap.backends)} configured"
        if sim:
            sub += " · [b #d7afff]memory figures are SIMULATED[/]"
        if app.demo_mode and not app.readonly:
            sub += " · demo: [b]d[/] runs a demo workload"
        titles(backends, subtitle=sub)
        jobs = self.query_one(JobsTable)
        jobs.set_columns(narrow or jobs.size.width < 110)
        jobs.sync(jobs.rows_for(snap, query, app.clocks, recent=8 if narrow else 20))
        marked = f" · {len(jobs.marked)} marked (c cancels them)" if jobs.marked else ""
        titles(jobs, subtitle=f"{len(snap.running)} running · {len(snap.queued)} queued · "
                                f"{len(snap.recent)} finished{marked}")
        procs = self.query_one(ProcessTable)
        if procs.display:
            procs.set_columns(True)
            procs.sync(procs.rows_for(snap, query))
            n = sum(len(g.processes) for g in snap.gpus)
            titles(procs, subtitle=f"{n} on {len(snap.gpus)} GPU(s)"
                   + (" · SIMULATED" if snap.simulated else ""))
        log = self.query_one(EventLog)
        if log.display:
            log.show(snap.log, query, wrap=True)
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
            share = h * (0.25 if narrow and h < 36 else 0.3)
            per = int(share / grid_rows)
            graph_h = per - 4  # border(s), bar, legend
            for panel in box.query(GpuPanel):
                # a graph of 2 rows says little: at 80x24 its rows go to the event log
                panel.graph.display = graph_h >= 3
                panel.legend.display = per >= 3 or not narrow
                if graph_h >= 3:
                    panel.graph.styles.height = min(graph_h, 10)
        short = narrow
        for panel, g in zip(box.query(GpuPanel), snap.gpus, strict=False):
            panel.show(g, self.vapp.graph_window, short)

    # -- selection ------------------------------------------------------------------------
    def selected_backend(self) -> str | None:
        return self.query_one(BackendsTable).selected_key()

    def selected_job(self) -> str | None:
        return self.query_one(JobsTable).selected_key()

    def marked_jobs(self) -> list[str]:
        table = self.query_one(JobsTable)
        return [k for k in table.keys() if k in table.marked]  # noqa: SIM118 - not a dict

    def _need(self, value: str | None, what: str) -> str | None:
        if value is None:
            self.notify(f"Select a {what} first (arrow keys or click; tab switches tables)",
                        severity="warning")
        return value

    # -- actions ----------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "demo" and not self.vapp.demo_mode:
            return False  # only with the simulated demo backends: not shown
        # read-only: not offered (pressing it says why: ReadonlyKeys)
        return not (self.vapp.readonly and action in MUTATING)

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
        marked = self.marked_jobs()
        if marked:
            self.vapp.request_cancel_many(marked, self.query_one(JobsTable).marked.clear)
        elif job := self._need(self.selected_job(), "job"):
            self.vapp.request_cancel(job)

    def action_retry(self) -> None:
        if job := self._need(self.selected_job(), "job"):
            self.vapp.request_retry(job)

    def action_priority_up(self) -> None:
        if job := self._need(self.selected_job(), "job"):
            self.vapp.request_priority_step(job, +1)

    def action_priority_down(self) -> None:
        if job := self._need(self.selected_job(), "job"):
            self.vapp.request_priority_step(job, -1)

    def action_kill(self) -> None:
        if name := self._need(self.selected_backend(), "backend"):
            self.vapp.request_kill(name)

    def action_drain(self) -> None:
        self.vapp.request_drain()

    def action_reload(self) -> None:
        self.vapp.request_reload()

    def action_processes(self) -> None:
        procs, log = self.query_one(ProcessTable), self.query_one(EventLog)
        procs.display = not procs.display
        log.display = not procs.display
        self.refresh_bindings()
        self.refresh_snapshot()

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
        elif isinstance(event.table, ProcessTable):
            owner = event.table.owner(key)
            if owner is not None:
                self.vapp.open_backend(owner)
        else:
            self.vapp.open_backend(key)

    @on(RowTable.Resorted)
    def _resorted(self, event: RowTable.Resorted) -> None:
        self.refresh_snapshot()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.focus()

    def action_clear_filter(self) -> None:
        jobs = self.query_one(JobsTable)
        if jobs.marked:
            jobs.marked.clear()
            jobs.refresh()
            self.refresh_snapshot()
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
                      "calibrate", "cancel_this", "demo", "cancel_run", "retry", "kill",
                      "drain", "reload", "priority_up", "priority_down", "retry_this"})


# =============================================================================== log tail


class LogTail:
    """The tail of a backend's worker log, read incrementally through the API (``logs``):
    the engine reads its own file, so an attached TUI needs no access to it.  Call from a
    thread."""

    FIRST_LINES = 300

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.path = f"{backend}.log"
        self.offset: int | None = None
        self._partial = b""
        # Two reads may overlap (a worker thread per snapshot; an "exclusive" worker's thread
        # is not stopped): one at a time, or both would hand over the same lines.
        self._lock = threading.Lock()

    def read(self, api: Any) -> tuple[list[str], str | None]:
        """New complete lines since the last call, and a note when there is no log (yet)."""
        with self._lock:
            return self._read(api)

    def _read(self, api: Any) -> tuple[list[str], str | None]:
        try:
            if self.offset is None:
                chunk = api.logs(self.backend, lines=self.FIRST_LINES)
            else:
                chunk = api.logs(self.backend, offset=self.offset)
        except Exception as exc:  # noqa: BLE001 - shown in the log box
            return [], f"(cannot read the log: {exc})"
        self.path = chunk.path or self.path
        if chunk.missing:
            return [], f"(no log yet: {fmt.short_path(chunk.path)})"
        first = self.offset is None or chunk.offset < (self.offset or 0)
        if first:
            self._partial = b""
        self.offset = chunk.offset
        lines = (self._partial + chunk.data).split(b"\n")
        self._partial = lines.pop()
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
        self.logs_read = False  # the first answer about the log has come

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

    def read_log(self, backend: str) -> None:
        if self.tail is None or self.tail.backend != backend:
            self.tail = LogTail(backend)
            self.query_one("#worker-log", RewrapLog).reset()
            self._log_title()
        if self.follow or self.tail.offset is None:
            self._read_tail(self.tail)

    @work(thread=True, exclusive=True, group="tail")
    def _read_tail(self, tail: LogTail) -> None:
        lines, note = tail.read(self.vapp.api)
        self.vapp.ui(self._append_log, lines, note, tail)

    def _append_log(self, lines: list[str], note: str | None, tail: LogTail) -> None:
        if not self.is_mounted:
            return
        try:  # the screen may be on its way out (popped while the read was under way)
            self._log_title()
            log = self.query_one("#worker-log", RewrapLog)
        except NoMatches:
            return
        self.logs_read = True
        if note is not None:
            if not getattr(self, "_noted", False):
                log.add(Text(note, style="dim"))
                self._noted = True
            return
        for line in lines:
            log.add(Text(line))


class JobDetail(ReadonlyKeys, DetailScreen):
    """One job: metadata, progress history, its request, its result or error, the worker's
    log tail."""

    BINDINGS = [
        _b("c", "cancel_this", "Cancel job", "Cancel this job"),
        _b("R", "retry_this", "Retry", "Run this job's request again, as a new job"),
        _b("plus", "priority_up", "Pri+", "Raise this queued job's priority by 1",
           key_display="+"),
        _b("minus", "priority_down", "Pri-", "Lower this queued job's priority by 1",
           key_display="-"),
        _b("w", "save_result", "Save result", "Write the job's result data to a file"),
        _b("b", "backend", "Backend", "Details of this job's backend"),
    ]
    REQUEST_SHOWN = 4096  # bytes of the request asked for and shown

    def __init__(self, job_id: str) -> None:
        super().__init__()
        self.job_id = job_id
        self.view: JobView | None = None
        self.request_shown = False

    def compose(self) -> ComposeResult:
        yield self.header()
        with VerticalScroll(id="detail"):
            with Horizontal(classes="cols"):
                yield Static(id="meta", classes="box")
                yield Static(id="timeline", classes="box")
            with Horizontal(classes="cols"):
                yield Static(id="request", classes="box")
                yield Static(id="result", classes="box")
        yield RewrapLog(id="worker-log", max_lines=1000, classes="box")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one("#meta").border_title = f"Job {self.job_id}"
        self.query_one("#timeline").border_title = "Progress"
        self.query_one("#request").border_title = "Request"
        self.query_one("#request", Static).update(Text("asking the engine…", style="dim"))
        self.query_one("#result").border_title = "Result"
        self._fetch_request()
        self.query_one("#worker-log", RichLog).border_title = "Worker log"

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        view = self.view
        if self.vapp.readonly and action in MUTATING:
            return False
        if action == "cancel_this":
            return not (view is not None and view.finished)
        if action == "retry_this":
            return bool(view is not None and view.finished and view.kind == "job")
        if action in ("priority_up", "priority_down"):
            return bool(view is not None and view.state is JobState.QUEUED)
        if action == "save_result":
            return bool(view is not None and view.state is JobState.SUCCEEDED)
        return True

    def on_key(self, event: events.Key) -> None:
        self.readonly_key(event)

    def action_cancel_this(self) -> None:
        self.vapp.request_cancel(self.job_id)

    def action_retry_this(self) -> None:
        self.vapp.request_retry(self.job_id)

    def action_priority_up(self) -> None:
        self.vapp.request_priority_step(self.job_id, +1)

    def action_priority_down(self) -> None:
        self.vapp.request_priority_step(self.job_id, -1)

    def action_save_result(self) -> None:
        self.vapp.request_save_result(self.job_id)

    @work(thread=True, exclusive=True, group="request")
    def _fetch_request(self) -> None:
        try:
            asked = self.vapp.api.job_request(self.job_id, limit=self.REQUEST_SHOWN)
        except Exception as exc:  # noqa: BLE001 - shown in the box
            self.vapp.ui(self._show_request, Text(f"cannot get it: {exc}", style="red"))
            return
        if not asked.kept:
            text = Text("no longer kept by the engine (it keeps the requests of its last "
                        "jobs)", style="dim")
        else:
            text = Text(fmt.payload_preview(asked.data, limit=1500))
            if asked.size > len(asked.data):
                text.append(f"\n… the first {len(asked.data)} of {asked.size} bytes",
                            style="dim")
            else:
                text.append(f"\n{asked.size} bytes", style="dim")
        self.vapp.ui(self._show_request, text)

    def _show_request(self, text: Text) -> None:
        if self.is_mounted:
            self.query_one("#request", Static).update(text)
            self.request_shown = True

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
        self._old_state = self.view.state if self.view is not None else None
        self.view = j
        clocks = self.vapp.clocks
        now = clocks.wall()
        if first or (self.view_state_changed(j)):
            self.refresh_bindings()
        if changed or not j.finished:
            rows: list[tuple[str, Any]] = [
                ("id", j.id),
                ("backend", j.backend),
                ("state", fmt.state_text(j.state.value, fmt.JOB_STATE_STYLE)),
                ("priority", j.priority),
                ("GPU", "–" if j.gpu is None else f"GPU{j.gpu}"),
                ("submitted", f"{clocks.hms(j.submitted_at)} "
                              f"({fmt.dur(now - j.submitted_at)} ago)"),
            ]
            if j.started_at is not None:
                rows.append(("started", f"{clocks.hms(j.started_at)}, after "
                                        f"{fmt.dur(j.started_at - j.submitted_at)} in the "
                                        "queue"))
            if j.finished_at is not None:
                rows.append(("finished", clocks.hms(j.finished_at)))
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
        if snap is not None and snap.backend(j.backend) is not None:
            self.read_log(j.backend)

    def view_state_changed(self, j: JobView) -> bool:
        return getattr(self, "_old_state", None) is not j.state

    def _timeline(self, j: JobView) -> Group:
        bar = fmt.progress_bar(j.progress, 24)
        if j.finished and j.progress_text:
            bar.append(f"  last: {j.progress_text}", style="dim")
        else:
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


class BackendDetail(ReadonlyKeys, DetailScreen):
    """One backend: descriptor layers, footprint, calibration report, its worker's log
    (follow); everything read through the API, never from the engine's files."""

    BINDINGS = [
        _b("e", "evict", "Evict", "Stop this backend's worker"),
        _b("r", "respawn", "Respawn", "Restart this backend's worker"),
        _b("p", "preload", "Preload", "Start this backend's worker now"),
        _b("m", "calibrate", "Calibrate", "Measure this backend's real peak memory"),
        _b("s", "submit", "Submit", "Submit a job to this backend"),
        _b("X", "kill", "Kill", "SIGKILL this backend's (stuck) worker; its jobs fail"),
        _b("L", "reload", "Reload", "Read the backend descriptors again and show what changed"),
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
            return False
        return not (action == "kill" and (self.view is None or self.view.pid is None))

    def on_key(self, event: events.Key) -> None:
        self.readonly_key(event)

    def action_kill(self) -> None:
        self.vapp.request_kill(self.backend_name)

    def action_reload(self) -> None:
        self.vapp.request_reload()

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
        if self.view is None or (self.view.pid is None) != (b.pid is None):
            self.refresh_bindings()
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
        self.read_log(b.name)

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
        api = self.vapp.api
        descriptor = describe_layers(api, b.name)
        calibration = calibration_text(api, b.name, self.vapp.clocks.localtime)
        self.vapp.ui(self._show_static, descriptor, calibration)

    def _show_static(self, descriptor: Text, calibration: Text) -> None:
        if not self.is_mounted:
            return
        self.query_one("#descriptor", Static).update(descriptor)
        self.query_one("#calibration", Static).update(calibration)
        self.static_shown = True


def describe_layers(api: Any, name: str) -> Text:
    """The backend's descriptor as the engine reads it: each file's entry (lowest layer
    first, later ones override single keys), then what it runs with now."""
    try:
        info = api.descriptor(name)
    except Exception as exc:  # noqa: BLE001 - shown in the box
        return Text(f"cannot get the descriptor: {exc}", style="red")
    text = Text()
    if not info.layers:
        text.append("(not from a file)\n", style="dim")
    for i, layer in enumerate(info.layers):
        where = fmt.short_path(layer.file) + (f":{layer.line}" if layer.line else "")
        label = "# " + where + ("  (overrides the keys it sets)" if i else "")
        text.append(label + "\n", style="dim")
        text.append(layer.text + "\n")
    for problem in info.errors:
        text.append(problem + "\n", style="red")
    if len(info.layers) > 1 or not info.layers:
        text.append("# in effect now\n", style="dim")
        text.append(info.effective, style="cyan")
    text.rstrip()
    return text if text.plain else Text("–")


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


def calibration_text(api: Any, name: str,
                     localtime: Callable[[float], time.struct_time] = time.localtime) -> Text:
    """The headline of the backend's latest calibration report (asked of the engine)."""
    from supervisor.errors import NoReport

    try:
        found = api.calibration_report(name)
    except NoReport:
        return Text.assemble(
            ("not calibrated yet.\n", "bold"),
            ("The peak comes from the descriptor (declared) or from jobs measured in "
             "production (learned). ", "dim"), ("m", "bold cyan"),
            (" measures it: a fresh worker alone on a GPU, sampled at 20 Hz.", "dim"))
    except Exception as exc:  # noqa: BLE001 - shown in the box
        return Text(f"cannot get the calibration report: {exc}", style="red")
    from supervisor.calibration.record import CalibrationError
    from supervisor.calibration.report import parse_report

    text = Text()
    text.append(fmt.short_path(found.path), style="dim")
    if found.count > 1:
        text.append(f"  (latest of {found.count})", style="dim")
    text.append("\n")
    try:
        record, report = parse_report(found.data, found.path)
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
    text.append("m", style="bold cyan")
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


def priority_problem(raw: str) -> str | None:
    """Why ``raw`` is not a priority (empty: the backend's default), or None."""
    raw = raw.strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        return f"priority must be a whole number, like 10 or -5 (not {raw[:20]!r})"
    if not -10**9 <= value <= 10**9:
        return "priority must be between -1000000000 and 1000000000"
    return None


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
                        compact=True)
            yield Static("", id="dialog-error")
            with Horizontal(id="dialog-buttons"):
                yield Button("Submit (ctrl+s)", variant="primary", id="ok", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def _default_priority(self, name: str | None) -> str:
        b = next((b for b in self.backends if b.name == name), None)
        return f"default: {b.priority}" if b is not None else "default"

    def on_mount(self) -> None:
        self.query_one("#payload", TextArea).focus()

    @on(Input.Changed, "#priority")
    def _priority_typed(self, event: Input.Changed) -> None:
        problem = priority_problem(event.value)
        self.query_one("#dialog-error", Static).update(problem or "")

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
        problem = priority_problem(raw)
        if problem is not None:
            self.query_one("#dialog-error", Static).update(problem)
            self.query_one("#priority", Input).focus()
            return
        priority = int(raw) if raw else None
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


class SaveDataDialog(ModalScreen[Path | None]):
    """A path for bytes the API handed over (a job's result, a calibration report): written
    here, atomically (a temporary file in the target's directory, then a rename)."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="save_cancel", tooltip="Close the dialog"),
    ]

    def __init__(self, title: str, what: Text | str, name: str, data: bytes) -> None:
        super().__init__()
        self.title_text = title
        self.what = what
        self.name_default = name
        self.data = data

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="save"):
            yield Label(self.title_text, id="dialog-title")
            yield Static(Text.assemble(
                self.what if isinstance(self.what, Text) else Text(self.what),
                (f"\n{len(self.data)} bytes.  A relative path is taken from ", "dim"),
                fmt.short_path(os.getcwd()), ("; a directory keeps the name.", "dim")),
                id="dialog-body")
            yield Input(value=self.name_default, id="save-path", compact=True)
            yield Static("", id="dialog-error")
            with Horizontal(id="dialog-buttons"):
                yield Button("Save (enter)", variant="primary", id="ok", compact=True)
                yield Button("Cancel (esc)", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one("#save-path", Input).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Input.Submitted, "#save-path")
    def _entered(self) -> None:
        self._save()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "ok":
            self._save()
        else:
            self.dismiss(None)

    def _save(self) -> None:
        target = self.query_one("#save-path", Input).value.strip()
        if not target:
            self.query_one("#dialog-error", Static).update("type a path")
            return
        self._write(target)

    @work(thread=True, exclusive=True, group="save-data")
    def _write(self, target: str) -> None:
        try:
            path = write_copy(self.data, target, self.name_default)
        except OSError as exc:
            self.app.call_from_thread(self._failed, exc)
            return
        self.app.call_from_thread(self.dismiss, path)

    def _failed(self, exc: OSError) -> None:
        if self.is_mounted:
            self.query_one("#dialog-error", Static).update(
                f"cannot save there: {exc.strerror or exc}"
                + (f" ({exc.filename})" if getattr(exc, "filename", None) else ""))


def write_copy(data: bytes, target: str | os.PathLike[str], name: str) -> Path:
    """Write ``data`` to ``target`` (a directory: ``name`` in it) atomically: never half a
    file, and an existing one is replaced only once the new one is complete."""
    from supervisor.atomicfile import write_atomic

    dest = Path(os.path.expanduser(os.fspath(target)))
    if dest.is_dir():
        dest = dest / name
    dest = dest.absolute()
    if not dest.parent.is_dir():
        raise FileNotFoundError(2, "no such directory", str(dest.parent))
    return write_atomic(dest, data, mode=0o644)


class DrainDialog(ModalScreen[tuple[int, bool] | None]):
    """Drain a GPU or open it again: one line per GPU; its number (or enter on it) toggles."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="drain_cancel", tooltip="Close")]

    def __init__(self, gpus: list[tuple[int, str, bool]]) -> None:
        super().__init__()
        self.gpus = gpus  # (index, name, draining)

    def compose(self) -> ComposeResult:
        from textual.widgets import OptionList

        with Vertical(id="dialog", classes="drain"):
            yield Label("Drain a GPU", id="dialog-title")
            yield Static("A draining GPU finishes its running work and admits nothing new; "
                         "queued work goes to the other GPUs or waits.  Choose one to drain "
                         "(or to open again):", id="dialog-body")
            yield OptionList(*[f"GPU{i} · {name} · " + ("DRAINING: open it again" if d
                                                         else "admitting: drain it")
                               for i, name, d in self.gpus], id="drain-gpus")

    def on_key(self, event: events.Key) -> None:
        if event.character and event.character.isdigit():
            for i, _name, d in self.gpus:
                if str(i) == event.character:
                    event.stop()
                    self.dismiss((i, not d))

    def on_option_list_option_selected(self, event: Any) -> None:
        i, _name, draining = self.gpus[event.option_index]
        self.dismiss((i, not draining))

    def action_cancel(self) -> None:
        self.dismiss(None)


class ReloadScreen(ModalScreen[None]):
    """What ``reload`` changed: added, removed, changed (key by key), kept, and the errors
    of each file (those backends kept their previous descriptor)."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close", id="reload_close",
                        tooltip="Close")]

    def __init__(self, result: Any) -> None:
        super().__init__()
        self.result = result

    def compose(self) -> ComposeResult:
        from supervisor.engine_commands import reload_summary

        r = self.result
        t = Text()
        t.append(f"{len(r.files)} file(s) read: {reload_summary(r)}\n", style="bold")
        for name in r.added:
            t.append(f"+ {name}\n", style="green")
        for name in r.removed:
            t.append(f"- {name}\n", style="#c678dd")
        for change in r.changed:
            t.append(f"~ {change.backend}\n", style="yellow")
            for line in change.changes:
                t.append(f"    {line}\n")
            for note in change.notes:
                t.append(f"    {note}\n", style="dim")
        for line in r.kept:
            t.append(f"= {line}\n", style="yellow")
        if r.errors:
            t.append("\nerrors (fix the file, then reload again):\n", style="bold red")
            for line in r.errors:
                t.append(f"  {line}\n", style="red")
        t.append("\nesc closes", style="dim")
        with VerticalScroll(id="dialog", classes="reload"):
            yield Label("Descriptors reloaded", id="dialog-title")
            yield Static(t, id="dialog-body")

    def action_close(self) -> None:
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
                          "each backend and job to act on, and the theme"),
                          ("tab", "the next table (backends, jobs, events or processes)"),
                          ("q", "quit (an embedded engine stops its workers)")):
            keys.add_row(key, does, "")
        nav = Table(box=None, padding=(0, 1), show_header=False)
        nav.add_column(style="bold cyan", no_wrap=True)
        nav.add_column()
        for key, does in (
                ("↑ ↓  k j", "move the selection in the focused table"),
                ("PgUp PgDn", "a page up or down (also ctrl+b, ctrl+f)"),
                ("Home End  g G", "the first or the last row"),
                ("o  O", "sort by the next column; reverse the order (again: back to none)"),
                ("space", "mark a job (c then cancels every marked one; esc clears marks)"),
                ("enter", "open the selected backend, job or process's backend"),
                ("mouse", "click a row to select it, click it again to open it; click a "
                          "column header to sort by it (again: reverse); the wheel scrolls; "
                          "the keys in the footer can be clicked")):
            nav.add_row(key, does)
        detail = Text.assemble(
            ("In a job: ", "bold"), "esc back · c cancel · R retry · + - priority (queued) · "
            "w save the result to a file · b its backend · f follow the log\n",
            ("In a backend: ", "bold"), "esc back · e evict · r respawn · p preload · "
            "m calibrate · s submit · X kill its worker · L reload descriptors · f follow "
            "the log\n",
            ("In a calibration: ", "bold"), "the live chart with its phase bands, then the "
            "results · c cancel the run · w save the report as…\n",
            ("Look: ", "bold"), "ctrl+p → theme, or --theme NAME; NO_COLOR=1 for no colour "
            "(the bars keep distinct characters)")
        bars = Text()
        for char, style, what in (("█", fmt.SEG_OURS, "used by our workers' processes"),
                                  ("▒", fmt.SEG_RESERVED, "reserved by admission, not used"),
                                  ("▓", fmt.SEG_OVER, "used beyond the reservation"),
                                  ("▞", fmt.SEG_FOREIGN, "used by processes not ours"),
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
        return Group(Text("vramtui — keys", style="bold"), keys, Text(""),
                     Text("Tables", style="bold"), nav, Text(""), detail, Text(""),
                     Text("Memory bars", style="bold"), bars,
                     Text("States", style="bold"), states, Text(""), sim, Text(""), mode,
                     Text("esc closes", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)

    def on_click(self, event: events.Click) -> None:
        if event.widget is self:  # a click outside the help box closes it
            self.dismiss(None)


CONFIRMED = frozenset({"evict", "respawn", "cancel_job", "zero", "calibrate", "kill", "drain",
                       "cancel_this"})
