"""A deterministic snapshot source: an `EngineAPI` that returns fixed engine snapshots.

It is a data source for stable snapshot tests, screenshots and the TUI benchmark — fixed
clock, fixed GPUs, backends, jobs and log — never a stand-in for the engine's behaviour
(behaviour tests drive a real embedded engine with real workers).  Commands are recorded in
``calls`` and change nothing.

A test fixture, not part of the application: tests import it as ``fixed_source`` (pytest puts
``tests/`` on the path); ``screenshots/make.py`` and ``bench/tui.py`` add ``tests/`` to
``sys.path`` themselves.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from supervisor.calibration import CalibrationRecord, CalSample, PhaseMark, analyze
from supervisor.calibration.report import write_calibrated_overlay, write_report
from supervisor.errors import EngineStopped, NoReport, UnknownBackend, UnknownJob
from supervisor.events import EngineEvent, EventHub, Subscription
from supervisor.jobs import JobState, JobView
from supervisor.paths import REPORT_STAMP, Paths
from supervisor.results import (
    BackendChange,
    CancelResult,
    DescriptorInfo,
    JobRequest,
    LogChunk,
    ReloadResult,
    ReportFile,
    YieldInfo,
)
from supervisor.snapshot import BackendView, EngineSnapshot, GpuProcess, GpuView, LogLine
from vramtui.app.fmt import Clocks

WALL0 = 1_767_268_800.0  # 2026-01-01 12:00:00 UTC: the fixed "now"
MONO0 = WALL0  # views carry wall-clock times: jobs, GPU history and log alike
LOG_DIR = "/nonexistent/vramtui/state/logs"
DEMO_SOURCE = "examples/demo/backends.yaml"


def fixed_clocks(offset: Callable[[], float] = lambda: 0.0) -> Clocks:
    return Clocks(mono=lambda: MONO0 + offset(), wall=lambda: WALL0 + offset(),
                  localtime=time.gmtime)


def _job(id: str, backend: str, state: JobState, *, priority: int = 0, submitted: float,
         started: float | None = None, finished: float | None = None,
         progress: float | None = None, text: str = "", gpu: int | None = 0,
         waiting: str = "", passed: int = 0, position: int | None = None,
         data: bytes | None = None, error: str | None = None, status: int | None = None,
         peak: int | None = None, metadata: dict[str, Any] | None = None) -> JobView:
    history: list[tuple[float, str, str]] = [(MONO0 - submitted, "queued", "")]
    if started is not None:
        history.append((MONO0 - started - 1.2, "starting", f"starting {backend} on GPU{gpu}"))
        history.append((MONO0 - started, "running", f"on {backend}#1 (pid 41021)"))
    if finished is not None:
        history.append((MONO0 - finished, state.value, error or ""))
    return JobView(
        id=id, backend=backend, state=state, priority=priority,
        submitted_at=MONO0 - submitted,
        started_at=None if started is None else MONO0 - started,
        finished_at=None if finished is None else MONO0 - finished,
        progress=progress, progress_text=text, gpu=gpu, waiting=waiting, passed=passed,
        position=position, metadata=metadata or {}, data=data,
        headers={"Content-Type": "application/json"} if data else {},
        status_code=status, chunks=(), error=error, history=tuple(history), peak_mib=peak,
    )


def _backend(name: str, state: str, *, pid: int | None = None, gpu: int | None = None,
             observed: int | None = None, declared: int | None = None,
             learned: int | None = None, p95: int | None = None, reserved: int = 0,
             priority: int = 0, served: int = 0, last_used: float | None = None,
             keep: float | None = None, error: str | None = None, queued: int = 0,
             running: int = 0, description: str = "", simulated: bool = True,
             failures: int = 0, log_dir: str = LOG_DIR) -> BackendView:
    return BackendView(
        name=name, state=state, pid=pid, gpu=gpu, observed_mib=observed,
        declared_peak_mib=declared, learned_peak_mib=learned, observed_p95_mib=p95,
        reserved_mib=reserved, priority=priority, jobs_served=served,
        last_used=None if last_used is None else WALL0 - last_used,
        keep_alive_left_s=keep, last_error=error, init_failures=failures, queued=queued,
        running=running, description=description, log_path=f"{log_dir}/{name}.log",
        pinned=False, simulated=simulated, source=DEMO_SOURCE,
        features=("cancel", "progress", "stream") if pid else (),
    )


def _history(index: int, total: int, seconds: float, hz: float, now: float,
             level: Callable[[float], float]) -> tuple[tuple[float, int], ...]:
    n = int(seconds * hz)
    pts = []
    for i in range(n):
        t = now - (n - 1 - i) / hz
        pts.append((t, max(0, min(total, int(level(now - t) * total)))))
    return tuple(pts)


def _demo_level(age: float) -> float:
    """Used fraction of the demo GPU ``age`` seconds ago: loads, jobs and an eviction."""
    base = 0.0
    if age < 560:
        base += 0.25  # sdxl weights
    if age < 420:
        base += 0.42  # llm weights
    if 300 < age < 400:
        base += 0.08  # llm KV cache while generating
    if 150 < age < 230:
        base = 0.25 + 0.5  # flux evicted llm
    if age < 150:
        base = 0.25 + 0.42 + 0.02
    if age < 45 and int(age) % 12 < 9:
        base += 0.125  # sdxl generating
    return base + 0.01 * math.sin(age / 7.0)


@dataclass
class FixedSource:
    """Fixed snapshots; ``fail`` makes every call raise as if the engine were gone."""

    snapshot_value: EngineSnapshot
    clocks: Clocks = field(default_factory=fixed_clocks)
    fail: bool = False
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    advance: Callable[[EngineSnapshot], EngineSnapshot] | None = None
    extra_jobs: dict[str, JobView] = field(default_factory=dict)  # not in the snapshot
    reports: dict[str, Path] = field(default_factory=dict)  # backend -> its report file
    overlays: dict[str, Path] = field(default_factory=dict)  # backend -> its overlay file
    _hub: EventHub = field(default_factory=EventHub)

    # -- EngineAPI ----------------------------------------------------------------------
    def snapshot(self, *, light: bool = False) -> EngineSnapshot:
        if self.fail:
            raise EngineStopped("the engine is not running (connection refused)")
        if self.advance is not None:
            self.snapshot_value = self.advance(self.snapshot_value)
        return self.snapshot_value

    def _record(self, name: str, *args: Any) -> None:
        if self.fail:
            raise EngineStopped("the engine is not running (connection refused)")
        self.calls.append((name, args))

    def submit(self, backend: str, payload: bytes = b"", *, priority: int | None = None,
               timeout: float | None = None, metadata: dict[str, Any] | None = None,
               stream: bool = False) -> str:
        self._record("submit", backend, payload, priority)
        return "j-00000fixed"

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        return self.job(job_id)

    def job(self, job_id: str) -> JobView:
        snap = self.snapshot_value
        for view in (*snap.running, *snap.queued, *snap.recent):
            if view.id == job_id:
                return view
        if job_id in self.extra_jobs:
            return self.extra_jobs[job_id]
        raise UnknownJob(job_id)

    def jobs(self, *, state: str | None = None, backends: Sequence[str] = (),
             limit: int = 100) -> tuple[JobView, ...]:
        snap = self.snapshot_value
        return (*snap.running, *snap.queued, *snap.recent)[:limit]

    def calibrate(self, backend: str, *, repeats: int = 3, request: bytes | None = None,
                  settle_s: float = 1.0) -> str:
        self._record("calibrate", backend, repeats, settle_s)
        return CAL_JOB

    def cancel(self, job_id: str) -> JobView:
        self._record("cancel", job_id)
        return self.job(job_id)

    def job_request(self, job_id: str, *, limit: int = 65536) -> JobRequest:
        self._record("job_request", job_id)
        view = self.job(job_id)
        data = json.dumps({"steps": 20, "prompt": view.metadata.get("prompt", "")}).encode()
        return JobRequest(job_id, len(data), data[:limit])

    def cancel_many(self, job_ids: Sequence[str]) -> list[CancelResult]:
        self._record("cancel_many", tuple(job_ids))
        return [CancelResult(j, self.job(j).state.value) for j in job_ids]

    def retry(self, job_id: str) -> str:
        self._record("retry", job_id)
        return "j-00000retry"

    def set_priority(self, job_id: str, priority: int) -> JobView:
        self._record("set_priority", job_id, priority)
        return replace(self.job(job_id), priority=priority)

    def evict(self, backend: str) -> None:
        self._record("evict", backend)

    def respawn(self, backend: str) -> None:
        self._record("respawn", backend)

    def preload(self, backend: str) -> None:
        self._record("preload", backend)

    def kill(self, backend: str) -> None:
        self._record("kill", backend)

    def sleep(self, backend: str) -> None:
        self._record("sleep", backend)

    def wake(self, backend: str) -> None:
        self._record("wake", backend)

    def zero(self) -> list[str]:
        self._record("zero")
        return []

    def drain(self, gpu: int, on: bool = True) -> tuple[int, ...]:
        self._record("drain", gpu, on)
        return (gpu,) if on else ()

    def yield_gpus(self, gpus: Sequence[int] = (), *, for_s: float | None = None,
                   now: bool = False, by: str = "") -> tuple[YieldInfo, ...]:
        self._record("yield_gpus", tuple(gpus), for_s, now, by)
        until = None if for_s is None else time.time() + for_s
        return tuple(YieldInfo(g, by or "ada", time.time(), until, now) for g in gpus or (0,))

    def resume_gpus(self, gpus: Sequence[int] = ()) -> tuple[int, ...]:
        self._record("resume_gpus", tuple(gpus))
        return tuple(gpus)

    def reload(self) -> ReloadResult:
        """A reload that found one file changed and one broken (what the screen shows)."""
        self._record("reload")
        return ReloadResult(
            added=("whisper-large-sim",), removed=(),
            changed=(BackendChange("sdxl-sim", ("priority: 10 → 20", "keep_alive: 300 → 600"),
                                   ()),
                     BackendChange("llm-8b-sim", ("vram.peak: 12288 → 13312 MiB",
                                                  "env: MODEL_PATH changed"),
                                   ("its busy worker runs the old env until it is respawned "
                                    "(vramtui respawn llm-8b-sim)",))),
            kept=("flux-sim: kept its previous descriptor (~/.config/vramtui/backends.d/"
                  "flux.yaml:7: YAML error: a tab at column 1)",),
            errors=("~/.config/vramtui/backends.d/flux.yaml:7: YAML error: a tab at column 1: "
                    "YAML indents with spaces only; replace it with spaces (found a tab "
                    "character that violates indentation)",),
            files=(DEMO_SOURCE, "~/.config/vramtui/backends.d/flux.yaml",
                   "~/.config/vramtui/backends.d/zz-calibrated-sdxl-sim.yaml"))

    def descriptor(self, backend: str) -> DescriptorInfo:
        """The demo descriptor file's entry, as the engine would describe it."""
        self._record("descriptor", backend)
        from supervisor.backends.loader import load_backends
        from supervisor.descriptors import describe

        layers = [Path(DEMO_SOURCE), *([self.overlays[backend]] if backend in self.overlays
                                       else [])]
        spec = load_backends(layers).backends.get(backend)
        if spec is None:
            raise UnknownBackend(backend, ())
        return describe(backend, spec, layers, {})

    def calibration_report(self, backend: str, *, name: str | None = None) -> ReportFile:
        self._record("calibration_report", backend)
        from supervisor.descriptors import read_report

        path = self.reports.get(backend)
        if path is None:
            raise NoReport(f"{backend} has not been calibrated yet; `vramtui calibrate "
                           f"{backend}` measures it")
        return read_report(path.parent, backend, name)

    def subscribe(self, *, kinds: Sequence[str] | None = None, maxsize: int = 1000,
                  callback: Callable[[EngineEvent], Any] | None = None) -> Subscription:
        return self._hub.subscribe(maxsize=maxsize,
                                   kinds=frozenset(kinds) if kinds else None, callback=callback)

    def logs(self, backend: str, *, lines: int = 50, offset: int | None = None) -> LogChunk:
        self._record("logs", backend)
        path = f"{LOG_DIR}/{backend}.log"
        if offset is not None:
            return LogChunk(path, b"", offset)
        data = DEMO_LOG.replace("sdxl-sim", backend).encode()
        return LogChunk(path, data, len(data))

    def stop(self, timeout: float | None = None) -> None:
        self._hub.close()


def _budget(total: int, free: int, held: int, others: int, reserve: int) -> int:
    """What admission may still hand out on a GPU of these figures (as the ledger says)."""
    return max(0, min(free, total - held - others) - reserve)


def demo_snapshot(*, simulated: bool = True, log_dir: str = LOG_DIR) -> EngineSnapshot:
    """The demo backends on one 24 GiB GPU, mid-afternoon: one job running, two waiting."""
    total = 24576
    hist = _history(0, total, 600, 4, MONO0, _demo_level)
    if simulated:
        gpu = GpuView(index=0, name="Simulated GPU (24 GiB)", total_mib=total,
                      used_mib=19020, free_mib=total - 19020, reserved_mib=20480,
                      ours_mib=19020, foreign_mib=0, util_pct=None, temp_c=None,
                      power_w=None, simulated=True, reserve_mib=256, history=hist,
                      budget_mib=_budget(total, total - 19020, 20480, 0, 256),
                      processes=(GpuProcess(41027, 10342, "ada", "llm-8b-sim"),
                                 GpuProcess(41021, 8678, "ada", "sdxl-sim"),
                                 GpuProcess(41022, 538, "ada", "sdxl-sim")))
    else:
        gpu = GpuView(index=0, name="NVIDIA L4", total_mib=total, used_mib=19788,
                      free_mib=total - 19788, reserved_mib=20480, ours_mib=19020,
                      foreign_mib=768, util_pct=87, temp_c=64, power_w=61.4,
                      simulated=False, reserve_mib=256, history=hist,
                      budget_mib=_budget(total, total - 19788, 20480, 768, 256),
                      processes=(GpuProcess(41027, 10342, "ada", "llm-8b-sim"),
                                 GpuProcess(41021, 8678, "ada", "sdxl-sim"),
                                 GpuProcess(7311, 768, "grace", None)))
    backends = (
        _backend("echo", "ready", pid=41033, gpu=0, observed=0, declared=16, reserved=16,
                 served=12, last_used=95, keep=205, p95=0,
                 log_dir=log_dir,
                 description='echoes what it gets: bytes, JSON, or {"stream": N}',
                 simulated=False),
        _backend("flux-sim", "cold", declared=18432, queued=1, served=3, last_used=260,
                 log_dir=log_dir,
                 description="simulated large image model (12 GiB weights, 6 GiB while "
                             "generating)"),
        _backend("llm-8b-sim", "ready", pid=41027, gpu=0, observed=10342, declared=12288,
                 reserved=10240, priority=20, served=41, last_used=38, keep=262, p95=12620,
                 log_dir=log_dir,
                 description="simulated 8B language model (10 GiB weights, 2 GiB of KV "
                             "cache)"),
        _backend("sdxl-sim", "busy", pid=41021, gpu=0, observed=9216, declared=10752,
                 reserved=9216, priority=10, served=17, last_used=52, running=1, p95=9216,
                 log_dir=log_dir,
                 description="simulated image model (6 GiB weights, 3 GiB while generating)"),
        _backend("whisper-sim", "crashed", declared=3072, queued=1, served=5, last_used=610,
                 error="exited with code -9 (SIGKILL); log: ~/.local/state/vramtui/logs/"
                       "whisper-sim.log", failures=0,
                 log_dir=log_dir,
                 description="simulated speech model (2 GiB weights, 1 GiB while "
                             "transcribing)"),
    )
    running = (
        _job("j-7f3a91c2d4", "sdxl-sim", JobState.RUNNING, priority=10, submitted=14.2,
             started=12.6, progress=0.45, text="step 9/20", peak=9216,
             metadata={"user": "ada", "prompt": "a lighthouse at dusk"}),
    )
    queued = (
        _job("j-1c0ffee5a1", "flux-sim", JobState.QUEUED, priority=0, submitted=31.0,
             gpu=None, position=1, passed=2,
             waiting="needs 18.0 GiB on one GPU; GPU0 has 4.3 GiB free and sdxl-sim is busy"),
        _job("j-5eed5eed77", "whisper-sim", JobState.QUEUED, priority=0, submitted=4.8,
             gpu=None, position=2, waiting="behind j-1c0ffee5a1"),
    )
    recent = (
        _job("j-a11ce0b0b1", "llm-8b-sim", JobState.SUCCEEDED, priority=20, submitted=44.0,
             started=43.1, finished=38.0, progress=1.0, text="done", status=200,
             data=b'{"backend": "llm-8b-sim", "pid": 41027, "steps": 10, "seconds": 5.1}',
             peak=12100),
        _job("j-badc0de001", "whisper-sim", JobState.FAILED, submitted=131.0, started=129.9,
             finished=127.2, progress=0.5, text="step 4/8",
             error="whisper-sim exited with code -9 (SIGKILL); log: "
                   "~/.local/state/vramtui/logs/whisper-sim.log"),
        _job("j-ca9ce1ed00", "sdxl-sim", JobState.CANCELLED, priority=10, submitted=201.0,
             started=199.0, finished=190.4, progress=0.3, text="step 6/20",
             error="cancelled at step 7"),
        _job("j-0dd5a1e5e1", "echo", JobState.SUCCEEDED, submitted=95.3, started=95.2,
             finished=95.1, progress=None, status=200, data=b'{"hello": "world"}'),
    )
    t = WALL0
    log = (
        LogLine(t - 900.0, "info", "engine started: SIMULATED: GPU0 24576 MiB"
                if simulated else "engine started: NVML driver 550.54.15: GPU0 24576 MiB"),
        LogLine(t - 899.9, "warning", "no backends configured: loaded the simulated demo "
                "backends"),
        LogLine(t - 560.0, "info", "starting sdxl-sim on GPU0", "sdxl-sim"),
        LogLine(t - 420.0, "info", "starting llm-8b-sim on GPU0", "llm-8b-sim"),
        LogLine(t - 230.0, "info", "evicting llm-8b-sim from GPU0 (frees 10240 MiB): idle, "
                "its room is needed by j-1c0ffee5a0 (flux-sim)", "llm-8b-sim"),
        LogLine(t - 229.0, "info", "starting flux-sim on GPU0", "flux-sim"),
        LogLine(t - 150.0, "info", "flux-sim idle for 60 s (keep_alive): unloading",
                "flux-sim"),
        LogLine(t - 131.0, "info", "starting whisper-sim on GPU0", "whisper-sim"),
        LogLine(t - 127.2, "error", "whisper-sim crashed: exited with code -9 (SIGKILL); log: "
                "~/.local/state/vramtui/logs/whisper-sim.log", "whisper-sim"),
        LogLine(t - 61.0, "warning", "refused a job for giant-sim: needs 96.0 GiB at peak; "
                "the largest GPU has 24.0 GiB", "giant-sim"),
    )
    return EngineSnapshot(
        taken_at=WALL0, uptime_s=3723.0, source="simulated" if simulated else "nvml",
        simulated=simulated, driver_version=None if simulated else "550.54.15",
        notice="no backends configured: loaded the simulated demo backends"
        if simulated else None,
        gpus=(gpu,), backends=backends, running=running, queued=queued, recent=recent,
        descriptor_errors=(), log=log, stopping=False, pid=40999, python="3.11.9",
    )


def big_snapshot(gpus: int = 4, jobs: int = 50, history_s: float = 600.0,
                 hz: float = 4.0, busy: bool = True) -> EngineSnapshot:
    """``gpus`` GPUs with ``history_s`` of samples each and ``jobs`` jobs (the benchmark).

    ``busy``: 4 jobs running and 26 queued, the rest finished; otherwise all 50 finished
    and the workers idle (the engine at rest).
    """
    base = demo_snapshot()
    total = 81920
    views = []
    for i in range(gpus):
        phase = i * 37.0
        hist = _history(i, total, history_s, hz, MONO0,
                        lambda age, p=phase: 0.5 + 0.35 * math.sin((age + p) / 40.0))
        views.append(GpuView(index=i, name=f"Simulated GPU (80 GiB) #{i}", total_mib=total,
                             used_mib=hist[-1][1], free_mib=total - hist[-1][1],
                             reserved_mib=hist[-1][1] + 2048, ours_mib=hist[-1][1],
                             foreign_mib=0, util_pct=None, temp_c=None, power_w=None,
                             simulated=True, reserve_mib=256, history=hist,
                             budget_mib=_budget(total, total - hist[-1][1],
                                                hist[-1][1] + 2048, 0, 256)))
    backends = tuple(
        _backend(f"model-{i:02d}", ("busy", "ready", "cold")[i % 3],
                 pid=50000 + i if i % 3 != 2 else None, gpu=i % gpus if i % 3 != 2 else None,
                 observed=4096 + 512 * i if i % 3 != 2 else None, declared=8192 + 256 * i,
                 reserved=8192 if i % 3 != 2 else 0, priority=i % 4, served=i * 3,
                 last_used=10.0 * i, keep=300.0 - i if i % 3 == 1 else None,
                 running=int(i % 3 == 0))
        for i in range(12)
    )
    if not busy:
        backends = tuple(replace(b, state="ready" if b.pid else "cold", running=0)
                         for b in backends)
    running, queued, recent = [], [], []
    for i in range(jobs):
        name = backends[i % len(backends)].name
        jid = f"j-{i:010x}"
        if not busy:
            recent.append(_job(jid, name, JobState.SUCCEEDED, submitted=100.0 + i,
                               started=90.0 + i, finished=80.0 + i, progress=1.0,
                               status=200, data=b"{}"))
        elif i < 4:
            running.append(_job(jid, name, JobState.RUNNING, submitted=30.0 + i,
                                started=20.0 + i, progress=(i * 0.23) % 1, text=f"step {i}",
                                gpu=i % gpus))
        elif i < 30:
            queued.append(_job(jid, name, JobState.QUEUED, submitted=10.0 + i, gpu=None,
                               position=i - 3, passed=i % 3, waiting="waiting for memory"))
        else:
            recent.append(_job(jid, name, JobState.SUCCEEDED, submitted=100.0 + i,
                               started=90.0 + i, finished=80.0 + i, progress=1.0,
                               status=200, data=b"{}"))
    return replace(base, gpus=tuple(views), backends=backends, running=tuple(running),
                   queued=tuple(queued), recent=tuple(recent), notice=None)


def ticking(hz: float = 4.0, busy: bool = True
            ) -> tuple[Callable[[EngineSnapshot], EngineSnapshot], Clocks]:
    """An ``advance`` hook that moves the clock and appends one GPU sample per call; when
    ``busy`` the used memory and the running jobs' progress change too."""
    state = {"t": 0.0}

    def offset() -> float:
        return state["t"]

    def advance(snap: EngineSnapshot) -> EngineSnapshot:
        state["t"] += 1.0 / hz
        now = MONO0 + state["t"]
        gpus = []
        for g in snap.gpus:
            used = int(g.total_mib * (0.5 + 0.35 * math.sin(now / 40.0 + g.index))) \
                if busy else g.history[-1][1]
            hist = g.history[1:] + ((now, used),)
            gpus.append(replace(g, history=hist, used_mib=used, free_mib=g.total_mib - used))
        running = tuple(replace(j, progress=((j.progress or 0) + 0.01) % 1)
                        for j in snap.running)
        return replace(snap, gpus=tuple(gpus), running=running,
                       uptime_s=snap.uptime_s + 1.0 / hz, taken_at=WALL0 + state["t"])

    return advance, fixed_clocks(offset)


DEMO_LOG = """\
2026-01-01 11:59:06 sdxl-sim: worker_sdk 0.1.0 starting (pid 41021, python 3.11.9)
2026-01-01 11:59:06 sdxl-sim: connected to the engine (control + data sockets)
2026-01-01 11:59:07 sdxl-sim: initialize: load() ...
2026-01-01 11:59:08 sdxl-sim: simulated VRAM: allocated 6144 MiB on GPU0 (total 6144 MiB)
2026-01-01 11:59:08 sdxl-sim: ready in 1.52 s
2026-01-01 11:59:45 sdxl-sim: request j-ca9ce1ed00: 20 steps
2026-01-01 11:59:45 sdxl-sim: simulated VRAM: allocated 3072 MiB on GPU0 (total 9216 MiB)
2026-01-01 11:59:49 sdxl-sim: request j-ca9ce1ed00 cancelled at step 7
2026-01-01 11:59:49 sdxl-sim: simulated VRAM: freed 3072 MiB on GPU0 (total 6144 MiB)
2026-01-01 11:59:47 sdxl-sim: request j-7f3a91c2d4: 20 steps
2026-01-01 11:59:47 sdxl-sim: simulated VRAM: allocated 3072 MiB on GPU0 (total 9216 MiB)
"""


def write_demo_logs(log_dir: str | Path) -> None:
    """Fixed worker logs for the fixed snapshot (one per demo backend)."""
    path = Path(log_dir)
    path.mkdir(parents=True, exist_ok=True)
    for name in ("echo", "flux-sim", "llm-8b-sim", "sdxl-sim", "whisper-sim"):
        (path / f"{name}.log").write_text(DEMO_LOG.replace("sdxl-sim", name))


# ----------------------------------------------------------------------------- calibration

CAL_JOB = "j-ca11b4a7e0"
CAL_STARTED = 300.0  # seconds before the fixed "now"
CAL_MARKS = ((0.0, "start"), (1.1, "initialize"), (2.8, "settle-load"), (3.8, "predict-1"),
             (6.2, "settle-1"), (7.2, "predict-2"), (9.0, "settle-2"), (10.0, "predict-3"),
             (11.8, "settle-3"), (12.8, "shutdown"), (14.3, "exited"), (15.3, "end"))
CAL_LIVE_S = 8.4  # how far the "live" scene is into the run (in predict-2)


def _cal_level(t: float) -> int | None:
    """The simulated sdxl-sim worker's memory ``t`` s into its calibration: a 512 MiB
    context, 6 GiB of weights streaming in, 3 GiB per request (4 GiB the first time: a
    warm-up), the weights freed at unload; None while no process of it is on the GPU."""
    phase = next(p for m, p in reversed(CAL_MARKS) if m <= t)
    context, weights, activation = 512, 6144, 3072
    if phase == "start":
        return context if t > 0.6 else None
    if phase == "initialize":
        return context + int(weights * min(1.0, max(0.0, (t - 1.1) / 1.6)))
    if phase.startswith("predict"):
        run = int(phase.split("-")[1])
        start = next(m for m, p in CAL_MARKS if p == phase)
        extra = activation + (1024 if run == 1 else 0)
        return context + weights + int(extra * min(1.0, (t - start) / 0.4))
    if phase.startswith("settle"):
        return context + weights
    if phase == "shutdown":
        return context + weights if t < 13.9 else context
    return None


def calibration_record() -> CalibrationRecord:
    """A completed calibration of sdxl-sim, sampled at 20 Hz (what the engine records)."""
    samples = []
    for k in range(int(CAL_MARKS[-1][0] * 20)):
        t = k / 20
        v = _cal_level(t)
        samples.append(CalSample(t, {41077: v} if v is not None else {}, v or 0))
    return CalibrationRecord(
        backend="sdxl-sim", gpu=0, source="simulated", per_process=True, sample_hz=20.0,
        repeats=3, request=b'{"steps": 20}', started_wall=WALL0 - CAL_STARTED,
        samples=tuple(samples), marks=tuple(PhaseMark(t, p) for t, p in CAL_MARKS),
        device_total_mib=24576, outcome="completed")


def write_fixed_calibration(paths: Paths) -> JobView:
    """Write the fixed calibration's report where the engine would (``state/calibration/``)
    and return its finished job, whose result is the summary the engine gives."""
    record = calibration_record()
    report = analyze(record)
    stamp = time.strftime(REPORT_STAMP, time.gmtime(record.started_wall))
    path = paths.calibration_report("sdxl-sim", stamp)
    write_report(path, record, report)
    write_calibrated_overlay(paths.calibration_overlay("sdxl-sim"), report)  # as calibrate does
    summary = {"report": str(path), "outcome": "completed", "error": None,
               **report.summary(), "overlay": str(paths.calibration_overlay("sdxl-sim"))}
    end = CAL_STARTED - CAL_MARKS[-1][0]
    view = _job(CAL_JOB, "sdxl-sim", JobState.SUCCEEDED, priority=10,
                submitted=CAL_STARTED + 2.0, started=CAL_STARTED, finished=end, progress=0.99,
                text="end", data=json.dumps(summary, indent=2).encode(),
                metadata={"repeats": 3, "settle_s": 1.0})
    return replace(view, kind="calibration", status_code=None)


def calibration_running(done: JobView) -> JobView:
    """The same calibration ``CAL_LIVE_S`` seconds in (the "live" scene)."""
    phase = next(p for m, p in reversed(CAL_MARKS) if m <= CAL_LIVE_S)
    started = MONO0 - CAL_LIVE_S
    return replace(done, state=JobState.RUNNING, started_at=started,
                   submitted_at=started - 2.0, finished_at=None, data=None, headers={},
                   progress=0.4, progress_text=phase,
                   history=done.history[:2])


def calibration_progress() -> list[tuple[float, float, str]]:
    """The job events of the live scene: (wall t, fraction, phase), as the app keeps them."""
    t0 = WALL0 - CAL_LIVE_S
    return [(t0 + m, i / 12, p) for i, (m, p) in enumerate(CAL_MARKS) if m <= CAL_LIVE_S]


def calibrating_snapshot(base: EngineSnapshot) -> EngineSnapshot:
    """``base`` while sdxl-sim is being calibrated: GPU0 to itself (the other workers
    evicted, the jobs waiting), its memory the calibration worker's at 20 Hz."""
    gpu = base.gpus[0]
    start = MONO0 - CAL_LIVE_S
    hist = [p for p in gpu.history if p[0] < start - 1.0]
    hist += [(start - 1.0 + k / 20, 0) for k in range(20)]
    hist += [(start + k / 20, _cal_level(k / 20) or 0) for k in range(int(CAL_LIVE_S * 20) + 1)]
    used = hist[-1][1]
    gpu = replace(gpu, history=tuple(hist), used_mib=used, free_mib=gpu.total_mib - used,
                  ours_mib=0, foreign_mib=used, reserved_mib=0)
    backends = tuple(replace(b, state="cold", pid=None, gpu=None, observed_mib=None,
                             reserved_mib=0, running=0, keep_alive_left_s=None, features=())
                     for b in base.backends)
    return replace(base, gpus=(gpu,), backends=backends, running=())
