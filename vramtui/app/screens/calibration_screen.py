"""The calibration view: a run's memory live with its phases, then the results and findings.

``m`` queues a calibration of a backend (``api.calibrate``: a fresh worker alone on a GPU,
sampled at 20 Hz through start, load, requests and unload) and opens `CalibrationScreen` for
that job.  While the run goes on, the chart shows the memory used on its GPU (the device
figure from each snapshot: the run has that GPU to itself) under coloured phase bands whose
names come from the job's progress text as the engine's events report it.  When the run
ends, the screen asks the engine for the JSON report it wrote (``calibration_report``: an
attached TUI may not be able to read the engine's files) and redraws the chart from the
worker's own 20 Hz samples and phase marks, then shows the measured footprint, the findings,
where the overlay went (or why none was written), and offers to save a copy of the report.

A running calibration is not part of the engine's snapshot (it is no backend's job), so the
screen asks for the job itself (``api.job``) once per snapshot until it has finished.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static

from supervisor.calibration.record import CalibrationRecord
from supervisor.calibration.report import parse_report
from supervisor.calibration.result import Finding, Measure, Report
from supervisor.jobs import JobState, JobView
from supervisor.snapshot import EngineSnapshot, device_label

from .. import fmt
from ..widgets.key_footer import KeyFooter
from ..widgets.line import Line
from ..widgets.phase_chart import (
    BAR_COLOUR,
    PHASE_FG,
    PhaseChart,
    live_span,
    phase_kind,
    phase_legend,
)
from ..widgets.titles import titles
from .keys import key_binding
from .save_data_dialog import SaveDataDialog
from .snapshot_screen import SnapshotScreen


def _measure_row(name: str, m: Measure | None, bold: bool = False) -> tuple[Any, ...]:
    style = "bold" if bold else ""
    if m is None:
        return (name, Text("not measured", style="dim"), "", "")
    return (name, Text(fmt.mib(m.value_mib), style=style), f"{m.spread_mib} MiB",
            str(m.samples))


CONFIDENCE_STYLE = {"high": "bold green", "medium": "bold yellow", "low": "bold red"}


def results_table(report: Report, declared_before: int | None) -> Group:
    """The footprint (context, weights, activation, peak, with spreads), then confidence."""
    table = Table(box=None, padding=(0, 1), show_header=True, header_style="bold",
                  pad_edge=False)
    table.add_column("", style="dim", no_wrap=True)
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("spread", justify="right", style="dim", no_wrap=True)
    table.add_column("samples", justify="right", style="dim", no_wrap=True)
    table.add_row(*_measure_row("context", report.context))
    table.add_row(*_measure_row("weights", report.weights))
    table.add_row(*_measure_row("activation", report.activation))
    table.add_row(*_measure_row("peak", report.peak, bold=True))
    table.add_row(*_measure_row("resident", report.resident))
    parts: list[Any] = [table]
    extra = Table.grid(padding=(0, 1))
    extra.add_column(style="dim", no_wrap=True)
    extra.add_column()
    extra.add_row("load peak", fmt.mib(report.load_peak_mib))
    runs = " · ".join("–" if p is None else str(p) for p in report.run_peaks)
    extra.add_row("request peak", f"{fmt.mib(report.predict_peak_mib)}"
                  + (f"  (runs: {runs} MiB)" if runs else ""))
    if declared_before is not None and report.peak is not None:
        diff = report.peak.value_mib - declared_before
        pct = diff / declared_before * 100 if declared_before else 0.0
        how = ("the same as" if diff == 0 else
               f"{fmt.mib(abs(diff))} ({abs(pct):.0f} %) "
               + ("above" if diff > 0 else "below"))
        extra.add_row("declared", Text.assemble(
            fmt.mib(declared_before), (f"  measured peak {how} it",
                                       "bold red" if diff > 0 else "green")))
    where = device_label(report.source, report.gpu) if report.source == "host" \
        else f"{report.source} GPU{report.gpu}"
    extra.add_row("duration", f"{fmt.dur(report.duration_s)}, {report.sample_count} samples, "
                              f"{report.repeats} repeats ({where})")
    parts.append(extra)
    conf = Text.assemble(("confidence ", "dim"),
                         (report.confidence, CONFIDENCE_STYLE.get(report.confidence, "")),
                         ("  " + report.reason, ""))
    parts.append(conf)
    return Group(*parts)


def _number(key: str, value: Any) -> str:
    name = key.replace("_", " ")
    if key.endswith("_mib") and isinstance(value, int | float):
        return f"{name[:-4]} {fmt.mib(int(value))}"
    if key.endswith("_s") and isinstance(value, int | float):
        return f"{name[:-2]} {value:g} s"
    if isinstance(value, float):
        return f"{name} {value:.3g}"
    if isinstance(value, list | tuple):
        return f"{name} " + "/".join(str(v) for v in value)
    return f"{name} {value}"


def findings_text(findings: Sequence[Finding]) -> Text:
    """Each finding: its code (model behaviour or measurement quality), words, numbers."""
    if not findings:
        return Text("None: the samples show nothing unusual (no load spike, warm-up, leak, "
                    "lazy loading or memory kept after unload).", style="dim")
    t = Text()
    for i, f in enumerate(findings):
        if i:
            t.append("\n")
        about = "measurement" if f.about_measurement else "model"
        t.append("● ", style="yellow" if f.about_measurement else "cyan")
        t.append(f.code, style="bold")
        t.append(f"  ({about})\n", style="dim")
        t.append(f.message + "\n")
        if f.numbers:
            t.append("  " + " · ".join(_number(k, v) for k, v in f.numbers.items()) + "\n",
                     style="dim")
    return t


class CalibrationScreen(SnapshotScreen):
    """One calibration run: live while it runs, then the report's figures and findings."""

    BINDINGS = [
        Binding("escape,backspace", "back", "Back", id="back",
                tooltip="Back (a running calibration goes on)"),
        key_binding("c", "cancel_run", "Cancel run", "Cancel this calibration run (asks first)"),
        key_binding("w", "save", "Save report as…",
                    "Save a copy of the JSON report (every sample)"),
    ]

    def __init__(self, job_id: str, backend: str, declared_before: int | None = None) -> None:
        super().__init__()
        self.job_id = job_id
        self.backend = backend
        self.declared_before = declared_before
        self.view: JobView | None = None
        self.summary: dict[str, Any] | None = None
        self.record: CalibrationRecord | None = None
        self.report: Report | None = None
        self.problem: str | None = None  # why there are no results (cancelled, no report)
        self.saved_to: Path | None = None
        self.live: list[tuple[float, int]] = []
        self.report_data: bytes | None = None  # the JSON report, as the engine sent it
        self._live_until = -math.inf

    def compose(self) -> ComposeResult:
        yield self.header()
        yield Static(id="cal-status")
        with Vertical(id="cal-chart-box", classes="box"):
            yield PhaseChart(id="cal-chart")
            yield Line(id="cal-legend")
        with VerticalScroll(id="cal-body"):
            with Horizontal(classes="cols"):
                yield Static(id="cal-results", classes="box")
                yield Static(id="cal-findings", classes="box")
            yield Static(id="cal-save", classes="box")
        yield KeyFooter(compact=True)

    def on_mount(self) -> None:
        self.query_one("#cal-chart-box").border_title = f"Calibration of {self.backend}"
        titles(self.query_one("#cal-results"), "Results")
        self.query_one("#cal-findings").border_title = "Findings"
        self.query_one("#cal-save").border_title = "Overlay and report"
        self.query_one("#cal-status", Static).update(Text(f"calibration {self.job_id} of "
                                                          f"{self.backend}: asking the engine…",
                                                          style="dim"))
        self.query_one("#cal-body").focus()  # the arrow keys scroll the results

    @property
    def finished(self) -> bool:
        return self.view is not None and self.view.finished

    # -- keys ---------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_run":
            if self.finished:
                return False  # nothing to cancel: not shown
            return None if self.vapp.readonly else True
        if action == "save":
            return True if self.summary and self.summary.get("report") and \
                self.report is not None else None
        return True

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_cancel_run(self) -> None:
        if self.finished:
            return
        phase = self.view.progress_text if self.view is not None else ""
        self.vapp.request_cancel_calibration(self.job_id, self.backend, phase)

    def action_save(self) -> None:
        path = (self.summary or {}).get("report")
        if not path or self.report is None or self.report_data is None:
            self.notify("No report to save yet.", severity="warning")
            return

        def saved(target: Path | None) -> None:
            if target is not None:
                self.saved_to = target
                self.notify(f"Saved the report to {fmt.short_path(target)}.", title="calibration")
                self._show_save()

        self.app.push_screen(SaveDataDialog(
            "Save the calibration report as…",
            Text.assemble(("The JSON report: every raw sample and phase mark, and the "
                           "analysis, from ", ""), fmt.short_path(str(path))),
            Path(str(path)).name, self.report_data), saved)

    # -- data ----------------------------------------------------------------------------
    def show_snapshot(self, snap: EngineSnapshot | None) -> None:
        super().show_snapshot(snap)
        if snap is None:
            return
        if self.view is not None and self.view.finished:
            return
        view = next((j for j in (*snap.queued, *snap.running, *snap.recent)
                     if j.id == self.job_id), None)
        if view is None or view.finished:
            # a running calibration is not in the snapshot, and a remote snapshot may leave
            # out a finished job's result (the summary): ask for the job itself
            self._fetch()
        else:
            self.show_job(view)

    @work(thread=True, exclusive=True, group="calibration-job")
    def _fetch(self) -> None:
        try:
            view = self.vapp.api.job(self.job_id)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.vapp.ui(self._fetch_failed, exc)
            return
        self.vapp.ui(self.show_job, view)

    def _fetch_failed(self, exc: Exception) -> None:
        if self.is_mounted and self.view is None:
            self.query_one("#cal-status", Static).update(
                Text(f"calibration {self.job_id}: {exc}", style="red"))

    def show_job(self, view: JobView) -> None:
        if not self.is_mounted or (self.view is not None and self.view.finished):
            return
        first = self.view is None
        self.view = view
        if first or view.finished:
            self.refresh_bindings()
        if view.state in (JobState.RUNNING, JobState.STARTING) or view.finished:
            self._fold_live(view, self.vapp.snap)
        self._show_status()
        if view.finished:
            self._ended(view)
        else:
            self._show_live(view)

    def _fold_live(self, view: JobView, snap: EngineSnapshot | None) -> None:
        """Add the run's GPU readings this snapshot brought (the run has that GPU alone)."""
        if snap is None or view.gpu is None or view.started_at is None:
            return
        gpu = next((g for g in snap.gpus if g.index == view.gpu), None)
        if gpu is None or not gpu.history:
            return
        new: list[tuple[float, int]] = []
        end = view.finished_at if view.finished_at is not None else math.inf
        for t, used in reversed(gpu.history):
            if t <= self._live_until:
                break
            if view.started_at <= t <= end:
                new.append((t - view.started_at, used))
        self._live_until = gpu.history[-1][0]
        self.live.extend(reversed(new))

    def live_bands(self, view: JobView) -> list[tuple[float, str]]:
        """(seconds since the run started, phase) from the job's progress events."""
        if view.started_at is None:
            return []
        bands: list[tuple[float, str]] = []  # event times and the view's are wall clock
        for t, _fraction, text in self.vapp.progress.get(self.job_id, ()):
            if text and (not bands or bands[-1][1] != text):
                bands.append((max(0.0, t - view.started_at), text))
        if not bands and view.progress_text:
            bands.append((0.0, view.progress_text))
        return bands

    def elapsed(self, view: JobView) -> float | None:
        if view.started_at is None:
            return None
        end = view.finished_at if view.finished_at is not None else \
            fmt.engine_now(self.vapp.snap, self.vapp.clocks)
        return max(0.0, end - view.started_at)

    # -- rendering -------------------------------------------------------------------------
    def _show_status(self) -> None:
        view = self.view
        assert view is not None
        t = Text(no_wrap=False)
        t.append(f" {self.backend} ", style="bold reverse")
        t.append("  ")
        t.append(view.state.value, style=fmt.JOB_STATE_STYLE.get(view.state.value, ""))
        if view.state is JobState.QUEUED:
            pos = f" #{view.position}" if view.position else ""
            t.append(f"{pos}  waiting for a GPU to itself", style="yellow")
            if view.waiting:
                t.append(f": {view.waiting}", style="dim")
        elif not view.finished:
            t.append("  phase ", style="dim")
            t.append(view.progress_text or "…", style="bold")
        elapsed = self.elapsed(view)
        if elapsed is not None:
            t.append("  ·  ", style="dim")
            t.append(fmt.dur(elapsed) + (" elapsed" if not view.finished else ""))
        if view.gpu is not None:
            t.append(f"  ·  GPU{view.gpu}", style="dim")
        if self.size.width >= 120:
            t.append(f"  ·  job {view.id}", style="dim")
        if self.report is not None:
            t.append("\n")
            t.append(self.report.headline(), style="bold")
        elif self.problem is not None:
            t.append("\n")
            t.append(self.problem, style="bold #c678dd" if view.state is JobState.CANCELLED
                     else "bold red")
        self.query_one("#cal-status", Static).update(t)

    def _show_live(self, view: JobView) -> None:
        chart = self.query_one(PhaseChart)
        elapsed = self.elapsed(view) or 0.0
        chart.show(self.live, self.live_bands(view), live_span(elapsed), now=elapsed)
        gpu = f"GPU{view.gpu}" if view.gpu is not None else "the GPU"
        self.query_one("#cal-legend", Line).set(phase_legend(Text.assemble(
            ("█", BAR_COLOUR), (f" {gpu} used, live", "dim"))))
        titles(self.query_one("#cal-chart-box"), f"Calibration of {self.backend} · live",
               "the worker's own 20 Hz samples when it ends")
        results = self.query_one("#cal-results", Static)
        titles(results, "Phases")
        if view.state is JobState.QUEUED:
            results.update(Text("Waiting for a GPU to itself: the run starts when no other "
                                "job holds one (idle workers there are evicted).", style="dim"))
        else:
            results.update(self._phase_table(view))
        self.query_one("#cal-findings", Static).update(Text(
            "The findings come with the results when the run ends.", style="dim"))
        self.query_one("#cal-save", Static).update(Text.assemble(
            "When the run ends the engine writes its JSON report (every raw sample and "
            "phase mark) and, if the run earns at least medium confidence, an overlay with "
            "the measured figures that admission uses at once.\n",
            ("c cancels the run: nothing is written.", "dim")))

    def _phase_table(self, view: JobView) -> Table:
        bands = self.live_bands(view)
        table = Table.grid(padding=(0, 2))
        table.add_column(style="dim", justify="right", no_wrap=True)
        table.add_column(no_wrap=True)
        table.add_column(style="dim", justify="right", no_wrap=True)
        now = self.elapsed(view) or 0.0
        for i, (t, phase) in enumerate(bands):
            end = bands[i + 1][0] if i + 1 < len(bands) else now
            kind = phase_kind(phase)
            table.add_row(f"+{t:.1f}s", Text(phase, style=PHASE_FG.get(kind, "")),
                          fmt.dur(end - t) + ("" if i + 1 < len(bands) else " so far"))
        if not bands:
            table.add_row("", Text("starting…", style="dim"), "")
        return table

    def _ended(self, view: JobView) -> None:
        summary: dict[str, Any] | None = None
        if view.data:
            try:
                parsed = json.loads(view.data)
                summary = parsed if isinstance(parsed, dict) else None
            except ValueError:
                summary = None
        self.summary = summary
        report = (summary or {}).get("report")
        if report:
            self._load(str(report))
            return
        if view.state is JobState.CANCELLED:
            self.problem = "Cancelled: no report and no overlay were written."
        else:
            self.problem = f"{view.state.value}: {view.error or 'no report was written'}"
        self._show_status()
        self._show_without_report(view)

    @work(thread=True, exclusive=True, group="calibration-report")
    def _load(self, path: str) -> None:
        try:
            found = self.vapp.api.calibration_report(self.backend, name=Path(path).name)
            record, report = parse_report(found.data, found.path)
        except Exception as exc:  # noqa: BLE001 - shown on the screen
            self.vapp.ui(self._loaded, None, None, str(exc))
            return
        self.report_data = found.data
        self.vapp.ui(self._loaded, record, report, None)

    def _loaded(self, record: CalibrationRecord | None, report: Report | None,
                problem: str | None) -> None:
        if not self.is_mounted:
            return
        self.record, self.report, self.problem = record, report, problem
        self.refresh_bindings()
        self._show_status()
        if record is None or report is None:
            assert self.view is not None
            self._show_without_report(self.view)
            return
        self._show_results(record, report)

    def _show_without_report(self, view: JobView) -> None:
        chart = self.query_one(PhaseChart)
        chart.show(self.live, self.live_bands(view), max(self.elapsed(view) or 0.0, 1.0))
        titles(self.query_one("#cal-chart-box"), f"Calibration of {self.backend} · "
               f"{view.state.value}", "what the GPU showed while it ran")
        titles(self.query_one("#cal-results", Static), "Phases")
        self.query_one("#cal-results", Static).update(self._phase_table(view))
        self.query_one("#cal-findings", Static).update(Text("No findings: no report.",
                                                            style="dim"))
        self._show_save()

    def _show_results(self, record: CalibrationRecord, report: Report) -> None:
        per_process = any(s.procs for s in record.samples)
        if per_process:
            series = [(s.t, s.total or 0) for s in record.samples]
            what = "the worker's memory"
        else:
            series = [(s.t, s.device_used_mib or 0) for s in record.samples]
            what = f"GPU{record.gpu} used (no per-process figures)"
        bands = [(m.t, m.phase) for m in record.marks]
        span = max([t for t, _v in series[-1:]] + [t for t, _p in bands[-1:]] + [1.0])
        peak = report.peak.value_mib if report.peak is not None else None
        self.query_one(PhaseChart).show(series, bands, span, peak)
        legend = Text.assemble(("█", BAR_COLOUR), (f" {what}", "dim"))
        if peak is not None:
            legend.append("  ╌", style="yellow")
            legend.append(" measured peak", style="dim")
        self.query_one("#cal-legend", Line).set(phase_legend(legend))
        titles(self.query_one("#cal-chart-box"),
               f"Calibration of {self.backend} · {record.outcome}",
               f"{len(record.samples)} samples at {record.sample_hz:g} Hz")
        results = self.query_one("#cal-results", Static)
        titles(results, "Results")
        results.update(results_table(report, self.declared_before))
        self.query_one("#cal-findings", Static).update(findings_text(report.findings))
        self._show_save()

    def _show_save(self) -> None:
        summary = self.summary or {}
        report = self.report
        t = Text()
        overlay = summary.get("overlay")
        if overlay:
            t.append("✔ overlay written: ", style="bold green")
            t.append(fmt.short_path(overlay) + "\n")
            peak = fmt.mib(report.peak.value_mib) if report is not None and report.peak \
                else "the measured peak"
            t.append(f"  admission uses {peak} at peak for {self.backend} from now on; delete "
                     "the file to go back to the descriptor's figures.\n", style="dim")
        else:
            if report is not None and report.overlay_refusal is not None:
                why = report.overlay_refusal
            elif self.view is not None and self.view.state is JobState.CANCELLED:
                why = "the run was cancelled"
            else:
                why = self.problem or (self.view.error if self.view is not None else None) \
                    or "the run earned none"
            t.append("✖ no overlay written: ", style="bold yellow")
            t.append(why + "\n")
            t.append("  admission keeps the descriptor's figures.\n", style="dim")
        path = summary.get("report")
        if path:
            t.append("report  ", style="dim")
            t.append(fmt.short_path(path))
            if self.record is not None:
                t.append(f"  ({len(self.record.samples)} raw samples, "
                         f"{len(self.record.marks)} phase marks; `vramtui recalibrate` "
                         "re-analyses it)", style="dim")
            t.append("\n")
            if self.saved_to is not None:
                t.append("saved   ", style="dim")
                t.append(fmt.short_path(self.saved_to) + "\n", style="green")
            if self.report is not None:
                t.append("w", style="bold cyan")
                t.append(" save a copy of the report as…", style="dim")
        else:
            t.append("no report was written", style="dim")
        t.rstrip()
        self.query_one("#cal-save", Static).update(t)
