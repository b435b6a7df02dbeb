"""A randomized, engine-level checker of admission, with a truth the engine does not compute.

Each scenario draws simulated GPUs, backends described in every form a user may write (a
peak alone, peak + weights, weights + activation, with a context, peak + activation, a vramd
``version: 2`` file, nothing at all; a third of them with a ``target_wait``), honest ones
and — in a dishonest scenario — one that declares far less than it takes, and a trace of
jobs with priorities and cancels. It runs the real engine on the simulated GPU, with real
worker processes (``examples/demo/simmodel.py`` holding simulated memory), while a watcher
thread reads the simulated device's own per-process ledger at ``watch_hz`` (not the
engine's snapshot) and attributes every over-commit to backends from the workers'
environments in /proc.

Properties (``Verdict.problems`` names each one that broke):

- honest: no instant over a GPU's total;
- dishonest: each over-commit ends within ``episode_limit_s`` and never recurs for a backend;
- no stall: never longer than ``stall_s`` with jobs queued and nothing running, starting or
  stopping (a process of ours still holding memory on its way out counts as stopping; a job
  held, with that reason, for a request a higher-priority stream is expected to send counts
  as waiting by decision for up to ``HELD_S``);
- every job final: succeeded, or cancelled when a cancel was asked, or failed with a reason
  for a liar's job; none left waiting.

``tests/test_admission_random.py`` runs a few fixed seeds; ``scripts/admission-soak`` runs
as many as asked.  Its host mode, on real memory with /proc as the oracle, is
``tests/host_checker.py`` (``scripts/host-soak``).
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml
from engine_support import scratch_dir

from supervisor import JobState, Supervisor
from supervisor.engine import EngineConfig
from supervisor.gpu.sim import SimulatedProbe
from supervisor.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
SIMMODEL = ROOT / "examples" / "demo" / "simmodel.py"
CONTEXT_MIB = 256  # what the simulated GPU adds per process
FORMS = ("peak", "peak+weights", "weights+activation", "context", "peak+activation",
         "vramd", "none")


@dataclass
class BackendPlan:
    name: str
    form: str
    weights: int  # what its worker really allocates at initialize (MiB)
    activation: int  # ... and per job
    load_s: float
    step_s: float
    honest: bool = True

    def env(self) -> dict[str, str]:
        return {"SIM_WEIGHTS_MIB": str(self.weights), "SIM_ACTIVATION_MIB": str(self.activation),
                "SIM_LOAD_S": f"{self.load_s:.3f}", "SIM_STEP_S": f"{self.step_s:.3f}",
                "SIM_STEPS": "3"}

    def vram(self, rng: random.Random) -> Any:
        """What its descriptor declares: the truth plus a margin, or a lie."""
        w, a = self.weights, self.activation
        if not self.honest:
            return {"weights": f"{max(1, w // 6)}MiB", "activation": f"{max(1, a // 6)}MiB"}
        margin = rng.choice((0, 0, 64, 256))
        peak = w + a + CONTEXT_MIB + margin
        resident = w + CONTEXT_MIB
        return {
            "peak": f"{peak}MiB",
            "peak+weights": {"peak": f"{peak}MiB", "weights": f"{resident}MiB"},
            "weights+activation": {"weights": f"{resident}MiB", "activation": f"{a + margin}MiB"},
            "context": {"weights": f"{w}MiB", "activation": f"{a + margin}MiB",
                        "context": f"{CONTEXT_MIB}MiB"},
            "peak+activation": {"peak": f"{peak}MiB", "activation": f"{a}MiB"},
            "vramd": peak,
            "none": None,
        }[self.form]


@dataclass
class JobPlan:
    at: float  # seconds after the first submit
    backend: str
    steps: int
    priority: int
    cancel_after: float | None = None


@dataclass
class Scenario:
    seed: int
    gpus: list[int]  # MiB each
    backends: list[BackendPlan]
    jobs: list[JobPlan]
    honest: bool
    descriptors: dict[str, Any] = field(default_factory=dict)  # file name -> YAML document

    @property
    def spec(self) -> str:
        return ",".join(f"sim:{mib}MiB" for mib in self.gpus)

    def describe(self) -> str:
        parts = [f"seed {self.seed}", self.spec,
                 "honest" if self.honest else "dishonest"]
        parts += [f"{b.name}:{b.form}{'' if b.honest else '(liar)'} {b.weights}+{b.activation}"
                  for b in self.backends]
        return ", ".join(parts) + f"; {len(self.jobs)} jobs"


def make_scenario(seed: int, *, honest: bool, jobs: int = 24) -> Scenario:
    rng = random.Random(seed)
    gpus = [rng.choice((6144, 8192, 12288, 16384)) for _ in range(rng.choice((1, 1, 2)))]
    smallest = min(gpus)
    n = rng.randint(3, 5)
    # Forms drawn with replacement: two peak-only backends competing for one GPU is the case
    # that overcommitted and stalled the first landing.
    forms = [rng.choice(FORMS) for _ in range(n)]
    backends: list[BackendPlan] = []
    for i in range(n):
        room = int(smallest * 0.8) - CONTEXT_MIB - 512 - 256  # safety and margin must fit
        weights = rng.randint(int(room * 0.2), max(256, int(room * 0.7)))
        activation = rng.randint(128, max(128, room - weights))
        backends.append(BackendPlan(f"b{i}", forms[i], weights, activation,
                                    rng.uniform(0.05, 0.4), rng.uniform(0.02, 0.06)))
    if not honest:
        liar = rng.randrange(n)
        b = backends[liar]
        b.honest, b.form = False, "weights+activation"
        b.activation = max(b.activation, int(smallest * 0.55))  # big enough to over-commit
        b.weights = min(b.weights, int(smallest * 0.2))
    plans = []
    t = 0.0
    for _ in range(jobs):
        t += rng.expovariate(12.0)
        cancel = rng.uniform(0.0, 0.8) if rng.random() < 0.15 else None
        plans.append(JobPlan(round(t, 3), rng.choice(backends).name, rng.randint(2, 6),
                             rng.choice((0, 0, 0, 5)), cancel))
    sc = Scenario(seed, gpus, backends, plans, honest)
    ours = []
    vramd = []
    # (drawn apart, so the seeds' other draws stay as they were) a target wait that lets a
    # request wait for a load of lower work rather than give it up (issue 28)
    waits = random.Random(f"target-{seed}")
    for b in backends:
        vram = b.vram(rng)
        if b.form == "vramd":
            vramd.append({"name": b.name, "vram_mib": vram, "runtime": {
                "command": [sys.executable, "-m", "worker_sdk", str(SIMMODEL)], "env": b.env()},
                "keep_alive": "30s", "timeouts": {"stop_grace": "3s"}})
            continue
        entry: dict[str, Any] = {"name": b.name, "script": str(SIMMODEL), "env": b.env(),
                                 "safety": f"{rng.choice((128, 256, 512))}MiB",
                                 "keep_alive": "30s",
                                 "timeouts": {"stop_grace": "3s", "start": "30s"}}
        if vram is not None:
            entry["vram"] = vram
        if waits.random() < 1 / 3:
            entry["target_wait"] = waits.choice(("5s", "30s"))
        ours.append(entry)
    sc.descriptors["backends.yaml"] = {"backends": ours}
    if vramd:
        sc.descriptors["vramd.yaml"] = {"version": 2, "backends": vramd}
    return sc


# --------------------------------------------------------------------------- watching


@dataclass
class Episode:
    gpu: int
    start: float
    end: float | None = None
    peak_mib: int = 0
    backends: set[str] = field(default_factory=set)
    workers: set[tuple[str, int]] = field(default_factory=set)  # (backend, pid)

    @property
    def duration_s(self) -> float:
        return (self.end if self.end is not None else time.monotonic()) - self.start


def backend_of(pid: int, cache: dict[int, str | None]) -> str | None:
    """The backend process ``pid`` works for (its ``VRAMTUI_BACKEND``), kept once known.  A
    process on its way out reads as an empty environment: nothing is kept from that, so a pid
    named while it lived stays named as it exits (the watcher names each pid at first sight)."""
    if pid not in cache:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return None
        if not environ:
            return None
        cache[pid] = next((item.split(b"=", 1)[1].decode() for item in environ.split(b"\0")
                           if item.startswith(b"VRAMTUI_BACKEND=")), None)
    return cache[pid]


#: Why a job waits when the scheduler holds it for an expected request (issue 28), and how
#: long such a hold, with nothing else going on, may last before the checker counts it as a
#: stall: with nothing else on the GPU, a stream of few gaps (every stream in these traces,
#: whose requests all come within about 2 s) holds a job for a silence of at most 3 of its
#: mean gaps or one mistake's cost (``expect.hold``): an unmeasured job's load and run at
#: twice a reload each and the victim's reload, 5 s for the default 1 s reload; plus margin
#: for reloads measured slower on a loaded machine.
HOLD_REASON = "expects a request within"
HELD_S = 8.0


class Watching:
    """A reader on its own thread for the span of a ``with`` block: ``_run`` until ``_stop``."""

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        raise NotImplementedError


class DeviceWatcher(Watching):
    """Reads the simulated device's ledger on its own thread; records over-commit episodes."""

    def __init__(self, spec: str, ledger: Path, hz: float) -> None:
        super().__init__("device-watcher")
        self.probe = SimulatedProbe(spec, ledger)
        self.period = 1.0 / hz
        self.samples = 0
        self.holders: frozenset[int] = frozenset()  # the pids holding memory at the last read
        self.episodes: list[Episode] = []
        self.max_used: dict[int, int] = {}
        self._open: dict[int, Episode] = {}
        self._names: dict[int, str | None] = {}

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            procs = self.probe.processes()
            used: dict[int, int] = {}
            for p in procs:
                used[p.gpu_index] = used.get(p.gpu_index, 0) + (p.used_mib or 0)
            self.samples += 1
            self.holders = frozenset(p.pid for p in procs if p.used_mib)
            for p in procs:  # at first sight, while it lives: an exiting one has no environ
                backend_of(p.pid, self._names)
            for i, total in enumerate(self.probe.sizes_mib):
                mib = used.get(i, 0)
                self.max_used[i] = max(self.max_used.get(i, 0), mib)
                if mib > total:
                    ep = self._open.get(i)
                    if ep is None:
                        ep = self._open[i] = Episode(i, now)
                        self.episodes.append(ep)
                    ep.peak_mib = max(ep.peak_mib, mib)
                    for p in procs:
                        name = backend_of(p.pid, self._names)
                        if p.gpu_index == i and name is not None:
                            ep.backends.add(name)
                            ep.workers.add((name, p.pid))
                elif i in self._open:
                    self._open.pop(i).end = now
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.monotonic()))


class StallWatch(Watching):
    """Reads the engine's snapshot on its own thread: the longest time jobs were queued with
    nothing running, starting or stopping.  ``dying(snapshot)``: a process of ours still holds
    memory on its way out (a killed liar exiting), which the engine rightly waits for.  A job
    held, with its reason, for a request a higher-priority stream is expected to send (issue
    28's policy) waits by decision, not a stall, up to ``HELD_S``."""

    def __init__(self, sup: Supervisor,
                 dying: Callable[[Any], bool] = lambda snap: False) -> None:
        super().__init__("stall-watch")
        self.sup, self.dying = sup, dying
        self.longest = 0.0
        self.longest_held = 0.0  # the longest such hold with nothing else going on
        self._since: float | None = None
        self._held_since: float | None = None

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                snap = self.sup.snapshot()
            except Exception:  # noqa: BLE001 - the engine may be stopping
                return
            now = time.monotonic()
            busy = any(b.state in ("starting", "initializing", "stopping")
                       for b in snap.backends) or self.dying(snap)
            held = any(HOLD_REASON in (q.waiting or "") for q in snap.queued)
            idle = not snap.running and not busy
            self._held_since = (self._held_since or now) if held and idle else None
            if self._held_since is not None:
                self.longest_held = max(self.longest_held, now - self._held_since)
                if now - self._held_since <= HELD_S:
                    busy = True
            if snap.queued and not snap.running and not busy:
                self._since = self._since or now
                self.longest = max(self.longest, now - self._since)
            else:
                self._since = None


# --------------------------------------------------------------------------- running


@dataclass
class Verdict:
    scenario: Scenario
    problems: list[str]
    outcomes: dict[str, int]
    episodes: list[Episode]
    longest_stall_s: float
    longest_held_s: float  # the longest hold for an expected request with nothing else going on
    watch_samples: int
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.problems


def run_scenario(sc: Scenario, *, watch_hz: float = 200.0, episode_limit_s: float = 0.5,
                 stall_s: float = 3.0, deadline_s: float = 120.0,
                 log: Callable[[str], None] | None = None) -> Verdict:
    root = scratch_dir("vt-chk-")
    files = []
    for name, doc in sc.descriptors.items():
        path = root / name
        path.write_text(yaml.safe_dump(doc))
        files.append(path)
    env = dict(os.environ)
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    env.pop("VRAMTUI_BACKENDS", None)
    sup = Supervisor.from_config(gpus=sc.spec, backends=files, environ=env,
                                 paths=Paths.from_env(env),
                                 config=EngineConfig(reserve_mib=0, tick_s=0.1, journal=False))
    problems: list[str] = []
    if sup.engine.descriptors.errors:
        problems.append(f"descriptor errors: {sup.engine.descriptors.errors}")
    started = time.monotonic()
    ids: dict[str, JobPlan] = {}
    cancelled: set[str] = set()
    longest_stall = longest_held = 0.0
    sup.start_in_thread()
    try:
        with DeviceWatcher(sc.spec, sup.paths.sim_dir, watch_hz) as watcher:
            def dying(snap: Any) -> bool:
                live = {b.pid for b in snap.backends if b.pid is not None}
                return bool(watcher.holders - live)

            stalls = StallWatch(sup, dying).__enter__()
            t0 = time.monotonic()
            timers: list[threading.Timer] = []
            for plan in sc.jobs:
                delay = plan.at - (time.monotonic() - t0)
                if delay > 0:
                    time.sleep(delay)  # the trace's own arrival times, not a wait for a state
                payload = json.dumps({"steps": plan.steps}).encode()
                job_id = sup.submit(plan.backend, payload, priority=plan.priority)
                ids[job_id] = plan
                if plan.cancel_after is not None:
                    def cancel(j: str = job_id) -> None:
                        cancelled.add(j)
                        sup.cancel(j)
                    timer = threading.Timer(plan.cancel_after, cancel)
                    timer.start()
                    timers.append(timer)
            for timer in timers:
                timer.join()
            finals = {}
            for job_id in ids:
                left = max(1.0, deadline_s - (time.monotonic() - started))
                try:
                    finals[job_id] = sup.wait(job_id, left)
                except Exception as exc:  # noqa: BLE001 - reported as a problem
                    problems.append(f"job {job_id} ({ids[job_id].backend}) not final: {exc}")
            stalls.__exit__()
            longest_stall, longest_held = stalls.longest, stalls.longest_held
        liars = {b.name for b in sc.backends if not b.honest}
        outcomes: dict[str, int] = {}
        for job_id, view in finals.items():
            outcomes[view.state.value] = outcomes.get(view.state.value, 0) + 1
            backend = ids[job_id].backend
            if view.state is JobState.SUCCEEDED:
                continue
            if view.state is JobState.CANCELLED and job_id in cancelled:
                continue
            if view.state is JobState.FAILED and backend in liars and view.error:
                continue
            problems.append(f"job {job_id} ({backend}) ended {view.state.value}: {view.error}")
        if sc.honest and watcher.episodes:
            problems.append(f"over-committed in an honest scenario: {_episodes(watcher)}")
        if not sc.honest:
            # One incident per liar worker: from its first over-commit to its last one (the
            # device may dip under its total in between); a later one by another worker of
            # the same backend is a recurrence.
            incidents: dict[tuple[str, int], list[Episode]] = {}
            for ep in watcher.episodes:
                culprits = {w for w in ep.workers if w[0] in liars}
                if not culprits:
                    problems.append(f"an over-commit without the liar: {_episodes(watcher)}")
                for worker in culprits:
                    incidents.setdefault(worker, []).append(ep)
            by_backend: dict[str, list[int]] = {}
            for (backend, pid), eps in incidents.items():
                span = max(e.start + e.duration_s for e in eps) - min(e.start for e in eps)
                if span > episode_limit_s:
                    problems.append(f"{backend} (pid {pid}) over-committed the device for "
                                    f"{span:.3f} s (limit {episode_limit_s} s): "
                                    f"{_episodes(watcher)}")
                by_backend.setdefault(backend, []).append(pid)
            for backend, pids in by_backend.items():
                if len(pids) > 1:
                    problems.append(f"an over-commit recurred for {backend} (workers {pids}): "
                                    f"{_episodes(watcher)}")
        if longest_stall > stall_s:
            problems.append(f"stalled {longest_stall:.1f} s with jobs queued and nothing "
                            "running, starting or stopping")
        if watcher.samples < 50:
            problems.append(f"the watcher read the device only {watcher.samples} times")
        episodes, samples = list(watcher.episodes), watcher.samples
    finally:
        sup.stop(timeout=30)
    if problems and log is not None:
        for line in sup.engine.notes.lines:
            log(f"  {line.level}: {line.text}")
    return Verdict(sc, problems, outcomes, episodes, longest_stall, longest_held, samples,
                   time.monotonic() - started)


def _episodes(watcher: DeviceWatcher) -> str:
    return "; ".join(f"GPU{e.gpu} {e.peak_mib} MiB for {e.duration_s:.3f} s "
                     f"({', '.join(sorted(e.backends))})" for e in watcher.episodes[:5])
