"""Deterministic scenes of every screen, shared by the snapshot tests and screenshots/make.py.

Each scene builds a `VramApp` over the fixed snapshot source (fixed clock and data) and
brings it to one screen; ``settle`` waits (with a deadline, never a bare sleep) until the
snapshot is rendered and background reads are done.

``make_app(home)`` writes the fixed calibration report under ``home`` laid out as vramtui lays
out a home directory (the fixed source hands it over through the API, as the engine would;
the app reads no file itself); with ``HOME`` set to it, the paths on screen read
``~/.local/state/vramtui/...`` whatever the temporary directory was.

A test fixture, not part of the application: ``tests/test_tui_snapshots.py`` imports it as
``tui_scenes``; ``screenshots/make.py`` adds ``tests/`` to ``sys.path`` to use it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from fixed_source import (
    CAL_JOB,
    FixedSource,
    big_snapshot,
    calibrating_snapshot,
    calibration_progress,
    calibration_running,
    demo_snapshot,
    fixed_clocks,
    write_fixed_calibration,
)
from textual.pilot import Pilot
from textual.widgets import TextArea

from supervisor.jobs import JobView
from supervisor.paths import Paths
from supervisor.snapshot import LogLine
from vramtui.app import VramApp
from vramtui.app.screens.calibration_screen import CalibrationScreen
from vramtui.app.widgets.jobs_table import JobsTable
from vramtui.app.widgets.rewrap_log import RewrapLog

Scene = Callable[[Pilot[int]], Awaitable[None]]
RUNNING_JOB = "j-7f3a91c2d4"


def make_app(home: Path, *, simulated: bool = True, readonly: bool = False,
             gpus: int = 1, calibrating: bool = False) -> VramApp:
    paths = Paths.from_env({"HOME": str(home), "XDG_RUNTIME_DIR": str(home / "run")})
    done = write_fixed_calibration(paths)
    calibration = done
    snap = demo_snapshot(simulated=simulated, log_dir=str(paths.logs_dir)) if gpus == 1 else \
        big_snapshot(gpus=gpus, jobs=30)
    if calibrating:
        snap = calibrating_snapshot(snap)
        calibration = calibration_running(calibration)
    source = FixedSource(snap, extra_jobs={calibration.id: calibration},
                         reports={"sdxl-sim": Path(_report_of(done))},
                         overlays={"sdxl-sim": paths.calibration_overlay("sdxl-sim")})
    return VramApp(source, "embedded", clocks=fixed_clocks(), readonly=readonly)


def _report_of(view: JobView) -> str:
    import json

    return str(json.loads(view.data or b"{}")["report"]) if view.data else ""


async def settle(pilot: Pilot[int], logs: bool = False, timeout: float = 10.0,
                 until: Callable[[], object] = lambda: True) -> None:
    app: VramApp = pilot.app  # type: ignore[assignment]
    deadline = time.monotonic() + timeout
    while app.polls < 1 or (logs and not logs_loaded(app)) or not until():
        if time.monotonic() > deadline:
            raise AssertionError("the app did not render a snapshot in time")
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


def logs_loaded(app: VramApp) -> bool:
    """Every worker log on screen has its lines, wrapped at its width, scrolled to the end
    (and the boxes filled from files, which change the layout, are there)."""
    if not getattr(app.screen, "static_shown", True) or \
            not getattr(app.screen, "request_shown", True):
        return False
    for w in app.screen.query("#worker-log"):
        if not isinstance(w, RewrapLog) or not w.lines:
            return False
        if w._wrapped_at != w.scrollable_content_region.width or w.scroll_y != w.max_scroll_y:
            return False
    return True


async def dashboard(pilot: Pilot[int]) -> None:
    await settle(pilot)


async def job_detail(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.open_job(RUNNING_JOB)
    await settle(pilot, logs=True)


async def backend_detail(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.open_backend("sdxl-sim")
    await settle(pilot, logs=True)


async def help_screen(pilot: Pilot[int]) -> None:
    await settle(pilot)
    pilot.app.action_help()  # type: ignore[attr-defined]  # the key itself: tests/test_tui.py
    await settle(pilot)


async def submit_dialog(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.open_submit("sdxl-sim")
    # The dialog composes and focuses its payload on later ticks (later still under load):
    # wait for both, or the cursor keeps blinking and the snapshot catches it on or off.
    await settle(pilot, until=lambda: isinstance(pilot.app.focused, TextArea))
    for area in pilot.app.screen.query(TextArea):
        area.cursor_blink = False  # a blinking cursor would make the snapshot flaky
        # A line drawn while the blink had the cursor off is cached under the key a line
        # without blink has: under load (a blink past before this), the cursor stayed off.
        area.notify_style_update()
        area.refresh()
    await settle(pilot)


async def processes(pilot: Pilot[int]) -> None:
    await settle(pilot)
    await pilot.press("v")  # the GPUs' processes in place of the events
    await settle(pilot)


async def events_after_processes(pilot: Pilot[int]) -> None:
    """Events that came while the processes were shown, wrapped at the events' width when
    they are back; then ``d``, whose toast leaves the events in sight."""
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    await pilot.press("v")
    await settle(pilot)
    source = app.api
    assert isinstance(source, FixedSource)
    snap = source.snapshot_value
    line = LogLine(snap.taken_at, "info", "admitted j-0dd5a1e5e2 (whisper-sim) on GPU0: needs "
                   "3072 MiB at peak, 4403 MiB free after 512 MiB of safety", "whisper-sim")
    source.snapshot_value = replace(snap, log=(*snap.log, line))
    polls = app.polls
    await settle(pilot, until=lambda: app.polls > polls + 1)
    await pilot.press("v")
    await pilot.press("d")
    await settle(pilot, until=lambda: bool(app._notifications))


QUEUED_JOB = "j-1c0ffee5a1"  # flux-sim's, whose reason for waiting its Note column cuts


async def job_note(pilot: Pilot[int]) -> None:
    """The jobs focused and ``j`` onto the queued job: its whole reason under the table."""
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    table = app.screen.query_one(JobsTable)
    table.focus()
    table.move_cursor(table.get_row_index(RUNNING_JOB))
    await pilot.press("j")
    await settle(pilot, until=lambda: table.selected_key() == QUEUED_JOB
                 and app.screen.query_one("#job-note").display)


async def reload_diff(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.request_reload()
    await settle(pilot, until=lambda: type(app.screen).__name__ == "ReloadScreen")


async def confirm_evict(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.request_evict("llm-8b-sim")
    await settle(pilot)


def _calibration_screen(app: VramApp) -> CalibrationScreen | None:
    screen = app.screen
    return screen if isinstance(screen, CalibrationScreen) else None


async def calibration_result(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.open_calibration(CAL_JOB, "sdxl-sim", 9216)

    def loaded() -> bool:
        screen = _calibration_screen(app)
        return screen is not None and screen.report is not None

    await settle(pilot, until=loaded)


async def calibration_live(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.progress[CAL_JOB] = deque(calibration_progress())
    app.open_calibration(CAL_JOB, "sdxl-sim", 9216)

    def drawn() -> bool:
        screen = _calibration_screen(app)
        return screen is not None and screen.view is not None and bool(screen.live)

    await settle(pilot, until=drawn)


@dataclass(frozen=True)
class SceneSpec:
    name: str
    run: Scene
    simulated: bool = True
    gpus: int = 1
    calibrating: bool = False


SCENES = (
    SceneSpec("dashboard", dashboard),
    SceneSpec("dashboard-nvml", dashboard, simulated=False),
    SceneSpec("dashboard-4gpu", dashboard, gpus=4),
    SceneSpec("job", job_detail),
    SceneSpec("backend", backend_detail),
    SceneSpec("help", help_screen),
    SceneSpec("processes", processes),
    SceneSpec("reload", reload_diff),
    SceneSpec("events-after-processes", events_after_processes),
    SceneSpec("job-note", job_note),
    SceneSpec("submit", submit_dialog),
    SceneSpec("confirm", confirm_evict),
    SceneSpec("calibration", calibration_result),
    SceneSpec("calibrating", calibration_live, calibrating=True),
)
SIZES = ((80, 24), (120, 40), (160, 48))
