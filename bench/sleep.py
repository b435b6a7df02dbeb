"""The sleep tier against reloads, through the real engine (issue 27): a table.

Two simulated 9 GiB models on ``sim:12GiB`` — load 3 s, asleep 300 MiB on the device, wake
0.3 s — and jobs alternating a, b four times, each submitted once the one before has ended
(a user taking turns between two models). Run once with the models' ``@worker_sdk.sleep`` and
``@worker_sdk.wake`` hooks and once without (the same script, the hooks not registered): the
eight jobs' time from the first submit to the last end, loads, wakes, the measured load and
wake times, and that time against seven reloads (the issue's bar: less than half). The device's
own ledger is read by a watcher the whole time: its peak is printed, never over 12 GiB.
``--servers``: the two models are HTTP model servers (``tests/model_server.py``, 8448 MiB and
its context), put to sleep and woken over HTTP (``http.sleep``, ``http.wake``), or not.

Run: ``.venv/bin/python bench/sleep.py [--load-s 3] [--wake-s 0.3] [--rounds 4] [--servers]``
(about 40 s). Simulated GPU: every figure is labelled so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# bench/http.py is beside this file: keep the folder off the path so `http` is the stdlib's
# (aiohttp, which the servers' handles import, needs it).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from engine_support import UsageWatcher, engine, sim_backend  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from supervisor.engine import EngineConfig  # noqa: E402
from supervisor.jobs import JobState  # noqa: E402

CARD = "sim:12GiB"


SERVER = ROOT / "tests" / "model_server.py"
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


def server(name: str, load_s: float, wake_s: float, hooks: bool) -> dict[str, Any]:
    """tests/model_server.py holding 8448 MiB (+ its context), 512 MiB more a request."""
    spec: dict[str, Any] = {
        "name": name, "simulated": True, "api": ["chat"], "safety": "0MiB",
        "command": [sys.executable, str(SERVER), "--port", "${PORT}", "--mib", "8448",
                    "--load-s", str(load_s), "--wake-s", str(wake_s), "--tokens", "2"],
        "http": {"health": "/health"},
        "vram": {"weights": "8448MiB", "activation": "512MiB", "context": "256MiB"},
        "timeouts": {"start": "60s", "stop_grace": "3s"}}
    if hooks:
        spec["http"].update(sleep="POST /sleep?level=1", wake="POST /wake_up")
    return spec


def pid_of(answer: dict[str, Any]) -> int:
    """A worker's answer has its pid; a server's, its system_fingerprint."""
    return int(answer["pid"]) if "pid" in answer else \
        int(str(answer["system_fingerprint"]).removeprefix("pid-"))


def model(name: str, load_s: float, wake_s: float, hooks: bool) -> dict[str, Any]:
    spec = sim_backend(name, 8448, 512, load_s=load_s, steps=1, step_s=0.05)
    if hooks:
        spec["env"].update(SIM_SLEEP_KEEP_MIB="44", SIM_WAKE_S=str(wake_s))
    return spec


def run(load_s: float, wake_s: float, rounds: int, hooks: bool,
        servers: bool) -> dict[str, Any]:
    # Room in host memory for both sleepers' weights, whatever this host has (a server does
    # not say what its sleep took: its weights are counted; simulated, they take nothing).
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0,
                          sleep_host_budget_mib=64 * 1024)
    make = server if servers else model
    payload = CHAT if servers else b'{"steps": 1, "step_s": 0.05}'
    backends = [make("a", load_s, wake_s, hooks), make("b", load_s, wake_s, hooks)]
    with engine(backends, gpus=CARD, config=config) as sup, \
            UsageWatcher(sup, CARD, hz=100) as watch:
        pids: dict[str, set[int]] = {"a": set(), "b": set()}
        started = time.monotonic()
        for i in range(rounds * 2):
            backend = "ab"[i % 2]
            view = sup.wait(sup.submit(backend, payload), 120)
            if view.state is not JobState.SUCCEEDED:
                raise SystemExit(f"job {i} {view.state.value}: {view.error}")
            pids[backend].add(pid_of(json.loads(view.data or b"{}")))
        took = time.monotonic() - started
        counters = sup.engine.counters
        loads = [h.total / h.n for h in counters.load_seconds.values() if h.n]
        wakes = [h.total / h.n for h in counters.wake_seconds.values() if h.n]
        return {"took": took, "loads": sum(counters.loads.values()),
                "wakes": sum(counters.wakes.values()),
                "load_s": statistics.mean(loads) if loads else float("nan"),
                "wake_s": statistics.mean(wakes) if wakes else float("nan"),
                "workers": sum(len(p) for p in pids.values()),
                "peak": watch.max_used.get(0, 0), "over": len(watch.overcommits)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-s", type=float, default=3.0, help="a model's load (s)")
    parser.add_argument("--wake-s", type=float, default=0.3, help="a model's wake (s)")
    parser.add_argument("--rounds", type=int, default=4, help="a, b turns")
    parser.add_argument("--servers", action="store_true",
                        help="HTTP model servers (http.sleep, http.wake), not workers")
    args = parser.parse_args()
    results = {hooks: run(args.load_s, args.wake_s, args.rounds, hooks, args.servers)
               for hooks in (True, False)}
    n = args.rounds * 2
    load_s = results[False]["load_s"]
    reloads = (n - 1) * load_s
    what = "model servers" if args.servers else "models"
    table = Table(title=f"SIMULATED sim:12GiB: two 9 GiB {what}, {n} jobs alternating "
                        f"(load {args.load_s:g} s, wake {args.wake_s:g} s)")
    for col in ("http.sleep/wake" if args.servers else "sleep hooks", f"{n} jobs (s)",
                "loads", "wakes", "server processes" if args.servers else "worker processes",
                "load (s, measured)", "wake (s, measured)", f"vs {n - 1} reloads",
                "device peak (MiB)", "over 12 GiB"):
        table.add_column(col, justify="right")
    for hooks, r in results.items():
        table.add_row("with" if hooks else "without", f"{r['took']:.2f}", str(r["loads"]),
                      str(r["wakes"]), str(r["workers"]), f"{r['load_s']:.2f}",
                      "-" if r["wake_s"] != r["wake_s"] else f"{r['wake_s']:.2f}",
                      f"{r['took'] / reloads:.2f}", str(r["peak"]), str(r["over"]))
    Console(width=170).print(table)
    print(f"{n - 1} reloads at the measured {load_s:.2f} s each: {reloads:.1f} s; with sleep "
          f"the {n} jobs took {results[True]['took']:.1f} s "
          f"({results[True]['took'] / reloads:.0%} of them; the bar is under 50%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
