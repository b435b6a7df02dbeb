"""Strangers on the simulated GPU, for real: worker processes, and a plain process (not a
worker: ``examples/demo/stranger.py``) that takes memory through ``worker_sdk.sim``.  What the
device holds is read from its own ledger (``SimulatedProbe``), never from the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from engine_support import ROOT, engine, sim_backend
from waiting import wait_until

from supervisor import Supervisor
from supervisor.engine import EngineConfig
from supervisor.gpu.sim import SimulatedProbe

pytestmark = pytest.mark.process

STRANGER = ROOT / "examples" / "demo" / "stranger.py"
GIB = 1024
TOTAL = 24 * GIB


@contextmanager
def stranger(sim_dir: Path, mib: int, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """A plain process holding ``mib`` on GPU0 of the simulated device until the block ends."""
    env = dict(os.environ, VRAMTUI_SIM_DIR=str(sim_dir))
    proc = subprocess.Popen([sys.executable, str(STRANGER), f"{mib}MiB", *extra], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("holding"), line
        yield proc
    finally:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(10)


def used(probe: SimulatedProbe) -> int:
    return probe.devices()[0].used_mib or 0


def states(sup: Supervisor) -> dict[str, str]:
    return {b.name: b.state for b in sup.snapshot().backends}


def test_a_stranger_gets_the_memory_back_and_a_spike_changes_nothing() -> None:
    backends = [sim_backend("a", 8 * GIB, 512), sim_backend("b", 8 * GIB, 512),
                sim_backend("c", GIB, 512, steps=400, step_s=0.01)]
    config = EngineConfig(reserve_mib=0, tick_s=0.1, others_leave_s=1.0)
    with engine(backends, gpus="sim:24GiB", config=config) as sup:
        probe = SimulatedProbe("sim:24GiB", sup.paths.sim_dir)
        sup.preload("a")
        sup.preload("b")
        wait_until(lambda: states(sup)["a"] == states(sup)["b"] == "ready", 30, "a, b loaded")
        running = sup.submit("c", json.dumps({"steps": 3000, "step_s": 0.01}).encode())
        wait_until(lambda: sup.job(running).state == "running", 30, "c's job running")

        # A one-second spike that the device holds beside ours: nothing moves.
        with stranger(sup.paths.sim_dir, 4 * GIB, "--for", "1s") as spike:
            wait_until(lambda: sup.snapshot().gpus[0].strangers, 5, "the spike seen")
            spike.wait(10)
        wait_until(lambda: not sup.snapshot().gpus[0].strangers, 5, "the spike gone")
        assert states(sup)["a"] == states(sup)["b"] == "ready"
        assert sup.snapshot().gpus[0].others_mib == 0
        assert not [line.text for line in sup.snapshot().log if "evict" in line.text]

        # A stranger that takes more than the rest: idle models go, the running job stays.
        with stranger(sup.paths.sim_dir, 10 * GIB):
            t0 = time.monotonic()
            fits = wait_until(lambda: used(probe) <= TOTAL and time.monotonic(), 10,
                              "the device back within its size")
            assert fits - t0 <= 1.5, f"the device fit again only after {fits - t0:.2f} s"
            gone = [n for n in "ab" if states(sup)[n] != "ready"]
            assert len(gone) == 1
            waiting = sup.submit(gone[0], b"{}")
            wait_until(lambda: sup.snapshot().gpus[0].others_mib >= 10 * GIB, 5, "held back")
            assert sup.job(waiting).state == "queued"
            assert sup.job(running).state == "running"
            line = next(t.text for t in sup.snapshot().log if t.text.startswith("evicted"))
            assert f"evicted {gone[0]}: 10.2 GiB taken by pid" in line, line
        assert sup.wait(waiting, 30).state == "succeeded"
        assert sup.job(running).state == "running"  # through it all; no need to wait it out
        sup.cancel(running)
