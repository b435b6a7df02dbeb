"""The control centre against a demanding (or hostile) user, on fixed scenes (no process):
what is typed, and what the engine's data carries, never takes the app down; a refusal
says what to do and loses nothing; --readonly offers nothing that changes anything."""

from __future__ import annotations

from dataclasses import replace

from fixed_source import FixedSource, demo_snapshot, fixed_clocks
from test_tui_walk import WIDE, aio, notes, shown

from vramtui.app import VramApp
from vramtui.app.screens.dashboard import Dashboard


@aio
async def test_submit_with_no_backend_configured_says_so_and_keeps_the_app() -> None:
    empty = replace(demo_snapshot(), backends=(), running=(), queued=(), recent=())
    source = FixedSource(empty)
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        await pilot.press("s")
        await pilot.pause()
        assert isinstance(app.screen, Dashboard)
        assert "No backend is configured" in notes(app)
        assert not [c for c in source.calls if c[0] == "submit"]
