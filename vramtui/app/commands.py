"""The command palette (ctrl+p): every action, and each backend and job to act on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from .app import VramApp

Command = tuple[str, Callable[[], object], str]


class VramCommands(Provider):
    """Actions on the selection, then per-backend and per-job commands from the snapshot."""

    @property
    def vapp(self) -> VramApp:
        return self.app  # type: ignore[return-value]

    def general(self) -> list[Command]:
        app = self.vapp
        act = app.dashboard_action
        demo: list[Command] = [
            ("Run a demo workload", app.request_demo_workload,
             "12 jobs over the simulated demo backends: admission, queue, eviction (d)"),
        ] if app.demo_mode else []
        return [*demo,
            ("Evict the selected backend", partial(act, "evict"),
             "stop its worker and free its memory (e)"),
            ("Respawn the selected backend", partial(act, "respawn"),
             "restart its worker: a new process (r)"),
            ("Cancel the selected job", partial(act, "cancel_job"),
             "queued or running (c)"),
            ("Preload the selected backend", partial(act, "preload"),
             "start its worker before any job (p)"),
            ("Evict all idle backends", app.request_zero, "free every worker not in use (z)"),
            ("Calibrate the selected backend", partial(act, "calibrate"),
             "measure its real peak memory (k)"),
            ("Submit a job", partial(act, "submit"), "backend, payload, priority (s)"),
            ("Details of the selection", partial(act, "details"),
             "the selected backend or job (enter)"),
            ("Filter", partial(act, "filter"), "backends, jobs and events by text (/)"),
            ("Switch the graph window (1 or 10 minutes)", app.toggle_graph_window,
             "the memory history graphs (g)"),
            ("Help", app.action_help, "every key and colour (?)"),
            ("Quit", app.action_quit, "leave vramtui (q)"),
        ]

    def targets(self) -> Iterator[Command]:
        app = self.vapp
        snap = app.snap
        if snap is None:
            return
        for b in snap.backends:
            n = b.name
            yield (f"Evict {n}", partial(app.request_evict, n), f"backend, {b.state}")
            yield (f"Respawn {n}", partial(app.request_respawn, n), f"backend, {b.state}")
            yield (f"Preload {n}", partial(app.request_preload, n), f"backend, {b.state}")
            yield (f"Calibrate {n}", partial(app.request_calibrate, n), "backend")
            yield (f"Submit a job to {n}", partial(app.open_submit, n), "backend")
            yield (f"Backend details: {n}", partial(app.open_backend, n), b.description)
        for job_id, backend in reversed(app.calibrations.items()):
            yield (f"Calibration of {backend} ({job_id})",
                   partial(app.open_calibration, job_id, backend), "live chart or results")
        for g in snap.gpus:
            if g.yielded_by is not None:
                yield (f"Resume GPU{g.index}", partial(app.request_yield, g.index),
                       g.yielded_text)
            else:
                yield (f"Yield GPU{g.index}", partial(app.request_yield, g.index),
                       "to programs we do not manage: running jobs finish (Y)")
            yield (f"Yield GPU{g.index} now", partial(app.request_yield, g.index, True),
                   "cancel its running jobs, unload its models")
        for j in (*snap.running, *snap.queued):
            yield (f"Cancel job {j.id} ({j.backend})", partial(app.request_cancel, j.id),
                   j.state.value)
        for j in (*snap.running, *snap.queued, *snap.recent[:30]):
            yield (f"Job details: {j.id} ({j.backend})", partial(app.open_job, j.id),
                   j.state.value)

    async def discover(self) -> Hits:
        for name, callback, help_text in self.general():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in (*self.general(), *self.targets()):
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
