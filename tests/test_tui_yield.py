"""Yielding a GPU from the TUI (a pilot test against a real embedded engine and real worker
processes): the key asks first, the GPU empties (read from the simulated device's ledger),
the panel says so, a job waits, the palette resumes it; yielding ``now`` asks and cancels."""

from __future__ import annotations

import asyncio

import pytest
from engine_support import engine, sim_backend
from textual.command import CommandPalette
from textual.pilot import Pilot
from waiting import wait_until_async

from supervisor import Supervisor
from supervisor.gpu.sim import SimulatedProbe
from vramtui.app import VramApp
from vramtui.app.screens.confirm_dialog import ConfirmDialog
from vramtui.app.widgets.gpu_panel import GpuPanel

pytestmark = pytest.mark.process


async def until(pilot: Pilot[int], predicate: object, what: str, timeout: float = 20.0) -> None:
    await wait_until_async(predicate, timeout, what,  # type: ignore[arg-type]
                           pause=lambda: pilot.pause(0.05))


def ours_on_gpu(sup: Supervisor) -> bool:
    return bool(SimulatedProbe("sim:8GiB", sup.paths.sim_dir).processes())


async def palette(pilot: Pilot[int], text: str) -> None:
    await pilot.press("ctrl+p")
    assert isinstance(pilot.app.screen, CommandPalette)
    await pilot.press(*text)
    await until(pilot, lambda: pilot.app.screen.query("CommandList")
                and pilot.app.screen.query_one("CommandList").option_count > 0, "hits")
    await pilot.pause(0.2)
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(pilot.app.screen, ConfirmDialog), "the dialog")


async def yield_resume_and_now() -> None:
    # (a job of 40 s: it must still run when "yield now" cancels it, on a loaded box too)
    with engine([sim_backend("alpha", 1024, 256, steps=2000, step_s=0.02)]) as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=(120, 40)) as pilot:
            sup.preload("alpha")
            await until(pilot, lambda: ours_on_gpu(sup), "alpha loaded")
            await pilot.press("Y")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await until(pilot, lambda: not ours_on_gpu(sup), "GPU0 empty", timeout=5)
            job = sup.submit("alpha", b"{}")
            await until(pilot, lambda: "YIELDED TO" in str(
                app.screen.query_one(GpuPanel).border_title), "the panel says yielded")
            assert sup.job(job).state == "queued"
            await palette(pilot, "resume gpu0")
            await pilot.press("y")
            await until(pilot, lambda: sup.job(job).state == "running", "the job runs")
            await palette(pilot, "yield gpu0 now")
            assert "CANCELLED" in app.screen.body  # type: ignore[attr-defined]
            await pilot.press("y")
            await until(pilot, lambda: sup.job(job).state == "cancelled", "cancelled now")
            await until(pilot, lambda: not ours_on_gpu(sup), "GPU0 empty again", timeout=5)
            assert (sup.snapshot().gpus[0].yielded_by or "").endswith("(tui)")


def test_yield_and_resume_from_the_tui() -> None:
    asyncio.run(yield_resume_and_now())
