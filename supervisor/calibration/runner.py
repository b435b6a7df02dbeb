"""A calibration run inside the engine: a fresh worker, alone on a GPU, sampled at 20 Hz.

The run is a job of the engine: it waits its turn in the queue as a job that needs a whole
GPU, stops the backend's own worker if one runs, starts a fresh worker and walks it through
its phases — start, initialize, settle, (predict, settle) × repeats, shutdown — marking each
phase from the worker's own time-stamped status events, while every process of the worker's
process tree is sampled at 20 Hz.  The record goes to the pure analysis; the report (every
raw sample and mark) and the descriptor overlay are written atomically, and the overlay only
when the run completed and earned more than "low" confidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..backends.overlay import overlay_text, write_overlay
from ..backends.schema import VramSpec
from ..gpu.sampler import Sample
from ..workers.handle import Outcome, WorkerHandle, WorkerState
from .analysis import analyze
from .record import CalibrationRecord, CalSample, PhaseMark
from .report import write_report

if TYPE_CHECKING:
    from ..engine import BackendRuntime, Engine
    from ..jobs import Job

SAMPLE_HZ = 20.0


class CalibrationRun:
    """One run; also the observer of its own worker (the engine does not route its jobs)."""

    def __init__(self, engine: Engine, rt: BackendRuntime, job: Job, gpu: int, *,
                 repeats: int, settle_s: float) -> None:
        self.engine = engine
        self.rt = rt
        self.job = job
        self.gpu = gpu
        self.repeats = repeats
        self.settle_s = settle_s
        self.samples: list[CalSample] = []
        self.marks: list[PhaseMark] = []
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.worker: WorkerHandle | None = None
        self._reply: asyncio.Future[Outcome] | None = None
        self._state_changed = asyncio.Event()
        self.outcome = "failed"
        self.error: str | None = None
        self.saw_numbers = False
        self.allocated: bool | None = None  # False: the source saw only a context, never more
        self.observed_mib: int | None = None  # for the engine's memory ledger

    # -- marks and samples ------------------------------------------------------------------
    def mark(self, phase: str, wall: float | None = None) -> None:
        t = (wall - self.wall0) if wall is not None else (time.monotonic() - self.t0)
        self.marks.append(PhaseMark(max(0.0, t), phase))
        fraction = min(0.99, len(self.marks) / (2 * self.repeats + 6))
        self.engine.request_progress(self.job.id, fraction, phase)

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
        self.samples.append(CalSample(sample.t - self.t0, procs, device))

    # -- WorkerObserver -----------------------------------------------------------------------
    def worker_state(self, handle: WorkerHandle) -> None:
        self._state_changed.set()

    def worker_exited(self, handle: WorkerHandle, code: int | None, reason: str) -> None:
        if handle.pid is not None:
            self.engine.lifeline.remove(handle.pid)
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

    # -- the run ------------------------------------------------------------------------------
    async def _wait_state(self, predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._state_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._state_changed.wait(), remaining)
        return True

    async def run(self) -> dict[str, Any]:
        engine, rt = self.engine, self.rt
        spec = rt.spec
        if rt.worker is not None:  # the backend's own worker goes first
            while rt.admitted and rt.worker is not None:
                await asyncio.sleep(0.05)
            if rt.worker is not None:
                await rt.worker.stop(grace=spec.timeouts.stop_grace_s)
        if engine.sampler is not None:
            engine.sampler.set_fast(True)
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
            if engine.sampler is not None and not engine.calibrations_running(besides=self):
                engine.sampler.set_fast(False)
        return self._finish()

    async def _phases(self) -> None:
        engine, spec = self.engine, self.rt.spec
        name = f"{spec.name}#cal{self.rt.generation + 1}"
        self.rt.generation += 1
        worker = engine.make_worker(self.rt, self.gpu, name, observer=self)
        self.worker = worker
        self.mark("start")
        await engine.start_worker(worker)
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
        await asyncio.sleep(self.settle_s)
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
            await asyncio.sleep(self.settle_s)
        self.mark("shutdown")
        stopping = asyncio.get_running_loop().create_task(
            worker.stop(grace=spec.timeouts.stop_grace_s))
        await self._wait_state(lambda: worker.exited, spec.timeouts.stop_grace_s + 10)
        self.mark("exited")
        await asyncio.sleep(self.settle_s)
        await stopping
        self.mark("end")
        self.outcome = "completed"

    def _finish(self) -> dict[str, Any]:
        engine, spec = self.engine, self.rt.spec
        probe = engine.probe
        reading = engine.readings.get(self.gpu)
        total = reading.total_mib if reading is not None else 0
        record = CalibrationRecord(
            backend=spec.name, gpu=self.gpu, source=probe.source,
            per_process=self.saw_numbers or not self.samples, sample_hz=SAMPLE_HZ,
            repeats=self.repeats,
            request=self.job.payload, started_wall=self.wall0,
            samples=tuple(self.samples), marks=tuple(self.marks), device_total_mib=total,
            outcome=self.outcome, error=self.error, allocated=self.allocated,
        )
        report = analyze(record)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.wall0))
        report_path = engine.paths.calibration_dir / f"{spec.name}-{stamp}.json"
        write_report(report_path, record, report)
        summary: dict[str, Any] = {"report": str(report_path), "outcome": self.outcome,
                                   "error": self.error, **report.summary()}
        fields = report.overlay_fields() if self.outcome == "completed" else None
        if fields:
            overlay = engine.paths.backends_dir / f"zz-calibrated-{spec.name}.yaml"
            comment = f"measured by vramtui calibrate on {stamp}; report {report_path}"
            write_overlay(overlay, spec.name, fields, comment=comment)
            summary["overlay"] = str(overlay)
            # The overlay itself, for a client that cannot read the engine's files
            # (`vramtui calibrate --out FILE`).
            summary["overlay_yaml"] = overlay_text(spec.name, fields, comment=comment)
            vram = fields.get("vram", {})
            self.rt.spec = replace(spec, vram=_vram_from(vram, spec.vram))
        return summary


def _vram_from(fields: dict[str, Any], old: VramSpec) -> VramSpec:
    from ..backends.units import parse_size

    def size(key: str) -> int | None:
        value = fields.get(key)
        return parse_size(value) if value is not None else None

    return VramSpec(peak_mib=size("peak"), weights_mib=size("weights"),
                    activation_mib=size("activation"), context_mib=size("context"))


def report_json(summary: dict[str, Any]) -> bytes:
    """A run's summary as the calibration job's result data."""
    return json.dumps(summary, indent=2, default=str).encode()
