"""The control centre against a user trying to break it, on a real embedded engine on the
simulated GPU (real worker processes): what a worker returns, a request's bytes and a
descriptor's words never act on the terminal; a queue of thousands stays responsive; a key
pressed twice fast does its work once."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from engine_support import ROOT, engine
from fixed_source import FixedSource, demo_snapshot, fixed_clocks
from test_tui import WIDE, aio, notes, preload, rendered, select_backend, state, until

from supervisor.engine import EngineConfig
from vramtui.app import VramApp
from vramtui.app.commands import QUEUED_OFFERED, VramCommands
from vramtui.app.fmt import Clocks
from vramtui.app.screens.backend_detail import BackendDetail
from vramtui.app.screens.job_detail import JobDetail
from vramtui.app.widgets.backends_table import BackendsTable
from vramtui.app.widgets.engine_header import EngineHeader
from vramtui.app.widgets.jobs_table import JobsTable

ECHO = ROOT / "examples" / "echo" / "main.py"
# a title, a clear-screen, a bell, a clipboard write and a bidi override
HOSTILE = "t \x1b]0;pwned\x07 clear \x1b[2J clip \x1b]52;c;aGk=\x07 \u202eevil"
ACTS = ("\x1b", "\x07", "\u202e")


def echo(description: str = "") -> dict[str, object]:
    return {"name": "echo", "script": str(ECHO), "description": description,
            "vram": {"weights": "0MiB", "activation": "16MiB"}, "timeouts": {"stop_grace": "3s"}}


def acting(screen: str) -> list[str]:
    return [c for c in ACTS if c in screen]


@pytest.mark.process
@aio
async def test_a_result_a_request_and_a_description_with_escapes_are_shown_inert() -> None:
    """The echo worker returns what it was sent: a request of raw bytes with a title,
    clear-screen, clipboard and bidi sequence comes back as its result.  The job's screen
    shows both written out, as the backend's screen and the palette show a descriptor's
    description that carries the same (a YAML "\\e" is an ESC)."""
    with engine([echo(f"a model {HOSTILE}")]) as sup:
        job = sup.submit("echo", HOSTILE.encode())
        app = VramApp(sup, "embedded")
        async with app.run_test(size=WIDE) as pilot:
            await until(pilot, lambda: sup.job(job).finished, "the echo")
            await rendered(pilot)
            app.open_job(job)
            await until(pilot, lambda: isinstance(app.screen, JobDetail)
                        and app.screen.request_shown and app.screen.view is not None
                        and app.screen.view.finished, "the job's screen")
            await pilot.pause()
            screen = app.export_screenshot()
            assert "\\x1b]0;pwned\\x07" in screen and "\\u202eevil" in screen
            assert acting(screen) == []
            await pilot.press("escape")
            app.open_backend("echo")
            await until(pilot, lambda: isinstance(app.screen, BackendDetail), "its backend")
            await rendered(pilot)
            screen = app.export_screenshot()
            assert "\\x1b]0;pwned" in screen and acting(screen) == []
            await pilot.press("escape", "ctrl+p")
            await pilot.press(*"Backend details")
            await pilot.pause(0.5)
            assert acting(app.export_screenshot()) == []


@pytest.mark.process
@aio
async def test_a_queue_of_thousands_shows_a_bounded_table_and_palette() -> None:
    """2,000 queued jobs on a drained GPU: the jobs table holds the first QUEUED_SHOWN (its
    title says so), a filter still finds any job, and the palette offers the first
    QUEUED_OFFERED by name and any other by its id.  (All 5,000 rows were rebuilt every
    second, 0.5 to 1.7 s a refresh at 4 a second, and the palette took 15 s to list them.)"""
    with engine([echo()], config=EngineConfig(reserve_mib=0, tick_s=0.1,
                                               max_queue_depth=5000)) as sup:
        sup.drain(0, True)
        ids = [sup.submit("echo", b"x") for _ in range(2000)]
        app = VramApp(sup, "embedded")
        async with app.run_test(size=WIDE) as pilot:
            await rendered(pilot, 2)
            jobs = app.screen.query_one(JobsTable)
            assert jobs.row_count == JobsTable.QUEUED_SHOWN
            assert jobs.keys() == ids[:JobsTable.QUEUED_SHOWN]
            assert len(jobs._memo) == JobsTable.QUEUED_SHOWN  # rows built: those shown
            subtitle = str(app.screen.query_one("#jobs-box").border_subtitle)
            assert f"2000 queued (first {JobsTable.QUEUED_SHOWN} shown" in subtitle
            last = ids[-1]
            await pilot.press("slash", *last)
            await until(pilot, lambda: jobs.keys() == [last], "the filter to find the last")
            await pilot.press("escape")
            offered = [name for name, _cb, _help in VramCommands(app.screen).targets()]
            assert len(offered) < 2 * QUEUED_OFFERED + 50
            assert not any(last in name for name in offered)
            by_id = [name for name, _cb, _help in VramCommands(app.screen).targets(last)]
            assert f"Cancel job {last} (echo)" in by_id


@pytest.mark.process
@aio
async def test_respawn_pressed_twice_fast_restarts_the_worker_once() -> None:
    """With --no-confirm, r r restarted the backend twice: the second respawn stopped the
    worker the first had just started.  The second press is about the worker shown when it
    was pressed, which is already being respawned: nothing is done twice.  Once the new
    worker shows, r acts on it."""
    with engine([echo()]) as sup:
        app = VramApp(sup, "embedded", confirm=False)
        async with app.run_test(size=WIDE, notifications=True) as pilot:
            pid = await preload(pilot, sup, "echo")
            await select_backend(pilot, "echo")
            # Both requests in one turn of the app's loop, as two fast presses land before
            # any snapshot: a snapshot that already showed the new worker between two key
            # presses would (rightly) let the second act on it, and the test would race.
            app.request_respawn("echo")
            app.request_respawn("echo")
            await until(pilot, lambda: state(sup, "echo")[0] == "ready"
                        and state(sup, "echo")[1] not in (None, pid), "a new worker")
            await rendered(pilot, 2)
            respawns = [line.text for line in sup.snapshot().log if "respawning" in line.text]
            assert respawns == ["respawning echo"]
            assert "already being respawned" in notes(app)
            new = state(sup, "echo")[1]
            await until(pilot, lambda: app.snap is not None
                        and app.snap.backend("echo").pid == new, "the new worker shown")
            await pilot.press("r")
            await until(pilot, lambda: len([line for line in sup.snapshot().log
                                            if "respawning" in line.text]) == 2, "respawned")


@pytest.mark.process
@aio
async def test_a_backend_last_used_a_day_ago_reads_whole_in_its_column() -> None:
    """A backend last used a day and an hour before the snapshot shows ``1d01h ago`` in Last
    use, whole (``25h00m ago`` was cut to ``25h00m a…``)."""
    snap = demo_snapshot()
    used = replace(snap.backends[0], last_used=snap.taken_at - 90_000)
    app = VramApp(FixedSource(replace(snap, backends=(used, *snap.backends[1:]))), "embedded",
                  clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await rendered(pilot)
        table = app.screen.query_one(BackendsTable)
        await until(pilot, lambda: str(table.get_cell(used.name, "last")) == "1d01h ago",
                    "the last use shown")
        assert len("1d01h ago") <= table.column_width("last")


@pytest.mark.process
@aio
async def test_ages_are_the_engines_whatever_the_apps_clock_says() -> None:
    """The app's wall clock a day ahead of the engine's (a clock stepped since the engine
    started): the backend just used still reads as just used, and the job just done as
    submitted seconds ago; an age is the engine's time of the snapshot less the engine's
    time of the thing."""
    with engine([echo()]) as sup:
        job = sup.submit("echo", b"x")
        clocks = Clocks(wall=lambda: time.time() + 90_000)
        app = VramApp(sup, "embedded", clocks=clocks)
        async with app.run_test(size=WIDE) as pilot:
            await until(pilot, lambda: sup.job(job).finished, "the job")
            await rendered(pilot)
            table = app.screen.query_one(BackendsTable)
            await until(pilot, lambda: str(table.get_cell("echo", "last")) not in ("", "never"),
                        "the last use shown")
            assert str(table.get_cell("echo", "last")).endswith(("s ago", "just now")), \
                table.get_cell("echo", "last")


@pytest.mark.process
@aio
async def test_a_tiny_terminal_still_says_simulated_read_only_and_gone() -> None:
    """At 20x6 and 40x10 the header's first cells say the GPU is SIMULATED (and READ-ONLY,
    and ENGINE GONE when so); the full line left them past the edge at 20x6."""
    with engine([echo()]) as sup:
        app = VramApp(sup, "embedded", readonly=True, retry_s=0.2)
        async with app.run_test(size=(20, 6)) as pilot:
            await rendered(pilot)
            header = app.screen.query_one(EngineHeader)
            for size in ((20, 6), (40, 10)):
                await pilot.resize_terminal(*size)
                await rendered(pilot)
                shown_line = header.render().plain[:size[0]]
                assert "SIM" in shown_line, (size, shown_line)
            assert "READ-ONLY" in header.render().plain[:40]
            sup.stop(timeout=30)
            await until(pilot, lambda: "ENGINE GONE" in header.render().plain[:40], "gone")
            await pilot.resize_terminal(20, 6)
            await pilot.pause()
            assert header.render().plain[:20].split()[:3] == ["SIM", "GONE", "RO"]


@pytest.mark.process
@aio
async def test_a_backend_removed_by_a_reload_leaves_nothing_selected() -> None:
    """The cursor on a backend that a reload removes lands on no other: with --no-confirm,
    the next e (evict) acted at once on the neighbour that took its row."""
    keep, gone = dict(echo(), name="keep"), dict(echo(), name="gone")
    with engine([keep, gone]) as sup:
        app = VramApp(sup, "embedded", confirm=False)
        async with app.run_test(size=WIDE, notifications=True) as pilot:
            pid = await preload(pilot, sup, "keep")
            await select_backend(pilot, "gone")
            source = Path(sup.descriptor("gone").layers[0].file)
            source.write_text(yaml.safe_dump({"backends": [keep]}))
            assert sup.reload().removed
            table = app.screen.query_one(BackendsTable)
            await until(pilot, lambda: table.keys() == ["keep"], "the reload shown")
            assert table.selected_key() is None
            await pilot.press("e")
            await rendered(pilot, 1)
            assert "Select a backend first" in notes(app)
            assert state(sup, "keep") == ("ready", pid)  # not evicted
            await pilot.press("down")  # moving the cursor selects again
            assert table.selected_key() == "keep"
