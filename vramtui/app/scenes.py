"""Deterministic scenes of every screen, shared by the snapshot tests and screenshots/make.py.

Each scene builds a `VramApp` over the fixed snapshot source (fixed clock and data) and
brings it to one screen; ``settle`` waits (with a deadline, never a bare sleep) until the
snapshot is rendered and background reads are done.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from textual.pilot import Pilot
from textual.widgets import TextArea

from .app import VramApp
from .fixed import FixedSource, big_snapshot, demo_snapshot, fixed_clocks, write_demo_logs
from .widgets import RewrapLog

Scene = Callable[[Pilot[int]], Awaitable[None]]
RUNNING_JOB = "j-7f3a91c2d4"


def make_app(log_dir: Path, *, simulated: bool = True, readonly: bool = False,
             gpus: int = 1) -> VramApp:
    write_demo_logs(log_dir)
    snap = demo_snapshot(simulated=simulated, log_dir=str(log_dir)) if gpus == 1 else \
        big_snapshot(gpus=gpus, jobs=30)
    return VramApp(FixedSource(snap), "embedded", clocks=fixed_clocks(), readonly=readonly)


async def settle(pilot: Pilot[int], logs: bool = False, timeout: float = 10.0) -> None:
    app: VramApp = pilot.app  # type: ignore[assignment]
    deadline = time.monotonic() + timeout
    while app.polls < 1 or (logs and not _logs_loaded(app)):
        if time.monotonic() > deadline:
            raise AssertionError("the app did not render a snapshot in time")
        await pilot.pause(0.02)
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    await pilot.pause()


def _logs_loaded(app: VramApp) -> bool:
    """Every worker log on screen has its lines, wrapped at its width, scrolled to the end."""
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
    await pilot.pause()
    for area in pilot.app.screen.query(TextArea):
        area.cursor_blink = False  # a blinking cursor would make the snapshot flaky
    await settle(pilot)


async def confirm_evict(pilot: Pilot[int]) -> None:
    await settle(pilot)
    app: VramApp = pilot.app  # type: ignore[assignment]
    app.request_evict("llm-8b-sim")
    await settle(pilot)


@dataclass(frozen=True)
class SceneSpec:
    name: str
    run: Scene
    simulated: bool = True
    gpus: int = 1


SCENES = (
    SceneSpec("dashboard", dashboard),
    SceneSpec("dashboard-nvml", dashboard, simulated=False),
    SceneSpec("dashboard-4gpu", dashboard, gpus=4),
    SceneSpec("job", job_detail),
    SceneSpec("backend", backend_detail),
    SceneSpec("help", help_screen),
    SceneSpec("submit", submit_dialog),
    SceneSpec("confirm", confirm_evict),
)
SIZES = ((80, 24), (160, 48))
