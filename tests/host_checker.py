"""The randomized admission checker's host mode: real memory, with /proc as the oracle.

Each scenario draws a host device budget (``host:<SIZE>``), backends whose workers really
allocate and touch memory (``tests/workers/hostmem.py``: weights at initialize, an activation
per job) declared honestly in the forms a user writes (a peak, a peak and the weights, nothing
at all — learned), and a trace of jobs with random lengths and arrival times.  It runs the
real engine while a watcher thread reads /proc on its own (never the engine's view): every
process whose environment says it is a worker of this engine (``VRAMTUI_ENGINE_PID``), its
PSS from ``smaps_rollup``, summed.

Properties (``HostVerdict.problems`` names each one that broke):

- the sum of the workers' PSS never exceeds the budget;
- every job succeeds; none is left waiting;
- no stall: never longer than ``stall_s`` with jobs queued and nothing running, starting or
  stopping.

``tests/test_host_checker.py`` runs one fixed seed with sizes of tens of MiB;
``scripts/host-soak`` runs as many as asked, as large as asked (``--scale``).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from admission_checker import StallWatch, Watching
from engine_support import scratch_dir

from supervisor import JobState, Supervisor
from supervisor.engine import EngineConfig
from supervisor.gpu.host import ENGINE_MARK
from supervisor.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
HOSTMEM = ROOT / "tests" / "workers" / "hostmem.py"
CONTEXT_MIB = 64  # what a worker's interpreter and libraries take at most (PSS), declared
FORMS = ("peak", "peak+weights", "none")


@dataclass
class HostBackend:
    name: str
    form: str
    weights: int  # MiB its worker allocates and touches at initialize
    activation: int  # ... and per job

    def descriptor(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name, "script": str(HOSTMEM), "safety": "8MiB", "keep_alive": "30s",
            "env": {"HOSTMEM_WEIGHTS_MIB": str(self.weights),
                    "HOSTMEM_ACTIVATION_MIB": str(self.activation)},
            "timeouts": {"stop_grace": "3s", "start": "30s"},
        }
        peak = f"{self.weights + self.activation + CONTEXT_MIB}MiB"
        if self.form == "peak":
            entry["vram"] = peak
        elif self.form == "peak+weights":
            entry["vram"] = {"peak": peak, "weights": f"{self.weights + CONTEXT_MIB}MiB"}
        return entry


@dataclass
class HostJob:
    at: float  # seconds after the first submit
    backend: str
    step_s: float


@dataclass
class HostScenario:
    seed: int
    budget_mib: int
    backends: list[HostBackend]
    jobs: list[HostJob]

    @property
    def spec(self) -> str:
        return f"host:{self.budget_mib}MiB"

    def describe(self) -> str:
        return ", ".join([f"seed {self.seed}", self.spec] + [
            f"{b.name}:{b.form} {b.weights}+{b.activation}" for b in self.backends]) \
            + f"; {len(self.jobs)} jobs"


def make_host_scenario(seed: int, *, jobs: int = 12, scale: int = 1) -> HostScenario:
    """Sizes of tens of MiB times ``scale``; every backend fits the budget alone, not all
    together: admission has to choose, evict and queue."""
    rng = random.Random(seed)
    n = rng.randint(3, 4)
    backends = []
    for i in range(n):
        weights = rng.randint(10, 60) * scale
        activation = rng.randint(5, 30) * scale
        backends.append(HostBackend(f"h{i}", rng.choice(FORMS), weights, activation))
    biggest = max(b.weights + b.activation + CONTEXT_MIB + 8 for b in backends)
    budget = rng.randint(biggest, biggest + 40 * scale)
    t = 0.0
    plans = []
    for _ in range(jobs):
        t += rng.expovariate(6.0)
        plans.append(HostJob(round(t, 3), rng.choice(backends).name,
                             round(rng.uniform(0.05, 0.3), 3)))
    return HostScenario(seed, budget, backends, plans)


# --------------------------------------------------------------------------- the oracle


def pss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            data = f.read()
    except OSError:
        return None
    for line in data.splitlines():
        if line.startswith(b"Pss:"):
            return int(line.split()[1]) / 1024
    return None


class ProcOracle(Watching):
    """Reads /proc on its own thread: the PSS of every worker of engine ``engine_pid``."""

    def __init__(self, engine_pid: int, hz: float = 50.0) -> None:
        super().__init__("proc-oracle")
        self.mark = f"{ENGINE_MARK}={engine_pid}".encode()
        self.period = 1.0 / hz
        self.samples = 0
        self.max_mib = 0.0
        self.over: list[tuple[float, float]] = []  # (t, MiB) above the budget
        self.budget_mib = 0
        self._ours: dict[int, bool] = {}  # pid -> a worker of ours (by its environment)

    def _is_ours(self, pid: int) -> bool:
        if pid not in self._ours:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    self._ours[pid] = self.mark in f.read().split(b"\0")
            except OSError:
                return False
        return self._ours[pid]

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
            alive = set(pids)
            self._ours = {p: v for p, v in self._ours.items() if p in alive}
            total = sum(pss_mib(p) or 0.0 for p in pids if self._is_ours(p))
            self.samples += 1
            self.max_mib = max(self.max_mib, total)
            if total > self.budget_mib:
                self.over.append((time.monotonic(), total))


# --------------------------------------------------------------------------- running


@dataclass
class HostVerdict:
    scenario: HostScenario
    problems: list[str]
    max_pss_mib: float
    samples: int
    wall_s: float
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def run_host_scenario(sc: HostScenario, *, stall_s: float = 3.0,
                      deadline_s: float = 120.0) -> HostVerdict:
    root = scratch_dir("vt-hchk-")
    desc = root / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": [b.descriptor() for b in sc.backends]}))
    env = dict(os.environ)
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    env.pop("VRAMTUI_BACKENDS", None)
    sup = Supervisor.from_config(gpus=sc.spec, backends=[desc], environ=env,
                                 paths=Paths.from_env(env),
                                 config=EngineConfig(reserve_mib=0, tick_s=0.1, journal=False))
    problems: list[str] = []
    if sup.engine.descriptors.errors:
        problems.append(f"descriptor errors: {sup.engine.descriptors.errors}")
    started = time.monotonic()
    outcomes: dict[str, int] = {}
    sup.start_in_thread()
    try:
        with ProcOracle(os.getpid()) as oracle:
            oracle.budget_mib = sc.budget_mib
            stalls = StallWatch(sup).__enter__()
            t0 = time.monotonic()
            ids: dict[str, HostJob] = {}
            for plan in sc.jobs:
                delay = plan.at - (time.monotonic() - t0)
                if delay > 0:
                    time.sleep(delay)  # the trace's own arrival times, not a wait for a state
                job = sup.submit(plan.backend, json.dumps({"step_s": plan.step_s}).encode())
                ids[job] = plan
            for job_id, plan in ids.items():
                left = max(1.0, deadline_s - (time.monotonic() - started))
                view = sup.wait(job_id, left)
                outcomes[view.state.value] = outcomes.get(view.state.value, 0) + 1
                if view.state is not JobState.SUCCEEDED:
                    problems.append(f"job {job_id} ({plan.backend}) ended "
                                    f"{view.state.value}: {view.error}")
            stalls.__exit__()
        if oracle.over:
            worst = max(mib for _t, mib in oracle.over)
            problems.append(f"the workers' PSS summed to {worst:.0f} MiB, over the "
                            f"{sc.budget_mib} MiB budget, in {len(oracle.over)} reading(s)")
        if stalls.longest > stall_s:
            problems.append(f"stalled {stalls.longest:.1f} s with jobs queued and nothing "
                            "running, starting or stopping")
        if oracle.samples < 20:
            problems.append(f"the oracle read /proc only {oracle.samples} times")
    finally:
        sup.stop(timeout=30)
    return HostVerdict(sc, problems, oracle.max_mib, oracle.samples,
                       time.monotonic() - started, outcomes)


if __name__ == "__main__":  # one scenario by hand: python tests/host_checker.py SEED
    verdict = run_host_scenario(make_host_scenario(int(sys.argv[1]) if sys.argv[1:] else 1))
    print(verdict.scenario.describe(), verdict.problems or "ok", f"{verdict.max_pss_mib:.0f}")
