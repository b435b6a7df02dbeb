"""The dashboard's cost: CPU at rest and the time to render one frame.

Not a test.  Run: ``.venv/bin/python bench/tui.py [--seconds S]``.

Data: the deterministic snapshot source with 4 GPUs x 10 minutes of history (4 Hz, 2,400
samples each), 12 backends and 50 jobs (4 running, 26 queued, 20 finished); every poll
appends one sample per GPU and moves the running jobs' progress, so the graphs, bars and
progress cells really change each time (what "at rest" looks like on a live engine).

CPU at rest: the app runs as a child process with the real terminal driver on a
pseudo-terminal of the given size (its output drained and counted); after a warm-up, its CPU
time (user + system, all threads) over ``--seconds`` of wall time is the share of one core.
Frame: in-process and headless, the time to hand one new snapshot to the widgets (apply),
and to compose the whole screen and turn it into terminal output (render), median of many.
The bar is under 3 % of one core at rest.
"busy" runs the same with 4 running jobs, 26 queued and every GPU's use changing.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import statistics
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fixed snapshot source is a test fixture
SIZES = ((160, 48), (80, 24))


def make_app(busy: bool = False, window: float = 60.0):  # type: ignore[no-untyped-def]
    from fixed_source import FixedSource, big_snapshot, ticking

    from vramtui.app import VramApp

    advance, clocks = ticking(busy=busy)
    source = FixedSource(big_snapshot(gpus=4, jobs=50, history_s=600, busy=busy),
                         advance=advance, clocks=clocks)
    app = VramApp(source, "embedded", clocks=clocks)
    app.graph_window = window
    return app


def child(busy: bool, window: float) -> int:
    app = make_app(busy, window)
    app.run()
    return 0


def cpu_share(size: tuple[int, int], busy: bool, window: float, seconds: float,
              warmup: float) -> tuple[float, float]:
    """(% of one core, terminal output in KiB/s) of the app on a pseudo-terminal."""
    import psutil

    master, slave = os.openpty()
    cols, rows = size
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLORTERM="truecolor",
               PYTHONPATH=str(ROOT))
    # Textual writes the screen to stderr
    argv = [sys.executable, __file__, "--child", "--window", str(window)] + (
        ["--busy"] if busy else [])
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave,
                            stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    count = [0]

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            count[0] += len(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        ps = psutil.Process(proc.pid)
        time.sleep(warmup)  # a benchmark, not a test: it measures over fixed wall time
        c0 = sum(ps.cpu_times()[:2])
        b0, t0 = count[0], time.monotonic()
        time.sleep(seconds)
        c1 = sum(ps.cpu_times()[:2])
        b1, t1 = count[0], time.monotonic()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(master)
    return (c1 - c0) / (t1 - t0) * 100, (b1 - b0) / (t1 - t0) / 1024


async def frame_times(size: tuple[int, int], busy: bool, window: float, frames: int
                      ) -> tuple[float, float, float]:
    """Median ms to apply one snapshot, to render the full screen, and the graphs' share."""
    from rich.console import Console

    from vramtui.app.widgets.history_graph import HistoryGraph

    app = make_app(busy, window)
    apply_ms, render_ms, graph_ms = [], [], []
    console = Console(file=open(os.devnull, "w"), width=size[0], height=size[1],  # noqa: SIM115
                      color_system="truecolor", force_terminal=True, legacy_windows=False)
    async with app.run_test(size=size) as pilot:
        while app.polls < 2:
            await pilot.pause(0.05)
        for _ in range(frames):
            snap = app.api.snapshot()
            t0 = time.perf_counter()
            app.snap = snap
            app.render_snapshot()
            t1 = time.perf_counter()
            graphs = list(app.screen.query(HistoryGraph))
            g0 = time.perf_counter()
            for g in graphs:
                if g.display and g.size.area:
                    g._strips = g._build(g.size)
            g1 = time.perf_counter()
            screen = app.screen
            screen._refresh_layout()
            update = screen._compositor.render_update(full=True)
            console.print(update, end="")
            t2 = time.perf_counter()
            apply_ms.append((t1 - t0) * 1000)
            render_ms.append((t2 - t1 - (g1 - g0)) * 1000 + (g1 - g0) * 1000)
            graph_ms.append((g1 - g0) * 1000)
            await pilot.pause()
    return statistics.median(apply_ms), statistics.median(render_ms), statistics.median(graph_ms)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring time per run")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--frames", type=int, default=40)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--busy", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--window", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.busy, args.window)
    sys.path.insert(0, str(ROOT))
    print("vramtui dashboard: 4 GPUs x 10 min of history (2,400 samples each), 12 backends, "
          "50 jobs; snapshots at 4 Hz")
    print("at rest: all 50 jobs finished, workers idle; busy: 4 running, 26 queued, and "
          "every GPU's use changing")
    head = (f"{'scene':<6}{'terminal':>9}{'graph':>7}{'CPU':>13}{'output':>9}{'apply':>8}"
            f"{'frame':>8}{'graphs':>8}")
    units = (f"{'':<6}{'':>9}{'window':>7}{'% of a core':>13}{'KiB/s':>9}{'ms':>8}{'ms':>8}"
             f"{'ms':>8}")
    print(head)
    print(units)
    for busy in (False, True):
        for size in SIZES:
            for window in (60.0, 600.0):
                cpu, out = cpu_share(size, busy, window, args.seconds, args.warmup)
                apply_ms, render_ms, graph_ms = asyncio.run(
                    frame_times(size, busy, window, args.frames))
                print(f"{'busy' if busy else 'rest':<6}{f'{size[0]}x{size[1]}':>9}"
                      f"{f'{window / 60:g} min':>7}{cpu:>12.1f}%{out:>9.1f}{apply_ms:>8.2f}"
                      f"{render_ms:>8.2f}{graph_ms:>8.2f}")
    print("apply: hand one snapshot to the widgets; frame: lay out and compose the whole "
          "screen into terminal output (a full repaint, graphs rebuilt); graphs: rebuilding "
          "every graph's rows.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
