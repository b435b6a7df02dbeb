"""`BackendDetail`: one backend — state, footprint (declared, learned, observed), its
descriptor's layers, its latest calibration and its worker's log; everything asked of
the engine through the API.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import RichLog, Static

from supervisor.snapshot import BackendView, EngineSnapshot
from supervisor.textsafe import visible
from vramtui.peaks import size_to_declare, suggested_peak_mib

from .. import fmt
from ..widgets.key_footer import KeyFooter
from ..widgets.mem_bar import MemBar
from ..widgets.rewrap_log import RewrapLog
from .detail_screen import DetailScreen, kv
from .keys import MUTATING, ReadonlyKeys, key_binding


class BackendDetail(ReadonlyKeys, DetailScreen):
    """One backend: descriptor layers, footprint, calibration report, its worker's log
    (follow); everything read through the API, never from the engine's files."""

    BINDINGS = [
        key_binding("e", "evict", "Evict", "Stop this backend's worker"),
        key_binding("r", "respawn", "Respawn", "Restart this backend's worker"),
        key_binding("p", "preload", "Preload", "Start this backend's worker now"),
        key_binding("m", "calibrate", "Calibrate", "Measure this backend's real peak memory"),
        key_binding("s", "submit", "Submit", "Submit a job to this backend"),
        key_binding("X", "kill", "Kill", "SIGKILL this backend's (stuck) worker; its jobs fail"),
        key_binding("L", "reload", "Reload",
                    "Read the backend descriptors again and show what changed"),
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
            ("GPU", "–" if b.gpu is None else f"HOST{b.gpu} · host memory"
             if any(g.host and g.index == b.gpu for g in snap.gpus) else f"GPU{b.gpu}"),
            ("priority", b.priority),
            ("jobs", f"{b.jobs_served} served · {b.running} running · {b.queued} queued"),
            ("last use", fmt.ago(fmt.engine_now(snap, clocks) - b.last_used)
             if b.last_used else "never"),
            ("keep-alive", _keep_alive_text(b)),
            ("sleep", _sleep_text(b)),
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
        # (a query, not query_one: read in a thread, the boxes may be gone when it comes back,
        # the screen still mounted while the app takes it down)
        for box in self.query("#descriptor").results(Static):
            box.update(descriptor)
        for box in self.query("#calibration").results(Static):
            box.update(calibration)
            self.static_shown = True


def describe_layers(api: Any, name: str) -> Text:
    """The backend's descriptor as the engine reads it: each file's entry (lowest layer
    first, later ones override single keys), then what it runs with now.  A file's text is
    anyone's: what a terminal would act on in it (a bidi override) is written out."""
    try:
        info = api.descriptor(name)
    except Exception as exc:  # noqa: BLE001 - shown in the box
        return Text(f"cannot get the descriptor: {exc}", style="red")
    text = Text()
    if not info.layers:
        text.append("(not from a file)\n", style="dim")
    elif len(info.layers) > 1:  # every layer named first: none is below the fold
        text.append(f"{len(info.layers)} layers, lowest first: ", style="dim")
        text.append(" ← ".join(
            layer.file.rsplit("/", 1)[-1] + (f":{layer.line}" if layer.line else "")
            + (" (overlay)" if "overlay: true" in layer.text else "")
            for layer in info.layers) + "\n", style="bold")
    for i, layer in enumerate(info.layers):
        where = fmt.short_path(layer.file) + (f":{layer.line}" if layer.line else "")
        label = "# " + where + ("  (overrides the keys it sets)" if i else "")
        text.append(label + "\n", style="dim")
        text.append(visible(layer.text, lines=True) + "\n")
    for problem in info.errors:
        text.append(visible(problem, lines=True) + "\n", style="red")
    if len(info.layers) > 1 or not info.layers:
        text.append("# in effect now\n", style="dim")
        text.append(visible(info.effective, lines=True), style="cyan")
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


def _keep_alive_text(b: BackendView) -> str:
    if b.pinned:
        return "pinned"
    if b.held:
        return f"held: {b.held} open through /upstream"
    return fmt.dur(b.keep_alive_left_s) + " left" if b.keep_alive_left_s is not None else "–"


def _sleep_text(b: BackendView) -> Text:
    """Whether it can sleep, what it keeps asleep and what a wake costs (measured or prior),
    or why it is no longer put to sleep."""
    if b.no_sleep is not None:
        return Text(f"stopped instead: {b.no_sleep}", style="yellow")
    if not b.can_sleep and b.sleep_residual_mib is None:
        return Text("–")
    parts = ["can sleep" if b.can_sleep else "asleep before"]
    if b.sleep_residual_mib is not None:
        parts.append(f"keeps {fmt.mib(b.sleep_residual_mib)}")
    if b.wake_cost_s is not None:
        parts.append(f"wakes in ~{fmt.dur(b.wake_cost_s)}")
    return Text(" · ".join(parts))
