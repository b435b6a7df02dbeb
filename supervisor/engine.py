"""The engine: one asyncio loop that owns every piece of state and acts on the scheduler's plans.

All state (backends, workers, queue, jobs, GPU readings) lives here and is touched only on the
engine loop — no locks around state.  Every event (submit, job end, worker state change, sample,
timer) schedules one coalesced scheduler step: build the pure scheduler's snapshot, call
``plan()``, then carry out its evictions and starts.  Other threads reach the engine through
:class:`supervisor.facade.Supervisor`; state leaves as immutable snapshots and events.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from .backends.schema import BackendSpec
from .engine_commands import EngineCommands, KeptRequests
from .errors import (
    BackendFailed,
    EngineStopped,
    InvalidRequest,
    QueueFull,
    Refused,
    UnknownBackend,
    UnknownJob,
)
from .events import EngineEvent, EventHub
from .gpu.model import GpuReading, Probe, ProcessReading
from .gpu.sampler import History, Sample, Sampler
from .jobqueue import JobQueue
from .jobs import Job, JobState, JobView, advance_seq, wall_offset
from .journal import JobRecord, Journal
from .paths import Paths
from .scheduler import model as sched
from .scheduler.plan import plan as make_plan
from .scheduler.submit import check_submit
from .snapshot import EngineSnapshot, LogLine
from .views import build_snapshot
from .workers.handle import Outcome, WorkerHandle, WorkerObserver, WorkerState
from .workers.wire import WireListener

if TYPE_CHECKING:
    from .calibration.engine_run import CalibrationRun

log = logging.getLogger("supervisor")

MAX_INIT_FAILURES = 3
EVICTION_CONFIRM_TIMEOUT_S = 5.0
PRELOAD_PATIENCE_S = 30.0


@dataclass
class EngineConfig:
    reserve_mib: int = 256  # kept free on every GPU for the driver and foreign processes
    max_queue_depth: int = 512
    affinity_limit: int = 3
    aging_interval_s: float = 60.0
    recent_jobs: int = 200
    cancel_grace_s: float = 5.0
    tick_s: float = 0.5
    journal: bool = True  # jobs survive a crash of the engine (SQLite, WAL)
    keep_finished: int = 1000  # finished results kept in the journal…
    keep_age_s: float = 7 * 86400  # …for at most this long


@dataclass
class Ghost:
    """Memory of a stopped worker, still reserved until its processes leave the GPU."""

    gpu: int
    mib: int
    pids: set[int]
    deadline: float


@dataclass
class BackendRuntime:
    """The engine's live record of one backend."""

    spec: BackendSpec
    worker: WorkerHandle | None = None
    generation: int = 0
    exclusive: bool = False  # the worker holds a whole GPU (footprint unknown at spawn)
    admitted: list[str] = field(default_factory=list)  # jobs holding a slot on the worker
    init_failures: int = 0
    failed: bool = False
    last_error: str | None = None
    jobs_served: int = 0
    last_used: float | None = None
    idle_since: float | None = None
    learned_peak_mib: int | None = None
    learned_resident_mib: int | None = None
    observed_mib: int | None = None  # the worker's processes' memory at the last sample
    observed_peaks: deque[int] = field(default_factory=lambda: deque(maxlen=200))
    ghost: Ghost | None = None
    preload: bool = False  # start the worker without a job, like a top-priority job would
    preload_deadline: float = 0.0
    _info: sched.BackendInfo | None = None
    _info_key: tuple[int, int | None, int | None] | None = None

    @property
    def peak(self) -> int | None:
        return self.spec.peak if self.spec.peak is not None else self.learned_peak_mib

    def sched_info(self) -> sched.BackendInfo:
        """What the scheduler knows of this backend (rebuilt only when the footprint moves)."""
        key = (id(self.spec), self.learned_peak_mib, self.learned_resident_mib)
        if self._info is None or self._info_key != key:
            spec, peak, act = self.spec, self.peak, self.activation
            if peak is not None and act is not None and act > peak:
                act = peak
            self._info = sched.BackendInfo(
                name=spec.name, peak_mib=peak, activation_mib=act, safety_mib=spec.safety_mib,
                priority=spec.priority, allowed_gpus=spec.gpus, concurrency=spec.concurrency,
                pinned=spec.pinned,
                reload_cost_s=spec.reload_cost_s if spec.reload_cost_s is not None else 1.0,
            )
            self._info_key = key
        return self._info

    @property
    def activation(self) -> int | None:
        if self.spec.peak is not None:
            return self.spec.vram.activation_mib
        if self.learned_peak_mib is not None and self.learned_resident_mib is not None:
            return max(0, self.learned_peak_mib - self.learned_resident_mib)
        return None

    @property
    def resident(self) -> int:
        peak, act = self.peak, self.activation
        if peak is None:
            return 0
        return peak - (act if act is not None else peak)


class Engine(EngineCommands):
    """Everything the engine knows and does; run ``main()`` on its own event loop."""

    def __init__(
        self,
        *,
        probe: Probe,
        probe_notice: str | None,
        backends: dict[str, BackendSpec],
        descriptor_errors: tuple[str, ...],
        paths: Paths,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        layers: Sequence[Path] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.probe = probe
        self.layers = tuple(layers) if layers is not None else None  # for reload (None: none)
        self.environ = environ if environ is not None else os.environ
        self.notice = probe_notice
        self.paths = paths
        self.config = config or EngineConfig()
        self.sched_config = sched.SchedulerConfig(
            affinity_limit=self.config.affinity_limit,
            aging_interval_s=self.config.aging_interval_s,
            max_queue_depth=self.config.max_queue_depth,
        )
        self.clock = clock
        self.backends = {name: BackendRuntime(spec) for name, spec in backends.items()}
        self.descriptor_errors = descriptor_errors
        self.jobs: dict[str, Job] = {}
        self.futures: dict[str, concurrent.futures.Future[JobView]] = {}
        self.queue = JobQueue()  # sorted by (-priority, seq): the scheduler's contract
        self.recent: deque[str] = deque()
        self.readings: dict[int, GpuReading] = {}
        self.proc_mib: dict[int, int] = {}  # pid -> MiB at the last process sample
        self.history: History[int, int] = History()
        self.backend_history: History[str, int] = History()
        self.events = EventHub()
        self.log_lines: deque[LogLine] = deque(maxlen=300)
        self.started_at = clock()
        self.wall_started = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listener = WireListener(
            str(paths.worker_control_socket), str(paths.worker_data_socket)
        )
        self.sampler: Sampler | None = None
        self._step_scheduled = False
        self._stopping = False
        self._stopped = asyncio.Event()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._gpu_totals: dict[int, int] = {}
        self._waiting: Mapping[str, str] = {}
        self.calibrations: dict[str, tuple[CalibrationRun, asyncio.Task[Any]]] = {}
        self.journal: Journal | None = None
        self._wall_offset = wall_offset(clock)
        self.draining: set[int] = set()  # GPUs that admit nothing new (Engine.drain)
        self.gpu_processes: tuple[ProcessReading, ...] = ()  # at the last process sample
        self.kept_requests = KeptRequests()  # for retry

    # ===================================================================== lifecycle ======
    async def main(self, started: Callable[[BaseException | None], None]) -> None:
        self.loop = asyncio.get_running_loop()
        try:
            if self.config.journal:
                self.journal = Journal.open(self.paths.journal_path,
                                            keep_finished=self.config.keep_finished,
                                            keep_age_s=self.config.keep_age_s)
            await self.listener.start()
            devices = self.probe.devices()
            for reading in devices:
                self.readings[reading.index] = reading
                self._gpu_totals[reading.index] = reading.total_mib
            self.sampler = Sampler(self.probe, self._sample_from_thread)
            self.sampler.start()
        except BaseException as exc:
            started(exc)
            await self.listener.close()
            if self.journal is not None:
                self.journal.close()
            return
        self._recover()
        self._note("info", f"engine started: {self._gpu_summary()}")
        if self.notice:
            self._note("warning", self.notice)
        for err in self.descriptor_errors:
            self._note("error", err)
        started(None)
        ticker = self.loop.create_task(self._ticker())
        await self._stopped.wait()
        ticker.cancel()
        await self._shutdown()

    def _gpu_summary(self) -> str:
        kind = "SIMULATED" if self.probe.simulated else (self.probe.source or "GPU")
        parts = [f"GPU{i} {r.total_mib} MiB" for i, r in sorted(self.readings.items())]
        return f"{kind}: " + (", ".join(parts) or "no GPU")

    @property
    def stopping(self) -> bool:
        return self._stopping

    def request_stop(self) -> None:
        self._stopping = True
        self._stopped.set()

    async def _shutdown(self) -> None:
        now = self.clock()
        for job in self.queue.clear():
            if self.journal is not None and job.kind == "job":
                # Still queued in the journal: it runs when the engine starts again.
                self._resolve(job, "the engine stopped before the job ran; it stays queued "
                              "and runs when the engine starts again")
            else:
                self._finish(job, JobState.CANCELLED,
                             error="the engine stopped before the job ran")
        running = [rt for rt in self.backends.values() if rt.worker is not None]
        await asyncio.gather(
            *(self._stop_worker(rt, grace=rt.spec.timeouts.stop_grace_s, drain=True)
              for rt in running),
            return_exceptions=True,
        )
        for job in list(self.jobs.values()):
            if not job.state.finished:
                self._stopped_during(job)
        if self.sampler is not None:
            self.sampler.stop()
        await self.listener.close()
        if self.journal is not None:
            self.journal.close()
        self._note("info", f"engine stopped after {self.clock() - now:.1f} s of shutdown")
        self.events.close()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.config.tick_s)
            self._expire_ghosts()
            self._expire_keep_alive()
            self._schedule()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ===================================================================== notes/events ===
    def _note(self, level: str, text: str, backend: str | None = None) -> None:
        line = LogLine(time.time(), level, text, backend)
        self.log_lines.append(line)
        getattr(log, "warning" if level == "warning" else level if level in (
            "info", "error", "debug") else "info")(text)
        self.events.publish(EngineEvent("log", line.t, message=text, level=level,
                                        backend=backend))

    def _job_event(self, job: Job) -> None:
        if not self.events.active:
            return
        self.events.publish(EngineEvent("job", time.time(), job=job.view(), backend=job.backend,
                                        state=job.state.value))

    def _worker_event(self, rt: BackendRuntime) -> None:
        state = rt.worker.state.value if rt.worker else ("failed" if rt.failed else "cold")
        self.events.publish(EngineEvent("worker", time.time(), backend=rt.spec.name,
                                        state=state))

    # ===================================================================== commands =======
    def submit(self, backend: str, payload: bytes, *, priority: int | None = None,
               timeout: float | None = None, metadata: dict[str, Any] | None = None,
               stream: bool = False) -> Job:
        if self._stopping:
            raise EngineStopped("the engine is stopping and takes no new jobs")
        rt = self.backends.get(backend)
        if rt is None:
            raise UnknownBackend(backend, self.backends)
        if rt.failed:
            raise BackendFailed(
                f"backend {backend!r} failed to initialise {MAX_INIT_FAILURES} times in a row "
                f"({rt.last_error}); fix it, then respawn it (vramtui respawn {backend})"
            )
        reason = check_submit(self._sched_snapshot(with_queue=False), backend, self.sched_config)
        if reason is None and len(self.queue) >= self.config.max_queue_depth:
            reason = (f"queue full: {len(self.queue)} jobs waiting; try again later or raise "
                      "max_queue_depth")
        _check_metadata(metadata)
        if reason is not None:
            self._note("warning", f"refused a job for {backend}: {reason}", backend)
            if reason.startswith("queue full"):
                raise QueueFull(reason)
            raise Refused(reason)
        job = Job(
            backend=backend,
            payload=payload,
            priority=rt.spec.priority if priority is None else priority,
            timeout=timeout if timeout is not None else rt.spec.timeouts.request_s,
            metadata=dict(metadata or {}),
            stream=stream or rt.spec.stream,
        )
        job.submitted_at = self.clock()
        job.mark(job.submitted_at, JobState.QUEUED)
        if self.journal is not None:  # durable before the submitter hears "accepted"
            self.journal.record_submit(self._record(job))
        self.jobs[job.id] = job
        self.futures[job.id] = concurrent.futures.Future()
        self.kept_requests.keep(job)
        self.queue.push(job)
        if job.timeout is not None:
            self._set_timer(job.id, job.timeout, lambda: self._time_out(job.id))
        self._job_event(job)
        self._schedule()
        return job

    def calibrate(self, backend: str, *, repeats: int = 3, request: bytes | None = None,
                  settle_s: float = 1.0, priority: int | None = None) -> Job:
        """Queue a calibration run of ``backend``: a job that needs a GPU to itself."""
        if self._stopping:
            raise EngineStopped("the engine is stopping and takes no new jobs")
        rt = self._runtime(backend)
        if not 1 <= repeats <= 100:
            raise Refused(f"repeats must be between 1 and 100, got {repeats}")
        payload = request if request is not None else (rt.spec.calibration_request or b"")
        job = Job(backend=backend, payload=payload,
                  priority=rt.spec.priority if priority is None else priority,
                  metadata={"repeats": repeats, "settle_s": settle_s}, kind="calibration")
        reason = check_submit(self._sched_snapshot(with_queue=False, calibrating={backend}),
                              job.sched_backend, self.sched_config)
        if reason is not None:
            raise Refused(reason)
        job.submitted_at = self.clock()
        job.mark(job.submitted_at, JobState.QUEUED, f"calibration x{repeats}")
        self.jobs[job.id] = job
        self.futures[job.id] = concurrent.futures.Future()
        self.queue.push(job)
        self._note("info", f"calibration of {backend} queued (x{repeats})", backend)
        self._job_event(job)
        self._schedule()
        return job

    def calibrations_running(self, besides: CalibrationRun | None = None) -> bool:
        return any(run is not besides for run, _task in self.calibrations.values())

    def _start_calibration(self, job: Job, gpu: int) -> None:
        from .calibration.engine_run import CalibrationRun

        rt = self.backends[job.backend]
        repeats = int(job.metadata.get("repeats", 3))
        settle_s = float(job.metadata.get("settle_s", 1.0))
        run = CalibrationRun(self, rt, job, gpu, repeats=repeats, settle_s=settle_s)
        job.gpu = gpu
        job.mark(self.clock(), JobState.RUNNING, f"calibrating {job.backend} alone on GPU{gpu}")
        self._job_event(job)
        self._note("info", f"calibrating {job.backend} alone on GPU{gpu}", job.backend)
        task = asyncio.get_running_loop().create_task(run.run())
        self.calibrations[job.id] = (run, task)
        task.add_done_callback(lambda t, j=job: self._calibration_done(j, t))

    def _calibration_done(self, job: Job, task: asyncio.Task[Any]) -> None:
        self.calibrations.pop(job.id, None)
        if task.cancelled():
            self._finish(job, job.cancel_state, error=job.error or "cancelled")
        elif (exc := task.exception()) is not None:
            self._note("error", f"calibration of {job.backend} failed: {exc}", job.backend)
            self._finish(job, JobState.FAILED, error=f"{type(exc).__name__}: {exc}")
        else:
            from .calibration.engine_run import report_json

            summary = task.result()
            job.data = report_json(summary)
            job.headers = {"Content-Type": "application/json"}
            if summary.get("outcome") == "completed":
                self._note("info", f"calibrated {job.backend}: "
                           + str(summary.get("headline", "see the report")), job.backend)
                self._finish(job, JobState.SUCCEEDED)
            else:
                self._finish(job, JobState.FAILED, error=f"calibration {summary.get('outcome')}: "
                             f"{summary.get('error')}; report {summary.get('report')}")
        self._schedule()

    def job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job

    def job_view(self, job_id: str) -> JobView:
        job = self.jobs.get(job_id)
        if job is None and self.journal is not None:
            rec = self.journal.finished(job_id)
            if rec is not None:  # finished before a restart, or long ago
                return self._job_from_record(rec).view()
        return self.view_of(self.job(job_id))

    # ===================================================================== journal ========
    def _wall(self, t: float) -> float:
        return t + self._wall_offset

    def _record(self, job: Job) -> JobRecord:
        return JobRecord(
            id=job.id, seq=job.seq, backend=job.backend, payload=job.payload,
            priority=job.priority, timeout=job.timeout, metadata=job.metadata,
            stream=job.stream, submitted_wall=self._wall(job.submitted_at), state=job.state,
            history=[(self._wall(t), st, note) for t, st, note in job.history],
        )

    def _job_from_record(self, rec: JobRecord) -> Job:
        job = Job(backend=rec.backend, payload=rec.payload, priority=rec.priority,
                  timeout=rec.timeout, metadata=dict(rec.metadata), stream=rec.stream,
                  id=rec.id, seq=rec.seq)
        job.submitted_at = rec.submitted_wall - self._wall_offset
        job.history = [(t - self._wall_offset, st, note) for t, st, note in rec.history]
        job.state = rec.state
        job.started_at = (rec.started_wall - self._wall_offset) if rec.started_wall else None
        job.finished_at = (rec.finished_wall - self._wall_offset) if rec.finished_wall else None
        job.data, job.headers, job.status_code = rec.data, dict(rec.headers), rec.status_code
        job.error, job.chunks = rec.error, list(rec.chunks)
        return job

    def _journal(self, what: str, *args: Any, **kwargs: Any) -> None:
        if self.journal is None:
            return
        try:
            getattr(self.journal, what)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - keep serving; say loudly what was not kept
            self._note("error", f"journal: {what} failed: {exc}")

    def _recover(self) -> None:
        """Requeue what the journal held when the engine last stopped, ids and order kept."""
        if self.journal is None:
            return
        recovery = self.journal.recover(time.time())
        advance_seq(recovery.max_seq)
        for rec in recovery.failed:
            self._note("error", f"job {rec.id} ({rec.backend}) was interrupted twice by an "
                       "engine stop; it was not run a third time", rec.backend)
        now = self.clock()
        for rec in recovery.jobs:
            job = self._job_from_record(rec)
            job.state = JobState.QUEUED
            self.jobs[job.id] = job
            self.futures[job.id] = concurrent.futures.Future()
            if job.backend not in self.backends:
                self._finish(job, JobState.FAILED,
                             error=f"backend {job.backend!r} is no longer configured")
                continue
            self.queue.push(job)
            if job.timeout is not None:
                left = job.timeout - (now - job.submitted_at)
                self._set_timer(job.id, left, lambda j=job.id: self._time_out(j))
        if recovery.jobs:
            interrupted = len(recovery.interrupted)
            self._note("info", f"recovered {len(recovery.jobs)} job(s) from the journal"
                       + (f", {interrupted} of them interrupted while running and requeued"
                          if interrupted else ""))
        self._schedule()

    def view_of(self, job: Job, position: int | None = None) -> JobView:
        if job.state is JobState.QUEUED:
            job.waiting = self._waiting.get(job.id, "")
        return job.view(position)

    def cancel(self, job_id: str, state: JobState = JobState.CANCELLED,
               note: str = "cancelled") -> JobView:
        job = self.job(job_id)
        if job.state.finished:
            return job.view()
        if job.state is JobState.QUEUED:
            self._remove_queued(job)
            self._finish(job, state, error=note)
        elif job.state is JobState.STARTING:
            rt = self.backends[job.backend]
            with contextlib.suppress(ValueError):
                rt.admitted.remove(job.id)
            self._finish(job, state, error=note)
        elif job.id in self.calibrations:
            job.cancel_state = state
            job.error = note
            self.calibrations[job.id][1].cancel()
        else:  # running on a worker
            job.cancel_requested = True
            job.cancel_state = state
            job.error = note
            rt = self.backends[job.backend]
            worker = rt.worker
            asked = worker.cancel(job.id) if worker is not None else False
            grace = self.config.cancel_grace_s if asked else min(self.config.cancel_grace_s, 1.0)
            job.progress_text = "cancelling"
            self._job_event(job)
            self._set_timer(f"kill:{job.id}", grace, lambda: self._kill_for(job.id))
        self._schedule()
        return job.view()

    def _kill_for(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state.finished:
            return
        rt = self.backends[job.backend]
        if rt.worker is not None:
            self._note("warning", f"{job.backend}: job {job_id} did not stop within the grace; "
                       "killing its worker", job.backend)
            rt.worker.kill()

    def _time_out(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and not job.state.finished:
            self.cancel(job_id, JobState.TIMED_OUT,
                        f"timed out after {job.timeout:g} s")

    def evict(self, backend: str) -> None:
        rt = self._runtime(backend)
        if rt.worker is None:
            return
        if rt.admitted:
            raise Refused(f"{backend} is busy with job {rt.admitted[0]}; cancel it or wait, "
                          "then evict")
        self._note("info", f"evicting {backend} (asked)", backend)
        self._evict_now(rt)

    def zero(self) -> list[str]:
        evicted = []
        for name, rt in self.backends.items():
            if rt.worker is not None and not rt.admitted and \
                    rt.worker.state != WorkerState.STOPPING:
                evicted.append(name)
                self.evict(name)
        return evicted

    def respawn(self, backend: str) -> None:
        rt = self._runtime(backend)
        if rt.admitted:
            raise Refused(f"{backend} is busy with job {rt.admitted[0]}; cancel it or wait, "
                          "then respawn")
        rt.failed = False
        rt.init_failures = 0
        rt.last_error = None
        self._note("info", f"respawning {backend}", backend)

        async def restart() -> None:
            if rt.worker is not None:
                await self._stop_worker(rt, grace=rt.spec.timeouts.stop_grace_s)
            self._request_preload(rt)

        self._spawn_task(restart())

    def preload(self, backend: str) -> None:
        rt = self._runtime(backend)
        if rt.failed:
            raise BackendFailed(f"backend {backend!r} has failed; respawn it first")
        if rt.worker is None:
            self._request_preload(rt)

    def _request_preload(self, rt: BackendRuntime) -> None:
        rt.preload = True
        rt.preload_deadline = self.clock() + PRELOAD_PATIENCE_S
        self._schedule()

    def _runtime(self, backend: str) -> BackendRuntime:
        rt = self.backends.get(backend)
        if rt is None:
            raise UnknownBackend(backend, self.backends)
        return rt

    # ===================================================================== scheduling =====
    def _schedule(self) -> None:
        if not self._step_scheduled and self.loop is not None and not self._stopping:
            self._step_scheduled = True
            self.loop.call_soon(self._step)

    def _budget_totals(self) -> dict[int, int]:
        return {i: r.total_mib for i, r in self.readings.items()}

    def reserved_mib(self, rt: BackendRuntime) -> int:
        worker = rt.worker
        if worker is None:
            return 0
        if rt.exclusive:
            return max(0, self._gpu_totals.get(worker.gpu, 0) - self.config.reserve_mib)
        act = rt.activation if rt.activation is not None else (rt.peak or 0)
        return rt.resident + len(rt.admitted) * (act + rt.spec.safety_mib)

    def _sched_snapshot(self, with_queue: bool = True,
                        extra: tuple[sched.QueuedJob, ...] = (),
                        calibrating: set[str] | None = None) -> sched.Snapshot:
        gpus = [
            sched.GpuState(index, self._gpu_totals.get(index, reading.total_mib),
                           reading.free_mib, self.config.reserve_mib)
            for index, reading in sorted(self.readings.items())
        ]
        backends = {}
        workers = {}
        calibrating_now = {run.rt.spec.name for run, _task in self.calibrations.values()}
        for name, rt in self.backends.items():
            backends[name] = rt.sched_info()
            w = rt.worker
            if w is not None and w.state not in (WorkerState.CRASHED, WorkerState.COLD,
                                                 WorkerState.FAILED):
                # A backend being calibrated takes no new job on its old worker, which the
                # run stops once its running jobs are done.
                state = "stopping" if name in calibrating_now else w.state.value
                workers[name] = sched.WorkerInfo(
                    backend=name, gpu=w.gpu, state=state, active_jobs=len(rt.admitted),
                    reserved_mib=self.reserved_mib(rt), idle_since=rt.idle_since,
                )
            elif rt.ghost is not None:
                # A stopped worker whose memory has not left the GPU yet: still reserved, as a
                # worker that is stopping, so the memory is counted once and not too early.
                workers[name] = sched.WorkerInfo(
                    backend=name, gpu=rt.ghost.gpu, state="stopping",
                    reserved_mib=rt.ghost.mib,
                )
        # A calibration needs a GPU to itself: the scheduler sees it as an unmeasured backend.
        wanted = set(calibrating or ())
        wanted.update(key[len("calibrate:"):] for key in self.queue.per_backend
                      if key.startswith("calibrate:"))
        for run, _task in self.calibrations.values():
            key = f"calibrate:{run.rt.spec.name}"
            wanted.add(run.rt.spec.name)
            workers[key] = sched.WorkerInfo(
                backend=key, gpu=run.gpu, state="busy", active_jobs=1,
                reserved_mib=max(0, self._gpu_totals.get(run.gpu, 0) - self.config.reserve_mib))
        for name in wanted:
            spec = self.backends[name].spec
            backends[f"calibrate:{name}"] = sched.BackendInfo(
                name=f"calibrate:{name}", peak_mib=None, safety_mib=0, priority=spec.priority,
                allowed_gpus=spec.gpus)
        queue: tuple[sched.QueuedJob, ...] = extra
        counts = None
        if with_queue:
            queue = self.queue.scheduler_view()
            counts = self.queue.per_backend
            if extra:
                queue = queue + extra
                counts = counts + Counter(q.backend for q in extra)
        return sched.Snapshot(gpus=tuple(gpus), backends=backends, workers=workers, queue=queue,
                              queued_per_backend=counts)

    def _step(self) -> None:
        self._step_scheduled = False
        if self._stopping:
            return
        extra: tuple[sched.QueuedJob, ...] = ()
        preloads = [name for name, rt in self.backends.items() if rt.preload]
        if preloads:
            # Last in the queue: a preload takes room nobody waits for, never a job's room.
            now = self.clock()
            extra = tuple(sched.QueuedJob(f"preload:{n}", n, -(10**9), 10**15 + i, now, 0)
                          for i, n in enumerate(preloads))
        snap = self._sched_snapshot(extra=extra)
        plan = make_plan(snap, self.clock(), self.sched_config)
        for ev in plan.evictions:
            rt = self.backends[ev.backend]
            if rt.worker is not None and rt.worker.state != WorkerState.STOPPING:
                self._note("info", f"evicting {ev.backend} from GPU{ev.gpu} "
                           f"(frees {ev.frees_mib} MiB): {ev.reason}", ev.backend)
                self._evict_now(rt)
        for job_id, passed in plan.passed.items():
            job = self.jobs.get(job_id)
            if job is not None:
                self.queue.set_passed(job, passed)
        for start in plan.starts:
            self._start(start)
        for rt_name in preloads:
            rt = self.backends[rt_name]
            if rt.worker is not None:
                rt.preload = False
            elif self.clock() >= rt.preload_deadline:
                rt.preload = False
                reason = plan.waiting.get(f"preload:{rt_name}", "no room")
                self._note("warning", f"gave up preloading {rt_name} after "
                           f"{PRELOAD_PATIENCE_S:g} s: {reason}", rt_name)
        self._waiting = plan.waiting  # read lazily: only shown jobs need their reason

    def _start(self, start: sched.Start) -> None:
        if start.backend.startswith("calibrate:"):
            job = self.jobs[start.job_id]
            self._remove_queued(job)
            job.waiting = ""
            self._start_calibration(job, start.gpu)
            return
        rt = self.backends[start.backend]
        if start.job_id.startswith("preload:"):
            if rt.worker is None:
                self._spawn_worker(rt, start.gpu)
            return
        job = self.jobs[start.job_id]
        self._remove_queued(job)
        job.gpu = start.gpu
        job.waiting = ""
        if start.spawn or rt.worker is None:
            self._spawn_worker(rt, start.gpu)
        rt.admitted.append(job.id)
        rt.idle_since = None
        worker = rt.worker
        assert worker is not None
        if worker.hot and worker.data is not None:
            self._dispatch(rt, job)
        else:
            job.mark(self.clock(), JobState.STARTING, f"starting {rt.spec.name} on GPU{job.gpu}")
            self._journal("record_state", job.id, JobState.STARTING, time.time())
            self._job_event(job)

    def _remove_queued(self, job: Job) -> None:
        self.queue.remove(job)

    def _dispatch(self, rt: BackendRuntime, job: Job) -> None:
        worker = rt.worker
        assert worker is not None
        job.mark(self.clock(), JobState.RUNNING, f"on {worker.name} (pid {worker.pid})")
        self._journal("record_start", job.id, time.time(), f"on {worker.name}")
        job.peak_mib = None
        worker.send(job.id, job.payload, stream=job.stream, metadata=job.metadata,
                    deadline=None)
        self._job_event(job)

    # ===================================================================== workers ========
    def _spawn_worker(self, rt: BackendRuntime, gpu: int) -> None:
        spec = rt.spec
        rt.generation += 1
        rt.exclusive = rt.peak is None
        handle = self.make_worker(rt, gpu, f"{spec.name}#{rt.generation}", observer=self)
        rt.worker = handle
        self._note("info", f"starting {spec.name} on GPU{gpu}"
                   + (" (footprint unknown: it runs alone until measured)" if rt.exclusive
                      else ""), spec.name)
        self._spawn_task(handle.start())
        self._set_timer(f"start:{handle.name}", spec.timeouts.start_s,
                        lambda: self._start_timed_out(rt, handle))
        self._worker_event(rt)

    def make_worker(self, rt: BackendRuntime, gpu: int, name: str,
                    observer: WorkerObserver) -> WorkerHandle:
        """A (not yet started) worker process of ``rt`` on ``gpu``."""
        spec = rt.spec
        env = dict(os.environ)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["VRAMTUI_BACKEND"] = spec.name
        if self.probe.simulated:
            env["VRAMTUI_SIM_DIR"] = str(self.paths.sim_dir)
            env["VRAMTUI_SIM_GPU"] = str(gpu)
        else:
            env.setdefault("CUDA_VISIBLE_DEVICES", str(gpu))
            env.pop("VRAMTUI_SIM_DIR", None)
        argv = list(spec.command) + [
            "--control-socket", str(self.paths.worker_control_socket),
            "--data-socket", str(self.paths.worker_data_socket),
            "--name", name,
        ]
        return WorkerHandle(
            backend=spec.name, name=name, gpu=gpu, argv=argv, env=env,
            cwd=str(spec.cwd) if spec.cwd else None,
            log_path=self.paths.logs_dir / f"{spec.name}.log",
            listener=self.listener, observer=observer, plain_stream=spec.stream,
        )

    def _start_timed_out(self, rt: BackendRuntime, handle: WorkerHandle) -> None:
        if rt.worker is handle and not handle.hot and not handle.exited:
            handle.init_error = (f"not ready after {rt.spec.timeouts.start_s:g} s "
                                 "(timeouts.start)")
            self._note("error", f"{rt.spec.name}: {handle.init_error}; killing it", rt.spec.name)
            handle.kill()

    def _evict_now(self, rt: BackendRuntime) -> None:
        """Stop ``rt``'s idle worker: it takes no job from this instant, then goes."""
        if rt.worker is not None:
            rt.worker.begin_stop()  # synchronously: a step already queued must not use it
            self._spawn_task(self._stop_worker(rt, grace=rt.spec.timeouts.stop_grace_s))

    async def _stop_worker(self, rt: BackendRuntime, grace: float, drain: bool = False) -> None:
        worker = rt.worker
        if worker is None:
            return
        if drain and rt.admitted:
            # Running jobs get the grace to finish; then the worker gets a short one to go
            # (not the whole grace again: stop() must end within grace + a few seconds).
            deadline = self.clock() + grace
            while rt.admitted and self.clock() < deadline and not worker.exited:
                await asyncio.sleep(0.05)
            grace = min(grace, 2.0)
        await worker.stop(grace=grace)

    # -- WorkerObserver ---------------------------------------------------------------------
    def worker_state(self, handle: WorkerHandle) -> None:
        rt = self.backends.get(handle.backend)
        if rt is None or rt.worker is not handle:
            return
        if handle.state == WorkerState.READY:
            self._cancel_timer(f"start:{handle.name}")
            if handle.ready_at is not None and rt.init_failures:
                rt.init_failures = 0
            for job_id in list(rt.admitted):
                job = self.jobs.get(job_id)
                # While stopping, admitted jobs stay unstarted: they run after a restart.
                if job is not None and job.state is JobState.STARTING and not self._stopping:
                    self._dispatch(rt, job)
            if not rt.admitted and rt.idle_since is None:
                rt.idle_since = self.clock()
        self._worker_event(rt)
        self._schedule()

    def worker_exited(self, handle: WorkerHandle, code: int | None, reason: str) -> None:
        rt = self.backends.get(handle.backend)
        if rt is None or rt.worker is not handle:
            return
        self._cancel_timer(f"start:{handle.name}")
        reserved = self.reserved_mib(rt)
        rt.worker = None
        rt.idle_since = None
        pids = {handle.pid} if handle.pid is not None else set()
        pids |= handle._descendants
        rt.ghost = Ghost(handle.gpu, reserved, pids, self.clock() + EVICTION_CONFIRM_TIMEOUT_S)
        self._spawn_task(self._confirm_ghost(rt))
        expected = handle.state == WorkerState.COLD
        never_ready = handle.ready_at is None
        log_hint = f"log: {handle.log_path}"
        if expected:
            self._note("info", f"{rt.spec.name} stopped", rt.spec.name)
        elif never_ready:
            rt.init_failures += 1
            rt.last_error = handle.init_error or reason
            self._note("error", f"{rt.spec.name} failed to start ({rt.init_failures}/"
                       f"{MAX_INIT_FAILURES}): {rt.last_error}; {log_hint}", rt.spec.name)
            if rt.init_failures >= MAX_INIT_FAILURES:
                rt.failed = True
        else:
            rt.last_error = f"{reason}; {log_hint}"
            self._note("error", f"{rt.spec.name} crashed: {rt.last_error}", rt.spec.name)
        for job_id in list(rt.admitted):
            job = self.jobs.get(job_id)
            rt.admitted.remove(job_id)
            if job is None or job.state.finished:
                continue
            if self._stopping and not job.cancel_requested:
                self._stopped_during(job)
            elif job.cancel_requested:
                self._finish(job, job.cancel_state, error=job.error or "cancelled (worker killed)")
            elif never_ready and not expected and not rt.failed:
                job.state = JobState.QUEUED  # it never ran: try again with a fresh worker
                job.history.append((self.clock(), "queued", "requeued: worker failed to start"))
                job.gpu = None
                self._journal("record_state", job.id, JobState.QUEUED, time.time(),
                              "requeued: worker failed to start")
                self.queue.push(job)
                self._job_event(job)
            else:
                what = ("its worker failed to start: " + (rt.last_error or reason)) \
                    if never_ready else f"{rt.spec.name} {reason}; {log_hint}"
                self._finish(job, JobState.FAILED, error=what)
        if rt.failed:
            for job in [j for j in self.queue if j.backend == rt.spec.name]:
                self._remove_queued(job)
                self._finish(job, JobState.FAILED,
                             error=f"{rt.spec.name} failed to initialise {MAX_INIT_FAILURES} "
                             f"times: {rt.last_error}; respawn it once fixed")
        self._worker_event(rt)
        self._schedule()

    def request_done(self, handle: WorkerHandle, job_id: str, outcome: Outcome) -> None:
        job = self.jobs.get(job_id)
        rt = self.backends.get(handle.backend)
        if job is None or rt is None:
            return
        with contextlib.suppress(ValueError):
            rt.admitted.remove(job_id)
        rt.jobs_served += 1
        rt.last_used = time.time()
        if not rt.admitted:
            rt.idle_since = self.clock()
        self._learn(rt, job)
        if job.cancel_requested:
            self._finish(job, job.cancel_state, error=job.error or "cancelled")
        elif outcome.ok:
            job.data = outcome.data
            job.headers = outcome.headers
            job.status_code = outcome.status_code
            self._finish(job, JobState.SUCCEEDED)
        else:
            job.status_code = outcome.status_code
            state = JobState.CANCELLED if outcome.cancelled else JobState.FAILED
            self._finish(job, state, error=outcome.error)
        self._schedule()

    def request_progress(self, job_id: str, fraction: float | None, text: str) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state.finished:
            return
        job.progress = fraction
        job.progress_text = text
        self._job_event(job)

    def request_chunk(self, job_id: str, chunk: bytes) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        job.chunks.append(chunk)
        if self.events.active:
            self.events.publish(EngineEvent("chunk", time.time(), backend=job.backend,
                                            job_id=job_id, data=chunk))

    def _learn(self, rt: BackendRuntime, job: Job) -> None:
        """Record the job's observed peak; size an unmeasured backend from it."""
        if job.peak_mib is None:
            return
        rt.observed_peaks.append(job.peak_mib)
        if rt.spec.peak is None:
            # The peak comes from samples during jobs; what stays resident is read later,
            # from a sample of the idle worker (see _learn_resident).
            rt.learned_peak_mib = max(rt.learned_peak_mib or 0, job.peak_mib)

    def _learn_resident(self, rt: BackendRuntime, mib: int) -> None:
        """An unmeasured backend's idle worker holds ``mib``: with its peak, it is sized."""
        first = rt.learned_resident_mib is None
        rt.learned_resident_mib = min(mib, rt.learned_peak_mib or mib)
        if first:
            self._note("info", f"{rt.spec.name} measured in production: peak "
                       f"{rt.learned_peak_mib} MiB, resident {rt.learned_resident_mib} MiB; "
                       "it no longer needs a GPU to itself", rt.spec.name)
        rt.exclusive = False
        self._schedule()

    def _finish(self, job: Job, state: JobState, error: str | None = None) -> None:
        if job.state.finished:
            return
        if error is not None:
            job.error = error
        job.mark(self.clock(), state, error or "")
        self._cancel_timer(job.id)
        self._cancel_timer(f"kill:{job.id}")
        job.payload = b""
        if job.kind == "job":
            self._journal("record_finish", job.id, state, time.time(), note=error or "",
                          data=job.data, headers=job.headers, status_code=job.status_code,
                          error=job.error, chunks=job.chunks)
        view = job.view()
        self._resolve(job, view)
        self.recent.append(job.id)
        while len(self.recent) > self.config.recent_jobs:
            old = self.recent.popleft()
            self.jobs.pop(old, None)
        self.events.publish(EngineEvent("job", time.time(), job=view, backend=job.backend,
                                        state=state.value))

    def _stopped_during(self, job: Job) -> None:
        """The engine stops under a job: journaled jobs stay to run again, others fail."""
        if self.journal is not None and job.kind == "job":
            # The journal still says queued/running: recovery requeues it (as interrupted).
            self._resolve(job, "the engine stopped while it ran; it runs again (marked "
                          "interrupted) when the engine starts again")
        else:
            self._finish(job, JobState.FAILED, error="the engine stopped during the job")

    def _resolve(self, job: Job, outcome: JobView | str) -> None:
        """Wake whoever waits for ``job``: with its final view, or with why it won't end."""
        fut = self.futures.pop(job.id, None)
        if fut is None or fut.done():
            return
        if isinstance(outcome, str):
            fut.set_exception(EngineStopped(f"job {job.id}: {outcome}"))
        else:
            fut.set_result(outcome)

    # ===================================================================== samples ========
    def _sample_from_thread(self, sample: Sample) -> None:
        loop = self.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_sample, sample)

    def _on_sample(self, sample: Sample) -> None:
        for reading in sample.devices:
            self.readings[reading.index] = reading
            self._gpu_totals[reading.index] = reading.total_mib
            if reading.used_mib is not None:
                self.history.append(reading.index, sample.t, reading.used_mib)
        if sample.processes is not None:
            self.gpu_processes = sample.processes
            self.proc_mib = {p.pid: p.used_mib or 0 for p in sample.processes}
            on_gpu = set(self.proc_mib)
            for rt in self.backends.values():
                worker = rt.worker
                if worker is not None and not worker.exited:
                    pids = worker.pids()
                    mib = sum(self.proc_mib.get(pid, 0) for pid in pids)
                    rt.observed_mib = mib
                    self.backend_history.append(rt.spec.name, sample.t, mib)
                    if (rt.spec.peak is None and rt.learned_peak_mib is not None
                            and not rt.admitted and worker.state == WorkerState.READY):
                        self._learn_resident(rt, mib)
                    for job_id in rt.admitted:
                        job = self.jobs.get(job_id)
                        if job is not None and job.state is JobState.RUNNING:
                            job.peak_mib = max(job.peak_mib or 0, mib)
                else:
                    rt.observed_mib = None
                if rt.ghost is not None and not (rt.ghost.pids & on_gpu):
                    rt.ghost = None
        for run, _task in self.calibrations.values():
            run.on_sample(sample)
        self.events.publish(EngineEvent("sample", time.time()))
        self._schedule()

    async def _confirm_ghost(self, rt: BackendRuntime) -> None:
        """Look at the GPU's process list right after an exit, not at the next sample."""
        assert self.loop is not None
        try:
            procs = await self.loop.run_in_executor(None, self.probe.processes)
        except Exception:  # noqa: BLE001 - the periodic samples will confirm it instead
            return
        ghost = rt.ghost
        if ghost is not None and not (ghost.pids & {p.pid for p in procs}):
            rt.ghost = None
            self._schedule()

    def _expire_ghosts(self) -> None:
        now = self.clock()
        for rt in self.backends.values():
            ghost = rt.ghost
            if ghost is not None and now >= ghost.deadline:
                if ghost.pids & set(self.proc_mib):
                    self._note("warning", f"{rt.spec.name}: processes {sorted(ghost.pids)} "
                               "still hold GPU memory after exiting; counting it as foreign",
                               rt.spec.name)
                rt.ghost = None

    def _expire_keep_alive(self) -> None:
        now = self.clock()
        for rt in self.backends.values():
            w = rt.worker
            if (w is not None and w.state == WorkerState.READY and not rt.admitted
                    and rt.idle_since is not None and not rt.spec.pinned
                    and math.isfinite(rt.spec.keep_alive_s)
                    and now - rt.idle_since >= rt.spec.keep_alive_s):
                self._note("info", f"{rt.spec.name} idle for {rt.spec.keep_alive_s:g} s "
                           "(keep_alive): unloading", rt.spec.name)
                rt.idle_since = None
                self._evict_now(rt)

    # ===================================================================== timers =========
    def _set_timer(self, key: str, delay: float, fn: Callable[[], None]) -> None:
        assert self.loop is not None
        self._cancel_timer(key)

        def fire() -> None:
            self._timers.pop(key, None)
            fn()

        self._timers[key] = self.loop.call_later(max(0.0, delay), fire)

    def _cancel_timer(self, key: str) -> None:
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()

    # ===================================================================== snapshots ======
    def snapshot(self) -> EngineSnapshot:
        return build_snapshot(self)


def _check_metadata(metadata: dict[str, Any] | None) -> None:
    """Metadata travels to the worker and into the journal: it must be plain data."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise InvalidRequest(f"metadata must be a mapping, got {type(metadata).__name__}")
    try:
        msgpack.packb(metadata, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidRequest(f"metadata must be plain data (strings, numbers, lists, "
                             f"mappings, bytes): {exc}") from None
