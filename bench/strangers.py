"""A stranger on the GPU (issue 26): how fast the engine gives memory back, as a table.

On ``sim:24GiB`` two idle simulated models are loaded (8.25 GiB each with their contexts), a
third runs a long job (1.75 GiB); then a plain process that is not a worker
(``examples/demo/stranger.py``) takes memory through ``worker_sdk.sim``.  A watcher reads the
simulated device's own ledger at 200 Hz (never the engine): the time is from the first reading
over the device's size to the first one back within it.  Cases:

- ``10 GiB``: the device over by ~4.5 GiB: one idle model must go;
- ``16 GiB``: over by ~10.5 GiB: both idle models must go;
- ``spike 4 GiB, 1 s``: the device holds it beside ours: nothing may move.

Each at the default sample rate (10 Hz) and at 20 Hz. The running job must never be killed
(the ``killed`` column counts jobs that did not succeed).

Run: ``.venv/bin/python bench/strangers.py [--runs 2]`` (about 40 s). Simulated GPU: every
figure is labelled so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from engine_support import engine, sim_backend  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.timing import percentile  # noqa: E402
from supervisor.engine import EngineConfig  # noqa: E402
from supervisor.gpu.sim import SimulatedProbe  # noqa: E402

CARD = "sim:24GiB"
TOTAL = 24 * 1024
STRANGER = ROOT / "examples" / "demo" / "stranger.py"


class Ledger:
    """The device's own ledger at ``hz``: when it went over its size, and back within it."""

    def __init__(self, sim_dir: Path, hz: float = 200.0) -> None:
        self.probe = SimulatedProbe(CARD, sim_dir)
        self.period = 1.0 / hz
        self.over_at: float | None = None
        self.fit_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def arm(self) -> None:
        self.over_at = self.fit_at = None

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            used = self.probe.devices()[0].used_mib or 0
            now = time.monotonic()
            if used > TOTAL and self.over_at is None:
                self.over_at = now
            elif used <= TOTAL and self.over_at is not None and self.fit_at is None:
                self.fit_at = now

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)


def wait(predicate: Any, deadline: float, what: str) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def case(mib: int, hold_s: float | None, runs: int, hz: float) -> dict[str, Any]:
    backends = [sim_backend("a", 8192, 512), sim_backend("b", 8192, 512),
                sim_backend("c", 1024, 512)]
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=hz, others_leave_s=0.5)
    times: list[float] = []
    evicted = killed = 0
    with engine(backends, gpus=CARD, config=config) as sup:
        ledger = Ledger(sup.paths.sim_dir)
        env = dict(os.environ, VRAMTUI_SIM_DIR=str(sup.paths.sim_dir))
        try:
            for _ in range(runs):
                for name in "ab":
                    sup.preload(name)
                wait(lambda: all(sup.snapshot().backend(n).state == "ready" for n in "ab"),
                     30, "a and b loaded")
                job = sup.submit("c", json.dumps({"steps": 100, "step_s": 0.02}).encode())
                wait(lambda j=job: sup.job(j).state == "running", 30, "c's job running")
                before = sum(1 for line in sup.snapshot().log if line.text.startswith("evicted"))
                ledger.arm()
                args = [sys.executable, str(STRANGER), f"{mib}MiB"]
                if hold_s is not None:
                    args += ["--for", f"{hold_s}s"]
                proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, text=True)
                if hold_s is None:
                    wait(lambda: ledger.fit_at is not None, 15, "the device to fit again")
                    assert ledger.over_at is not None and ledger.fit_at is not None
                    times.append(ledger.fit_at - ledger.over_at)
                    assert proc.stdin is not None
                    proc.stdin.close()
                proc.wait(30)
                after = sum(1 for line in sup.snapshot().log if line.text.startswith("evicted"))
                evicted += after - before
                view = sup.wait(job, 60)
                killed += view.state.value != "succeeded"
                wait(lambda: sup.snapshot().gpus[0].others_mib == 0, 15, "others gone")
        finally:
            ledger.close()
    return {"times": times, "evicted": evicted, "killed": killed, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    logging.getLogger("supervisor").setLevel(logging.ERROR)  # the table, not the event log
    table = Table(title="A stranger on sim:24GiB (SIMULATED): from the device over its size "
                        "to back within it, its own ledger read at 200 Hz")
    for col in ("case", "sampling", "runs", "median s", "p90 s", "max s", "evicted",
                "killed"):
        table.add_column(col, justify="left" if col in ("case", "sampling") else "right")
    for label, mib, hold in (("10 GiB", 10 * 1024, None), ("16 GiB", 16 * 1024, None),
                             ("spike 4 GiB, 1 s", 4 * 1024, 1.0)):
        for hz in (10.0, 20.0):
            r = case(mib, hold, args.runs, hz)
            t = r["times"]
            cells = [f"{statistics.median(t):.2f}", f"{percentile(t, 0.9):.2f}",
                     f"{max(t):.2f}"] if t else ["–", "–", "–"]
            table.add_row(label, f"{hz:g} Hz", str(r["runs"]), *cells, str(r["evicted"]),
                          str(r["killed"]))
    Console().print(table)


if __name__ == "__main__":
    main()
