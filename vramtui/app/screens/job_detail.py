"""`JobDetail`: one job — metadata, progress history, its request, its result or error,
and its worker's log.
"""

from __future__ import annotations

import json
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual import events, work
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import RichLog, Static

from supervisor.jobs import JobState, JobView
from supervisor.snapshot import EngineSnapshot

from .. import fmt
from ..widgets.jobs_table import job_time
from ..widgets.key_footer import KeyFooter
from ..widgets.rewrap_log import RewrapLog
from .detail_screen import DetailScreen, kv
from .keys import MUTATING, ReadonlyKeys, key_binding


class JobDetail(ReadonlyKeys, DetailScreen):
    """One job: metadata, progress history, its request, its result or error, the worker's
    log tail."""

    BINDINGS = [
        key_binding("c", "cancel_this", "Cancel job", "Cancel this job"),
        key_binding("R", "retry_this", "Retry", "Run this job's request again, as a new job"),
        key_binding("plus", "priority_up", "Pri+", "Raise this queued job's priority by 1",
                    key_display="+"),
        key_binding("minus", "priority_down", "Pri-", "Lower this queued job's priority by 1",
                    key_display="-"),
        key_binding("w", "save_result", "Save result", "Write the job's result data to a file"),
        key_binding("b", "backend", "Backend", "Details of this job's backend"),
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
        now = fmt.engine_now(snap, clocks)
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
            t0 = j.submitted_at  # one origin for the history and the progress (epoch s)
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
