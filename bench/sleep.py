"""The sleep tier against reloads, through the real engine (issue 27): a table.

Two simulated 9 GiB models on ``sim:12GiB`` — load 3 s, asleep 300 MiB on the device, wake
0.3 s — and jobs alternating a, b four times, each submitted once the one before has ended
(a user taking turns between two models). Run once with the models' ``@worker_sdk.sleep`` and
``@worker_sdk.wake`` hooks and once without (the same script, the hooks not registered): the
eight jobs' time from the first submit to the last end, loads, wakes, the measured load and
wake times, and that time against seven reloads (the issue's bar: less than half). The device's
own ledger is read by a watcher the whole time: its peak is printed, never over 12 GiB.

Run: ``.venv/bin/python bench/sleep.py [--load-s 3] [--wake-s 0.3] [--rounds 4]`` (about
40 s). Simulated GPU: every figure is labelled so.
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
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from engine_support import UsageWatcher, engine, sim_backend  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from supervisor.engine import EngineConfig  # noqa: E402
from supervisor.jobs import JobState  # noqa: E402

CARD = "sim:12GiB"


def model(name: str, load_s: float, wake_s: float, hooks: bool) -> dict[str, Any]:
    spec = sim_backend(name, 8448, 512, load_s=load_s, steps=1, step_s=0.05)
    if hooks:
        spec["env"].update(SIM_SLEEP_KEEP_MIB="44", SIM_WAKE_S=str(wake_s))
    return spec


def run(load_s: float, wake_s: float, rounds: int, hooks: bool) -> dict[str, Any]:
    config = EngineConfig(reserve_mib=0, tick_s=0.1, sample_hz=20.0)
    backends = [model("a", load_s, wake_s, hooks), model("b", load_s, wake_s, hooks)]
    with engine(backends, gpus=CARD, config=config) as sup, \
            UsageWatcher(sup, CARD, hz=100) as watch:
        pids: dict[str, set[int]] = {"a": set(), "b": set()}
        started = time.monotonic()
        for i in range(rounds * 2):
            view = sup.wait(sup.submit("ab"[i % 2], b'{"steps": 1, "step_s": 0.05}'), 120)
            if view.state is not JobState.SUCCEEDED:
                raise SystemExit(f"job {i} {view.state.value}: {view.error}")
            answer = json.loads(view.data or b"{}")
            pids[answer["backend"]].add(answer["pid"])
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
    args = parser.parse_args()
    results = {hooks: run(args.load_s, args.wake_s, args.rounds, hooks)
               for hooks in (True, False)}
    n = args.rounds * 2
    load_s = results[False]["load_s"]
    reloads = (n - 1) * load_s
    table = Table(title=f"SIMULATED sim:12GiB: two 9 GiB models, {n} jobs alternating "
                        f"(load {args.load_s:g} s, wake {args.wake_s:g} s)")
    for col in ("sleep hooks", f"{n} jobs (s)", "loads", "wakes", "worker processes",
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
