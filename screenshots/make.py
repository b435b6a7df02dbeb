"""Regenerate the screenshots of the TUI (SVG and PNG) from a real engine run.

    .venv/bin/python screenshots/make.py              # a real run, then the fixed-only scenes
    .venv/bin/python screenshots/make.py --fixed      # every scene from the fixed data instead

The real run: an embedded engine on a simulated 24 GiB GPU with the demo backends, in a
fresh home directory; the script presses the keys a user would (``d`` for the demo workload,
``enter`` on a backend and a job, ``m`` to calibrate, ``v``, ``L``, ``?``) and shoots each screen
at 80x24, 120x40 and 160x48 at that moment, so the event log tells what really happened.
The scenes a simulated GPU cannot show (an NVIDIA GPU, four GPUs) come from the fixed data,
which says so.  Writes ``screenshots/<scene>-<cols>x<rows>.svg`` and ``.png`` (PNG through
cairosvg, from the dev extra).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SIZES = ((80, 24), (120, 40), (160, 48))
FIXED_ONLY = ("dashboard-nvml", "dashboard-4gpu")


def to_png(svg: Path) -> Path:
    import cairosvg

    png = svg.with_suffix(".png")
    # The SVG asks for Fira Code (a browser fetches it); cairo would fall back to a
    # proportional font, so the PNG is drawn with the monospace font that is installed.
    text = svg.read_text().replace("font-family: Fira Code, monospace",
                                   "font-family: DejaVu Sans Mono, monospace")
    cairosvg.svg2png(bytestring=text.encode(), write_to=str(png), scale=1.0)
    # a 256-colour palette keeps the text crisp at a third of the size
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").quantize(colors=256)
    small.save(png, optimize=True)
    return png


def _write(app: Any, scene: str, size: tuple[int, int]) -> None:
    svg = HERE / f"{scene}-{size[0]}x{size[1]}.svg"
    svg.write_text(app.export_screenshot(title=f"vramtui — {scene}"))
    png = to_png(svg)
    print(f"{svg.relative_to(ROOT)}  {png.relative_to(ROOT)}", flush=True)


async def _until(pilot: Any, predicate: Callable[[], object], what: str,
                 timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise SystemExit(f"make.py: timed out waiting for {what}")
        await pilot.pause(0.1)
    return value


async def _shoot_all_sizes(pilot: Any, scene: str, ready: Callable[[], object] = lambda: True
                           ) -> None:
    """The screen on top now, at each size (a resize re-lays it out; then it settles)."""
    from tui_scenes import logs_loaded

    app = pilot.app
    for size in SIZES:
        await pilot.resize_terminal(*size)
        polls = app.polls
        await _until(pilot, lambda p=polls: app.polls >= p + 2 and ready()
                     and logs_loaded(app), f"{scene} at {size}")
        await pilot.pause(0.2)
        await pilot.wait_for_scheduled_animations()
        _write(app, scene, size)
    await pilot.resize_terminal(*SIZES[-1])


async def live() -> None:
    """The real run (see the module's docstring)."""
    from supervisor import Supervisor
    from supervisor.jobs import JobState
    from vramtui.app import VramApp
    from vramtui.app.screens.calibration_screen import CalibrationScreen
    from vramtui.app.widgets.backends_table import BackendsTable
    from vramtui.app.widgets.jobs_table import JobsTable

    with tempfile.TemporaryDirectory(prefix="vt-shots-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
        env.update(HOME=home, VRAMTUI_RUNTIME_DIR=f"/tmp/vt-shots-run-{os.getpid()}")
        os.environ.clear()
        os.environ.update(env)  # paths on screen read ~/.local/state/vramtui/...
        sup = Supervisor.from_config(gpus="sim:24GiB")  # nothing configured: the demo
        sup.start_in_thread()
        try:
            app = VramApp(sup, "embedded", calibration_settle_s=0.5)
            async with app.run_test(size=SIZES[-1]) as pilot:
                await _until(pilot, lambda: app.polls >= 2, "the first snapshots")
                await pilot.press("d")  # the demo workload: 12 jobs over 4 models
                snap = lambda: sup.snapshot()  # noqa: E731
                await _until(pilot, lambda: len(snap().recent) >= 3 and snap().running
                             and snap().queued, "jobs done, running and waiting")
                # the jobs focused on the job with the longest reason to wait: the whole
                # reason under the table where its column cuts it
                jobs = app.screen.query_one(JobsTable)
                jobs.focus()

                def shown() -> list[Any]:
                    keys = set(jobs.keys())
                    return [j for j in snap().queued if j.id in keys]

                await _until(pilot, lambda: any(len(j.waiting) > 40 for j in shown()),
                             "a long reason to wait")
                longest = max(shown(), key=lambda j: len(j.waiting))
                jobs.move_cursor(jobs.get_row_index(longest.id))
                await _shoot_all_sizes(pilot, "dashboard")
                await pilot.press("v")
                await _shoot_all_sizes(pilot, "processes")
                await pilot.press("v")
                running = await _until(pilot, lambda: next(
                    (j.id for j in snap().running if j.state is JobState.RUNNING), None),
                    "a running job")
                jobs.focus()
                await _until(pilot, lambda: running in jobs.keys(),  # noqa: SIM118
                             "the job in the table")
                jobs.move_cursor(jobs.get_row_index(running))
                await pilot.press("enter")
                await _shoot_all_sizes(pilot, "job",
                                       lambda: getattr(app.screen, "request_shown", False))
                await pilot.press("escape")
                table = app.screen.query_one(BackendsTable)
                table.focus()
                table.move_cursor(table.get_row_index("sdxl-sim"))
                await pilot.press("enter")
                await _shoot_all_sizes(pilot, "backend")
                await pilot.press("escape", "question_mark")
                await _shoot_all_sizes(pilot, "help")
                await pilot.press("escape")
                table.move_cursor(table.get_row_index("llm-8b-sim"))
                await pilot.press("e")
                await _shoot_all_sizes(pilot, "confirm")
                await pilot.press("n", "s")
                await _shoot_all_sizes(pilot, "submit")
                await pilot.press("escape", "L")
                await _until(pilot, lambda: type(app.screen).__name__ == "ReloadScreen",
                             "the reload diff")
                await _shoot_all_sizes(pilot, "reload")
                await pilot.press("escape")
                # the workload drains, then a calibration of sdxl-sim, live and at its end
                await _until(pilot, lambda: not snap().running and not snap().queued,
                             "the demo workload to finish", timeout=240)
                table.focus()
                table.move_cursor(table.get_row_index("sdxl-sim"))
                await pilot.press("m", "y")
                screen = await _until(pilot, lambda: isinstance(app.screen, CalibrationScreen)
                                      and app.screen, "the calibration screen")
                await _until(pilot, lambda: screen.view is not None and
                             screen.view.progress_text.startswith("predict-2"), "predict-2")
                await _shoot_all_sizes(pilot, "calibrating")
                await _until(pilot, lambda: screen.report is not None, "the report",
                             timeout=120)
                await _shoot_all_sizes(pilot, "calibration")
        finally:
            sup.stop(60)


async def fixed(scene_name: str, size: tuple[int, int]) -> None:
    from tui_scenes import SCENES, make_app

    spec = next(s for s in SCENES if s.name == scene_name)
    with tempfile.TemporaryDirectory(prefix="vt-shots-") as home:
        old_home = os.environ.get("HOME")
        os.environ["HOME"] = home  # paths on screen read ~/.local/state/vramtui/...
        try:
            app = make_app(Path(home), simulated=spec.simulated, gpus=spec.gpus,
                           calibrating=spec.calibrating)
            async with app.run_test(size=size) as pilot:
                await spec.run(pilot)
                _write(app, scene_name, size)
        finally:
            if old_home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = old_home


def main(argv: list[str]) -> int:
    os.chdir(ROOT)  # the fixed data names examples/demo/backends.yaml relative to the repo
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))  # the fixed data and its scenes are test fixtures
    from tui_scenes import SCENES

    if "--fixed" in argv:
        names = [s.name for s in SCENES]
    else:
        asyncio.run(live())
        names = list(FIXED_ONLY)
    for name in names:
        for size in SIZES:
            asyncio.run(fixed(name, size))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
