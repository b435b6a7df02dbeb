"""The command palette (ctrl+p): every key's action (generated from the bindings), and each
backend and job to act on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from supervisor.jobs import JobView
    from supervisor.snapshot import EngineSnapshot

    from .app import VramApp

Command = tuple[str, Callable[[], object], str]
QUEUED_OFFERED = 100  # queued jobs offered by name (any other: by typing its id)


def _command(binding: Binding, callback: Callable[[], object]) -> Command:
    """``Evict: stop the selected backend's worker …`` with its key as the help line."""
    tip = str(binding.tooltip or "")
    text = f"{binding.description}: {tip[:1].lower()}{tip[1:]}" if tip else binding.description
    return text, callback, f"key {binding.key_display or binding.key}"


def _literal(text: str) -> str:
    """``text`` as markup that reads as the text itself: a help line is markup to the
    palette, and a backend's description (anyone's descriptor) may hold a ``[/]``."""
    return text.replace("[", "\\[")


class VramCommands(Provider):
    """Actions on the selection, then per-backend and per-job commands from the snapshot."""

    @property
    def vapp(self) -> VramApp:
        return self.app  # type: ignore[return-value]

    def general(self) -> list[Command]:
        """One command per key the dashboard and the app offer now, generated from their
        bindings (their one source: a key, its name and what it does cannot drift apart)."""
        from .screens.dashboard import DASHBOARD_BINDINGS, Dashboard

        app = self.vapp
        dash = next((s for s in app.screen_stack if isinstance(s, Dashboard)), None)
        out: list[Command] = []
        for b in DASHBOARD_BINDINGS:
            if dash is None or dash.check_action(b.action, ()) is False:
                continue
            out.append(_command(b, partial(app.dashboard_action, b.action)))
        for b in type(app).BINDINGS:
            if isinstance(b, Binding):
                out.append(_command(b, getattr(app, f"action_{b.action}")))
        return out

    def targets(self, query: str = "") -> Iterator[Command]:
        """Per backend, GPU and job; in --readonly only those that look (details), as the
        keys that would change something are not offered there either.  Of a long queue,
        the first `QUEUED_OFFERED` jobs, and any other whose id holds ``query``: every
        keystroke matches each command, and 5,000 queued jobs took the palette 15 s."""
        app = self.vapp
        snap = app.snap
        if snap is None:
            return
        changes = not app.readonly
        for b in snap.backends:
            n = b.name
            if changes:
                yield (f"Evict {n}", partial(app.request_evict, n), f"backend, {b.state}")
                yield (f"Respawn {n}", partial(app.request_respawn, n), f"backend, {b.state}")
                yield (f"Preload {n}", partial(app.request_preload, n), f"backend, {b.state}")
                yield (f"Calibrate {n}", partial(app.request_calibrate, n), "backend")
                yield (f"Submit a job to {n}", partial(app.open_submit, n), "backend")
            yield (f"Backend details: {n}", partial(app.open_backend, n), b.description)
        for job_id, backend in reversed(app.calibrations.items()):
            yield (f"Calibration of {backend} ({job_id})",
                   partial(app.open_calibration, job_id, backend), "live chart or results")
        jobs = self._jobs(snap, query)
        if changes:
            yield from self._changes(snap, jobs)
        for j in (*jobs, *snap.recent[:30]):
            yield (f"Job details: {j.id} ({j.backend})", partial(app.open_job, j.id),
                   j.state.value)

    @staticmethod
    def _jobs(snap: EngineSnapshot, query: str) -> list[JobView]:
        """The running jobs and the queued ones offered (`targets`)."""
        q = query.strip().lower()
        return [*snap.running, *snap.queued[:QUEUED_OFFERED],
                *(j for j in snap.queued[QUEUED_OFFERED:] if len(q) >= 3 and q in j.id)]

    def _changes(self, snap: EngineSnapshot, jobs: list[JobView]) -> Iterator[Command]:
        """The per-GPU and per-job commands that change something."""
        app = self.vapp
        for g in snap.gpus:
            if g.yielded_by is not None:
                yield (f"Resume GPU{g.index}", partial(app.request_yield, g.index),
                       g.yielded_text)
            else:
                yield (f"Yield GPU{g.index}", partial(app.request_yield, g.index),
                       "to programs we do not manage: running jobs finish (Y)")
            yield (f"Yield GPU{g.index} now", partial(app.request_yield, g.index, True),
                   "cancel its running jobs, unload its models")
        for j in jobs:
            yield (f"Cancel job {j.id} ({j.backend})", partial(app.request_cancel, j.id),
                   j.state.value)

    async def discover(self) -> Hits:
        for name, callback, help_text in self.general():
            yield DiscoveryHit(name, callback, help=_literal(help_text))

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in (*self.general(), *self.targets(query)):
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=_literal(help_text))
