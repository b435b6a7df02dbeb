"""The dashboard as a newcomer meets it, on fixed scenes (no process): the command palette is
generated from the bindings, so every key is there under its own key; cancel acts on the job
shown when the key was pressed; the rows say what is true."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any

from fixed_source import FixedSource, demo_snapshot, fixed_clocks
from rich.text import Text
from textual.geometry import Region
from textual.pilot import Pilot
from textual.widgets import Select, TextArea
from waiting import wait_until_async

from vramtui.app import VramApp
from vramtui.app.commands import VramCommands
from vramtui.app.screens.confirm_dialog import ConfirmDialog
from vramtui.app.screens.dashboard import DASHBOARD_BINDINGS
from vramtui.app.screens.job_detail import JobDetail
from vramtui.app.screens.submit_dialog import SubmitDialog
from vramtui.app.widgets.backends_table import BackendsTable
from vramtui.app.widgets.jobs_table import JobsTable
from vramtui.app.widgets.process_table import ProcessTable

WIDE = (160, 48)


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


async def until(pilot: Pilot[int], predicate: Callable[[], object], what: str) -> object:
    return await wait_until_async(predicate, 20.0, what, pause=lambda: pilot.pause(0.05))


async def shown(pilot: Pilot[int]) -> None:
    app: VramApp = pilot.app  # type: ignore[assignment]
    await until(pilot, lambda: app.polls >= 1, "a snapshot")
    await pilot.pause()


async def open_submit_dialog(pilot: Pilot[int], backend: str) -> SubmitDialog:
    """The submit dialog, opened on ``backend`` once the dashboard shows, with its fields."""
    app: VramApp = pilot.app  # type: ignore[assignment]
    await shown(pilot)
    app.open_submit(backend)
    await until(pilot, lambda: isinstance(app.screen, SubmitDialog)
                and app.screen.query("#payload"), "the dialog")
    assert isinstance(app.screen, SubmitDialog)
    return app.screen


@aio
async def test_the_palette_offers_every_key_under_its_own_key() -> None:
    app = VramApp(FixedSource(demo_snapshot()), "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        general = VramCommands(app.screen).general()
        by_name = {name.split(":")[0]: (help_text, callback) for name, callback, help_text
                   in general}
        for b in DASHBOARD_BINDINGS:
            assert by_name[b.description][0] == f"key {b.key_display or b.key}", b.action
        assert by_name["Calibrate"][0] == "key m" and by_name["1m/10m"][0] == "key t"
        for wanted in ("Reload", "Drain", "Kill", "Processes", "Retry", "Pri+", "Help",
                       "Quit"):
            assert wanted in by_name, wanted
        by_name["Processes"][1]()  # a palette command does what its key does
        await pilot.pause()
        assert app.screen.query_one(ProcessTable).display


@aio
async def test_the_palette_leaves_out_what_the_dashboard_does_not_offer() -> None:
    app = VramApp(FixedSource(demo_snapshot()), "attached to /tmp/x.sock", readonly=True,
                  clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        names = {name.split(":")[0] for name, _cb, _help in VramCommands(app.screen).general()}
        assert "Evict" not in names and "Reload" not in names  # read-only: not offered
        assert {"Details", "Processes", "Filter", "Help", "Quit"} <= names


async def select_job(pilot: Pilot[int], job_id: str) -> JobsTable:
    table = pilot.app.screen.query_one(JobsTable)
    table.focus()
    table.move_cursor(table.get_row_index(job_id))
    await pilot.pause()
    assert table.selected_key() == job_id
    return table


@aio
async def test_cancel_acts_on_the_job_shown_when_the_key_was_pressed() -> None:
    snap = demo_snapshot()
    source = FixedSource(snap)
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        second = snap.queued[1]
        await select_job(pilot, second.id)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the dialog")
        assert app.screen.title_text == (f"Cancel job {second.id} ({second.backend}, queued, "
                                         "position 2)?")
        # The queue moves under the dialog: the first job runs, the cursor's row changes.
        source.snapshot_value = replace(snap, running=(*snap.running, snap.queued[0]),
                                        queued=(replace(second, position=1),))
        polls = app.polls
        await until(pilot, lambda: app.polls > polls + 1, "the queue to move")
        await pilot.press("y")
        await until(pilot, lambda: ("cancel", (second.id,)) in source.calls, "the cancel")
        assert [c for c in source.calls if c[0] == "cancel"] == [("cancel", (second.id,))]


@aio
async def test_a_selected_job_that_left_the_table_is_not_replaced_by_another() -> None:
    snap = demo_snapshot()
    source = FixedSource(snap)
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        gone = snap.queued[0]
        table = await select_job(pilot, gone.id)
        source.snapshot_value = replace(snap, queued=snap.queued[1:])  # it went away
        polls = app.polls
        await until(pilot, lambda: app.polls > polls + 1, "the job to leave")
        assert table.selected_key() is None
        await pilot.press("c")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmDialog)
        assert not [c for c in source.calls if c[0] == "cancel"]
        await pilot.press("down")  # moving the cursor selects again
        assert table.selected_key() is not None


def notes(app: VramApp) -> str:
    return " | ".join(str(n.message) for n in app._notifications)


@aio
async def test_evicting_a_cold_backend_says_there_is_nothing_to_evict() -> None:
    app = VramApp(FixedSource(demo_snapshot()), "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        table = app.screen.query_one(BackendsTable)
        table.focus()
        table.move_cursor(table.get_row_index("flux-sim"))  # cold
        await pilot.press("e")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmDialog)
        assert "flux-sim is not loaded: nothing to evict." in notes(app)
        assert table.column_width("jobs") and "Served" in str(table.render_line(0).text)


@aio
async def test_the_quit_dialog_counts_the_jobs_while_it_is_open() -> None:
    snap = demo_snapshot()
    source = FixedSource(snap)
    app = VramApp(source, "embedded", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        await pilot.press("q")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the dialog")
        dialog = app.screen
        assert isinstance(dialog, ConfirmDialog) and dialog.body.startswith("3 jobs are")
        source.snapshot_value = replace(snap, running=(), queued=())
        await until(pilot, lambda: dialog.body.startswith("No job is running or queued now"),
                    "the count to follow")


@aio
async def test_the_job_screen_times_history_and_progress_from_one_origin() -> None:
    snap = demo_snapshot()
    job = snap.running[0]
    app = VramApp(FixedSource(snap), "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        app.progress[job.id] = deque([(job.submitted_at + 3.0, 0.5, "step 10/20")])
        app.open_job(job.id)
        await until(pilot, lambda: isinstance(app.screen, JobDetail), "the job screen")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, JobDetail)
        text = _plain(screen._timeline(job))
        assert "+1.60s running" in text and "+3.00s 50% step 10/20" in text


def _plain(renderable: object) -> str:
    import io

    from rich.console import Console

    console = Console(width=100, record=True, file=io.StringIO())
    console.print(renderable)
    return " ".join(console.export_text().split())


@aio
async def test_the_submit_dialogs_example_fits_the_backends_api() -> None:
    snap = demo_snapshot()
    chat = replace(snap.backends[0], name="chat-sim", api=("chat",))
    source = FixedSource(replace(snap, backends=(*snap.backends, chat)))
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await open_submit_dialog(pilot, "chat-sim")
        payload = app.screen.query_one("#payload", TextArea)
        assert '"model": "chat-sim", "messages": [' in payload.text
        app.screen.query_one("#backend", Select).value = "sdxl-sim"
        await until(pilot, lambda: payload.text == '{"steps": 10}', "the demo's example")


def on_screen(widget: Any) -> str:
    """The words a widget shows now, its lines joined (a wrapped line reads on)."""
    if not widget.display:
        return ""
    strips = widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))
    return " ".join(" ".join(s.text for s in strips).split())


@aio
async def test_the_whole_note_of_every_job_can_be_read_at_80x24() -> None:
    snap = demo_snapshot()
    stream = "waits: chat-llm expects a request within 1.2 s (its stream is open)"
    longest = ("needs 18.0 GiB: waiting for the jobs running on GPU0 to give it back; "
               "sdxl-sim and whisper-sim stay loaded for 2 more jobs, then flux-sim is next")
    snap = replace(snap, queued=(replace(snap.queued[0], waiting=longest),
                                 replace(snap.queued[1], waiting=stream)))
    app = VramApp(FixedSource(snap), "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=(80, 24)) as pilot:
        await shown(pilot)
        table = app.screen.query_one(JobsTable)
        line = app.screen.query_one("#job-note")
        table.focus()
        jobs = [*snap.running, *snap.queued, *snap.recent[:8]]
        assert table.keys() == [j.id for j in jobs]
        table.move_cursor(0)
        cut = []
        for i, job in enumerate(jobs):
            if i:
                await pilot.press("j")  # as a user moves: the line follows the cursor
            await pilot.pause()
            note = job.error if job.state.finished else job.waiting or job.progress_text
            whole = " ".join((note or "").split())
            cell = table.get_cell(job.id, "note")
            cell = cell.plain if isinstance(cell, Text) else cell
            if cell == whole:
                assert not line.display, job.id  # nothing cut: no line spent on it
            else:
                assert whole in on_screen(line), (job.id, whole, on_screen(line))
                cut.append(job.id)
        assert len(cut) == 3, cut  # both reasons and the crash are longer than the column


@aio
async def test_the_selected_job_stays_selected_across_a_resize_and_a_new_sort() -> None:
    snap = demo_snapshot()
    source = FixedSource(snap)
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        chosen = snap.recent[0].id
        table = await select_job(pilot, chosen)
        for size, shift in (((80, 24), 1), (WIDE, 2)):  # over the narrow breakpoint
            # new columns, and a job more on top by the time the rows come again
            extra = tuple(replace(snap.queued[0], id=f"j-new{n}") for n in range(shift))
            source.snapshot_value = replace(snap, running=(*extra, *snap.running))
            await pilot.resize_terminal(*size)
            polls = app.polls
            await until(pilot, lambda p=polls, n=shift: app.polls > p + 1
                        and f"j-new{n - 1}" in table.keys(),  # noqa: SIM118
                        f"the table at {size}")
            assert table.selected_key() == chosen, size
        await pilot.press("O")  # sorted by job id, reversed: the row moves, the selection too
        polls = app.polls
        await until(pilot, lambda: app.polls > polls + 1 and table.row_count, "sorted")
        assert table.sort_by == "id" and table.get_row_index(chosen) != 5
        assert table.selected_key() == chosen
