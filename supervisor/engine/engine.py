"""The engine: its parts, wired, on one asyncio loop that owns every piece of state.

The Engine builds its parts (the job table, the journal, the worker pool, the monitor, the
watch, the planner, the calibration runs, the notes, the loop: each owns its state; see
docs/ARCHITECTURE.md) and keeps how a job travels: :meth:`Engine.submit` checks, journals and
queues it; each event asks for a step (:meth:`Engine._step`) that plans, evicts and starts; a
job goes to a hot worker (:meth:`Engine._dispatch`) or waits ``starting`` for the worker
spawned for it; the worker's events come back through the ``WorkerObserver`` methods, and
:meth:`Engine._finish` journals the end and wakes the waiters.  It receives its GPU reader,
its worker factory and its clock (tests give it fakes: ``tests/fake_worker.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from supervisor.clock import monotonic

from .. import validate
from ..backends.schema import BackendSpec
from ..calibration.runner import Calibrations
from ..clock import WallClock
from ..counters import Counters
from ..errors import (
    BackendFailed,
    CannotStart,
    EngineStopped,
    NothingToDo,
    QueueFull,
    Refused,
    UnknownJob,
    VramtuiError,
)
from ..events import EventHub
from ..gpu.model import GpuReading, Probe
from ..gpu.sampler import Sample
from ..jobs import Job, JobState, JobView, advance_seq
from ..jobs.table import JobTable
from ..journal import Journal
from ..ledger import Book
from ..paths import Paths
from ..results import CancelResult, JobRequest, ReloadResult, YieldInfo
from ..scheduler import model as sched
from ..snapshot import EngineSnapshot
from ..textsafe import visible
from ..workers.base import Worker
from ..workers.factory import ProcessWorkers, WorkerFactory
from ..workers.handle import CANCELLED_STATUS, Outcome
from ..workers.states import WorkerState
from . import reload, stopping
from .config import EngineConfig
from .durable import JobJournal
from .loop import EngineLoop
from .monitor import Monitor
from .notes import Notes
from .others import Others
from .planner import Planner
from .pool import WorkerPool
from .rules import Rules
from .runtime import MAX_INIT_FAILURES, BackendRuntime, Ghost
from .sleeper import Sleeper
from .timings import Timings
from .views import Parts, build_snapshot
from .watch import WorkerWatch
from .yielding import Yields, announce

log = logging.getLogger(__name__)
EVICTION_CONFIRM_TIMEOUT_S = 5.0
PRELOAD_PATIENCE_S = 30.0
STEP_NOW_MAX_QUEUE = 8  # step_now decides at once only while the queue is this short


class Engine:
    """Everything the engine knows and does; run ``main()`` on its own event loop."""

    def __init__(
        self,
        *,
        probe: Probe,
        probe_notice: str | None,
        backends: Mapping[str, BackendSpec],
        descriptor_errors: tuple[str, ...],
        paths: Paths,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = monotonic,
        descriptor_warnings: tuple[tuple[str | None, str], ...] = (),
        layers: Sequence[Path] | None = None, environ: Mapping[str, str] | None = None,
        workers: WorkerFactory | None = None,
    ) -> None:
        self.config = config = config or EngineConfig()
        self.paths = paths
        self.descriptors = reload.Descriptors.of(layers, environ, descriptor_errors,
                                                 descriptor_warnings)
        self.wall = WallClock(clock)
        self.notes = Notes(self.wall.now)
        self.run = EngineLoop(self._step, self._nothing_waits, clock)
        self._next_ping = 0.0  # when the ticker next checks that workers answer (monotonic)
        self.jobs = JobTable(self.wall, recent_jobs=config.recent_jobs,
                             max_recent_bytes=config.max_recent_result_bytes)
        self.journal = JobJournal(None, self.wall, self.notes.note)
        self.monitor = Monitor(probe, config.sample_hz, probe_notice)
        self.pool = WorkerPool(backends, workers or ProcessWorkers(
            paths, simulated="simulated" in self.monitor.kinds(),
            host_gpus=self.monitor.host_gpus(), max_result=config.max_result_bytes,
            follower=self.monitor, gpu_total_mib=lambda gpu: self.monitor.total_mib(gpu),
            budget_mib=lambda name: self.pool.runtime(name).peak), self.run, clock)
        self.planner = Planner(config, clock, self.jobs.get)
        self.yields = Yields(paths.yields_path if config.journal else None,
                             device=self.monitor.identity)
        self.timings = Timings(paths.timings_path if config.journal else None)
        self.rules = Rules(config.yield_when, self.notes.note, own=self.monitor.own,
                           arrive_s=config.others_arrive_s, leave_s=config.others_leave_s,
                           clock=clock)
        self.others = Others(self.notes.note, config, lambda gpus: [self.cancel(
            j, note="cancelled: others need its GPU") for j in self.pool.admitted_on(gpus)])
        self.watch = WorkerWatch(self.pool, self.jobs, self.monitor, self.notes, self.run,
                                 self.book, clock)
        self.sleeper = Sleeper(self.pool, self.jobs, self.monitor, self.notes, self.run, clock,
                               self._requeue, config.sleep_host_budget_mib)
        self.calibrations = Calibrations(self.pool, self.monitor, paths, self.request_progress)

    # -- what the doors read ------------------------------------------------------------------
    @property
    def clock(self) -> Callable[[], float]:
        return self.wall.clock

    @property
    def probe(self) -> Probe:
        return self.monitor.probe

    @property
    def readings(self) -> Mapping[int, GpuReading]:
        return self.monitor.readings

    @property
    def backends(self) -> Mapping[str, BackendRuntime]:
        return self.pool.mapping()

    @property
    def events(self) -> EventHub:
        return self.notes.events

    @property
    def stopping(self) -> bool:
        return self.run.stopping

    @property
    def counters(self) -> Counters:
        return self.notes.counters

    @property
    def wall_started(self) -> float:
        """When the engine was made, wall clock."""
        return self.wall.wall(self.run.started_at)

    def spec(self, backend: str) -> BackendSpec:
        return self.pool.runtime(backend).spec

    # ===================================================================== lifecycle ======
    async def main(self, started: Callable[[BaseException | None], None]) -> None:
        loop = self.run.attach()
        try:
            if self.config.journal:
                self.journal.use(Journal.open(self.paths.journal_path,
                                              keep_finished=self.config.keep_finished,
                                              keep_age_s=self.config.keep_age_s))
            leftovers = await self.pool.factory.start()
            try:
                self.monitor.start(self._sample_from_thread)
            except BaseException:
                await self.pool.factory.close()
                raise
        except BaseException as exc:
            started(exc)
            self.journal.close()
            return
        self.notes.warn_each(leftovers)
        self._recover()
        self.notes.warn_each(self.timings.restore(self.pool.runtimes(), self.planner.expect))
        self.notes.warn_each(self.yields.load())
        self.rules.restore(self.yields.waived)
        for rt in self.pool.runtimes():
            if rt.spec.preload:
                self._request_preload(rt)
        self.notes.started(self.monitor.summary(), self.notice(), self.descriptors.errors,
                           self.descriptors.warnings)
        started(None)
        tasks = (loop.create_task(self.run.every(
            min(self.config.tick_s, self.config.ping_interval_s), self._tick)),
            loop.create_task(self.rules.watch_commands()))
        await self.run.stopped()
        for task in tasks:
            task.cancel()
        await self._shutdown()

    def request_stop(self, now: bool = False) -> tuple[str, ...]:
        return stopping.request(self.pool, self.run.request_stop, now)  # see .stopping

    async def _shutdown(self) -> None:
        now = self.clock()
        for job in self.jobs.queue.clear():
            if self.journal.durable(job):
                # Still queued in the journal: it runs when the engine starts again.
                self.jobs.abandoned(job, "the engine stopped before the job ran; it stays "
                                    "queued and runs when the engine starts again")
            else:
                # Whoever waits hears that the engine stopped (Dynamo's caller retries
                # elsewhere), and the job ends: nothing keeps it.
                self.jobs.abandoned(job, "the engine stopped before the job ran")
                self._finish(job, JobState.CANCELLED,
                             error="the engine stopped before the job ran")
        self.notes.note("info", stopping.stop_line(self.pool, self.calibrations.backends()))
        await self.pool.stop_all()
        for job in self.jobs.live():
            self._stopped_during(job)
        self.timings.save(self.pool.runtimes(), self.planner.expect, monotonic(), force=True)
        self.monitor.stop()
        await self.pool.factory.close()
        self.journal.close()
        self.notes.note("info", f"engine stopped after {self.clock() - now:.1f} s of shutdown")
        self.notes.close()

    def kill_all_workers(self) -> None:
        """Last resort, from any thread, when the engine is stuck or gone: SIGKILL every
        worker it started (no worker may outlive it)."""
        self.pool.kill_all()
        self.calibrations.kill_all()

    def _tick(self) -> None:
        self.watch.expire_ghosts()
        self.watch.expire_keep_alive()
        for y in self.yields.expire():
            self.notes.note("info", f"GPU{y.gpu} resumed: its yield ({y.by}) is over")
        # (every stranger, not the few largest that are named: a program a rule follows may
        # hold less than the rest of a desktop)
        self.rules.follow(self.others.everyone() if self.rules.by_name else {},
                          self.monitor.readings, self.yields.held, self.yield_gpus,
                          lambda gpus: self.resume_gpus(gpus, rule=True))
        self.yields.keep_waivers(self.rules.waivers())
        now = monotonic()
        self.timings.save(self.pool.runtimes(), self.planner.expect, now)
        if now >= self._next_ping:
            self._next_ping = now + self.config.ping_interval_s
            self.watch.check_liveness(now)
        self.run.schedule()

    def _recover(self) -> None:
        """Requeue what the journal held when the engine last stopped, ids and order kept."""
        recovered = self.journal.recover()
        advance_seq(recovered.max_seq)
        self.jobs.restore(self.journal.recent(self.jobs.recent_jobs, self.jobs.max_recent_bytes))
        for rec in recovered.failed:
            self.notes.note("error", f"job {rec.id} ({rec.backend}) was interrupted twice by "
                            "an engine stop; it was not run a third time", rec.backend)
        for job in recovered.jobs:
            self.jobs.add(job)
            if job.backend not in self.pool:
                self.jobs.dequeue(job)
                self._finish(job, JobState.FAILED,
                             error=f"backend {job.backend!r} is no longer configured")
        if recovered.jobs:
            n = recovered.interrupted
            self.notes.note("info", f"recovered {len(recovered.jobs)} job(s) from the journal"
                            + (f", {n} of them interrupted while running and requeued"
                               if n else ""))
        self.run.schedule()

    # ===================================================================== jobs ===========
    def _job_event(self, job: Job) -> None:
        if self.notes.wants("job"):
            self.notes.job(self.jobs.view(job, light=True), job.backend, job.state.value)

    def submit(self, backend: str, payload: bytes, *, priority: int | None = None,
               timeout: float | None = None, metadata: dict[str, Any] | None = None,
               stream: bool = False, durable: bool = True) -> Job:
        """Queue a job. ``durable`` ones are journaled before they are accepted and come back
        after a crash; others (a request whose client goes with the engine) are not."""
        counters = self.notes.counters
        if self.stopping:
            counters.refused("stopping")
            raise EngineStopped("the engine is stopping and takes no new jobs")
        args = validate.check_submit(backend, payload, priority=priority, timeout=timeout,
                                     metadata=metadata, stream=stream,
                                     max_payload=self.config.max_payload_bytes)
        rt = self.pool.runtime(args.backend)
        if rt.health.failed:
            counters.refused("backend_failed")
            raise BackendFailed(
                f"backend {args.backend!r} failed to initialise {MAX_INIT_FAILURES} times in "
                f"a row ({rt.health.last_error}); fix it, then respawn it (vramtui respawn "
                f"{args.backend})")
        queue = self.jobs.queue
        reason = self.planner.refusal(rt, self.monitor.readings)
        if reason is None and len(queue) >= self.config.max_queue_depth:
            reason = (f"queue full: {len(queue)} jobs waiting; try again later or raise "
                      "max_queue_depth")
        if reason is not None:
            counters.refused_because(reason)
            self.notes.note("warning", f"refused a job for {args.backend}: {reason}",
                            args.backend)
            raise QueueFull(reason) if reason.startswith("queue full") else Refused(reason)
        validate.check_queue_room(queue.payload_bytes, len(args.payload),
                                  self.config.max_queued_bytes)
        spec = rt.spec
        job = Job(backend=args.backend, payload=args.payload,
                  priority=spec.priority if args.priority is None else args.priority,
                  timeout=args.timeout if args.timeout is not None else spec.timeouts.request_s,
                  metadata=args.metadata, stream=args.stream or spec.stream, durable=durable)
        job.begin(self.clock())
        if self.journal.durable(job):  # durable before the submitter hears "accepted"
            self.journal.submitted(job)
        self.jobs.add(job, keep_request=True)
        self.planner.arrived(job)
        self._job_event(job)
        self.run.schedule()
        return job

    def calibrate(self, backend: str, *, repeats: int = 3, request: bytes | None = None,
                  settle_s: float = 1.0, priority: int | None = None) -> Job:
        """Queue a calibration run of ``backend``: a job that needs a GPU to itself."""
        if self.stopping:
            raise EngineStopped("the engine is stopping and takes no new jobs")
        rt = self.pool.runtime(backend)
        repeats, settle_s, request, priority = validate.check_calibrate(
            repeats, settle_s, request, priority, self.config.max_payload_bytes)
        payload = request if request is not None else (rt.spec.calibration_request or b"")
        job = Job(backend=backend, payload=payload,
                  priority=rt.spec.priority if priority is None else priority,
                  metadata={"repeats": repeats, "settle_s": settle_s}, kind="calibration")
        reason = self.planner.refusal(rt, self.monitor.readings, kind="calibration")
        if reason is not None:
            raise Refused(reason)
        job.begin(self.clock(), f"calibration x{repeats}")
        self.jobs.add(job)
        self.notes.note("info", f"calibration of {backend} queued (x{repeats})", backend)
        self._job_event(job)
        self.run.schedule()
        return job

    def job_view(self, job_id: str) -> JobView:
        """A job now, in memory or (finished before a restart, or long ago) in the journal."""
        job = self.jobs.get(job_id)
        if job is None:
            job = self.journal.finished(job_id)
            if job is None:
                raise UnknownJob(job_id)
        return self.jobs.view(job)

    def cancel(self, job_id: str, state: JobState = JobState.CANCELLED,
               note: str = "cancelled") -> JobView:
        job = self.jobs.require(job_id)
        if job.state.finished:
            return self.jobs.view(job)
        if job.state is JobState.QUEUED:
            self.jobs.dequeue(job)
            self._finish(job, state, error=note)
        elif job.state is JobState.STARTING:
            rt = self.pool.runtime(job.backend)
            if job.id in rt.admitted:
                rt.admitted.remove(job.id)
            self._finish(job, state, error=note)
        elif job.id in self.calibrations:
            job.cancel_state, job.error = state, note
            self.calibrations.cancel(job.id)
        else:  # running on a worker
            job.cancel_requested = True
            job.cancel_state, job.error = state, note
            worker = self.pool.runtime(job.backend).worker
            asked = worker.cancel(job.id) if worker is not None else False
            grace = self.config.cancel_grace_s if asked else min(self.config.cancel_grace_s, 1.0)
            job.progress_text = "cancelling"
            self._job_event(job)
            self.run.set_timer(f"kill:{job.id}", grace, lambda: self._kill_for(job.id))
        self.run.schedule()
        return self.jobs.view(job)

    def cancel_many(self, job_ids: Sequence[str]) -> tuple[CancelResult, ...]:
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

    def _kill_for(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state.finished:
            return
        worker = self.pool.runtime(job.backend).worker
        if worker is not None:
            self.notes.note("warning", f"{job.backend}: job {job_id} did not stop within the "
                            "grace; killing its worker", job.backend)
            worker.kill()

    def _time_out(self, job_id: str) -> None:
        job = self.jobs.get(job_id)
        if job is not None and not job.state.finished:
            self.cancel(job_id, JobState.TIMED_OUT, f"timed out after {job.timeout:g} s")

    def retry(self, job_id: str) -> Job:
        """Run a finished job's request again, as a new job (its id is new)."""
        view = self.job_view(job_id)
        if not view.finished:
            raise Refused(f"job {job_id} is {view.state.value}: only a finished job can be "
                          "retried")
        if view.kind != "job":
            raise Refused(f"job {job_id} is a calibration: run `vramtui calibrate "
                          f"{view.backend}` again")
        kept = self.jobs.kept.get(job_id)
        if kept is None:
            raise Refused(f"the request of job {job_id} is no longer kept (the engine keeps "
                          f"the last {self.jobs.kept.max_items} requests, at most "
                          f"{self.jobs.kept.max_bytes >> 20} MiB, since it started); "
                          "submit it again")
        job = self.submit(kept.backend, kept.payload, priority=view.priority,
                          timeout=kept.timeout, metadata=kept.metadata, stream=kept.stream)
        self.notes.note("info", f"retrying {job_id} as {job.id} on {kept.backend} (asked)",
                        kept.backend)
        return job

    def job_request(self, job_id: str, limit: int) -> JobRequest:
        """The first ``limit`` bytes of the job's request, while it is kept."""
        request = self.jobs.request(job_id, limit)
        if request is None:
            self.job_view(job_id)  # UnknownJob when there is no such job at all
            return JobRequest(job_id, 0, b"", kept=False)
        return request

    def set_priority(self, job_id: str, priority: int) -> JobView:
        """Give a queued job another priority (it keeps its place among equals)."""
        job = self.jobs.require(job_id)
        if job.state is not JobState.QUEUED:
            raise Refused(f"job {job_id} is {job.state.value}: only a queued job's priority "
                          "can change")
        old = job.priority
        if old != priority:
            self.jobs.dequeue(job)
            job.priority = priority
            self.jobs.enqueue(job)
            note = f"priority {old} → {priority}"
            job.note(self.clock(), note)
            if self.journal.durable(job):
                self.journal.write("record_priority", job.id, priority, self.journal.when(job),
                                   note)
            self.notes.note("info", f"{job_id} ({job.backend}): {note} (asked)", job.backend)
            self._job_event(job)
            self.run.schedule()
        return self.jobs.view(job, self.jobs.position(job))

    # ===================================================================== backends =======
    def evict(self, backend: str) -> None:
        rt = self.pool.runtime(backend)
        if rt.worker is None:
            return
        if rt.admitted:
            raise Refused(f"{backend} is busy with job {rt.admitted[0]}; cancel it or wait, "
                          "then evict")
        self.notes.note("info", f"evicting {backend} (asked)", backend)
        self.notes.counters.evicted(backend, "asked")
        self.pool.evict_now(rt)

    def evict_when_idle(self, backend: str) -> None:
        """Evict ``backend`` now if idle, else once the jobs it runs have ended (Ollama's
        ``keep_alive: 0`` on a busy model): its keep-alive is 0 for this worker."""
        rt = self.pool.runtime(backend)
        if rt.worker is None:
            return
        if not rt.admitted:
            self.evict(backend)
            return
        rt.usage.unload_after = rt.worker
        self.notes.note("info", f"{backend} unloads once its jobs have ended (asked)", backend)

    def zero(self) -> list[str]:
        evicted = []
        for name, rt in self.pool.items():
            if rt.worker is not None and not rt.admitted and \
                    rt.worker.state != WorkerState.STOPPING:
                evicted.append(name)
                self.evict(name)
        return evicted

    def respawn(self, backend: str) -> None:
        rt = self.pool.runtime(backend)
        if self._respawning(rt):
            raise NothingToDo(f"{backend} is already being respawned (its new worker is not "
                              "ready yet): nothing more done")
        if rt.admitted:
            raise Refused(f"{backend} is busy with job {rt.admitted[0]}; cancel it or wait, "
                          "then respawn")
        health = rt.health
        health.failed, health.init_failures, health.last_error = False, 0, None
        health.no_sleep = None
        self.notes.note("info", f"respawning {backend}", backend)
        rt.respawn_of = rt.generation

        async def restart() -> None:
            if rt.worker is not None:
                await self.pool.stop(rt, grace=rt.spec.timeouts.stop_grace_s)
            self._request_preload(rt)

        self.run.spawn(restart())

    def _respawning(self, rt: BackendRuntime) -> bool:
        """A respawn asked before is still under way: its old worker stopping, its preload
        waiting, or its new worker starting.  (Asked again then, it would stop the worker it
        had just started: two restarts for one.)"""
        if rt.respawn_of is None:  # (cleared once its worker is ready, exits, or its preload
            return False  # gives up: another start later is no respawn's)
        w = rt.worker
        if rt.generation == rt.respawn_of:  # no new worker yet
            return w is not None or rt.preload_until is not None
        return w is not None and w.state in (WorkerState.STARTING, WorkerState.INITIALIZING)

    def preload(self, backend: str) -> None:
        rt = self.pool.runtime(backend)
        if rt.health.failed:
            raise BackendFailed(f"backend {backend!r} has failed; respawn it first")
        if rt.worker is None and (reason := self.planner.refusal(rt, self.monitor.readings)):
            # (as a job of it is refused: loaded, it could never run one)
            raise Refused(f"not preloaded: {reason}")
        if rt.worker is None or rt.worker.state == WorkerState.ASLEEP:  # (asleep: it wakes)
            self._request_preload(rt)

    def sleep(self, backend: str) -> None:
        """Put a backend's idle worker to sleep now (:class:`.sleeper.Sleeper`)."""
        self.sleeper.sleep_asked(backend)

    def wake(self, backend: str) -> None:
        """Wake a backend's sleeping worker once what waking adds fits (as a preload)."""
        self.sleeper.wake_asked(backend, self._request_preload)

    def _request_preload(self, rt: BackendRuntime) -> None:
        rt.preload_until = self.clock() + PRELOAD_PATIENCE_S
        self.run.schedule()

    def kill(self, backend: str) -> None:
        """SIGKILL a (stuck) worker's process group now; its jobs fail, saying so."""
        rt = self.pool.runtime(backend)
        worker = rt.worker
        if worker is None or worker.pid is None or worker.exited:
            raise Refused(f"{backend} has no worker process to kill")
        jobs = [job for j in rt.admitted if (job := self.jobs.get(j)) is not None]
        for job in jobs:
            if not job.state.finished:
                job.cancel_requested = True
                job.cancel_state = JobState.FAILED
                job.error = f"its worker was killed on request (vramtui kill {backend})"
        self.notes.note("warning", f"killing {backend}'s worker (pid {worker.command_pid}, asked)"
                        + (f"; {len(jobs)} job(s) on it fail" if jobs else ""), backend)
        worker.kill()

    def drain(self, gpu: int, on: bool = True) -> None:
        """Drain ``gpu`` (finish what runs there, admit nothing new, evict its idle workers),
        or stop draining it."""
        said = self.planner.drain(gpu, on, self.monitor.readings)
        if said:
            self.notes.note("info", said)
        self.run.schedule()

    def yield_gpus(self, gpus: Sequence[int], *, for_s: float | None = None, now: bool = False,
                   by: str = "", rule: bool = False) -> tuple[YieldInfo, ...]:
        """Hand ``gpus`` over (:mod:`.yielding`); ``now`` cancels the jobs running there."""
        given = self.yields.give(gpus, self.monitor.readings, for_s=for_s, now=now, by=by,
                                 rule=rule)
        for y in given:
            self.notes.note("warning", announce(y, now))
        for job_id in self.pool.admitted_on({y.gpu for y in given}) if now else ():
            self.cancel(job_id, note="cancelled: its GPU was yielded now")
        self.run.schedule()
        return given

    def resume_gpus(self, gpus: Sequence[int], *, rule: bool = False) -> tuple[int, ...]:
        """Open yielded ``gpus`` again (none: all of them). A person's resume (not ``rule``)
        overrides the rules that want them now: they do not yield them again while what they
        saw goes on (:meth:`.rules.Rules.waive`)."""
        was = dict(self.yields.held)
        back = self.yields.take_back(gpus, self.monitor.readings)
        for g in back:
            y = was[g]
            waived = [] if rule else self.rules.waive(g, y.by if y.rule else None)
            self.notes.note("info", f"GPU{g} resumed: jobs run there again" + (
                f"; its rule ({', '.join(waived)}) yields it again only once that has ended "
                "and begun anew" if waived else ""))
        self.yields.keep_waivers(self.rules.waivers())
        self.run.schedule()
        return back

    def apply_descriptors(self, loaded: Any) -> ReloadResult:
        """Apply freshly loaded descriptors (see :mod:`.reload`)."""
        result = reload.apply(self.pool, self.jobs.queue, self.descriptors, loaded,
                              self.notes.note, self.pool.evict_now, self._forget_times,
                              self._retire_times)
        for name in result.added:
            self.timings.adopt(self.pool.runtime(name), self.planner.expect)
        self.notes.counters.forget(set(result.removed))
        self.run.schedule()
        return result

    def _forget_times(self, rt: BackendRuntime) -> None:
        """Another launch of ``rt`` may be another model: its times are measured anew (and
        again once its worker of the old launch, if one runs on, has gone)."""
        rt.measures.forget_times(rt.worker.name if rt.worker is not None else None)
        self.planner.expect.forget_runs(rt.spec.name)

    def _retire_times(self, rt: BackendRuntime) -> None:
        """``rt`` leaves the engine: its times are kept apart, for a reload that adds it
        back (its launch the same), and the planner forgets its job times."""
        self.timings.retire(rt, self.planner.expect)
        self.planner.expect.forget_runs(rt.spec.name)

    # ===================================================================== scheduling =====
    def step_now(self) -> None:
        """Take the scheduled decision now rather than on the loop's next turn (on the engine
        loop, by a caller that has nothing else to do first: a request handler that has just
        submitted its job and will wait for it); only while the queue is short (a deep one is
        decided once per turn, for everyone), and never raising."""
        if len(self.jobs.queue) <= STEP_NOW_MAX_QUEUE:
            self.run.step_now()

    def _nothing_waits(self) -> bool:
        """No job, preload or draining GPU: a plan could neither start nor evict anything
        (nor a job held while others over-commit its GPU start)."""
        return not self.jobs.queue and not self.planner.draining and \
            not self.others.pressing() and not self.yields.held and \
            not any(rt.preload_until is not None or rt.health.held_for_others is not None
                    for rt in self.pool.runtimes())

    def book(self) -> Book:
        """The memory ledger's accounts of the engine now."""
        return self._inputs(with_queue=False)[1]

    def _inputs(self, extra: tuple[sched.QueuedJob, ...] = (), *, with_queue: bool = True
                ) -> tuple[sched.Snapshot, Book]:
        queue: tuple[sched.QueuedJob, ...] = ()
        counts: Mapping[tuple[str, str], int] = {}
        if with_queue:
            queue, counts = self.planner.with_extra(self.jobs.queue.scheduler_view(),
                                                    self.jobs.queue.counts, extra)
        return self.planner.inputs(self.monitor.readings, self.pool.runtimes(),
                                   self.calibrations.facts(), self._foreign(), queue,
                                   counts, self.sleeper.host_room_mib(), self.yields.closed())

    def _foreign(self) -> dict[int, int]:
        """GPU -> what admission counts there beside our workers on it: strangers (with
        hysteresis) and, on the host device, what our workers placed elsewhere hold of it."""
        foreign = dict(self.others.counted)
        for index, mib in self.monitor.elsewhere.items():
            if mib:
                foreign[index] = foreign.get(index, 0) + mib
        return foreign

    def _step(self) -> None:
        now = self.clock()
        preloads = [rt for rt in self.pool.runtimes() if rt.preload_until is not None]
        # Last in the queue: a preload takes room nobody waits for, never a job's room.
        extra = tuple(sched.QueuedJob(f"preload-{rt.spec.name}", rt.spec.name, -(10**9),
                                      10**15 + i, now, 0, kind="preload")
                      for i, rt in enumerate(preloads))
        snap, _book = self._inputs(extra)
        plan = self.planner.plan(snap, now)
        for ev in plan.evictions:
            rt = self.pool.runtime(ev.backend)
            if ev.sleep:
                self.sleeper.sleep(rt, ev.reason)
            elif rt.worker is not None and rt.worker.state != WorkerState.STOPPING:
                if ev.requeue:  # a load given up: its jobs first, or they fail with it
                    self.sleeper.requeue_admitted(rt, f"requeued: {ev.reason}")
                    if ev.given_up_for is not None:
                        self.planner.given_up(ev.backend, ev.given_up_for,
                                              monotonic() - rt.worker.started_at)
                self.notes.note("warning" if ev.others else "info", self.others.evicted(ev)
                                if ev.others else f"evicting {ev.backend} from GPU{ev.gpu} "
                                f"(frees {ev.frees_mib} MiB): {ev.reason}", ev.backend)
                self.notes.counters.evicted(ev.backend, "others" if ev.others else "room")
                self.pool.evict_now(rt, 0.0 if ev.requeue else None)
        queue = self.jobs.queue
        for job_id, passed in plan.passed.items():
            if (job := self.jobs.get(job_id)) is not None:
                queue.set_passed(job, passed)
        for job_id, since in plan.blocked.items():
            if (job := self.jobs.get(job_id)) is not None:
                queue.set_blocked(job, since)
        for start in plan.starts:
            self._start(start, snap)
        for rt in self.pool.live():  # (jobs held while others over-committed their GPU)
            if rt.health.held_for_others is not None:
                self._start_admitted(rt)
        for rt in preloads:  # (a sleeping worker's waits until its wake began)
            if rt.worker is not None and not Sleeper.unwoken(rt):
                rt.preload_until = None
            elif rt.preload_until is not None and self.clock() >= rt.preload_until:
                rt.preload_until = None
                rt.respawn_of = None
                reason = plan.waiting.get(f"preload-{rt.spec.name}", "no room")
                self.notes.note("warning", f"gave up preloading {rt.spec.name} after "
                                f"{PRELOAD_PATIENCE_S:g} s: {reason}", rt.spec.name)
        self.jobs.set_waiting(plan.waiting)  # read lazily: only shown jobs need their reason

    def _start(self, start: sched.Start, snap: sched.Snapshot) -> None:
        rt = self.pool.runtime(start.backend)
        if start.kind == "preload":
            if rt.worker is None and self._spawn_worker(rt, start.gpu) is not None:
                rt.preload_until = None  # (said why; asking again would say it again)
                return
            self.sleeper.wake(rt)  # (a sleeping worker: wakes it)
            return
        job = self.jobs.require(start.job_id)
        self.jobs.dequeue(job)
        job.waiting = ""
        job.gpu = start.gpu
        if start.kind == "calibration":
            job.mark(self.clock(), JobState.RUNNING, f"calibrating {job.backend} alone on "
                     f"GPU{start.gpu}")
            self._job_event(job)
            self.notes.note("info", f"calibrating {job.backend} alone on GPU{start.gpu}",
                            job.backend)
            self.calibrations.start(job, rt, start.gpu, self._calibration_done)
            return
        spawn = start.spawn or rt.worker is None

        def admitted() -> str:  # (its line: written once the request is on its way)
            return Planner.admitted(job.id, start, snap, spawn)

        if spawn:
            self.notes.note("info", admitted(), job.backend, quiet=True)
            if (why := self._spawn_worker(rt, start.gpu)) is not None:
                self._finish(job, JobState.FAILED, error=why)
                return
        rt.admitted.append(job.id)
        rt.usage.idle_since = None
        worker = rt.worker
        assert worker is not None
        if worker.hot and worker.data is not None:
            self._dispatch(rt, job)
            # Told once the worker has the request: it works while the engine writes this.
            self.notes.note("info", admitted(), job.backend, quiet=True)
        else:
            if not spawn:
                self.notes.note("info", admitted(), job.backend, quiet=True)
            how = "waking" if worker.state == WorkerState.ASLEEP else "starting"
            job.mark(self.clock(), JobState.STARTING, f"{how} {rt.spec.name} on GPU{job.gpu}")
            self.sleeper.wake(rt)
            if self.journal.durable(job):
                self.journal.write("record_state", job.id, JobState.STARTING,
                                   self.journal.when(job))
            self._job_event(job)

    def _dispatch(self, rt: BackendRuntime, job: Job) -> None:
        worker = rt.worker
        assert worker is not None
        job.mark(self.clock(), JobState.RUNNING, f"on {worker.name} (pid {worker.command_pid})")
        if self.journal.durable(job):
            self.journal.write("record_start", job.id, self.journal.when(job),
                               f"on {worker.name}")
        job.peak_mib = None
        job.peak_samples = 0
        worker.send(job.id, job.payload, stream=job.stream, metadata=job.metadata, deadline=None)
        if job.timeout is not None:  # timeouts.request counts from dispatch
            self.run.set_timer(job.id, job.timeout, lambda: self._time_out(job.id))
        self._job_event(job)

    def _calibration_done(self, job: Job, task: asyncio.Task[Any]) -> None:
        state, error = self.calibrations.outcome(job, task, self.notes.note)
        self._finish(job, state, error=error)
        self.run.schedule()

    # ===================================================================== workers ========
    def _spawn_worker(self, rt: BackendRuntime, gpu: int) -> str | None:
        """Start a worker of ``rt`` on ``gpu``; None, or why none could be (noted; the job
        it was for fails with it, never left neither queued nor running)."""
        spec = rt.spec
        try:
            handle = self.pool.spawn(rt, gpu, self)
        except CannotStart as exc:
            why = f"cannot start {spec.name}: {exc}"
        except Exception as exc:  # noqa: BLE001 - a fault of ours: that job fails, never hangs
            log.exception("starting a worker of %s failed", spec.name)
            why = (f"the engine failed starting {spec.name}: {type(exc).__name__}: "
                   f"{str(exc)[:200]} (a bug: please report it)")
        else:
            why = None
        if why is not None:
            self.notes.note("error", why, spec.name)
            self.notes.worker(spec.name, rt.state)
            return why
        self.notes.note("info", f"starting {spec.name} on GPU{gpu}"
                        + (" (footprint unknown: it runs alone until measured)"
                           if rt.conduct.exclusive else ""), spec.name)
        self.run.set_timer(f"start:{handle.name}", spec.timeouts.start_s,
                           lambda: self._start_timed_out(rt, handle))
        self.notes.worker(spec.name, rt.state)
        return None

    def _start_timed_out(self, rt: BackendRuntime, handle: Worker) -> None:
        if rt.worker is handle and not handle.hot and not handle.exited:
            handle.init_error = (f"not ready after {rt.spec.timeouts.start_s:g} s "
                                 "(timeouts.start)")
            self.notes.note("error", f"{rt.spec.name}: {handle.init_error}; killing it",
                            rt.spec.name)
            handle.kill()

    # -- WorkerObserver -----------------------------------------------------------------------
    def worker_state(self, handle: Worker) -> None:
        rt = self.pool.get(handle.backend)
        if rt is None or rt.worker is not handle:
            return
        if handle.state == WorkerState.BUSY:
            self.notes.worker(rt.spec.name, rt.state)  # a busy worker takes no new job
            return
        if handle.state == WorkerState.READY:
            self.run.cancel_timer(f"start:{handle.name}")
            self._ready(rt, handle)
        self.notes.worker(rt.spec.name, rt.state)
        self.run.schedule()

    def _ready(self, rt: BackendRuntime, handle: Worker) -> None:
        rt.respawn_of = None  # a respawn under way is done
        m = rt.measures
        if handle.ready_at is not None and rt.health.init_failures:
            rt.health.init_failures = 0
        if handle.ready_at is not None and m.timed_worker != handle.name:
            m.timed_worker = handle.name  # its first ready: one load, and its cost
            loaded = max(0.0, handle.ready_at - handle.started_at)
            m.timed(load_s=loaded)
            self.notes.loaded(rt.spec.name, handle.gpu, loaded, preloaded=not rt.admitted)
        self._start_admitted(rt)
        if not rt.admitted and rt.usage.idle_since is None:
            rt.usage.idle_since = self.clock()

    def _start_admitted(self, rt: BackendRuntime) -> None:
        """Send its hot worker the jobs admitted to it that wait for it (a load, a wake) —
        not while others over-commit its GPU: they took the room those jobs were admitted
        with since (a stranger that came during the load), and a job started there would
        take memory the device no longer has. They start once it fits (``_step``)."""
        w = rt.worker
        # While stopping, admitted jobs stay unstarted: they run after a restart.
        if w is None or not w.hot or self.stopping:
            return
        waiting = [job for job_id in list(rt.admitted)
                   if (job := self.jobs.get(job_id)) is not None
                   and job.state is JobState.STARTING]
        if not waiting:
            return
        g = self.book().gpus.get(w.gpu)
        over = g.overcommit_mib if g is not None and g.foreign_mib > 0 else 0
        if over > 0:
            if rt.health.held_for_others is None:
                rt.health.held_for_others = over
                self.notes.note("warning", f"{rt.spec.name} is loaded on GPU{w.gpu}, but "
                                f"others over-commit it by {over} MiB: its {len(waiting)} "
                                "job(s) start once it fits", rt.spec.name)
            return
        rt.health.held_for_others = None
        for job in waiting:
            self._dispatch(rt, job)

    def worker_exited(self, handle: Worker, code: int | None, reason: str) -> None:
        rt = self.pool.get(handle.backend)
        self.pool.factory.exited(handle)
        if rt is None or rt.worker is not handle:
            return
        self.run.cancel_timer(f"start:{handle.name}")
        if rt.respawn_of is not None and rt.generation > rt.respawn_of:
            rt.respawn_of = None  # the respawn's own worker is gone: that respawn is over
        held = self.planner.holds(rt, self.monitor.readings, self._foreign())
        health, killed_for = rt.health, rt.health.kill_reason
        rt.worker = None
        rt.usage.idle_since = None
        rt.measures.observed_mib = None
        if rt.measures.old_launch_worker == handle.name:
            self._forget_times(rt)  # (what it measured since its launch changed)
        rt.conduct.reset()
        health.kill_reason = None
        if rt.conduct.caught_mib is not None:
            self.watch.distrust(rt, rt.conduct.caught_mib)
            rt.conduct.caught_mib = None
        pids = {handle.pid} if handle.pid is not None else set()
        rt.ghosts.append(Ghost(handle.name, handle.gpu, held, pids | handle.known_descendants(),
                               self.clock() + EVICTION_CONFIRM_TIMEOUT_S))
        self.run.spawn(self.watch.confirm_ghosts(rt))
        expected = handle.state == WorkerState.COLD and killed_for is None
        never_ready = handle.ready_at is None
        self.notes.counters.worker_exited(handle, expected=expected, never_ready=never_ready)
        log_hint = f"log: {handle.log_path}"
        name = rt.spec.name
        said = health.record_exit(name, reason, handle.init_error, log_hint,
                                  killed_for=killed_for, expected=expected, never_ready=never_ready)
        if said is not None:
            self.notes.note(*said, name)
        for job_id in list(rt.admitted):
            job = self.jobs.get(job_id)
            rt.admitted.remove(job_id)
            if job is None or job.state.finished:
                continue
            if self.stopping and not job.cancel_requested:
                self._stopped_during(job)
            elif job.cancel_requested:
                self._finish(job, job.cancel_state, error=job.error or "cancelled (worker killed)")
            elif job.state is JobState.STARTING and not never_ready:
                # it waited for this worker (a wake), never sent to it: it has not run
                self._requeue(job, f"requeued: {name} {reason} before it ran")
            elif "retry" in handle.features and not never_ready and not job.retried \
                    and job.status_code is None:
                job.retried = True  # its server died before answering it: once more
                self._requeue(job, f"requeued once: {killed_for or name + ' ' + reason}")
            elif killed_for is not None:
                self._finish(job, JobState.FAILED, error=f"{killed_for}; {log_hint}")
            elif never_ready and not expected and not health.failed:
                self._requeue(job, f"requeued: {rt.spec.runner} failed to start")  # never ran
            else:
                tries = f" (tried {health.init_failures} times in a row)" \
                    if never_ready and health.init_failures > 1 else ""
                what = (f"its {rt.spec.runner} failed to start: {health.last_error or reason}"
                        f"{tries}" if never_ready else f"{name} {reason}; {log_hint}")
                self._finish(job, JobState.FAILED, error=what)
        if health.failed:
            for job in [j for j in self.jobs.queue if j.backend == name]:
                self.jobs.dequeue(job)
                self._finish(job, JobState.FAILED,
                             error=f"{name} failed to initialise {MAX_INIT_FAILURES} times: "
                             f"{health.last_error}; respawn it once fixed")
        self.notes.worker(name, rt.state)
        self.run.schedule()

    def _requeue(self, job: Job, why: str) -> None:
        """A job that never ran on the worker it was admitted to goes back to the queue."""
        job.mark(self.clock(), JobState.QUEUED, why)
        job.gpu = None
        if self.journal.durable(job):
            self.journal.write("record_state", job.id, JobState.QUEUED, self.journal.when(job),
                               why)
        self.jobs.enqueue(job)
        self._job_event(job)

    def request_done(self, handle: Worker, job_id: str, outcome: Outcome) -> None:
        job = self.jobs.get(job_id)
        rt = self.pool.get(handle.backend)
        if rt is not None and outcome.unanswered is not None and rt.worker is handle \
                and not handle.exited:
            # Its server stopped answering (it takes no job now): killed, and this job, still
            # admitted, ends with its other running jobs (retried once when nothing of it was
            # sent to its client, or failed with why)
            self.watch.kill_unanswering(rt, outcome.unanswered)
            if job_id in rt.admitted:
                return
        if job is None or rt is None:
            return
        if job_id in rt.admitted:
            rt.admitted.remove(job_id)
        usage = rt.usage
        usage.jobs_served += 1
        usage.last_used = self.clock()
        m = rt.measures
        m.settling, m.ended_at = True, monotonic()  # samples so far saw this job's memory
        if not rt.admitted:
            usage.idle_since = self.clock()
        self.watch.learn(rt, job, outcome.ok)
        if job.cancel_requested:
            self._finish(job, job.cancel_state, error=job.error or "cancelled")
        elif outcome.ok:
            job.data, job.headers = outcome.data, outcome.headers
            job.status_code = outcome.status_code
            self._finish(job, JobState.SUCCEEDED)
        else:
            job.status_code = outcome.status_code
            if outcome.data is not None:  # a model server's own failed answer (its 5xx)
                job.data, job.headers = outcome.data, outcome.headers
            if outcome.too_large:
                job.chunks = []  # the part of an oversized result that came: not kept
            state = JobState.CANCELLED if outcome.cancelled else JobState.FAILED
            self._finish(job, state, error=outcome.error)
        if not rt.conduct.accepting and not rt.admitted and rt.worker is handle:
            self.notes.note("warning", f"evicting {rt.spec.name}: its job is done and it held "
                            f"{rt.conduct.over_mib} MiB more than its figures (on_overuse: "
                            "evict)", rt.spec.name)
            self.notes.counters.evicted(rt.spec.name, "overuse")
            self.pool.evict_now(rt)
        self.run.schedule()

    def request_progress(self, job_id: str, fraction: float | None, text: str) -> None:
        job = self.jobs.get(job_id)
        if job is None or job.state.finished:
            return
        job.progress = fraction
        job.progress_text = visible(text)  # a worker's words, shown on terminals
        self._job_event(job)

    def request_chunk(self, job_id: str, chunk: bytes) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.chunks.append(chunk)
            self.notes.chunk(job.backend, job_id, chunk)

    def request_head(self, job_id: str, status: int, headers: dict[str, str]) -> None:
        if (job := self.jobs.get(job_id)) is not None and not job.state.finished:
            job.status_code, job.headers = status, headers
            self._job_event(job)  # its answer began: a door may open its response now

    # ===================================================================== ends ===========
    def _finish(self, job: Job, state: JobState, error: str | None = None) -> None:
        if job.state.finished:
            return
        error = visible(error, lines=True) if error is not None else None  # a worker's words
        if state is JobState.CANCELLED and job.status_code is not None \
                and job.status_code < 400:  # its answer had begun: cut short, never whole
            job.status_code = CANCELLED_STATUS
        now = self.clock()
        if self.journal.durable(job):  # durable before anyone hears of it
            state, error = self.journal.finish(job, state, error, now)
        if error is not None:
            job.error = error
        job.mark(now, state, error or "")
        self.notes.counters.job_finished(job)
        self.run.cancel_timer(job.id)
        self.run.cancel_timer(f"kill:{job.id}")
        job.payload = b""
        self.jobs.ended(job)
        if job.kind == "job":
            self.notes.job_ended(job)
            self.planner.ended(job)
        self._job_event(job)  # events carry no result: whoever wants it asks (wait, job)

    def _stopped_during(self, job: Job) -> None:
        """The engine stops under a job: journaled jobs stay to run again, others fail."""
        if self.journal.durable(job):
            # The journal still says queued/running: recovery requeues it (as interrupted).
            self.jobs.abandoned(job, "the engine stopped while it ran; it runs again (marked "
                                "interrupted) when the engine starts again")
        else:
            self._finish(job, JobState.FAILED, error="the engine stopped during the job")

    # ===================================================================== samples ========
    def _sample_from_thread(self, sample: Sample) -> None:
        loop = self.run.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_sample, sample)

    def _on_sample(self, sample: Sample) -> None:
        if self.monitor.took(sample):
            self.watch.observe(sample, self.calibrations.runs())
            self.others.observe(self.clock(), self.monitor, self.book)
            self.sleeper.check(self.book)
        self.calibrations.on_sample(sample)
        self.notes.sample()
        self.run.schedule()

    # ===================================================================== snapshots ======
    def notice(self) -> str | None:
        """What to tell first: of the GPUs (no driver: simulated…), then of the backends."""
        said = [n for n in (self.monitor.notice, self.descriptors.note(len(self.pool))) if n]
        return "; ".join(said) or None

    def snapshot(self) -> EngineSnapshot:
        return build_snapshot(Parts(
            wall=self.wall, monitor=self.monitor, pool=self.pool, jobs=self.jobs,
            notes=self.notes, descriptors=self.descriptors, paths=self.paths,
            reserve_mib=self.planner.reserves(self.monitor.readings),
            draining=frozenset(self.planner.draining),
            notice=self.notice(), stopping=self.stopping,
            started_at=self.run.started_at, others=self.others.counted,
            yielded=dict(self.yields.held), job_s=self.planner.expect.job_times()),
            self.book())


