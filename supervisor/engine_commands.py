"""The engine's commands beyond submit/cancel/evict: retry, priority, cancel several, kill,
and applying reloaded descriptors (drain is the engine's own: ``Engine.drain``).

:class:`EngineCommands` is a base class of :class:`supervisor.engine.Engine` (kept apart so
the admission code stays readable); its methods run on the engine loop like every engine
method and use the engine's own state and notes.  :class:`KeptRequests` keeps the requests of
recent jobs, bounded in count and bytes, so that a finished job can be run again.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import Refused, VramtuiError
from .jobs import Job, JobState, JobView
from .results import BackendChange, CancelResult, JobRequest, ReloadResult

if TYPE_CHECKING:
    from .backends.loader import LoadResult
    from .backends.schema import BackendSpec
    from .engine import Engine

KEEP_REQUESTS = 500  # requests kept for retry ...
KEEP_REQUEST_BYTES = 64 * 1024 * 1024  # ... and their bytes at most
LAUNCH_FIELDS = ("command", "cwd", "env")  # a running worker runs the old ones


@dataclass(frozen=True, slots=True)
class KeptRequest:
    backend: str
    payload: bytes
    timeout: float | None
    metadata: dict[str, Any]
    stream: bool


class KeptRequests:
    """The last requests submitted (a job's payload is dropped once it ends), for retry.

    The payload is the job's own bytes object (nothing is copied while the job lives); the
    oldest go first past ``max_items`` requests or ``max_bytes`` bytes.
    """

    def __init__(self, max_items: int = KEEP_REQUESTS, max_bytes: int = KEEP_REQUEST_BYTES):
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, KeptRequest] = OrderedDict()
        self._bytes = 0

    def keep(self, job: Job) -> None:
        if len(job.payload) > self.max_bytes:
            return
        self._kept[job.id] = KeptRequest(job.backend, job.payload, job.timeout,
                                         dict(job.metadata), job.stream)
        self._bytes += len(job.payload)
        while len(self._kept) > self.max_items or self._bytes > self.max_bytes:
            _, old = self._kept.popitem(last=False)
            self._bytes -= len(old.payload)

    def get(self, job_id: str) -> KeptRequest | None:
        return self._kept.get(job_id)

    def __len__(self) -> int:
        return len(self._kept)


class EngineCommands:
    """Commands of the engine (a base of ``Engine``; ``self`` is the engine)."""

    # -- jobs --------------------------------------------------------------------------------
    def retry(self: Engine, job_id: str) -> Job:
        """Run a finished job's request again, as a new job (its id is new)."""
        view = self.job_view(job_id)
        if not view.finished:
            raise Refused(f"job {job_id} is {view.state.value}: only a finished job can be "
                          "retried")
        if view.kind != "job":
            raise Refused(f"job {job_id} is a calibration: run `vramtui calibrate "
                          f"{view.backend}` again")
        kept = self.kept_requests.get(job_id)
        if kept is None:
            raise Refused(f"the request of job {job_id} is no longer kept (the engine keeps "
                          f"the last {self.kept_requests.max_items} requests, at most "
                          f"{self.kept_requests.max_bytes >> 20} MiB, since it started); "
                          "submit it again")
        job = self.submit(kept.backend, kept.payload, priority=view.priority,
                          timeout=kept.timeout, metadata=kept.metadata, stream=kept.stream)
        self._note("info", f"retrying {job_id} as {job.id} on {kept.backend} (asked)",
                   kept.backend)
        return job

    def job_request(self: Engine, job_id: str, limit: int) -> JobRequest:
        """The first ``limit`` bytes of the job's request, while it is kept."""
        job = self.jobs.get(job_id)
        payload: bytes | None = None
        if job is not None and not job.state.finished:
            payload = job.payload
        else:
            kept = self.kept_requests.get(job_id)
            if kept is not None:
                payload = kept.payload
            else:
                self.job_view(job_id)  # UnknownJob when there is no such job at all
        if payload is None:
            return JobRequest(job_id, 0, b"", kept=False)
        return JobRequest(job_id, len(payload), payload[:limit])

    def set_priority(self: Engine, job_id: str, priority: int) -> JobView:
        """Give a queued job another priority (it keeps its place among equals)."""
        job = self.job(job_id)
        if job.state is not JobState.QUEUED:
            raise Refused(f"job {job_id} is {job.state.value}: only a queued job's priority "
                          "can change")
        old = job.priority
        if old != priority:
            self.queue.remove(job)
            job.priority = priority
            self.queue.push(job)
            note = f"priority {old} → {priority}"
            job.history.append((self.clock(), JobState.QUEUED.value, note))
            if job.kind == "job":
                self._journal("record_priority", job.id, priority, time.time(), note)
            self._note("info", f"{job_id} ({job.backend}): {note} (asked)", job.backend)
            self._job_event(job)
            self._schedule()
        position = next((i for i, j in enumerate(self.queue, 1) if j is job), None)
        return self.view_of(job, position)

    def cancel_many(self: Engine, job_ids: Sequence[str]) -> tuple[CancelResult, ...]:
        """Cancel each job (once each); one result per job, unknown ones included."""
        out = []
        for job_id in dict.fromkeys(job_ids):
            try:
                view = self.cancel(job_id)
            except VramtuiError as exc:
                out.append(CancelResult(job_id, None, str(exc)))
                continue
            out.append(CancelResult(job_id, view.state.value))
        return tuple(out)

    # -- workers and GPUs ----------------------------------------------------------------------
    def kill(self: Engine, backend: str) -> None:
        """SIGKILL a (stuck) worker's process group now; its jobs fail, saying so."""
        rt = self._runtime(backend)
        worker = rt.worker
        if worker is None or worker.pid is None or worker.exited:
            raise Refused(f"{backend} has no worker process to kill")
        jobs = [self.jobs[j] for j in rt.admitted if j in self.jobs]
        for job in jobs:
            if not job.state.finished:
                job.cancel_requested = True
                job.cancel_state = JobState.FAILED
                job.error = f"its worker was killed on request (vramtui kill {backend})"
        self._note("warning", f"killing {backend}'s worker (pid {worker.pid}, asked)"
                   + (f"; {len(jobs)} job(s) on it fail" if jobs else ""), backend)
        worker.kill()

    # -- descriptors -------------------------------------------------------------------------
    def apply_descriptors(self: Engine, loaded: LoadResult) -> ReloadResult:
        """Apply freshly loaded descriptors: new backends join, changed ones take their new
        figures at once, removed idle ones go; a backend whose file now has errors keeps its
        previous descriptor, so one bad file never stops the rest."""
        from .backends.errors import display_path
        from .engine import BackendRuntime

        added, removed, kept = [], [], []
        changed: list[BackendChange] = []
        errors = loaded.errors
        for name, spec in loaded.backends.items():
            rt = self.backends.get(name)
            if rt is None:
                self.backends[name] = BackendRuntime(spec)
                added.append(name)
                continue
            diff = spec_changes(rt.spec, spec)
            if not diff:
                if rt.spec.source != spec.source:
                    rt.spec = spec
                continue
            notes = self._apply_change(rt, spec, diff)
            changed.append(BackendChange(name, tuple(diff), tuple(notes)))
        for name in [n for n in self.backends if n not in loaded.backends]:
            rt = self.backends[name]
            files = set(rt.spec.source.split(" + ")) if rt.spec.source else set()
            broken = [e for e in errors if e.backend == name
                      or (e.file is not None and display_path(e.file) in files)]
            waiting = sum(1 for j in self.queue if j.backend == name)
            if broken:
                kept.append(f"{name}: kept its previous descriptor ({broken[0]})")
            elif rt.worker is not None or rt.admitted or waiting:
                what = "a running worker" if rt.worker is not None else f"{waiting} job(s)"
                kept.append(f"{name}: no longer configured but it still has {what}; evict "
                            "it or let its jobs end, then reload again")
            else:
                del self.backends[name]
                removed.append(name)
        self.descriptor_errors = tuple(str(e) for e in errors)
        result = ReloadResult(tuple(added), tuple(removed), tuple(changed), tuple(kept),
                              tuple(str(e) for e in errors),
                              tuple(display_path(f) for f in loaded.layers))
        self._note("warning" if errors or kept else "info", "descriptors reloaded: "
                   + reload_summary(result))
        for line in (*kept, *result.errors):
            self._note("error" if line in result.errors else "warning", line)
        self._schedule()
        return result

    def _apply_change(self: Engine, rt: Any, spec: BackendSpec, diff: list[str]) -> list[str]:
        from .workers.handle import WorkerState

        notes: list[str] = []
        old = rt.spec
        rt.spec = spec
        if rt.failed:
            rt.failed = False
            rt.init_failures = 0
            notes.append("its start failures are forgotten: the next job starts it again")
        if rt.distrusted and old.vram != spec.vram:
            rt.distrusted = False  # a new claim; what was measured of it still sizes it too
            notes.append("its new vram figures are used again (it had been caught above its "
                         "old ones); what was measured of it stays a floor")
        launch = [f for f in LAUNCH_FIELDS if getattr(old, f) != getattr(spec, f)]
        worker = rt.worker
        if launch and worker is not None:
            if not rt.admitted and worker.state == WorkerState.READY:
                self._evict_now(rt)
                notes.append(f"its idle worker was stopped ({', '.join(launch)} changed): the "
                             "next job starts the new one")
            else:
                notes.append(f"its busy worker runs the old {', '.join(launch)} until it is "
                             f"respawned (vramtui respawn {spec.name})")
        return notes


def reload_summary(result: ReloadResult) -> str:
    """``1 added (x), 2 changed (a, b), 1 file with errors`` or ``nothing changed``."""
    parts = []
    for what, names in (("added", result.added), ("changed", [c.backend for c in
                                                              result.changed]),
                        ("removed", result.removed)):
        if names:
            parts.append(f"{len(names)} {what} ({', '.join(names)})")
    if result.kept:
        parts.append(f"{len(result.kept)} kept as they were")
    if result.errors:
        parts.append(f"{len(result.errors)} error(s)")
    return ", ".join(parts) if parts else "nothing changed"


def _show(value: Any) -> str:
    if isinstance(value, float) and math.isinf(value):
        return "forever"
    if isinstance(value, tuple):
        return " ".join(map(str, value)) if value else "–"
    if value is None:
        return "–"
    return str(value)


def _sub_changes(prefix: str, old: Any, new: Any, unit: str = "") -> Iterable[str]:
    for f in dataclasses.fields(old):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            key = f.name.removesuffix("_mib").removesuffix("_s")
            yield f"{prefix}.{key}: {_show(a)} → {_show(b)}{unit if b is not None else ''}"


def spec_changes(old: BackendSpec, new: BackendSpec) -> list[str]:
    """One line per field that differs (env: the names only, never the values)."""
    out: list[str] = []
    for f in dataclasses.fields(old):
        name = f.name
        if name in ("name", "source"):
            continue
        a, b = getattr(old, name), getattr(new, name)
        if a == b:
            continue
        if name == "vram":
            out.extend(_sub_changes("vram", a, b, " MiB"))
        elif name == "timeouts":
            out.extend(_sub_changes("timeouts", a, b, " s"))
        elif name == "env":
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"env: {', '.join(keys)} changed")
        elif name == "calibration_request":
            out.append("calibration.request changed")
        else:
            out.append(f"{name.removesuffix('_mib').removesuffix('_s')}: {_show(a)} → "
                       f"{_show(b)}")
    return out
