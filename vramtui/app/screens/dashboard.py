"""`Dashboard`: GPUs, backends, jobs and the event log (or the GPUs' processes) at a
glance, with the keys that act on the selection (`DASHBOARD_BINDINGS`, which the help
lists).
"""

from __future__ import annotations

import math

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.widgets import Input, Static

from supervisor.snapshot import EngineSnapshot

from .. import fmt
from ..widgets.backends_table import BackendsTable
from ..widgets.cells import trim
from ..widgets.event_log import EventLog
from ..widgets.gpu_panel import GpuPanel
from ..widgets.jobs_table import JobsTable
from ..widgets.key_footer import KeyFooter
from ..widgets.process_table import ProcessTable
from ..widgets.row_table import RowTable
from ..widgets.titles import titles
from .keys import MUTATING, ReadonlyKeys, key_binding
from .snapshot_screen import SnapshotScreen

DASHBOARD_BINDINGS = [
    key_binding("enter", "details", "Details", "Details of the selected backend or job"),
    key_binding("e", "evict", "Evict", "Stop the selected backend's worker and free its memory"),
    key_binding("r", "respawn", "Respawn", "Restart the selected backend's worker (a new process)"),
    key_binding("c", "cancel_job", "Cancel", "Cancel the selected job, or every marked one "
                "(space marks jobs)"),
    key_binding("s", "submit", "Submit", "Submit a job: backend, payload, priority"),
    key_binding("d", "demo", "Demo", "Submit a demo workload to the simulated demo backends"),
    key_binding("R", "retry", "Retry",
                "Run the selected finished job's request again, as a new job"),
    key_binding("plus", "priority_up", "Pri+", "Raise the selected queued job's priority by 1",
                key_display="+"),
    key_binding("minus", "priority_down", "Pri-", "Lower the selected queued job's priority by 1",
                key_display="-"),
    key_binding("p", "preload", "Preload",
                "Start the selected backend's worker now, before any job"),
    key_binding("S", "sleep_wake", "Sleep/Wake",
                "Put the selected backend's idle worker to sleep (its GPU memory given back, "
                "its process kept), or wake it"),
    key_binding("m", "calibrate", "Calibrate", "Measure the selected backend's real peak memory "
                "(a calibration run alone on a GPU)"),
    key_binding("X", "kill", "Kill",
                "SIGKILL the selected backend's (stuck) worker; its jobs fail"),
    key_binding("z", "zero", "Evict idle",
                "Evict every idle backend (frees all memory not in use)"),
    key_binding("D", "drain", "Drain",
                "Drain a GPU (running work finishes, nothing new is admitted "
                "there), or open it again"),
    key_binding("Y", "yield_gpu", "Yield",
                "Hand a GPU over to programs we do not manage (running work finishes, its "
                "models are unloaded), or resume a yielded one"),
    key_binding("L", "reload", "Reload",
                "Read the backend descriptors again and show what changed"),
    key_binding("v", "processes", "Processes",
                "Show each GPU's processes (pid, user, memory, backend "
                "or others) in place of the events, and back"),
    key_binding("slash", "filter", "Filter", "Filter backends, jobs and events by text",
                key_display="/"),
    key_binding("t", "graph_window", "1m/10m", "Switch the memory graphs between 1 and 10 minutes"),
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
        self._job_note: Text | None = None  # what the line under the jobs shows

    def compose(self) -> ComposeResult:
        yield self.header()
        yield Static("", id="banner")
        yield Vertical(id="gpus")
        yield BackendsTable(id="backends")
        with Horizontal(id="lower"):
            with Vertical(id="jobs-box"):
                yield JobsTable(id="jobs")
                yield Static("", id="job-note")
            yield EventLog(self.vapp.clocks, id="log")
            yield ProcessTable(id="procs")
        yield Input(placeholder="filter: backend, job id or state (esc clears)", id="filter")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        backends = self.query_one(BackendsTable)
        backends.border_title = "Backends"
        self.query_one("#jobs-box").border_title = "Jobs"
        self.query_one("#job-note").display = False
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
        else:
            sims = [f"GPU{g.index}" for g in snap.gpus if g.simulated]
            if sims:
                sub += f" · [b #d7afff]figures on {', '.join(sims)} are SIMULATED[/]"
            if any(g.host for g in snap.gpus):
                sub += " · [b]on HOST: figures are host memory (PSS)[/]"
        if app.demo_mode and not app.readonly:
            sub += " · demo: [b]d[/] runs a demo workload"
        titles(backends, subtitle=sub)
        jobs = self.query_one(JobsTable)
        jobs.set_columns(narrow or jobs.size.width < 110)
        jobs.sync(jobs.rows_for(snap, query, app.clocks, recent=8 if narrow else 20))
        self._show_job_note()
        marked = f" · {len(jobs.marked)} marked (c cancels them)" if jobs.marked else ""
        hidden = (f" (first {jobs.QUEUED_SHOWN} shown; / finds any)"
                  if jobs.queued_hidden else "")
        titles(self.query_one("#jobs-box"),
               subtitle=f"{len(snap.running)} running · {len(snap.queued)} queued{hidden} · "
                        f"{len(snap.recent)} finished{marked}")
        procs = self.query_one(ProcessTable)
        if procs.display:
            procs.set_columns(True)
            procs.sync(procs.rows_for(snap, query))
            n = sum(len(g.processes) for g in snap.gpus)
            titles(procs, subtitle=f"{n} on {len(snap.gpus)} GPU(s)"
                   + (" · SIMULATED" if snap.simulated else "")
                   + (" · host memory on HOST" if any(g.host for g in snap.gpus) else ""))
        log = self.query_one(EventLog)
        if log.display:
            log.show(snap.log, query, wrap=True)
            if app.demo_mode and not app.readonly and not self._demo_hinted:
                self._demo_hinted = True  # once, on the first start in demo mode
                log.add(Text.assemble((app.clocks.hms(app.clocks.wall()) + " ", "dim"),
                                      ("▸ Simulated demo: press ", "bold cyan"),
                                      ("d", "bold reverse cyan"),
                                      (" to run a demo workload (12 jobs)", "bold cyan")))
        titles(backends, Content.assemble("Backends · filter ", (query, "bold")) if query
               else "Backends")

    def _show_job_note(self) -> None:
        """Under the jobs: the selected job's whole note, when its column cuts it."""
        jobs = self.query_one(JobsTable)
        whole = jobs.cut_note(jobs.selected_key())
        line = self.query_one("#job-note", Static)
        if whole is not None:
            room = 3 * max(8, jobs.size.width - 2) - 2  # three lines (#job-note), less "↳ "
            if len(whole) > room:  # the rest is on the job's screen
                whole = Text(trim(whole.plain, room - 15) + " (enter: all)", style=whole.style)
            text = Text.assemble(("↳ ", "dim"), whole)
            if text != self._job_note:
                self._job_note = text
                line.update(text)
        line.display = whole is not None

    @on(RowTable.Moved, "#jobs")
    def _job_moved(self, event: RowTable.Moved) -> None:
        self._show_job_note()

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

    def action_sleep_wake(self) -> None:
        if name := self._need(self.selected_backend(), "backend"):
            self.vapp.request_sleep_wake(name)

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

    def action_yield_gpu(self) -> None:
        self.vapp.request_yield()

    def action_reload(self) -> None:
        self.vapp.request_reload()

    def action_processes(self) -> None:
        procs, log = self.query_one(ProcessTable), self.query_one(EventLog)
        procs.display = not procs.display
        log.display = not procs.display
        if log.display:
            log.rewrap()  # what came while it was hidden, at the width it has again
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
