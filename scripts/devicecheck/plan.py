"""What the device check runs: the sizes of each step and the backends file of the engine.

Everything is sized from the card (its total memory), so the same plan fits an 8 GiB card,
an H200 and a simulated GPU.  The trace's backends each peak at half the card, so their peaks
sum to twice the card: they cannot all be resident, and the engine must queue and evict.
Pure, standard library only; the backends file is JSON (which YAML reads as it is).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SIM_CONTEXT_MIB = 256  # what the simulated GPU charges per process (supervisor.gpu.sim)
GUESSED_CONTEXT_MIB = 1024  # a real context's size before the probe has measured it
CONTEXT_MARGIN_MIB = 64  # declared on top of the measured context (processes differ a little)
TRACE_PEAK_SHARES = (0.35, 0.15, 0.30, 0.20)  # of twice the card: they sum to 2x
TRACE_WEIGHT_SHARES = (0.6, 0.4, 0.7, 0.5)  # weights' share of each peak less its context
CALIBRATE_NAME = "dc-calibrate"
SERVER_NAME = "dc-server"  # an HTTP model server (examples/cuda_alloc/server.py), its memory
# held by a child process: the engine must measure the server's process tree


@dataclass(frozen=True)
class Sizes:
    weights_mib: int
    activation_mib: int
    load_s: float
    steps: int
    step_s: float

    def env(self) -> dict[str, str]:
        return {"CUDA_ALLOC_WEIGHTS_MIB": str(self.weights_mib),
                "CUDA_ALLOC_ACTIVATION_MIB": str(self.activation_mib),
                "CUDA_ALLOC_LOAD_S": f"{self.load_s:g}",
                "CUDA_ALLOC_STEPS": str(self.steps),
                "CUDA_ALLOC_STEP_S": f"{self.step_s:g}"}


@dataclass(frozen=True)
class TraceBackend:
    """A trace backend peaking at ``peak_mib`` (context included), ``weight_share`` of the
    rest being weights and the remainder activation."""

    name: str
    peak_mib: int
    weight_share: float
    priority: int

    def split(self, context_mib: int) -> tuple[int, int]:
        """(weights, activation) MiB once the context is known."""
        body = max(0, self.peak_mib - context_mib)
        weights = int(body * self.weight_share)
        return weights, body - weights


@dataclass(frozen=True)
class Plan:
    simulated: bool
    gpu: int
    total_mib: int
    probe: Sizes
    calibrate: Sizes
    repeats: int
    settle_s: float
    trace: tuple[TraceBackend, ...]
    rounds: int
    trace_steps: int
    trace_step_s: float
    trace_timeout_s: float
    sim_spec: str = ""
    extra_env: dict[str, str] = field(default_factory=dict)
    server: Sizes = Sizes(256, 128, load_s=0.5, steps=20, step_s=0.05)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        data = dict(data)
        data["probe"] = Sizes(**data["probe"])
        data["calibrate"] = Sizes(**data["calibrate"])
        data["server"] = Sizes(**data["server"])
        data["trace"] = tuple(TraceBackend(**t) for t in data["trace"])
        return cls(**data)

    def trace_jobs(self) -> list[tuple[str, int]]:
        """(backend, priority) of each trace job, in submission order: rounds interleaved."""
        jobs = []
        for r in range(self.rounds):
            order = self.trace[r % len(self.trace):] + self.trace[: r % len(self.trace)]
            jobs += [(b.name, (b.priority + r) % 3) for b in order]
        return jobs


def make_plan(total_mib: int, *, simulated: bool, gpu: int = 0, quick: bool = False,
              sim_spec: str = "") -> Plan:
    """The plan for a card of ``total_mib`` (``quick``: shorter waits and fewer jobs)."""
    if total_mib < 2048:
        raise ValueError(f"a {total_mib} MiB GPU is too small for the device check (2 GiB at "
                         "least)")
    weights = min(8192, total_mib // 8)
    activation = min(4096, total_mib // 16)
    if simulated or quick:
        weights, activation = min(weights, 1024), min(activation, 512)
    fast = simulated or quick
    probe = Sizes(weights, activation, load_s=0.3 if fast else 1.0, steps=10,
                  step_s=0.05 if fast else 0.1)
    calibrate = Sizes(weights, activation, load_s=0.5 if fast else 1.0, steps=6 if fast else 10,
                      step_s=0.05 if fast else 0.1)
    # a request holds its activation long enough (1-2 s) to be seen at the engine's sampling
    server = Sizes(weights, activation, load_s=0.5 if fast else 1.0, steps=20,
                   step_s=0.05 if fast else 0.1)
    trace = [TraceBackend(f"dc-trace-{i + 1}", int(2 * total_mib * peak), share, priority=i % 3)
             for i, (peak, share) in enumerate(zip(TRACE_PEAK_SHARES, TRACE_WEIGHT_SHARES,
                                                   strict=True))]
    return Plan(
        simulated=simulated, gpu=gpu, total_mib=total_mib, probe=probe, calibrate=calibrate,
        repeats=2 if quick else 3, settle_s=0.4 if quick else 1.0,
        trace=tuple(trace), rounds=1 if quick else 3,
        trace_steps=3 if quick else 8, trace_step_s=0.05 if quick else 0.15,
        trace_timeout_s=90.0 if quick else 180.0, sim_spec=sim_spec, server=server,
    )


def declared_context(measured_mib: int | None, simulated: bool) -> int:
    """The context the trace's descriptors declare: measured (plus a margin) when known."""
    if simulated:
        return SIM_CONTEXT_MIB
    if measured_mib is None:
        return GUESSED_CONTEXT_MIB
    return measured_mib + CONTEXT_MARGIN_MIB


def backends(plan: Plan, *, script: Path, python: str, context_mib: int,
             declare_fraction: float = 1.0) -> dict[str, Any]:
    """The engine's backends: the calibration subject, the HTTP model server (``server.py``
    beside ``script``) and the trace's backends, all pinned to the plan's GPU.  The trace
    declares exactly what its workers take (plus ``context_mib``), so admission is tested,
    not guessing.  ``declare_fraction`` < 1 makes the trace's
    descriptors lie (declare that share of their weights and activation): the check's own
    test that an engine trusting them over-commits and the trace rows fail."""

    def backend(name: str, description: str, sizes: dict[str, str], vram: dict[str, str],
                priority: int) -> dict[str, Any]:
        return {"name": name, "description": description, "script": str(script),
                "python": python, "gpus": [plan.gpu], "priority": priority,
                "env": {**sizes, **plan.extra_env}, "vram": vram,
                "timeouts": {"start": "120s", "stop_grace": "15s"}}

    cal = plan.calibrate
    out = [backend(CALIBRATE_NAME, "device check: calibration subject", cal.env(),
                   {"weights": f"{cal.weights_mib}MiB",
                    "activation": f"{cal.activation_mib}MiB",
                    "context": f"{context_mib}MiB"}, 0)]
    for b in plan.trace:
        weights, activation = b.split(context_mib)
        sizes = Sizes(weights, activation, load_s=0.0, steps=plan.trace_steps,
                      step_s=plan.trace_step_s).env()
        sizes["CUDA_ALLOC_TOUCH"] = "1"
        out.append(backend(b.name, f"device check: trace backend, peak {b.peak_mib} MiB",
                           sizes, {"weights": f"{int(weights * declare_fraction)}MiB",
                                   "activation": f"{int(activation * declare_fraction)}MiB",
                                   "context": f"{context_mib}MiB"}, b.priority))
    srv = plan.server
    out.append({"name": SERVER_NAME, "description": "device check: an HTTP model server whose "
                "child process holds its memory",
                "command": [python, str(script.with_name("server.py")), "--port", "${PORT}"],
                "http": {"health": "/health"}, "api": ["chat"], "concurrency": 1,
                "gpus": [plan.gpu], "env": {**srv.env(), **plan.extra_env},
                "vram": {"weights": f"{srv.weights_mib}MiB",
                         "activation": f"{srv.activation_mib}MiB",
                         "context": f"{context_mib}MiB"},
                "timeouts": {"start": "120s", "stop_grace": "15s"}})
    return {"backends": out}


def write_backends(path: Path, document: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(document, indent=1) + "\n")
    tmp.replace(path)
