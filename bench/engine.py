"""Engine benchmarks (issue 3): a table of the four numbers the engine is held to.

- one scheduling decision (the engine's own step: snapshot of its state + plan) with 10,000
  queued jobs, 50 backends and 4 GPUs (bar: under 1 ms);
- hot echo jobs through submit/wait in-process (bar: 2,000 jobs/s; vramd ~170);
- cold start of an echo worker until it is ready (bar: 150 ms; vramd 351 ms);
- cancel of a running cooperative job until the caller sees "cancelled" (bar: 10 ms;
  vramd 109 ms).

Run: ``.venv/bin/python bench/engine.py`` (about 30 s). Medians of repeated runs; the machine
is shared, so compare ratios within one run rather than across runs.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from supervisor import Supervisor  # noqa: E402
from supervisor.engine import EngineConfig  # noqa: E402
from supervisor.jobs import Job  # noqa: E402
from supervisor.paths import Paths  # noqa: E402


def isolated_env() -> dict[str, str]:
    root = Path(tempfile.mkdtemp(prefix="vtb-", dir="/tmp"))
    env = dict(os.environ)
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    env.pop("VRAMTUI_BACKENDS", None)
    return env


def write_backends(env: dict[str, str], backends: list[dict]) -> Path:
    path = Path(env["VRAMTUI_STATE_DIR"]).parent / "backends.yaml"
    path.write_text(yaml.safe_dump({"backends": backends}))
    return path


def bench_decision() -> tuple[float, float]:
    """Median and p99 (ms) of one scheduler step over 10k queued jobs, 50 backends, 4 GPUs."""
    env = isolated_env()
    backends = [
        {"name": f"m{i}", "command": ["/bin/true"], "vram": {"weights": f"{4 + i % 7}GiB",
                                                              "activation": "2GiB"}}
        for i in range(50)
    ]
    desc = write_backends(env, backends)
    sup = Supervisor.from_config(gpus="sim:24GiB,sim:24GiB,sim:24GiB,sim:24GiB",
                                 backends=[desc], environ=env, paths=Paths.from_env(env),
                                 config=EngineConfig(max_queue_depth=20_000))
    engine = sup.engine
    monitor, planner, queue = engine.monitor, engine.planner, engine.jobs.queue
    for reading in engine.probe.devices():
        monitor.readings[reading.index] = reading
    for i in range(10_000):
        job = Job(backend=f"m{i % 50}", payload=b"", priority=i % 4)
        queue.push(job)

    times = []
    for _ in range(200):
        t0 = time.perf_counter()
        snap, _book = planner.inputs(monitor.readings, engine.pool.runtimes(), [],
                                     monitor.foreign, queue.scheduler_view(), queue.counts)
        planner.plan(snap, 1.0)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.99 * len(times)) - 1]


def echo_engine(journal: bool = True) -> Supervisor:
    env = isolated_env()
    desc = write_backends(env, [{
        "name": "echo", "script": str(ROOT / "examples" / "echo" / "main.py"),
        "vram": {"weights": "64MiB", "activation": "16MiB"},
    }, {
        "name": "sim", "script": str(ROOT / "examples" / "demo" / "simmodel.py"),
        "vram": {"weights": "64MiB", "activation": "16MiB"},
        "env": {"SIM_WEIGHTS_MIB": "64", "SIM_ACTIVATION_MIB": "16", "SIM_LOAD_S": "0"},
    }])
    return Supervisor.from_config(gpus="sim:24GiB", backends=[desc], environ=env,
                                  paths=Paths.from_env(env),
                                  config=EngineConfig(journal=journal)).start_in_thread()


def bench_hot_jobs(sup: Supervisor, n: int = 4000) -> float:
    sup.wait(sup.submit("echo", b"warm"), 30)
    for _ in range(200):
        sup.wait(sup.submit("echo", b"x" * 100), 10)
    t0 = time.perf_counter()
    for _ in range(n):
        sup.wait(sup.submit("echo", b"x" * 100), 10)
    return n / (time.perf_counter() - t0)


def bench_cold_start(sup: Supervisor, rounds: int = 7) -> float:
    results = []
    for _ in range(rounds):
        sup.evict("echo")
        deadline = time.monotonic() + 20
        while sup.snapshot().backend("echo").state != "cold":
            if time.monotonic() > deadline:
                raise RuntimeError("echo did not stop")
            time.sleep(0.01)
        ready = threading.Event()
        sub = sup.subscribe(kinds=["worker"], callback=lambda e, ready=ready: e.backend == "echo"
                            and e.state == "ready" and ready.set())
        t0 = time.perf_counter()
        sup.preload("echo")
        ready.wait(20)
        results.append((time.perf_counter() - t0) * 1000)
        sub.close()
    return statistics.median(results)


def bench_cancel(sup: Supervisor, rounds: int = 15) -> float:
    results = []
    for _ in range(rounds):
        job = sup.submit("sim", json.dumps({"steps": 100_000, "step_s": 0.01}).encode())
        running = threading.Event()
        sub = sup.subscribe(
            kinds=["job"],
            callback=lambda e, j=job, running=running: e.job is not None and e.job.id == j
            and e.job.progress is not None and running.set(),
        )
        running.wait(20)
        sub.close()
        t0 = time.perf_counter()
        sup.cancel(job)
        view = sup.wait(job, 10)
        results.append((time.perf_counter() - t0) * 1000)
        assert view.state.value == "cancelled", view.state
    return statistics.median(results)


def main() -> None:
    console = Console()
    console.print("[dim]measuring… (about 30 s)[/]")
    median_ms, p99_ms = bench_decision()
    bare = echo_engine(journal=False)
    try:
        jobs_s_bare = bench_hot_jobs(bare)
    finally:
        bare.stop()
    sup = echo_engine()
    try:
        jobs_s = bench_hot_jobs(sup)
        cold_ms = bench_cold_start(sup)
        cancel_ms = bench_cancel(sup)
    finally:
        sup.stop()
    table = Table(title="vramtui engine (simulated GPU, 2-core machine)")
    table.add_column("measure")
    table.add_column("vramtui", justify="right")
    table.add_column("bar", justify="right")
    table.add_column("vramd 0.3.9", justify="right")
    table.add_row("scheduling decision, 10k queued / 50 backends / 4 GPUs",
                  f"{median_ms:.2f} ms (p99 {p99_ms:.2f})", "< 1 ms", "—")
    table.add_row("hot echo jobs, submit+wait in-process (no journal)",
                  f"{jobs_s_bare:,.0f} jobs/s", "2,000 jobs/s", "~170 jobs/s")
    table.add_row("  the same with the journal (3 SQLite commits a job)",
                  f"{jobs_s:,.0f} jobs/s", "", "")
    table.add_row("cold start of an echo worker to ready", f"{cold_ms:.0f} ms", "150 ms",
                  "351 ms")
    table.add_row("cancel a running cooperative job", f"{cancel_ms:.1f} ms", "10 ms", "109 ms")
    console.print(table)


if __name__ == "__main__":
    main()
