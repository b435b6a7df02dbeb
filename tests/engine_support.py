"""Shared helpers for engine tests: isolated paths, descriptors of simulated models, polling."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from supervisor import Supervisor
from supervisor.engine import EngineConfig
from supervisor.gpu.sim import SimulatedProbe
from supervisor.paths import Paths

ROOT = Path(__file__).resolve().parents[1]
SIMMODEL = ROOT / "examples" / "demo" / "simmodel.py"
T = TypeVar("T")


def sim_backend(name: str, weights: int, activation: int, *, load_s: float = 0.05,
                steps: int = 2, step_s: float = 0.02, **extra: Any) -> dict[str, Any]:
    """A descriptor for the simulated model holding ``weights`` + ``activation`` MiB."""
    spec: dict[str, Any] = {
        "name": name,
        "script": str(SIMMODEL),
        "vram": {"weights": f"{weights}MiB", "activation": f"{activation}MiB"},
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


def wait_for(predicate: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy, with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


@contextmanager
def engine(backends: list[dict[str, Any]], gpus: str = "sim:8GiB",
           config: EngineConfig | None = None) -> Iterator[Supervisor]:
    """A started embedded engine with its own config/state/runtime directories."""
    root = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
    env = dict(os.environ)
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    env.pop("VRAMTUI_BACKENDS", None)
    desc = root / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": backends}))
    sup = Supervisor.from_config(gpus=gpus, backends=[desc], environ=env,
                                 paths=Paths.from_env(env),
                                 config=config or EngineConfig(reserve_mib=0, tick_s=0.1))
    sup.start_in_thread()
    try:
        yield sup
    finally:
        sup.stop(timeout=30)


class UsageWatcher:
    """Reads the simulated GPU independently of the engine and records every over-commit."""

    def __init__(self, sup: Supervisor, spec: str, hz: float = 50.0) -> None:
        self.probe = SimulatedProbe(spec, sup.paths.sim_dir)
        self.period = 1.0 / hz
        self.samples = 0
        self.overcommits: list[tuple[int, int, int]] = []
        self.max_used: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UsageWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            for reading in self.probe.devices():
                self.samples += 1
                used = reading.used_mib or 0
                self.max_used[reading.index] = max(self.max_used.get(reading.index, 0), used)
                if used > reading.total_mib:
                    self.overcommits.append((reading.index, used, reading.total_mib))


PYTHON = sys.executable
