"""The engine: one asyncio loop that owns every piece of state and acts on the scheduler's plans.

All state (backends, workers, queue, jobs, GPU readings) lives here and is touched only on the
engine loop — no locks around state.  Every event (submit, job end, worker state change, sample,
timer) schedules one coalesced scheduler step: ``admission.decide_inputs`` turns the state into
the memory ledger's book and the pure scheduler's snapshot, ``plan()`` decides, and the step
carries out its evictions and starts.  Each sample of the GPUs feeds the ledger what every
worker's processes really hold: figures that proved too small are replaced by what was
observed, a worker above its figures is handled by its backend's ``on_overuse`` policy, and one
that over-commits a GPU is killed at once.  Every live worker is pinged; one that stops
answering is killed as hung.  Other threads reach the engine through
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import admission, validate
from .backends.schema import BackendSpec
from .counters import Counters
from .engine_commands import EngineCommands, KeptRequests
from .errors import (
    BackendFailed,
    EngineStopped,
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
from .ledger import Book, Device, Learned, foreign_mib
from .paths import Paths
from .scheduler import model as sched
from .scheduler.plan import plan as make_plan
from .scheduler.submit import check_submit
from .snapshot import EngineSnapshot, LogLine
from .views import build_snapshot
from .workers.base import Worker
from .workers.handle import Outcome, WorkerHandle, WorkerObserver, WorkerState
from .workers.lifeline import Lifeline, kill_leftovers
from .workers.vramd import VramdWorkerHandle
from .workers.wire import WireListener

if TYPE_CHECKING:
    from .calibration.engine_run import CalibrationRun

log = logging.getLogger("supervisor")

MAX_INIT_FAILURES = 3
EVICTION_CONFIRM_TIMEOUT_S = 5.0
PRELOAD_PATIENCE_S = 30.0
STEP_NOW_MAX_QUEUE = 8  # step_now decides at once only while the queue is this short
HISTORY_STEP_S = 0.25  # at most 4 points a second in the GPU history, whatever the sample rate
MIN_OVERUSE_TOLERANCE_MIB = 64
MIN_PEAK_SAMPLES = 3  # a job's peak is trusted to size a backend once sampled this often


@dataclass
class EngineConfig:
    reserve_mib: int = 256  # kept free on every GPU for the driver and foreign processes
    max_queue_depth: int = 512
    patience_factor: float = 4.0  # see SchedulerConfig: batching against switch costs
    max_patience_s: float = 300.0  # the hard bound on how long a job first in line is passed
    aging_interval_s: float = 60.0
    recent_jobs: int = 200
    cancel_grace_s: float = 5.0
    tick_s: float = 0.5
    sample_hz: float = 10.0  # GPU devices and processes: the memory ledger's eyes
    ping_interval_s: float = 1.0  # every live worker is pinged this often
    journal: bool = True  # jobs survive a crash of the engine (SQLite, WAL)
    keep_finished: int = 1000  # finished results kept in the journal…
    keep_age_s: float = 7 * 86400  # …for at most this long
    # What one job may make the engine hold (see supervisor.validate and the README): its
    # request, all queued requests together, and its result (data, or stream chunks in all);
    # a result over max_result_bytes fails the job with a reason saying so.
    max_payload_bytes: int = 64 * 1024 * 1024
    max_queued_bytes: int = 1024 * 1024 * 1024
    max_result_bytes: int = field(default_factory=validate.default_max_result_bytes)
    # Results of finished jobs kept in memory, all together (the oldest go first; with the
    # journal they stay retrievable from it).
    max_recent_result_bytes: int = 256 * 1024 * 1024


@dataclass
class Ghost:
    """A stopped worker whose memory is still held until its processes leave the GPU."""

    name: str
    gpu: int
    mib: int
    pids: set[int]
    deadline: float
    observed_mib: int | None = None


@dataclass
class BackendRuntime:
    """The engine's live record of one backend."""

    spec: BackendSpec
    worker: Worker | None = None
    generation: int = 0
    exclusive: bool = False  # the worker holds a whole GPU (footprint unknown at spawn)
    admitted: list[str] = field(default_factory=list)  # jobs holding a slot on the worker
    init_failures: int = 0
    failed: bool = False
    last_error: str | None = None
    jobs_served: int = 0
    last_used: float | None = None
    idle_since: float | None = None
    learned: Learned = Learned()
    distrusted: bool = False  # caught lying: its descriptor only a floor (see _distrust)
    accepting: bool = True  # the live worker takes new jobs (False: evicted once idle)
    baseline: sched.BackendInfo | None = None  # the figures its live worker was admitted with
    over_mib: int = 0  # how far the live worker was last seen above its baseline
    over_noted: bool = False
    # The live worker was caught above its figures (past tolerance), holding at most this:
    # once it exits, the backend is distrusted (None: not caught).
    caught_mib: int | None = None
    kill_reason: str | None = None  # why the engine killed the live worker (its jobs fail so)
    observed_mib: int | None = None  # the worker's processes' memory at the last sample
    settling: bool = False  # a job ended since that sample: its memory is on its way back
    observed_peaks: deque[int] = field(default_factory=lambda: deque(maxlen=200))
    load_times: deque[float] = field(default_factory=lambda: deque(maxlen=20))
    timed_worker: str | None = None  # the worker whose load time was last recorded
    ghosts: list[Ghost] = field(default_factory=list)
    preload: bool = False  # start the worker without a job, in room nobody waits for
    preload_deadline: float = 0.0
    _info: sched.BackendInfo | None = None
    _info_key: tuple[Any, ...] | None = None

    @property
    def reload_cost_s(self) -> float:
        """What a (re)load costs, learned from measured start-to-ready times."""
        return admission.reload_cost_s(self.spec.reload_cost_s, self.load_times)

    def info(self) -> sched.BackendInfo:
        """What admission knows of this backend (rebuilt only when its figures move)."""
        reload = round(self.reload_cost_s, 2)
        # The spec itself, compared by identity: a replaced spec's id may be reused by the next.
        key = (self.spec, self.learned, self.distrusted, reload)
        if self._info is None or self._info_key is None or self._info_key[0] is not key[0] \
                or self._info_key[1:] != key[1:]:
            self._info = admission.backend_info(self.spec, self.learned, reload,
                                                distrusted=self.distrusted)
            self._info_key = key
        return self._info

    @property
    def peak(self) -> int | None:
        """The peak admission uses (declared, calibrated or learned; None: unknown)."""
        return self.info().peak_mib


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
        descriptor_warnings: tuple[tuple[str | None, str], ...] = (),
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
            patience_factor=self.config.patience_factor,
            max_patience_s=self.config.max_patience_s,
            aging_interval_s=self.config.aging_interval_s,
            max_queue_depth=self.config.max_queue_depth,
        )
        self.clock = clock
        self.backends = {name: BackendRuntime(spec) for name, spec in backends.items()}
        self.descriptor_errors = descriptor_errors
        # (backend, line): keys that load but are not honoured, e.g. vramd's footprint_key
        self.descriptor_warnings = descriptor_warnings
        self.jobs: dict[str, Job] = {}
        self.futures: dict[str, concurrent.futures.Future[JobView]] = {}
        self.queue = JobQueue()  # sorted by (-priority, seq): the scheduler's contract
        self.recent: deque[str] = deque()
        self.readings: dict[int, GpuReading] = {}
        self.proc_mib: dict[int, int] = {}  # pid -> MiB at the last process sample
        self.history: History[int, int] = History()
        self.backend_history: History[str, int] = History()
        self.events = EventHub()
        self.counters = Counters()  # what happened, for /metrics
        self.log_lines: deque[LogLine] = deque(maxlen=300)
        self.started_at = clock()
        self.wall_started = time.time()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listener = WireListener(
            str(paths.worker_control_socket), str(paths.worker_data_socket)
        )
        self.sampler: Sampler | None = None
        self._step_scheduled = False
        self._step_handle: asyncio.Handle | None = None
        # backend -> (its figures, the GPUs' sizes, why a job of it could never run)
        self._refusals: dict[str, tuple[sched.BackendInfo, tuple[tuple[int, int], ...],
                                        str | None]] = {}
        self._stopping = False
        self._stopped = asyncio.Event()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiting: Mapping[str, str] = {}
        self.calibrations: dict[str, tuple[CalibrationRun, asyncio.Task[Any]]] = {}
        self.journal: Journal | None = None
        self._disk_full_noted = False
        self._recent_bytes: dict[str, int] = {}  # result bytes of each job in self.recent
        self._wall_offset = wall_offset(clock)
        self.foreign: dict[int, int] = {}  # GPU -> MiB held by processes that are not ours
        self.draining: set[int] = set()
        self.lifeline = Lifeline(paths.runtime_dir / "workers")
        self._history_at: dict[int, float] = {}
        self.gpu_processes: tuple[ProcessReading, ...] = ()  # at the last process sample
        self.gpu_owners: dict[int, str] = {}  # pid -> the backend it works for, at that sample
        self.kept_requests = KeptRequests()  # for retry

    # ===================================================================== lifecycle ======
    async def main(self, started: Callable[[BaseException | None], None]) -> None:
        self.loop = asyncio.get_running_loop()
        leftovers: list[str] = []
        try:
            if self.config.journal:
                self.journal = Journal.open(self.paths.journal_path,
                                            keep_finished=self.config.keep_finished,
                                            keep_age_s=self.config.keep_age_s)
            # Workers an earlier engine left behind die before anything is requeued: a job
            # never executes twice at once.
            leftovers = await self.loop.run_in_executor(None, kill_leftovers,
                                                        self.lifeline.records_dir)
            self.lifeline.start()
            await self.listener.start()
            devices = self.probe.devices()
            for reading in devices:
                self.readings[reading.index] = reading
            rate = self.config.sample_hz
            self.sampler = Sampler(self.probe, self._sample_from_thread, device_hz=rate,
                                   process_hz=rate)
            self.sampler.start()
        except BaseException as exc:
            started(exc)
            await self.listener.close()
            self.lifeline.close()
            if self.journal is not None:
                self.journal.close()
            return
        for line in leftovers:
            self._note("warning", line)
        self._recover()
        self._note("info", f"engine started: {self._gpu_summary()}")
        if self.notice:
            self._note("warning", self.notice)
        for err in self.descriptor_errors:
            self._note("error", err)
        for backend, warning in self.descriptor_warnings:
            self._note("warning", f"descriptor warning: {warning}", backend)
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
            if self._journaled(job):
                # Still queued in the journal: it runs when the engine starts again.
                self._resolve(job, "the engine stopped before the job ran; it stays queued "
                              "and runs when the engine starts again")
            else:
                # Whoever waits hears that the engine stopped (Dynamo's caller retries
                # elsewhere), and the job ends: nothing keeps it.
                self._resolve(job, "the engine stopped before the job ran")
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
        self.lifeline.close()
        if self.journal is not None:
            self.journal.close()
        self._note("info", f"engine stopped after {self.clock() - now:.1f} s of shutdown")
        self.events.close()

    async def _ticker(self) -> None:
        next_ping = 0.0
        while True:
            await asyncio.sleep(min(self.config.tick_s, self.config.ping_interval_s))
            self._expire_ghosts()
            self._expire_keep_alive()
            now = time.monotonic()
            if now >= next_ping:
                next_ping = now + self.config.ping_interval_s
                self._check_liveness(now)
            self._schedule()

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ===================================================================== notes/events ===
    def _note(self, level: str, text: str, backend: str | None = None, *,
              quiet: bool = False) -> None:
        """A line of the event log (the TUI's, the events' and Python logging's); ``quiet``
        lines (one per job) go to Python logging at debug level only."""
        line = LogLine(time.time(), level, text, backend)
        self.log_lines.append(line)
        if quiet:
            log.debug(text)
        else:
            getattr(log, level if level in ("info", "error", "debug", "warning") else "info")(text)
        if self.events.wants("log"):
            self.events.publish(EngineEvent("log", line.t, message=text, level=level,
                                            backend=backend))

    def _job_event(self, job: Job) -> None:
        if not self.events.wants("job"):
            return
        self.events.publish(EngineEvent("job", time.time(), job=job.view(light=True),
                                        backend=job.backend, state=job.state.value))

    def _worker_event(self, rt: BackendRuntime) -> None:
        if not self.events.wants("worker"):
            return
        state = rt.worker.state.value if rt.worker else ("failed" if rt.failed else "cold")
        self.events.publish(EngineEvent("worker", time.time(), backend=rt.spec.name,
                                        state=state))

    # ===================================================================== commands =======
    def submit(self, backend: str, payload: bytes, *, priority: int | None = None,
               timeout: float | None = None, metadata: dict[str, Any] | None = None,
               stream: bool = False, durable: bool = True) -> Job:
        """Queue a job. ``durable`` ones are journaled before they are accepted and come back
        after a crash; others (a request whose client goes with the engine) are not."""
        if self._stopping:
            self.counters.refused("stopping")
            raise EngineStopped("the engine is stopping and takes no new jobs")
        args = validate.check_submit(backend, payload, priority=priority, timeout=timeout,
                                     metadata=metadata, stream=stream,
                                     max_payload=self.config.max_payload_bytes)
        backend, payload, priority, timeout = (args.backend, args.payload, args.priority,
                                               args.timeout)
        rt = self.backends.get(backend)
        if rt is None:
            raise UnknownBackend(backend, self.backends)
        if rt.failed:
            self.counters.refused("backend_failed")
            raise BackendFailed(
                f"backend {backend!r} failed to initialise {MAX_INIT_FAILURES} times in a row "
                f"({rt.last_error}); fix it, then respawn it (vramtui respawn {backend})"
            )
        reason = self._refusal(rt)
        if reason is None and len(self.queue) >= self.config.max_queue_depth:
            reason = (f"queue full: {len(self.queue)} jobs waiting; try again later or raise "
                      "max_queue_depth")
        if reason is not None:
            self.counters.refused_because(reason)
            self._note("warning", f"refused a job for {backend}: {reason}", backend)
            if reason.startswith("queue full"):
                raise QueueFull(reason)
            raise Refused(reason)
        validate.check_queue_room(self.queue.payload_bytes, len(payload),
                                  self.config.max_queued_bytes)
        job = Job(
            backend=backend,
            payload=payload,
            priority=rt.spec.priority if priority is None else priority,
            timeout=timeout if timeout is not None else rt.spec.timeouts.request_s,
            metadata=args.metadata,
            stream=args.stream or rt.spec.stream,
            durable=durable,
        )
        job.submitted_at = self.clock()
        job.mark(job.submitted_at, JobState.QUEUED)
        if self._journaled(job):  # durable before the submitter hears "accepted"
            self.journal.record_submit(self._record(job))  # type: ignore[union-attr]
        self.jobs[job.id] = job
        self.futures[job.id] = concurrent.futures.Future()
        self.kept_requests.keep(job)
        self.queue.push(job)
        self._job_event(job)
        self._schedule()
        return job

    def calibrate(self, backend: str, *, repeats: int = 3, request: bytes | None = None,
                  settle_s: float = 1.0, priority: int | None = None) -> Job:
        """Queue a calibration run of ``backend``: a job that needs a GPU to itself."""
        if self._stopping:
            raise EngineStopped("the engine is stopping and takes no new jobs")
        rt = self._runtime(backend)
        repeats, settle_s, request, priority = validate.check_calibrate(
            repeats, settle_s, request, priority, self.config.max_payload_bytes)
        payload = request if request is not None else (rt.spec.calibration_request or b"")
        job = Job(backend=backend, payload=payload,
                  priority=rt.spec.priority if priority is None else priority,
                  metadata={"repeats": repeats, "settle_s": settle_s}, kind="calibration")
        reason = check_submit(self._refusal_view(backend), backend, self.sched_config,
                              kind="calibration")
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
            if summary.get("outcome") == "completed" and summary.get("overlay"):
                self._note("info", f"calibrated {job.backend}: "
                           + str(summary.get("headline", "see the report")), job.backend)
                self._finish(job, JobState.SUCCEEDED)
            elif summary.get("outcome") == "completed":
                why = f"nothing usable was measured: {summary.get('reason')}"
                self._note("warning", f"calibration of {job.backend}: {why}; no overlay "
                           "written", job.backend)
                self._finish(job, JobState.FAILED,
                             error=f"{why}; no overlay written; report {summary.get('report')}")
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

    def _journaled(self, job: Job) -> bool:
        """Whether ``job`` lives in the journal (and so survives an engine stop)."""
        return self.journal is not None and job.kind == "job" and job.durable

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
        if self.journal.damage is not None:
            self._note("error", "journal: " + self.journal.damage.describe())
        recovery = self.journal.recover(time.time())
        advance_seq(recovery.max_seq)
        for rec in recovery.failed:
            self._note("error", f"job {rec.id} ({rec.backend}) was interrupted twice by an "
                       "engine stop; it was not run a third time", rec.backend)
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
        self.counters.evicted(backend, "asked")
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
        if not self._step_scheduled and self.loop is not None and not self._stopping \
                and not self._nothing_waits():
            self._step_scheduled = True
            self._step_handle = self.loop.call_soon(self._step)

    def step_now(self) -> None:
        """Take the scheduled decision now rather than on the loop's next turn (on the engine
        loop, by a caller that has nothing else to do first: a request handler that has just
        submitted its job and will wait for it).

        Only while the queue is short (a deep one is decided once per turn, for everyone), and
        never raising: what goes wrong in a step is the engine's, reported as from the loop,
        not a failure of the caller's request, whose job was accepted.
        """
        if not self._step_scheduled or self._step_handle is None or \
                len(self.queue) > STEP_NOW_MAX_QUEUE:
            return
        self._step_handle.cancel()
        try:
            self._step()
        except Exception as exc:  # noqa: BLE001 - the loop's handler logs it, as it would
            assert self.loop is not None
            self.loop.call_exception_handler({
                "message": "the engine's scheduling step failed", "exception": exc})

    def _nothing_waits(self) -> bool:
        """No job, preload or draining GPU: a plan could neither start nor evict anything."""
        return not self.queue and not self.draining and \
            not any(rt.preload for rt in self.backends.values())

    def drain(self, gpu: int, on: bool = True) -> None:
        """Drain ``gpu`` (finish what runs there, admit nothing new, evict its idle workers),
        or stop draining it."""
        if gpu not in self.readings:
            present = ", ".join(f"GPU{i}" for i in sorted(self.readings)) or "none"
            raise Refused(f"there is no GPU{gpu} (present: {present})")
        if on and gpu not in self.draining:
            self.draining.add(gpu)
            self._note("info", f"draining GPU{gpu}: running jobs finish, nothing new starts "
                       "there, idle workers are evicted")
        elif not on and gpu in self.draining:
            self.draining.discard(gpu)
            self._note("info", f"GPU{gpu} takes jobs again")
        self._schedule()

    def book(self) -> Book:
        """The memory ledger's accounts of the engine now."""
        return self._inputs(with_queue=False)[1]

    def _refusal(self, rt: BackendRuntime) -> str | None:
        """Why a job of ``rt`` could never run here (None: it can), remembered while the
        backend's figures and the GPUs' sizes stay the same."""
        info = rt.info()
        sizes = tuple((i, r.total_mib) for i, r in sorted(self.readings.items()))
        name = rt.spec.name
        known = self._refusals.get(name)
        if known is not None and known[0] is info and known[1] == sizes:
            return known[2]
        reason = check_submit(self._refusal_view(name), name, self.sched_config)
        self._refusals[name] = (info, sizes, reason)
        return reason

    def _refusal_view(self, backend: str) -> sched.Snapshot:
        """What ``check_submit`` reads: the GPUs and that backend's figures (no ledger: a
        refusal at submit depends on sizes, never on what runs now)."""
        gpus = [sched.GpuState(i, r.total_mib, None, self.config.reserve_mib)
                for i, r in sorted(self.readings.items())]
        return sched.Snapshot(gpus=gpus, backends={backend: self.backends[backend].info()})

    def _devices(self) -> list[Device]:
        return [Device(i, r.total_mib, r.used_mib, r.free_mib)
                for i, r in sorted(self.readings.items())]

    def _inputs(self, extra: tuple[sched.QueuedJob, ...] = (), *, with_queue: bool = True,
                ) -> tuple[sched.Snapshot, Book]:
        """The scheduler's snapshot and the ledger's book of the engine now."""
        calibrating = {run.rt.spec.name for run, _task in self.calibrations.values()}
        backends: dict[str, sched.BackendInfo] = {}
        workers: list[admission.WorkerFacts] = []
        ghosts: list[admission.GhostFacts] = []
        for name, rt in self.backends.items():
            backends[name] = rt.info()
            w = rt.worker
            if w is not None and w.state not in (WorkerState.CRASHED, WorkerState.COLD,
                                                 WorkerState.FAILED):
                # A backend being calibrated takes no new job on its old worker, which the
                # run stops once its running jobs are done.
                state = "stopping" if name in calibrating else w.state.value
                workers.append(admission.WorkerFacts(
                    name=w.name, backend=name, gpu=w.gpu, state=state, jobs=len(rt.admitted),
                    exclusive=rt.exclusive, observed_mib=rt.observed_mib,
                    idle_since=rt.idle_since, accepting=rt.accepting,
                    over_declared=rt.over_mib > 0, settling=rt.settling))
            for gh in rt.ghosts:
                ghosts.append(admission.GhostFacts(gh.name, name, gh.gpu, gh.mib,
                                                   gh.observed_mib))
        runs = [admission.RunFacts(run.worker.name if run.worker else f"{job_id}/run",
                                   run.rt.spec.name, run.gpu, run.observed_mib)
                for job_id, (run, _task) in self.calibrations.items()]
        queue: tuple[sched.QueuedJob, ...] = ()
        counts: Mapping[tuple[str, str], int] | None = {}
        if with_queue:
            queue = self.queue.scheduler_view()
            counts = self.queue.counts
            if extra:
                queue = queue + extra
                counts = counts + Counter((q.kind, q.backend) for q in extra)
        return admission.decide_inputs(
            self._devices(), backends, workers, queue, ghosts=ghosts, runs=runs,
            queued_counts=counts, reserve_mib=self.config.reserve_mib, foreign=self.foreign,
            draining=self.draining)

    def _step(self) -> None:
        self._step_scheduled = False
        if self._stopping:
            return
        if self._nothing_waits():  # it may have changed since the step was scheduled
            return
        extra: tuple[sched.QueuedJob, ...] = ()
        preloads = [name for name, rt in self.backends.items() if rt.preload]
        if preloads:
            # Last in the queue: a preload takes room nobody waits for, never a job's room.
            now = self.clock()
            extra = tuple(sched.QueuedJob(f"preload-{n}", n, -(10**9), 10**15 + i, now, 0,
                                          kind="preload")
                          for i, n in enumerate(preloads))
        snap, _book = self._inputs(extra)
        plan = make_plan(snap, self.clock(), self.sched_config)
        for ev in plan.evictions:
            rt = self.backends[ev.backend]
            if rt.worker is not None and rt.worker.state != WorkerState.STOPPING:
                self._note("info", f"evicting {ev.backend} from GPU{ev.gpu} "
                           f"(frees {ev.frees_mib} MiB): {ev.reason}", ev.backend)
                self.counters.evicted(ev.backend, "room")
                self._evict_now(rt)
        for job_id, passed in plan.passed.items():
            job = self.jobs.get(job_id)
            if job is not None:
                self.queue.set_passed(job, passed)
        for job_id, since in plan.blocked.items():
            job = self.jobs.get(job_id)
            if job is not None:
                self.queue.set_blocked(job, since)
        for start in plan.starts:
            self._start(start, snap)
        for rt_name in preloads:
            rt = self.backends[rt_name]
            if rt.worker is not None:
                rt.preload = False
            elif self.clock() >= rt.preload_deadline:
                rt.preload = False
                reason = plan.waiting.get(f"preload-{rt_name}", "no room")
                self._note("warning", f"gave up preloading {rt_name} after "
                           f"{PRELOAD_PATIENCE_S:g} s: {reason}", rt_name)
        self._waiting = plan.waiting  # read lazily: only shown jobs need their reason

    def _start(self, start: sched.Start, snap: sched.Snapshot) -> None:
        rt = self.backends[start.backend]
        if start.kind == "calibration":
            job = self.jobs[start.job_id]
            self._remove_queued(job)
            job.waiting = ""
            self._start_calibration(job, start.gpu)
            return
        if start.kind == "preload":
            if rt.worker is None:
                self._spawn_worker(rt, start.gpu)
            return
        job = self.jobs[start.job_id]
        self._remove_queued(job)
        job.gpu = start.gpu
        job.waiting = ""
        gpu = next((g for g in snap.gpus if g.index == start.gpu), None)
        free = ""
        if gpu is not None:
            room = gpu.total_mib - gpu.foreign_mib - sum(
                w.reserved_mib for w in snap.workers.values() if w.gpu == start.gpu)
            free = f" ({max(0, room - gpu.reserve_mib)} MiB free before)"
        spawn = start.spawn or rt.worker is None
        how = "spawning its worker" if spawn else "on its worker"
        admitted = (f"admitted {job.id} ({job.backend}) on GPU{start.gpu}, {how}: takes "
                    f"{start.reserve_mib} MiB{free}")
        if spawn:
            self._note("info", admitted, job.backend, quiet=True)
            self._spawn_worker(rt, start.gpu)
        rt.admitted.append(job.id)
        rt.idle_since = None
        worker = rt.worker
        assert worker is not None
        if worker.hot and worker.data is not None:
            self._dispatch(rt, job)
            # Told once the worker has the request: it works while the engine writes this.
            self._note("info", admitted, job.backend, quiet=True)
        else:
            if not spawn:
                self._note("info", admitted, job.backend, quiet=True)
            job.mark(self.clock(), JobState.STARTING, f"starting {rt.spec.name} on GPU{job.gpu}")
            if self._journaled(job):
                self._journal("record_state", job.id, JobState.STARTING, time.time())
            self._job_event(job)

    def _remove_queued(self, job: Job) -> None:
        self.queue.remove(job)

    def _dispatch(self, rt: BackendRuntime, job: Job) -> None:
        worker = rt.worker
        assert worker is not None
        job.mark(self.clock(), JobState.RUNNING, f"on {worker.name} (pid {worker.pid})")
        if self._journaled(job):
            self._journal("record_start", job.id, time.time(), f"on {worker.name}")
        job.peak_mib = None
        job.peak_samples = 0
        worker.send(job.id, job.payload, stream=job.stream, metadata=job.metadata,
                    deadline=None)
        if job.timeout is not None:  # timeouts.request counts from dispatch
            self._set_timer(job.id, job.timeout, lambda: self._time_out(job.id))
        self._job_event(job)

    # ===================================================================== workers ========
    def _spawn_worker(self, rt: BackendRuntime, gpu: int) -> None:
        spec = rt.spec
        rt.generation += 1
        rt.exclusive = rt.peak is None
        rt.baseline = None if rt.exclusive else rt.info()
        rt.accepting, rt.over_mib, rt.over_noted, rt.kill_reason = True, 0, False, None
        rt.observed_mib = None
        handle = self.make_worker(rt, gpu, f"{spec.name}#{rt.generation}", observer=self)
        rt.worker = handle
        self._note("info", f"starting {spec.name} on GPU{gpu}"
                   + (" (footprint unknown: it runs alone until measured)" if rt.exclusive
                      else ""), spec.name)
        self._spawn_task(self.start_worker(handle))
        self._set_timer(f"start:{handle.name}", spec.timeouts.start_s,
                        lambda: self._start_timed_out(rt, handle))
        self._worker_event(rt)

    async def start_worker(self, handle: Worker) -> None:
        """Start ``handle``'s process, and put its process group on the lifeline."""
        await handle.start()
        if handle.pid is not None:
            if handle.exited:
                return
            self.lifeline.add(handle.pid, handle.backend)

    def make_worker(self, rt: BackendRuntime, gpu: int, name: str,
                    observer: WorkerObserver) -> Worker:
        """A (not yet started) worker process of ``rt`` on ``gpu``, with the handle that
        speaks its protocol: ours (worker sockets) or vramd's (JSON lines on stdin/stdout)."""
        spec = rt.spec
        env = dict(os.environ)
        env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["VRAMTUI_BACKEND"] = spec.name
        if self.probe.simulated:
            env["VRAMTUI_SIM_DIR"] = str(self.paths.sim_dir)
            env["VRAMTUI_SIM_GPU"] = str(gpu)
        else:
            # NVML numbers GPUs in PCI bus order; CUDA's default order is fastest first, so
            # without this the worker could land on another GPU than the one admitted.
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            env.setdefault("CUDA_VISIBLE_DEVICES", str(gpu))
            env.pop("VRAMTUI_SIM_DIR", None)
        if spec.protocol == "vramd":
            return VramdWorkerHandle(
                backend=spec.name, name=name, gpu=gpu, argv=spec.command, env=env,
                cwd=str(spec.cwd) if spec.cwd else None,
                log_path=self.paths.logs_dir / f"{spec.name}.log", observer=observer,
                settings=spec.vramd, unload_frees_vram=spec.unload_frees_vram,
            )
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
            max_result=self.config.max_result_bytes,
        )

    def _start_timed_out(self, rt: BackendRuntime, handle: Worker) -> None:
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
        if handle.state == WorkerState.BUSY:
            self._worker_event(rt)  # nothing for admission: a busy worker takes no new job
            return
        if handle.state == WorkerState.READY:
            self._cancel_timer(f"start:{handle.name}")
            if handle.ready_at is not None and rt.init_failures:
                rt.init_failures = 0
            if handle.ready_at is not None and rt.timed_worker != handle.name:
                rt.timed_worker = handle.name  # its first ready: one load, and its cost
                loaded = max(0.0, handle.ready_at - handle.started_at)
                rt.load_times.append(loaded)
                self.counters.loaded(rt.spec.name, loaded)
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
        if handle.pid is not None:
            self.lifeline.remove(handle.pid)
        if rt is None or rt.worker is not handle:
            return
        self._cancel_timer(f"start:{handle.name}")
        held = self._holds(rt)
        killed_for = rt.kill_reason
        rt.worker = None
        rt.idle_since = None
        rt.observed_mib = None
        rt.accepting, rt.over_mib, rt.over_noted, rt.kill_reason = True, 0, False, None
        if rt.caught_mib is not None:
            self._distrust(rt, rt.caught_mib)
            rt.caught_mib = None
        pids = {handle.pid} if handle.pid is not None else set()
        pids |= handle.known_descendants()
        rt.ghosts.append(Ghost(handle.name, handle.gpu, held, pids,
                               self.clock() + EVICTION_CONFIRM_TIMEOUT_S))
        self._spawn_task(self._confirm_ghosts(rt))
        expected = handle.state == WorkerState.COLD and killed_for is None
        never_ready = handle.ready_at is None
        self.counters.worker_exited(handle, expected=expected, never_ready=never_ready)
        log_hint = f"log: {handle.log_path}"
        if killed_for is not None:
            rt.last_error = killed_for
        elif expected:
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
            elif killed_for is not None:
                self._finish(job, JobState.FAILED, error=f"{killed_for}; {log_hint}")
            elif never_ready and not expected and not rt.failed:
                job.state = JobState.QUEUED  # it never ran: try again with a fresh worker
                job.history.append((self.clock(), "queued", "requeued: worker failed to start"))
                job.gpu = None
                if self._journaled(job):
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

    def _holds(self, rt: BackendRuntime) -> int:
        """What the ledger says ``rt``'s live worker holds now."""
        w = rt.worker
        if w is None:
            return 0
        fact = admission.WorkerFacts(w.name, rt.spec.name, w.gpu, "ready", len(rt.admitted),
                                     rt.exclusive, rt.observed_mib)
        held = admission.holders(self._devices(), {rt.spec.name: rt.info()}, [fact],
                                 reserve_mib=self.config.reserve_mib, foreign=self.foreign)
        return held[0].holds_mib if held else 0

    def request_done(self, handle: WorkerHandle, job_id: str, outcome: Outcome) -> None:
        job = self.jobs.get(job_id)
        rt = self.backends.get(handle.backend)
        if job is None or rt is None:
            return
        with contextlib.suppress(ValueError):
            rt.admitted.remove(job_id)
        rt.jobs_served += 1
        rt.last_used = time.time()
        rt.settling = True  # the last sample saw this job's memory: not held any more
        if not rt.admitted:
            rt.idle_since = self.clock()
        self._learn(rt, job, outcome.ok)
        if job.cancel_requested:
            self._finish(job, job.cancel_state, error=job.error or "cancelled")
        elif outcome.ok:
            job.data = outcome.data
            job.headers = outcome.headers
            job.status_code = outcome.status_code
            self._finish(job, JobState.SUCCEEDED)
        else:
            job.status_code = outcome.status_code
            if outcome.too_large:
                job.chunks = []  # the part of an oversized result that came: not kept
            state = JobState.CANCELLED if outcome.cancelled else JobState.FAILED
            self._finish(job, state, error=outcome.error)
        if not rt.accepting and not rt.admitted and rt.worker is handle:
            self._note("warning", f"evicting {rt.spec.name}: its job is done and it held "
                       f"{rt.over_mib} MiB more than its figures (on_overuse: evict)",
                       rt.spec.name)
            self.counters.evicted(rt.spec.name, "overuse")
            self._evict_now(rt)
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
        if self.events.wants("chunk"):
            self.events.publish(EngineEvent("chunk", time.time(), backend=job.backend,
                                            job_id=job_id, data=chunk))

    def _learn(self, rt: BackendRuntime, job: Job, ok: bool) -> None:
        """The job's observed peak becomes the backend's learned peak when it is larger."""
        peak = job.peak_mib
        if peak is None:
            return
        rt.observed_peaks.append(peak)
        learned = rt.learned
        if learned.peak_mib is None or peak > learned.peak_mib:
            learned = replace(learned, peak_mib=peak)
        measured = ok and job.peak_samples >= MIN_PEAK_SAMPLES
        if measured and not learned.peak_confirmed:
            learned = replace(learned, peak_confirmed=True)
        rt.learned = learned
        if rt.distrusted and measured:
            rt.distrusted = False
            how = "measured alone" if rt.exclusive else "measured again"
            self._note("info", f"{rt.spec.name} {how}: peak {peak} MiB; it shares GPUs "
                       "again, at what it was seen to use", rt.spec.name)
        self._maybe_share(rt)

    def _learn_idle(self, rt: BackendRuntime, mib: int) -> None:
        """An idle, ready worker holds ``mib``: what the backend keeps resident at least."""
        learned = rt.learned
        if learned.resident_mib is not None and mib <= learned.resident_mib:
            return
        rt.learned = replace(learned, resident_mib=mib)
        self._maybe_share(rt)

    def _maybe_share(self, rt: BackendRuntime) -> None:
        """A worker that held its GPU alone (its footprint was unknown) stops doing so once
        production measured it."""
        if rt.exclusive and not rt.distrusted and rt.learned.peak_confirmed:
            rt.exclusive = False
            resident = rt.learned.resident_mib
            self._note("info", f"{rt.spec.name} measured in production: peak "
                       f"{rt.learned.peak_mib} MiB"
                       + (f", resident {resident} MiB" if resident is not None else "")
                       + "; it no longer needs a GPU to itself", rt.spec.name)
            self._schedule()

    def _finish(self, job: Job, state: JobState, error: str | None = None) -> None:
        if job.state.finished:
            return
        if self._journaled(job):  # durable before anyone hears of it
            state, error = self._record_finish(job, state, error)
        if error is not None:
            job.error = error
        job.mark(self.clock(), state, error or "")
        self.counters.job_finished(job)
        self._cancel_timer(job.id)
        self._cancel_timer(f"kill:{job.id}")
        job.payload = b""
        view = job.view()
        self._resolve(job, view)
        self.recent.append(job.id)
        self._recent_bytes[job.id] = len(job.data or b"") + sum(map(len, job.chunks))
        held = sum(self._recent_bytes.values())
        while len(self.recent) > self.config.recent_jobs or (
                len(self.recent) > 1 and held > self.config.max_recent_result_bytes):
            old = self.recent.popleft()
            self.jobs.pop(old, None)
            held -= self._recent_bytes.pop(old, 0)
        if job.kind == "job":
            self._note_end(job, state)
        self._job_event(job)  # events carry no result: whoever wants it asks (wait, job)

    def _note_end(self, job: Job, state: JobState) -> None:
        """The end of a job in the event log: the queue's story, told from admission to end."""
        took = ""
        if job.started_at is not None and job.finished_at is not None:
            took = f" after {job.finished_at - job.started_at:.1f} s"
        if state is JobState.SUCCEEDED:
            self._note("info", f"{job.id} ({job.backend}) succeeded{took}", job.backend,
                       quiet=True)
        elif state is JobState.FAILED:
            self._note("warning", f"{job.id} ({job.backend}) failed{took}: {job.error}",
                       job.backend, quiet=True)
        else:
            self._note("info", f"{job.id} ({job.backend}) {state.value.replace('_', ' ')}"
                       f"{took}: {job.error}", job.backend, quiet=True)

    def _record_finish(self, job: Job, state: JobState,
                       error: str | None) -> tuple[JobState, str | None]:
        """Journal the finish; what was stored (a result the journal cannot hold fails the
        job, with the reason, and that failure is what is stored and reported)."""
        if self.journal is None:
            return state, error
        error = error if error is not None else job.error
        try:
            stored, why = self.journal.finish_durably(
                job.id, state, time.time(), note=error or "", data=job.data,
                headers=job.headers, status_code=job.status_code, error=error,
                chunks=job.chunks)
        except Exception as exc:  # noqa: BLE001 - not even a failure could be stored
            stored, why = JobState.FAILED, (
                f"the journal could not record how this job ended ({exc}); it still holds it "
                "as unfinished, so it runs again when the engine restarts")
        if stored is not state or why != error:
            self._note("error", f"job {job.id} ({job.backend}) failed: {why}", job.backend)
            job.data, job.chunks, job.headers, job.status_code = None, [], {}, None
        if self.journal.reserve_spent and not self._disk_full_noted:
            self._disk_full_noted = True
            self._note("error", f"journal: the disk under {self.journal.path.parent} is full; "
                       "its reserve was spent to record the jobs already accepted, and new "
                       "jobs are refused until there is room again")
        elif not self.journal.reserve_spent:
            self._disk_full_noted = False
        return stored, why

    def _stopped_during(self, job: Job) -> None:
        """The engine stops under a job: journaled jobs stay to run again, others fail."""
        if self._journaled(job):
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
            if reading.used_mib is not None and \
                    sample.t - self._history_at.get(reading.index, -1e9) >= HISTORY_STEP_S:
                self._history_at[reading.index] = sample.t
                self.history.append(reading.index, sample.t, reading.used_mib)
        if sample.processes is not None:
            self.gpu_processes = sample.processes
            self._observe(sample)
        for run, _task in self.calibrations.values():
            run.on_sample(sample)
        if self.events.wants("sample"):
            self.events.publish(EngineEvent("sample", time.time()))
        self._schedule()

    def _observe(self, sample: Sample) -> None:
        """What every worker's processes hold now: learning, foreign memory, models that lie."""
        assert sample.processes is not None
        per_gpu: dict[int, dict[int, int]] = {}
        for p in sample.processes:
            mine = per_gpu.setdefault(p.gpu_index, {})
            mine[p.pid] = mine.get(p.pid, 0) + (p.used_mib or 0)
        self.proc_mib = {p.pid: p.used_mib or 0 for p in sample.processes}
        on_gpu = set(self.proc_mib)
        ours: dict[int, set[int]] = {}
        owners: dict[int, str] = {}  # the one attribution of a GPU process to a backend
        for rt in self.backends.values():
            worker = rt.worker
            if worker is not None and not worker.exited:
                pids = worker.pids(on_gpu)
                ours.setdefault(worker.gpu, set()).update(pids)
                owners.update(dict.fromkeys(pids & on_gpu, rt.spec.name))
                mine = per_gpu.get(worker.gpu, {})
                mib = sum(mine.get(pid, 0) for pid in pids)
                seen = bool(pids & set(mine))
                rt.observed_mib = mib if seen or worker.hot else None
                rt.settling = False
                self.backend_history.append(rt.spec.name, sample.t, mib)
                if seen and rt.observed_mib is not None:
                    if not rt.admitted and worker.state == WorkerState.READY:
                        self._learn_idle(rt, mib)
                    if len(rt.admitted) == 1:
                        job = self.jobs.get(rt.admitted[0])
                        if job is not None and job.state is JobState.RUNNING:
                            job.peak_mib = max(job.peak_mib or 0, mib)
                            job.peak_samples += 1
            for gh in list(rt.ghosts):
                mine = per_gpu.get(gh.gpu, {})
                if not (gh.pids & on_gpu):
                    rt.ghosts.remove(gh)
                    continue
                gh.observed_mib = sum(mine.get(pid, 0) for pid in gh.pids)
                ours.setdefault(gh.gpu, set()).update(gh.pids)
                owners.update(dict.fromkeys(gh.pids & on_gpu, rt.spec.name))
        for run, _task in self.calibrations.values():
            pids = run.pids(on_gpu)
            ours.setdefault(run.gpu, set()).update(pids)
            owners.update(dict.fromkeys(pids & on_gpu, run.rt.spec.name))
            run.observed_mib = sum(per_gpu.get(run.gpu, {}).get(pid, 0) for pid in pids)
        self.gpu_owners = owners
        for index, reading in self.readings.items():
            self.foreign[index] = foreign_mib(reading.used_mib, per_gpu.get(index, {}),
                                              ours.get(index, ()))
        self._check_overuse()

    def _check_overuse(self) -> None:
        """Workers above the figures they were admitted with: the reservation follows what
        they hold (the ledger does that, and learning sizes the next admissions), they are
        reported, and their backend's ``on_overuse`` applies; one over-committing its GPU is
        killed at once, whatever the policy."""
        liars: dict[str, int] = {}
        for rt in self.backends.values():
            w = rt.worker
            over = self._over_declared(rt)
            rt.over_mib = over
            if over <= 0 or w is None or w.state == WorkerState.STOPPING:
                continue
            liars[w.name] = over
            policy = rt.spec.on_overuse
            if not rt.over_noted:
                rt.over_noted = True
                figure = rt.observed_mib - over if rt.observed_mib is not None else 0
                self._note("warning", f"{rt.spec.name} holds {rt.observed_mib} MiB on "
                           f"GPU{w.gpu}, {over} MiB above what it was admitted with ({figure} "
                           f"MiB for {len(rt.admitted)} job(s)): admission now counts what it "
                           f"holds; on_overuse: {policy}", rt.spec.name)
                self.events.publish(EngineEvent("overuse", time.time(), backend=rt.spec.name,
                                                message=f"{over} MiB over its figures"))
            tolerance = max(MIN_OVERUSE_TOLERANCE_MIB, rt.spec.safety_mib)
            if over <= tolerance or policy == "warn":
                continue
            rt.caught_mib = max(rt.caught_mib or 0, rt.observed_mib or 0)
            if policy == "kill":
                self._kill_liar(rt, f"killed: it held {rt.observed_mib} MiB, {over} MiB "
                                "above what it was admitted with (on_overuse: kill)")
            elif rt.accepting:
                rt.accepting = False
                if rt.admitted:
                    self._note("warning", f"{rt.spec.name} takes no new job and is evicted "
                               "once its job ends (on_overuse: evict)", rt.spec.name)
                else:
                    self._note("warning", f"evicting {rt.spec.name}: idle and {over} MiB "
                               "above what it was admitted with (on_overuse: evict)",
                               rt.spec.name)
                    self.counters.evicted(rt.spec.name, "overuse")
                    self._evict_now(rt)
        book = self.book()
        for gpu in book.gpus.values():
            excess = gpu.overcommit_mib
            if excess <= 0:
                continue
            culprits = sorted((h for h in gpu.holders if h.name in liars),
                              key=lambda h: -liars[h.name])
            for h in culprits:
                rt = self.backends.get(h.backend)
                if rt is None or rt.worker is None or rt.worker.name != h.name:
                    continue
                self._kill_liar(rt, f"killed: it held {h.observed_mib} MiB, {liars[h.name]} "
                                f"MiB above what it was admitted with, and GPU{gpu.index} was "
                                f"over-committed by {excess} MiB", distrust=True)
                excess -= liars[h.name]
                if excess <= 0:
                    break

    def _over_declared(self, rt: BackendRuntime) -> int:
        """How far ``rt``'s live worker was last seen above the figures it was admitted with
        (0 for a worker that holds its GPU whole, or was not seen yet)."""
        w, baseline, observed = rt.worker, rt.baseline, rt.observed_mib
        if w is None or w.exited or baseline is None or observed is None or rt.exclusive:
            return 0
        return max(0, observed - baseline.holds_mib(len(rt.admitted)))

    @staticmethod
    def _distrust(rt: BackendRuntime, seen_mib: int) -> None:
        """``rt`` was caught above its figures, holding up to ``seen_mib``: its descriptor is
        only a floor now, and unless a confirmed measurement covers what it was seen to hold,
        it runs alone until one of its jobs is measured again (a peak reached with two jobs
        running, or between two samples, was never measured), so an over-commit never
        recurs."""
        rt.distrusted = True
        learned = rt.learned
        if not (learned.peak_confirmed and (learned.peak_mib or 0) >= seen_mib):
            rt.learned = replace(learned, peak_confirmed=False)

    def _kill_liar(self, rt: BackendRuntime, reason: str, *, distrust: bool = False) -> None:
        w = rt.worker
        if w is None or w.exited or rt.kill_reason is not None:
            return
        if distrust:
            self._distrust(rt, rt.observed_mib or 0)
        if rt.observed_mib is not None:
            key = "peak_mib" if rt.admitted else "resident_mib"
            old = getattr(rt.learned, key)
            if old is None or rt.observed_mib > old:
                rt.learned = replace(rt.learned, **{key: rt.observed_mib})
        rt.kill_reason = f"{rt.spec.name} {reason}"
        self._note("error", rt.kill_reason, rt.spec.name)
        w.kill()

    async def _confirm_ghosts(self, rt: BackendRuntime) -> None:
        """Look at the GPU's process list right after an exit, not at the next sample."""
        assert self.loop is not None
        try:
            procs = await self.loop.run_in_executor(None, self.probe.processes)
        except Exception:  # noqa: BLE001 - the periodic samples will confirm it instead
            return
        on_gpu = {p.pid for p in procs}
        before = len(rt.ghosts)
        rt.ghosts = [gh for gh in rt.ghosts if gh.pids & on_gpu]
        if len(rt.ghosts) != before:
            self._schedule()

    def _expire_ghosts(self) -> None:
        now = self.clock()
        for rt in self.backends.values():
            for gh in list(rt.ghosts):
                if now >= gh.deadline:
                    if gh.pids & set(self.proc_mib):
                        self._note("warning", f"{rt.spec.name}: processes {sorted(gh.pids)} "
                                   "still hold GPU memory after exiting; counting it as "
                                   "foreign", rt.spec.name)
                    rt.ghosts.remove(gh)

    def _check_liveness(self, now: float) -> None:
        """Ping every ready or busy worker; kill one whose last ping went unanswered too long."""
        for rt in self.backends.values():
            w = rt.worker
            if w is None or w.exited or not w.hot or rt.kill_reason is not None:
                continue
            overdue = w.ping_overdue(now)
            limit = rt.spec.timeouts.ping_s
            if overdue >= limit:
                rt.kill_reason = (f"{rt.spec.name} hung: its worker (pid {w.pid}) answered no "
                                  f"ping for {overdue:.1f} s (timeouts.ping {limit:g} s); "
                                  "killed it, the backend restarts on its next job")
                self._note("error", rt.kill_reason, rt.spec.name)
                w.kill()
            else:
                w.ping()

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
                self.counters.evicted(rt.spec.name, "idle")
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

