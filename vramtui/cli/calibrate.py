"""``vramtui calibrate`` and ``vramtui recalibrate``: measure a backend, or re-analyse a report.

``calibrate`` queues a calibration run through the running engine (it waits its turn and gets
a GPU to itself), shows a progress bar by phase on stderr while it runs (one line per phase
when stderr is not a terminal), then prints the measured figures with their spread, the
confidence, the findings with their numbers, and where the report and overlay went.  Ctrl-C
cancels the run.  ``recalibrate`` needs neither GPU nor engine: it re-runs the analysis on the
raw samples a report keeps, compares the result with the analysis stored in it, and can write
the overlay into the configuration's ``backends.d``.

Exit codes: 0 a completed run that justified an overlay (recalibrate: the analysis ran, and
the overlay was written if asked); 1 the run failed, was cancelled or earned too low a
confidence for an overlay (said why); 2 bad input; 3 no engine; 4 unknown backend; 130 Ctrl-C
(the run is cancelled).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from supervisor.atomicfile import write_atomic
from supervisor.calibration.record import CalibrationError
from supervisor.calibration.result import Finding, Measure, Report
from supervisor.client import Client
from supervisor.errors import VramtuiError
from supervisor.jobs import JobState, JobView
from supervisor.snapshot import device_label
from supervisor.units import mib_whole

from ..connect import open_client
from ..exits import Exit, UsageError
from .submit import read_request

FIGURES = ("context", "weights", "activation", "peak")
MAX_REPEATS = 100  # the engine's own limit


# -- arguments -------------------------------------------------------------------------------


def calibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("backend", help="the backend to measure (`vramtui backends` lists them)")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="requests to run, one after another (default 3; 2 or more tell a "
                        "leak or a warm-up apart)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--request", metavar="JSON",
                        help="the request each repeat sends, as JSON text (default: the "
                             "backend's calibration_request)")
    source.add_argument("--request-file", metavar="FILE", help="the request, read from FILE")
    p.add_argument("--settle", type=float, default=1.0, metavar="S",
                   help="seconds to watch the memory settle after loading and after each "
                        "request, and at least until one sample of it (default 1)")
    p.add_argument("--out", metavar="FILE",
                   help="also write the measured descriptor overlay (YAML) to FILE, as "
                        "vramd's --out does (nothing is written when the run earns none)")
    p.add_argument("--report", metavar="FILE", help="also copy the JSON report to FILE")


def recalibrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("report", metavar="REPORT.json",
                   help="a calibration report (`vramtui calibrate` names the one it writes)")
    p.add_argument("--write-overlay", action="store_true",
                   help="write the measured figures into the config's backends.d (when the "
                        "report justifies them)")


# -- input -----------------------------------------------------------------------------------


def _request(args: argparse.Namespace) -> bytes | None:
    """The request for each repeat: --request (JSON), --request-file, else the backend's."""
    return read_request(args.request, args.request_file, "request")


def _out_target(out: str | None, flag: str = "--out") -> Path | None:
    """``--out FILE`` (or ``--report FILE``), checked before the run starts (a calibration
    can take minutes)."""
    if out is None:
        return None
    target = Path(out)
    if target.is_dir():
        raise UsageError(f"{flag} {out} is a directory; name a file")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {out}: cannot write in {parent}")
    return target


# -- progress ----------------------------------------------------------------------------------


def phase_label(phase: str, repeats: int) -> str:
    """A phase name (the job's progress_text) with a few words on what happens in it."""
    kind, _, number = phase.partition("-")
    if kind in ("predict", "settle") and number.isdigit():
        if kind == "predict":
            return f"{phase}: request {number}/{repeats}"
        return f"{phase}: memory after request {number}/{repeats}"
    words = {
        "start": "starting a fresh worker",
        "initialize": "loading the model",
        "settle-load": "memory after loading",
        "shutdown": "unloading",
        "exited": "watching the memory return",
        "end": "analysing the samples",
    }
    return f"{phase}: {words[phase]}" if phase in words else phase


class _PhaseView:
    """The run's phases on stderr: a rich progress bar on a terminal, else a line per phase."""

    def __init__(self, backend: str, repeats: int, *, bar: bool, lines: bool) -> None:
        self.backend = backend
        self.repeats = repeats
        self.bar = bar
        self.lines = lines
        self._progress: Any = None
        self._task: Any = None
        self._last = ""

    def __enter__(self) -> _PhaseView:
        if self.bar:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                TextColumn(f"[bold]calibrate {escape(self.backend)}"), BarColumn(),
                TextColumn("{task.description}"), TimeElapsedColumn(),
                console=Console(stderr=True, highlight=False), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("submitted", total=None)
        return self

    def update(self, view: JobView) -> None:
        if view.state is JobState.QUEUED:
            where = f" (position {view.position})" if view.position else ""
            text = f"queued{where}" + (f": {view.waiting}" if view.waiting else "")
        elif view.state is JobState.RUNNING and view.progress_text:
            text = phase_label(view.progress_text, self.repeats)
        else:
            text = view.state.value.replace("_", " ")
        if self._progress is not None:
            total = 1.0 if view.progress is not None else None
            self._progress.update(self._task, description=escape(text), total=total,
                                  completed=view.progress or 0.0)
        elif self.lines and text != self._last:
            sys.stderr.write(f"calibrate {self.backend}: {text}\n")
            sys.stderr.flush()
        self._last = text

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)


def _follow(client: Client, job_id: str, view: _PhaseView) -> JobView:
    """Follow the run's job events until it ends; its final view (with the result data)."""
    sub = client.subscribe(kinds=("job",), job_id=job_id)
    try:
        with view:
            current = client.job(job_id)  # what happened before the subscription began
            view.update(current)
            next_poll = time.monotonic() + 0.5
            while not current.finished:
                if current.state is JobState.QUEUED and time.monotonic() >= next_poll:
                    current = client.job(job_id)  # the queue position is only known here
                    view.update(current)
                    next_poll = time.monotonic() + 0.5
                    continue
                event = sub.get(timeout=0.5)
                if event is None:
                    continue
                if event.kind == "closed":
                    break
                if event.job is not None and event.job.id == job_id:
                    current = event.job
                    view.update(current)
    finally:
        sub.close()
    return client.wait(job_id)


def _interrupted(client: Client, job_id: str, backend: str) -> int:
    """Ctrl-C: cancel the run, and say so."""
    sys.stderr.write("\n")
    try:
        view = client.cancel(job_id)
    except VramtuiError as exc:
        from ..output import error

        error(f"could not cancel the calibration of {backend} (job {job_id}): {exc}")
        return Exit.INTERRUPTED
    if view.finished and view.state is not JobState.CANCELLED:
        sys.stderr.write(f"vramtui: the calibration of {backend} (job {job_id}) had already "
                         f"{view.state.value.replace('_', ' ')}; nothing to cancel\n")
    else:
        sys.stderr.write(f"vramtui: interrupted: the calibration of {backend} (job {job_id}) "
                         "is cancelled; nothing was written\n")
    return Exit.INTERRUPTED


# -- the calibrate command ----------------------------------------------------------------------


def calibrate(args: argparse.Namespace) -> int:
    request = _request(args)
    if not 1 <= args.repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats must be between 1 and {MAX_REPEATS}, got {args.repeats}")
    if not args.settle > 0:
        raise UsageError(f"--settle must be more than 0 seconds, got {args.settle:g}")
    out = _out_target(args.out)
    report_out = _out_target(args.report, "--report")
    if out is not None and report_out is not None and out.resolve() == report_out.resolve():
        raise UsageError("--out (the overlay) and --report (the JSON report) name the same file")
    client = open_client(args)
    job_id = client.calibrate(args.backend, repeats=args.repeats, request=request,
                              settle_s=args.settle)
    tty = sys.stderr.isatty()
    view = _PhaseView(args.backend, args.repeats, bar=tty and not args.json,
                      lines=not tty and not args.json)
    try:
        final = _follow(client, job_id, view)
    except KeyboardInterrupt:
        return _interrupted(client, job_id, args.backend)
    return _finish(client, final, args, out, report_out)


def _summary_of(view: JobView) -> dict[str, Any] | None:
    if not view.data:
        return None
    try:
        value = json.loads(view.data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _finish(client: Any, view: JobView, args: argparse.Namespace, out: Path | None,
            report_out: Path | None) -> int:
    from ..output import error, print_json
    from ..output import out as console

    summary = _summary_of(view)
    report_path = Path(summary["report"]) if summary and summary.get("report") else None
    report: Report | None = None
    unreadable: str | None = None
    data: bytes | None = None
    if report_path is not None:
        try:  # through the API: the engine's files may not be readable here
            data = client.calibration_report(view.backend, name=report_path.name).data
            from supervisor.calibration.report import parse_report

            _record, report = parse_report(data, report_path)
        except (CalibrationError, VramtuiError) as exc:
            unreadable = str(exc)
    copied: str | None = None
    if report_out is not None and data is not None:
        try:
            write_atomic(report_out, data, mode=0o644)
            copied = str(report_out)
        except OSError as exc:
            error(f"cannot copy the report to --report {report_out}: {exc.strerror or exc}")
            return Exit.USAGE
    wrote: str | None = None
    overlay_yaml = summary.get("overlay_yaml") if summary else None
    if out is not None and isinstance(overlay_yaml, str):
        try:
            write_atomic(out, overlay_yaml, mode=0o644)
            wrote = str(out)
        except OSError as exc:
            error(f"cannot write the overlay to --out {out}: {exc.strerror or exc}")
            return Exit.USAGE

    overlay = summary.get("overlay") if summary else None
    why = _why_not(view, summary, report)
    if args.json:
        document: dict[str, Any] = {"job": view.id, "state": view.state.value,
                                    **(summary or {"backend": view.backend})}
        if view.error and view.state is not JobState.SUCCEEDED:
            document["job_error"] = view.error
        document.pop("overlay_yaml", None)
        if wrote:
            document["out"] = wrote
        if copied:
            document["report_copy"] = copied
        print_json(document)
    else:
        if report is not None:
            render_report(report)
        elif summary is not None:
            render_summary(summary)
            if unreadable:
                console.print(f"[dim](figures without spread: {escape(unreadable)})[/]")
        if report_path is not None:
            console.print(f"report: {escape(str(report_path))}")
        if copied:
            console.print(f"report copied to: {escape(copied)}")
        if overlay:
            console.print(f"overlay: {escape(str(overlay))} (admission uses the measured peak "
                          "from now on)")
        if wrote:
            console.print(f"overlay written to: {escape(wrote)}")
    if overlay and view.state is JobState.SUCCEEDED:
        return Exit.OK
    error(f"calibration of {view.backend}: {why}")
    return Exit.FAILED


def _why_not(view: JobView, summary: dict[str, Any] | None, report: Report | None) -> str:
    """Why a run wrote no overlay, in one line."""
    if view.state is JobState.CANCELLED:
        return f"cancelled ({view.error or 'no reason'}); nothing was written"
    if view.state is not JobState.SUCCEEDED:
        if summary is not None and summary.get("outcome"):
            what, reason = str(summary["outcome"]), summary.get("error") or view.error
        else:
            what, reason = view.state.value.replace("_", " "), view.error
        return f"the run {what}: {reason or 'no reason'}; no overlay was written"
    if report is not None and report.overlay_refusal is not None:
        return f"no overlay was written: {report.overlay_refusal}"
    if summary is not None and summary.get("confidence") == "low":
        return f"no overlay was written: confidence is low: {summary.get('reason')}"
    return "no overlay was written"


# -- rendering ---------------------------------------------------------------------------------


def _measure_cells(measure: Measure | None) -> tuple[str, str, str]:
    if measure is None:
        return "not measured", "–", "–"
    return mib_whole(measure.value_mib), mib_whole(measure.spread_mib), str(measure.samples)


def _numbers(finding: Finding) -> str:
    return ", ".join(f"{key}={value}" for key, value in finding.numbers.items())


def figures_table(report: Report) -> Table:
    table = Table(title=escape(f"Calibration of {report.backend}"), title_justify="left")
    for col in ("figure", "value", "spread", "samples"):
        table.add_column(col, justify="left" if col == "figure" else "right")
    for name in FIGURES:
        table.add_row(name, *_measure_cells(getattr(report, name)))
    return table


def render_report(report: Report) -> None:
    """The figures with their spread, the confidence and the findings with their numbers."""
    from ..output import out

    out.print(f"{escape(report.backend)} on {escape(device_label(report.source, report.gpu))}: "
              f"{report.repeats} repeats, {report.sample_count} samples in "
              f"{report.duration_s:.1f} s, run {escape(report.outcome)}")
    out.print(figures_table(report))
    extra = []
    if report.resident is not None:
        extra.append(f"resident {mib_whole(report.resident.value_mib)}")
    if report.load_peak_mib is not None:
        extra.append(f"load peak {mib_whole(report.load_peak_mib)}")
    if report.predict_peak_mib is not None:
        extra.append(f"request peak {mib_whole(report.predict_peak_mib)}")
    runs = [mib_whole(p) for p in report.run_peaks]
    if runs:
        extra.append("run peaks " + " / ".join(runs))
    if extra:
        out.print(", ".join(extra))
    style = {"high": "green", "medium": "yellow", "low": "bold red"}.get(report.confidence, "")
    out.print(f"confidence: [{style}]{report.confidence}[/]: {escape(report.reason)}")
    _render_findings([(f.code, f.message, _numbers(f), f.about_measurement)
                      for f in report.findings])


def render_summary(summary: dict[str, Any]) -> None:
    """The same from a job's summary alone (when the report file cannot be read)."""
    from ..output import out

    table = Table(title=escape(f"Calibration of {summary.get('backend', '?')}"),
                  title_justify="left")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name in FIGURES:
        value = summary.get(f"{name}_mib")
        table.add_row(name, "not measured" if value is None else mib_whole(value))
    out.print(table)
    out.print(f"confidence: {escape(str(summary.get('confidence')))}: "
              f"{escape(str(summary.get('reason')))}")
    _render_findings([(str(f.get("code")), str(f.get("message")), "", False)
                      for f in summary.get("findings") or [] if isinstance(f, dict)])


def _render_findings(findings: list[tuple[str, str, str, bool]]) -> None:
    from ..output import out

    if not findings:
        out.print("findings: none")
        return
    out.print("findings:")
    for code, message, numbers, about_measurement in findings:
        style = "dim" if about_measurement else "yellow"
        tail = f" [dim]({escape(numbers)})[/]" if numbers else ""
        out.print(f"  [{style}]{escape(code)}[/]: {escape(message)}{tail}")


# -- the recalibrate command ----------------------------------------------------------------


def _measure_text(measure: Measure | None) -> str:
    if measure is None:
        return "not measured"
    return f"{measure.value_mib} MiB (spread {measure.spread_mib} MiB)"


def changes(stored: Report, new: Report) -> list[str]:
    """What the new analysis says differently from the stored one, one line per change."""
    lines: list[str] = []
    if stored.analysis_version != new.analysis_version:
        lines.append(f"analysis version {stored.analysis_version} -> {new.analysis_version}")
    for name in (*FIGURES, "resident"):
        before, after = getattr(stored, name), getattr(new, name)
        if before != after:
            lines.append(f"{name}: {_measure_text(before)} -> {_measure_text(after)}")
    if stored.confidence != new.confidence:
        lines.append(f"confidence: {stored.confidence} -> {new.confidence} ({new.reason})")
    elif stored.reason != new.reason:
        lines.append(f"reason: {stored.reason!r} -> {new.reason!r}")
    old_codes, new_codes = set(stored.codes), set(new.codes)
    added = [c for c in new.codes if c not in old_codes]
    removed = [c for c in stored.codes if c not in new_codes]
    if added:
        lines.append("new findings: " + ", ".join(added))
    if removed:
        lines.append("findings gone: " + ", ".join(removed))
    kept = {f.code: f for f in stored.findings}
    for finding in new.findings:
        old = kept.get(finding.code)
        if old is not None and old.numbers != finding.numbers:
            lines.append(f"finding {finding.code}: {_numbers(old)} -> {_numbers(finding)}")
    if stored.overlay_refusal != new.overlay_refusal:
        before = stored.overlay_refusal or "an overlay"
        after = new.overlay_refusal or "an overlay"
        lines.append(f"justifies: {before} -> {after}")
    return lines


def overlay_path(backend: str) -> Path:
    """Where a calibrated overlay goes: the config's ``backends.d`` (as the engine writes it)."""
    from supervisor.paths import Paths

    return Paths.from_env().calibration_overlay(backend)


def recalibrate(args: argparse.Namespace) -> int:
    from supervisor.calibration.analysis import analyze
    from supervisor.calibration.report import load_report, write_calibrated_overlay

    from ..output import error, out, print_json

    path = Path(args.report)
    try:
        record, stored = load_report(path)
        report = analyze(record)
    except CalibrationError as exc:
        text = str(exc)
        raise UsageError(text if text.startswith(str(path)) else f"{path}: {text}") from None
    diff = changes(stored, report)
    written: Path | None = None
    refused: str | None = None
    if args.write_overlay:
        target = overlay_path(report.backend)
        try:
            target.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            target.parent.mkdir(mode=0o700, exist_ok=True)
            written = write_calibrated_overlay(target, report)
        except CalibrationError:
            refused = report.overlay_refusal or "the report justifies no overlay"
        except OSError as exc:
            raise UsageError(f"cannot write the overlay {target}: {exc.strerror or exc}"
                             ) from None
    if args.json:
        print_json({**report.summary(), "report": str(path), "changed": diff,
                    "stored": stored.summary(),
                    "overlay": str(written) if written else None,
                    "overlay_refusal": report.overlay_refusal})
    else:
        render_report(report)
        if diff:
            out.print("changed from the stored analysis:")
            for line in diff:
                out.print(f"  {escape(line)}")
        else:
            out.print(f"same figures, confidence and findings as the stored analysis "
                      f"(analysis version {report.analysis_version})")
        if written:
            out.print(f"overlay: {escape(str(written))} (a running engine reads it when it "
                      "restarts)")
    if refused is not None:
        error(f"no overlay for {report.backend}: {refused}")
        return Exit.FAILED
    return Exit.OK
