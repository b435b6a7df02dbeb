"""Calibration runs inside the engine: each a fresh worker, alone on a GPU, sampled at 20 Hz.

:class:`Calibrations` is the engine's part that holds the runs under way; it reaches the rest
of the engine only through the worker pool (to make and launch a worker), the monitor (the
samples, 20 Hz while a run goes on) and a progress callback.  A run is a job of the engine:
it waits its turn in the queue as a job that needs a whole GPU, stops the backend's own
worker if one runs, starts a fresh worker and walks it through its phases — start,
initialize, settle, (predict, settle) × repeats, shutdown — marking each phase from the
worker's own time-stamped status events, while every process of the worker's process tree
is sampled at 20 Hz.  The record goes to the pure analysis; the report (every
raw sample and mark) and the descriptor overlay are written atomically, and the overlay only
when the run completed and earned more than "low" confidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from supervisor.clock import monotonic

from ..admission import RunFacts
from ..backends.overlay import overlay_text, write_overlay
from ..backends.schema import VramSpec
from ..gpu.sampler import Sample
from ..jobs import Job, JobState
from ..paths import REPORT_STAMP, Paths
from ..units import parse_size
from ..workers.base import Worker
from ..workers.handle import Outcome, WorkerHandle
from ..workers.states import WorkerState
from .analysis import analyze
from .record import ASLEEP, SLEEP, WAKE, WOKEN, CalibrationRecord, CalSample, PhaseMark
from .report import write_report

if TYPE_CHECKING:
    from ..engine.monitor import Monitor
    from ..engine.pool import WorkerPool
    from ..engine.runtime import BackendRuntime

SAMPLE_HZ = 20.0
#: How much longer than ``settle_s`` a settle waits for its first sample: a loaded machine's
#: sampler can fall behind a short settle (0.2 s, in a test on two busy cores, saw no sample
#: after the worker was ready, and the run measured nothing).
SAMPLE_WAIT_S = 5.0
Progress = Callable[[str, float | None, str], None]


class Calibrations:
    """The calibration runs under way (job id -> the run and its task)."""

    def __init__(self, pool: WorkerPool, monitor: Monitor, paths: Paths,
                 progress: Progress) -> None:
        self.pool = pool
        self.monitor = monitor
        self.paths = paths
        self.progress = progress
        self._runs: dict[str, tuple[CalibrationRun, asyncio.Task[Any]]] = {}

    def start(self, job: Job, rt: BackendRuntime, gpu: int,
              done: Callable[[Job, asyncio.Task[Any]], None]) -> None:
        """Run the calibration ``job`` of ``rt`` on ``gpu``; ``done`` when it ends."""
        run = CalibrationRun(self, rt, job, gpu, repeats=int(job.metadata.get("repeats", 3)),
                             settle_s=float(job.metadata.get("settle_s", 1.0)))
        task = asyncio.get_running_loop().create_task(run.run())
        self._runs[job.id] = (run, task)

        def ended(t: asyncio.Task[Any]) -> None:
            self._runs.pop(job.id, None)
            done(job, t)

        task.add_done_callback(ended)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._runs

    def runs(self) -> list[CalibrationRun]:
        return [run for run, _task in self._runs.values()]

    def running(self, besides: CalibrationRun | None = None) -> bool:
        return any(run is not besides for run, _task in self._runs.values())

    def backends(self) -> set[str]:
        return {run.backend for run in self.runs()}

    def cancel(self, job_id: str) -> None:
        self._runs[job_id][1].cancel()

    def facts(self) -> list[RunFacts]:
        """Each run as the ledger holds it: its whole GPU."""
        return [RunFacts(run.worker.name if run.worker else f"{job_id}/run", run.backend,
                         run.gpu, run.observed_mib)
                for job_id, (run, _task) in self._runs.items()]

    def on_sample(self, sample: Sample) -> None:
        for run in self.runs():
            run.on_sample(sample)

    def kill_all(self) -> None:
        for run in self.runs():
            if run.worker is not None:
                run.worker.kill()

    @staticmethod
    def outcome(job: Job, task: asyncio.Task[Any], note: Callable[..., None]
                ) -> tuple[JobState, str | None]:
        """How the run of ``job`` ended, as the job's final state and error; its report's
        summary becomes the job's data."""
        if task.cancelled():
            return job.cancel_state, job.error or "cancelled"
        exc = task.exception()
        if exc is not None:
            note("error", f"calibration of {job.backend} failed: {exc}", job.backend)
            return JobState.FAILED, f"{type(exc).__name__}: {exc}"
        summary = task.result()
        job.data = report_json(summary)
        job.headers = {"Content-Type": "application/json"}
        report = summary.get("report")
        if summary.get("outcome") == "completed" and summary.get("overlay"):
            note("info", f"calibrated {job.backend}: "
                 + str(summary.get("headline", "see the report")), job.backend)
            return JobState.SUCCEEDED, None
        if summary.get("outcome") == "completed":
            why = f"nothing usable was measured: {summary.get('reason')}"
            note("warning", f"calibration of {job.backend}: {why}; no overlay written",
                 job.backend)
            return JobState.FAILED, f"{why}; no overlay written; report {report}"
        return JobState.FAILED, (f"calibration {summary.get('outcome')}: "
                                 f"{summary.get('error')}; report {report}")


class CalibrationRun:
    """One run; also the observer of its own worker (the engine does not route its jobs)."""

    def __init__(self, host: Calibrations, rt: BackendRuntime, job: Job, gpu: int, *,
                 repeats: int, settle_s: float) -> None:
        self.host = host
        self.rt = rt
        self.job = job
        self.gpu = gpu
        self.repeats = repeats
        self.settle_s = settle_s
        self.samples: list[CalSample] = []
        self.marks: list[PhaseMark] = []
        self.t0 = monotonic()
        self.wall0 = time.time()
        self.worker: Worker | None = None
        self._reply: asyncio.Future[Outcome] | None = None
        self._state_changed = asyncio.Event()  # the worker's state, or a sample came
        self._starved = False  # a settle waited in vain for a sample
        self.outcome = "failed"
        self.error: str | None = None
        self.saw_numbers = False
        self.allocated: bool | None = None  # False: the source saw only a context, never more
        self.observed_mib: int | None = None  # for the engine's memory ledger
        self.sleep_error: str | None = None  # a sleep or wake that failed during the run

    # -- marks and samples ------------------------------------------------------------------
    def mark(self, phase: str, wall: float | None = None) -> None:
        t = (wall - self.wall0) if wall is not None else (monotonic() - self.t0)
        self.marks.append(PhaseMark(max(0.0, t), phase))
        fraction = min(0.99, len(self.marks) / (2 * self.repeats + 6))
        self.host.progress(self.job.id, fraction, phase)

    @property
    def backend(self) -> str:
        return self.rt.spec.name

    def pids(self, on_gpu: Collection[int]) -> set[int]:
        """The run's worker and its descendants among ``on_gpu`` (the pids a sample saw on
        the GPUs; empty before it started or once it exited)."""
        worker = self.worker
        if worker is None:
            return set()
        # pids() holds the live worker; its descendants may outlive it on the GPU
        return worker.pids(on_gpu) | worker.known_descendants()

    def on_sample(self, sample: Sample) -> None:
        worker = self.worker
        if worker is None or sample.processes is None:
            return
        pids = self.pids({p.pid for p in sample.processes})
        # A process whose memory the driver would not tell is left out (never counted as 0);
        # a run in which no reading ever had a number is recorded as not per-process.
        mine = [p for p in sample.processes if p.pid in pids and p.gpu_index == self.gpu]
        procs = {p.pid: p.used_mib for p in mine if p.used_mib is not None}
        if procs:
            self.saw_numbers = True
        for p in mine:
            if p.allocated is True:
                self.allocated = True
            elif p.allocated is False and self.allocated is None:
                self.allocated = False
        device = next((d.used_mib for d in sample.devices if d.index == self.gpu), None)
        self.samples.append(CalSample(sample.t - self.t0, procs, device, sample.read_s))
        self._state_changed.set()

    async def _settle(self) -> None:
        """The phase just marked lasts ``settle_s``, and until a sample taken in it has come
        (at most ``SAMPLE_WAIT_S`` more, and not again once one never came: a run with no
        sampler would wait that long at every phase): a phase with no sample tells
        nothing."""
        began = self.marks[-1].t if self.marks else 0.0
        await asyncio.sleep(self.settle_s)
        if not self._starved:
            self._starved = not await self._wait_state(
                lambda: bool(self.samples) and self.samples[-1].t >= began, SAMPLE_WAIT_S)

    # -- WorkerObserver -----------------------------------------------------------------------
    def worker_state(self, handle: WorkerHandle) -> None:
        self._state_changed.set()

    def worker_exited(self, handle: WorkerHandle, code: int | None, reason: str) -> None:
        self.host.pool.factory.exited(handle)
        self._state_changed.set()
        if self._reply is not None and not self._reply.done():
            self._reply.set_result(Outcome(ok=False, error=reason))

    def request_done(self, handle: WorkerHandle, job_id: str, outcome: Outcome) -> None:
        if self._reply is not None and not self._reply.done():
            self._reply.set_result(outcome)

    def request_progress(self, job_id: str, fraction: float | None, text: str) -> None:
        pass

    def request_chunk(self, job_id: str, chunk: bytes) -> None:
        pass

    def request_head(self, job_id: str, status: int, headers: dict[str, str]) -> None:
        pass

    # -- the run ------------------------------------------------------------------------------
    async def _wait_state(self, predicate: Any, timeout: float) -> bool:
        deadline = monotonic() + timeout
        while not predicate():
            remaining = deadline - monotonic()
            if remaining <= 0:
                return False
            self._state_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state_changed.wait(), remaining)
        return True

    async def run(self) -> dict[str, Any]:
        host, rt = self.host, self.rt
        spec = rt.spec
        if rt.worker is not None:  # the backend's own worker goes first
            while rt.admitted and rt.worker is not None:
                await asyncio.sleep(0.05)
            if rt.worker is not None:
                await rt.worker.stop(grace=spec.timeouts.stop_grace_s)
        host.monitor.set_fast(True)
        try:
            await self._phases()
        except asyncio.CancelledError:
            self.outcome = "cancelled"
            self.error = "cancelled"
            raise
        finally:
            if self.worker is not None and not self.worker.exited:
                # Its GPU is released when this task ends: not before the process is gone.
                self.worker.kill()
                await self.worker.wait_exited(5.0)
            if not host.running(besides=self):
                host.monitor.set_fast(False)
        return self._finish()

    async def _phases(self) -> None:
        pool, spec = self.host.pool, self.rt.spec
        name = f"{spec.name}#cal{self.rt.generation + 1}"
        self.rt.generation += 1
        worker = pool.factory.make(spec, self.gpu, name, self)
        self.worker = worker
        self.mark("start")
        await pool.launch(worker)
        if worker.exited:
            self.outcome, self.error = "crashed", worker.init_error or "could not start"
            return
        ready = await self._wait_state(
            lambda: worker.state == WorkerState.READY or worker.exited, spec.timeouts.start_s)
        for wall, status in worker.status_marks:
            if status == "initializing":
                self.mark("initialize", wall)
                break
        if not ready or worker.exited:
            self.outcome = "crashed"
            self.error = worker.init_error or ("not ready in time" if not ready else "exited")
            return
        ready_wall = next((w for w, s in worker.status_marks if s == "ready"), None)
        self.mark("settle-load", ready_wall)
        await self._settle()
        request = self.job.payload
        for i in range(1, self.repeats + 1):
            self._reply = asyncio.get_running_loop().create_future()
            self.mark(f"predict-{i}")
            worker.send(f"{self.job.id}/{i}", request, stream=spec.stream)
            outcome = await self._reply
            self.mark(f"settle-{i}")
            if not outcome.ok:
                self.outcome = "crashed" if worker.exited else "failed"
                self.error = f"predict {i} failed: {outcome.error}"
                return
            await self._settle()
        if "sleep" in worker.features and spec.sleep.enabled:
            await self._sleep_and_wake(worker)
        self.mark("shutdown")
        stopping = asyncio.get_running_loop().create_task(
            worker.stop(grace=spec.timeouts.stop_grace_s))
        await self._wait_state(lambda: worker.exited, spec.timeouts.stop_grace_s + 10)
        self.mark("exited")
        await self._settle()
        await stopping
        self.mark("end")
        self.outcome = "completed"

    async def _sleep_and_wake(self, worker: Worker) -> None:
        """A worker that can sleep: what it keeps asleep, and how long its wake takes (a
        sleep or a wake that fails ends these phases early; the footprint stands)."""
        spec = self.rt.spec
        self.mark(SLEEP)
        slept = await worker.sleep(spec.sleep.level, spec.timeouts.start_s)
        if not slept.ok:
            self.sleep_error = f"its sleep failed: {slept.error}"
            return
        self.mark(ASLEEP)
        await self._settle()
        self.mark(WAKE)
        woke = await worker.wake(spec.timeouts.start_s)
        if not woke.ok:
            self.sleep_error = f"it did not wake: {woke.error}"
            return
        self.mark(WOKEN)
        await self._settle()

    def _finish(self) -> dict[str, Any]:
        host, spec = self.host, self.rt.spec
        probe = host.monitor.probe
        reading = host.monitor.readings.get(self.gpu)
        total = reading.total_mib if reading is not None else 0
        record = CalibrationRecord(
            backend=spec.name, gpu=self.gpu,
            source=(reading.source if reading is not None else None) or probe.source,
            per_process=self.saw_numbers or not self.samples, sample_hz=SAMPLE_HZ,
            repeats=self.repeats,
            request=self.job.payload, started_wall=self.wall0,
            samples=tuple(self.samples), marks=tuple(self.marks), device_total_mib=total,
            outcome=self.outcome, error=self.error, allocated=self.allocated,
        )
        report = analyze(record)
        stamp = time.strftime(REPORT_STAMP, time.localtime(self.wall0))
        report_path = host.paths.calibration_report(spec.name, stamp)
        write_report(report_path, record, report)
        summary: dict[str, Any] = {"report": str(report_path), "outcome": self.outcome,
                                   "error": self.error, **report.summary()}
        if self.sleep_error is not None:
            summary["sleep_error"] = self.sleep_error
        fields = report.overlay_fields() if self.outcome == "completed" else None
        if fields:
            overlay = host.paths.calibration_overlay(spec.name)
            # the report's own words (when, on which device: "simulated GPU 0", how sure), as
            # `recalibrate --write-overlay` writes them, and where the report is
            comment = f"{report.overlay_comment()}\nreport {report_path}"
            write_overlay(overlay, spec.name, fields, comment=comment)
            summary["overlay"] = str(overlay)
            # The overlay itself, for a client that cannot read the engine's files
            # (`vramtui calibrate --out FILE`).
            summary["overlay_yaml"] = overlay_text(spec.name, fields, comment=comment)
            vram = fields.get("vram", {})
            spec = replace(spec, vram=_vram_from(vram, spec.vram))
            if report.sleeps:  # the measured sleep: the scheduler's priors from now on
                assert report.sleep_residual is not None
                spec = replace(spec, wake_cost_s=report.wake_s, sleep=replace(
                    spec.sleep, residual_mib=report.sleep_residual.value_mib))
            self.rt.spec = spec
        return summary


def _vram_from(fields: dict[str, Any], old: VramSpec) -> VramSpec:
    def size(key: str) -> int | None:
        value = fields.get(key)
        return parse_size(value) if value is not None else None

    return VramSpec(peak_mib=size("peak"), weights_mib=size("weights"),
                    activation_mib=size("activation"), context_mib=size("context"))


def report_json(summary: dict[str, Any]) -> bytes:
    """A run's summary as the calibration job's result data."""
    return json.dumps(summary, indent=2, default=str).encode()
