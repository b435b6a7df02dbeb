"""What watching the host device costs: CPU per second of the real sampler thread (issue 25).

For 1, 10 and 50 worker trees — each a Python process holding 16 MiB it touched, with one
child holding 4 MiB — this runs the engine's own ``Sampler`` over a ``HostProbe`` at the
engine's rate (``EngineConfig.sample_hz``, devices and processes alike) for a few seconds and
reads the sampler thread's CPU clock: CPU-seconds per second, as a % of one core.  Beside it,
the same sampler over ``NvmlProbe`` with the fake ``pynvml`` the tests use (two GPUs, N
processes): Python's share of an NVML sample, without the driver's own (that needs a GPU).
The goal (the issue's): under 1 % of one core for 10 workers.

Run: ``.venv/bin/python bench/host_sampling.py [--seconds 4] [--trees 1,10,50]`` (~40 s).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from supervisor.engine import EngineConfig  # noqa: E402
from supervisor.gpu.host import HostProbe  # noqa: E402
from supervisor.gpu.model import Probe  # noqa: E402
from supervisor.gpu.nvml import NvmlProbe  # noqa: E402
from supervisor.gpu.sampler import Sample, Sampler  # noqa: E402

MIB = 1024 * 1024
TREE = (
    "import subprocess, sys, time\n"
    "b = bytearray(16 << 20)\n"
    "for i in range(0, len(b), 4096): b[i] = 1\n"
    "c = subprocess.Popen([sys.executable, '-c', 'import time\\n"
    "b = bytearray(4 << 20)\\nfor i in range(0, len(b), 4096): b[i] = 1\\n"
    "print(1, flush=True)\\ntime.sleep(3600)'], stdout=subprocess.PIPE)\n"
    "c.stdout.readline()\n"
    "print(1, flush=True)\n"
    "sys.stdin.read()\n"
    "c.kill()\n"
)


def spawn_trees(n: int) -> list[subprocess.Popen[bytes]]:
    trees = [subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE) for _ in range(n)]
    for t in trees:
        assert t.stdout is not None
        t.stdout.readline()  # the tree holds its memory now
    return trees


def stop_trees(trees: list[subprocess.Popen[bytes]]) -> None:
    for t in trees:
        assert t.stdin is not None
        t.stdin.close()
    for t in trees:
        t.wait(10)


def sampler_cpu(probe: Probe, hz: float, seconds: float) -> tuple[float, int]:
    """(CPU-seconds per second of the sampler thread, samples taken)."""
    taken: list[Sample] = []
    sampler = Sampler(probe, taken.append, device_hz=hz, process_hz=hz)
    sampler.start()
    thread = next(t for t in threading.enumerate() if t.name == "vramtui-sampler")
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    time.sleep(0.5)  # the first discovery, and the pace settles
    cpu0, wall0, n0 = time.clock_gettime(clock), time.monotonic(), len(taken)
    time.sleep(seconds)
    cpu1, wall1, n1 = time.clock_gettime(clock), time.monotonic(), len(taken)
    sampler.stop()
    return (cpu1 - cpu0) / (wall1 - wall0), n1 - n0


def fake_nvml(processes: int) -> Any:
    from test_gpu_nvml import FakeDevice, FakeNvml

    procs = [(1000 + i, 512 * MIB) for i in range(processes)]
    return FakeNvml([FakeDevice(compute=procs),
                     FakeDevice(name=b"NVIDIA L4", total_mib=23034, used_mib=0)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--trees", default="1,10,50")
    args = parser.parse_args()
    hz = EngineConfig().sample_hz
    table = Table(title=f"Sampling at the engine's rate ({hz:g} Hz devices + processes), "
                        f"{args.seconds:g} s each: the sampler thread's CPU")
    for col in ("worker trees", "processes read", "host: CPU s/s", "host: % of a core",
                "samples", "NVML (fake pynvml): % of a core"):
        table.add_column(col, justify="right")
    for n in (int(x) for x in args.trees.split(",")):
        trees = spawn_trees(n)
        try:
            probe = HostProbe("host", reserve_mib=0)
            cpu, samples = sampler_cpu(probe, hz, args.seconds)
            read = len(probe.processes())
            probe.close()
        finally:
            stop_trees(trees)
        nvml = NvmlProbe(fake_nvml(n * 2))
        nvml_cpu, _ = sampler_cpu(nvml, hz, args.seconds)
        nvml.close()
        table.add_row(str(n), str(read), f"{cpu:.4f}", f"{cpu * 100:.2f} %", str(samples),
                      f"{nvml_cpu * 100:.2f} % (driver not included)")
    Console().print(table)
    print("goal: under 1 % of one core for 10 worker trees (the host device's PSS reads, "
          "its /proc passes to find new processes, and MemAvailable included)")


if __name__ == "__main__":
    main()
