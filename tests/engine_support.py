"""Shared helpers for engine tests: isolated paths (``scratch_dir``), descriptors of simulated
models, polling."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from supervisor import Supervisor
from supervisor.engine import EngineConfig
from supervisor.events import EngineEvent
from supervisor.gpu.sim import SimulatedProbe
from supervisor.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
SIMMODEL = ROOT / "examples" / "demo" / "simmodel.py"
T = TypeVar("T")


def scratch_dir(prefix: str = "vt-") -> Path:
    """A fresh directory under /tmp (short socket paths), removed when this process exits,
    whatever the test did with it; ``VRAMTUI_TEST_KEEP=1`` keeps them all, to read a failed
    run's logs. (A suite run left some 200 of them behind.)"""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    if os.environ.get("VRAMTUI_TEST_KEEP") != "1":
        atexit.register(shutil.rmtree, path, True)
    return path


def sim_backend(name: str, weights: int, activation: int, *, load_s: float = 0.05,
                steps: int = 2, step_s: float = 0.02, context: int = 256,
                **extra: Any) -> dict[str, Any]:
    """An honest descriptor for the simulated model holding ``weights`` + ``activation`` MiB
    (plus the simulated GPU's CUDA context of ``context`` MiB per process)."""
    spec: dict[str, Any] = {
        "name": name,
        "script": str(SIMMODEL),
        "vram": {"weights": f"{weights}MiB", "activation": f"{activation}MiB",
                 "context": f"{context}MiB"},
        "safety": "128MiB",
        "env": {
            "SIM_WEIGHTS_MIB": str(weights),
            "SIM_ACTIVATION_MIB": str(activation),
            "SIM_LOAD_S": str(load_s),
            "SIM_STEPS": str(steps),
            "SIM_STEP_S": str(step_s),
        },
        "timeouts": {"stop_grace": "3s", "start": "20s"},
    }
    spec.update(extra)
    return spec


@contextmanager
def engine(backends: list[dict[str, Any]], gpus: str = "sim:8GiB",
           config: EngineConfig | None = None, root: Path | None = None
           ) -> Iterator[Supervisor]:
    """A started embedded engine with its own config/state/runtime directories (under
    ``root``: another engine there later is this one restarted); with no ``backends``,
    nothing is configured (no file named: the engine loads the demo)."""
    root = root or scratch_dir()
    env = dict(os.environ)
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    env.pop("VRAMTUI_BACKENDS", None)
    named = []
    if backends:
        named.append(root / "backends.yaml")
        named[0].write_text(yaml.safe_dump({"backends": backends}))
    sup = Supervisor.from_config(gpus=gpus, backends=named, environ=env,
                                 paths=Paths.from_env(env),
                                 config=config or EngineConfig(reserve_mib=0, tick_s=0.1))
    sup.start_in_thread()
    try:
        yield sup
    finally:
        sup.stop(timeout=30)


@dataclass
class Episode:
    """An interval during which a simulated GPU's real usage was over its total."""

    gpu: int
    start: float  # monotonic time of the first sample over the total
    end: float | None = None  # of the first sample back under it (None: still over)
    peak_mib: int = 0
    total_mib: int = 0
    backends: set[str] = field(default_factory=set)  # whose processes were on it, from /proc
    workers: set[tuple[str, int]] = field(default_factory=set)  # (backend, pid)

    @property
    def duration_s(self) -> float:
        return (self.end if self.end is not None else time.monotonic()) - self.start


def backend_of(pid: int) -> str | None:
    """The backend a worker process serves, read from its own environment in /proc."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in environ.split(b"\0"):
        if item.startswith(b"VRAMTUI_BACKEND="):
            return item.split(b"=", 1)[1].decode(errors="replace")
    return None


class UsageWatcher:
    """Reads the simulated GPU independently of the engine and records every over-commit.

    It reads the device's own per-process ledger (``SimulatedProbe`` on the engine's ledger
    directory), never the engine's snapshot, on its own thread at ``hz``.
    """

    def __init__(self, sup: Supervisor, spec: str, hz: float = 50.0) -> None:
        self.probe = SimulatedProbe(spec, sup.paths.sim_dir)
        self.period = 1.0 / hz
        self.samples = 0
        self.overcommits: list[tuple[int, int, int]] = []
        self.max_used: dict[int, int] = {}
        self._episodes: list[Episode] = []
        self._open: dict[int, Episode] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UsageWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def episodes(self) -> list[Episode]:
        return list(self._episodes)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            now = time.monotonic()
            procs = self.probe.processes()
            used: dict[int, int] = {}
            for p in procs:
                used[p.gpu_index] = used.get(p.gpu_index, 0) + (p.used_mib or 0)
            for i, total in enumerate(self.probe.sizes_mib):
                self.samples += 1
                mib = used.get(i, 0)
                self.max_used[i] = max(self.max_used.get(i, 0), mib)
                if mib > total:
                    self.overcommits.append((i, mib, total))
                    episode = self._open.get(i)
                    if episode is None:
                        episode = self._open[i] = Episode(i, now, total_mib=total)
                        self._episodes.append(episode)
                    episode.peak_mib = max(episode.peak_mib, mib)
                    for p in procs:
                        name = backend_of(p.pid)
                        if p.gpu_index == i and name is not None:
                            episode.backends.add(name)
                            episode.workers.add((name, p.pid))
                elif i in self._open:
                    self._open.pop(i).end = now


PYTHON = sys.executable


@dataclass
class Played:
    """A trace played through the real engine (see ``play_trace``)."""

    makespan_s: float  # first submission to the last end, wall clock
    loads: int  # workers started
    waits: dict[int, list[float]]  # priority -> each job's submission to its start
    job_waits: dict[str, float]  # trace job id -> its submission to its start
    states: dict[str, str]  # trace job id -> its final state
    reasons: list[str]  # why jobs waited, as their views said while the trace played
    log: list[str]
    submitted: dict[str, float]  # trace job id -> when the engine took it (from the first)
    ended: dict[str, float]  # trace job id -> when it ended (from the first submission)

    def largest_gap(self, ids: list[str]) -> float:
        """The longest time between two of these jobs' submissions, as the engine saw them
        (a loaded box can hold the player's pacing up: a gap the trace does not have)."""
        times = sorted(self.submitted[i] for i in ids)
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


def play_trace(trace: Any, gpus: str, *, step_s: float = 0.1,
               watch: tuple[str, ...] = ()) -> Played:
    """Play ``trace`` (a ``supervisor.tracesim.Trace``) through the real engine with real
    simulated workers: each backend a ``simmodel`` of its load time and memory, each job
    submitted at its arrival time (the arrivals are the pacing, not a wait for a condition;
    those of one instant by priority, as one step of the simulator takes them) running its
    duration in steps of ``step_s``. ``watch``: trace job ids whose waiting
    reason is read after each submission."""
    specs = []
    for b in trace.backends:
        spec = sim_backend(b.name, b.resident_mib - 256, b.activation_mib, load_s=b.load_s,
                           steps=1, step_s=step_s, priority=b.priority)
        spec.update(safety=f"{b.safety_mib}MiB", keep_alive="10m")
        if b.target_wait_s is not None:
            spec["target_wait"] = f"{b.target_wait_s}s"
        specs.append(spec)
    order = sorted(trace.jobs, key=lambda j: (j.at, -j.priority, j.id))  # as the simulator
    ids: dict[str, str] = {}
    reasons: list[str] = []
    with engine(specs, gpus=gpus) as sup:
        t0 = time.monotonic()
        for j in order:
            delay = t0 + j.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the arrival process itself
            steps = max(1, round(j.duration_s / step_s))
            ids[j.id] = sup.submit(j.backend, f'{{"steps": {steps}, "step_s": {step_s}}}'
                                   .encode(), priority=j.priority)
            for w in watch:
                if w in ids and (text := sup.job(ids[w]).waiting):
                    reasons.append(text)
        views = {tid: sup.wait(jid, 600) for tid, jid in ids.items()}
        log = [line.text for line in sup.snapshot().log]
    first = min(v.submitted_at for v in views.values())
    last = max(v.finished_at or v.submitted_at for v in views.values())
    waits: dict[int, list[float]] = {}
    for v in views.values():
        if v.started_at is not None:
            waits.setdefault(v.priority, []).append(v.started_at - v.submitted_at)
    job_waits = {tid: v.started_at - v.submitted_at for tid, v in views.items()
                 if v.started_at is not None}
    return Played(last - first, sum(1 for text in log if text.startswith("starting ")),
                  waits, job_waits, {tid: v.state.value for tid, v in views.items()}, reasons,
                  log, {tid: v.submitted_at - first for tid, v in views.items()},
                  {tid: v.finished_at - first for tid, v in views.items()
                   if v.finished_at is not None})


def sleep_events(sup: Any) -> list[EngineEvent]:
    """The engine's ``sleep`` events from now on, as they are published (a list that grows)."""
    seen: list[EngineEvent] = []
    lock = threading.Lock()

    def add(event: EngineEvent) -> None:
        with lock:
            seen.append(event)

    sup.subscribe(kinds=["sleep"], callback=add)
    return seen
