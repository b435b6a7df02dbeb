"""Benchmark of serve mode: a hot echo job over the control socket, and the CLI's start-up.

Starts ``vramtui --serve`` (simulated GPU, the echo example backend) in a fresh /tmp root and
measures, after a warm-up:

- submit-to-result of a hot echo job over the control socket, sequentially: one round trip
  (``submit_wait``) and two (``submit`` then ``wait``); median, p90, jobs per second;
- the same through the in-process facade of an embedded engine, for reference;
- whole processes side by side, their runs interleaved so that a busy moment hits all of them
  alike: bare ``python -c pass`` (the floor), ``vramtui status``, ``queue``, ``jobs`` and
  ``submit echo --wait``; median and p90 wall, median CPU (user+sys), and how many modules
  each imports.  Issue 11's bar: ``vramtui status`` at most 100 ms wall (median, quiet
  machine).

Run: ``.venv/bin/python bench/serve.py [--jobs 2000] [--runs 15]``.  Never run as a test.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.timing import percentile, time_jobs  # noqa: E402
from supervisor.client import Client  # noqa: E402
from supervisor.control.errors import EngineNotRunning  # noqa: E402

ECHO = {"name": "echo", "script": str(ROOT / "examples" / "echo" / "main.py"),
        "vram": {"weights": "0MiB", "activation": "16MiB", "context": "256MiB"},
        "keep_alive": "forever"}  # the simulated device gives each process a 256 MiB context
PAYLOAD = b'{"prompt": "hello"}'


PROCESSES = (
    ("bare python (-c pass)", ["-c", "pass"]),
    ("vramtui status", ["-m", "vramtui", "status"]),
    ("vramtui queue", ["-m", "vramtui", "queue"]),
    ("vramtui jobs", ["-m", "vramtui", "jobs"]),
    ("vramtui submit echo --wait", ["-m", "vramtui", "submit", "echo", "--data", '{"a": 1}',
                                    "--wait"]),
)
COUNT_MODULES = ("import runpy, sys, atexit; "
                 "atexit.register(lambda: sys.stderr.write(f'\\nMODULES {len(sys.modules)}\\n')); "
                 "sys.argv = ['vramtui', *sys.argv[1:]]; runpy.run_module('vramtui', "
                 "run_name='__main__')")


def time_processes(env: dict[str, str], runs: int) -> list[tuple[str, list[float], list[float],
                                                                  int]]:
    """Each of PROCESSES, ``runs`` times, interleaved: (name, walls, cpus, modules)."""
    out: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n, _ in PROCESSES}
    for _name, args in PROCESSES:  # warm-up: bytecode cached, the worker hot
        subprocess.run([sys.executable, *args], env=env, capture_output=True)
    for _ in range(runs):
        for name, args in PROCESSES:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            done = subprocess.run([sys.executable, *args], env=env, capture_output=True)
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed: {done.stderr.decode()[-500:]}")
            out[name][0].append(wall)
            out[name][1].append((after.ru_utime - before.ru_utime)
                                + (after.ru_stime - before.ru_stime))
    rows = []
    for name, args in PROCESSES:
        modules = 0
        if args[:2] == ["-m", "vramtui"]:
            done = subprocess.run([sys.executable, "-c", COUNT_MODULES, *args[2:]], env=env,
                                  capture_output=True, text=True)
            modules = next((int(line.split()[1]) for line in done.stderr.splitlines()
                            if line.startswith("MODULES ")), 0)
        rows.append((name, *out[name], modules))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=15)
    opts = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="vtb-", dir="/tmp"))
    desc = root / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": [ECHO]}))
    # As installed: bytecode cached (a warm-up run writes it), whatever this shell says.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VRAMTUI_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    sock = root / "run" / "control.sock"
    server = subprocess.Popen([sys.executable, "-m", "vramtui", "--serve", "--gpus", "sim:24GiB",
                               "--backends", str(desc)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                client = Client(sock)
                break
            except EngineNotRunning:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("vramtui --serve did not come up") from None
                time.sleep(0.05)

        one_rt, one_total = time_jobs(lambda: client.submit_wait("echo", PAYLOAD), opts.jobs)
        two_rt, two_total = time_jobs(lambda: client.wait(client.submit("echo", PAYLOAD)),
                                      opts.jobs)
        processes = time_processes(env, opts.runs)
        client.close()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(root, ignore_errors=True)

    embedded, embedded_total = _embedded(opts.jobs)

    ms = 1000.0
    rows = [
        ("hot echo, submit→result over the socket (1 round trip), median",
         f"{statistics.median(one_rt) * ms:.3f} ms", "< 1 ms", "5.0 ms"),
        ("  same, p90", f"{percentile(one_rt, 0.9) * ms:.3f} ms", "", "10 ms"),
        ("  sequential jobs/s", f"{opts.jobs / one_total:,.0f}", "1,000", "~170"),
        ("hot echo, submit + wait (2 round trips), median",
         f"{statistics.median(two_rt) * ms:.3f} ms", "", ""),
        ("  sequential jobs/s", f"{opts.jobs / two_total:,.0f}", "", ""),
        ("hot echo, in-process facade (embedded), median",
         f"{statistics.median(embedded) * ms:.3f} ms", "", ""),
        ("  sequential jobs/s", f"{opts.jobs / embedded_total:,.0f}", "", ""),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'vramtui':>10}  {'bar':>8}  {'vramd':>13}")
    for name, ours, bar, peer in rows:
        print(f"{name:<{width}}  {ours:>10}  {bar:>8}  {peer:>13}")
    print()
    bars = {"vramtui status": "≤ 100 ms"}
    width = max(len(r[0]) for r in processes)
    print(f"{'whole process':<{width}}  {'wall p50':>9}  {'wall p90':>9}  {'CPU p50':>8}  "
          f"{'modules':>7}  {'bar':>9}")
    for name, walls, cpus, modules in processes:
        print(f"{name:<{width}}  {statistics.median(walls) * ms:>6.0f} ms  "
              f"{percentile(walls, 0.9) * ms:>6.0f} ms  {statistics.median(cpus) * ms:>5.0f} ms"
              f"  {modules or '':>7}  {bars.get(name, ''):>9}")
    print(f"({opts.jobs} jobs after 200 warm-up; {opts.runs} interleaved runs of each process; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    return 0


def _embedded(n: int) -> tuple[list[float], float]:
    from supervisor.engine import EngineConfig
    from supervisor.facade import Supervisor
    from supervisor.paths import Paths

    root = Path(tempfile.mkdtemp(prefix="vtb-", dir="/tmp"))
    desc = root / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": [ECHO]}))
    env = dict(os.environ, VRAMTUI_RUNTIME_DIR=str(root / "run"),
               VRAMTUI_STATE_DIR=str(root / "state"), VRAMTUI_CONFIG_DIR=str(root / "cfg"))
    sup = Supervisor.from_config(gpus="sim:24GiB", backends=[desc], environ=env,
                                 paths=Paths.from_env(env), config=EngineConfig())
    sup.start_in_thread()
    try:
        return time_jobs(lambda: sup.wait(sup.submit("echo", PAYLOAD)), n)
    finally:
        sup.stop(30)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
