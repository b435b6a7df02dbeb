"""The control centre against a demanding (or hostile) user, on fixed scenes (no process):
what is typed, and what the engine's data carries, never takes the app down; a refusal
says what to do and loses nothing; --readonly offers nothing that changes anything."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fixed_source import FixedSource, demo_snapshot, fixed_clocks
from test_tui_walk import WIDE, aio, notes, open_submit_dialog, shown, until
from textual.command import CommandPalette
from textual.widgets import Input, OptionList, Static, TextArea

from supervisor.errors import UnknownBackend
from supervisor.results import LogChunk
from supervisor.validate import PRIORITY_MAX, PRIORITY_MIN
from vramtui.app import VramApp
from vramtui.app.commands import VramCommands
from vramtui.app.screens.backend_detail import BackendDetail
from vramtui.app.screens.confirm_dialog import ConfirmDialog
from vramtui.app.screens.dashboard import Dashboard
from vramtui.app.screens.save_data_dialog import write_copy
from vramtui.app.screens.submit_dialog import priority_problem
from vramtui.app.widgets.backends_table import BackendsTable
from vramtui.app.widgets.gpu_panel import GpuPanel
from vramtui.app.widgets.jobs_table import JobsTable
from vramtui.app.widgets.rewrap_log import RewrapLog


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


MARKUP = "[/] [@click=app.quit]q[/] [b"  # closes nothing, clicks to quit, opens a tag


@aio
async def test_what_is_typed_or_reported_is_text_never_markup() -> None:
    """A filter, a GPU's name, who yielded it and an engine's error carry ``[/]`` (one user
    may name a yield as they like): each is shown as typed, and the app stays up."""
    snap = demo_snapshot()
    gpu = replace(snap.gpus[0], name=f"GPU {MARKUP}", yielded_by=f"mallory {MARKUP}")
    source = FixedSource(replace(snap, gpus=(gpu,)))
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE, notifications=True) as pilot:
        await shown(pilot)
        panel = app.screen.query_one(GpuPanel)
        assert f"GPU {MARKUP}" in panel._border_title.plain
        assert f"MALLORY {MARKUP.upper()}" in panel._border_title.plain
        await pilot.press("slash", *"[/")
        await pilot.pause()
        assert app.filter_text == "[/"
        assert app.screen.query_one(BackendsTable)._border_title.plain.endswith("filter [/")
        await pilot.press("escape", "Y")  # "Resume GPU0? It is yielded to mallory [/] …"
        await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the dialog")
        assert f"mallory {MARKUP}" in str(app.screen.query_one("#dialog-body").render())
        await pilot.press("n")
        app.notify(f"evict x: {MARKUP}")  # as an engine's refusal would read
        await pilot.pause(0.3)
        assert app.is_running and isinstance(app.screen, Dashboard)


@aio
async def test_readonly_palette_offers_only_what_looks() -> None:
    """In --readonly the palette's per-backend, per-GPU and per-job commands are the details
    only (as with the keys); each one offered changes nothing when run."""
    source = FixedSource(demo_snapshot())
    app = VramApp(source, "attached to /tmp/x.sock", readonly=True, clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        offered = list(VramCommands(app.screen).targets())
        names = [name for name, _cb, _help in offered]
        assert names and all(n.startswith(("Backend details:", "Job details:"))
                             for n in names), names
        for _name, callback, _help in offered:
            callback()
            await pilot.pause()
            await pilot.press("escape")
        assert not [c for c in source.calls
                    if c[0] not in ("logs", "descriptor", "calibration_report", "job_request")]


@aio
async def test_the_palette_shows_a_description_with_brackets_as_written() -> None:
    snap = demo_snapshot()
    backends = tuple(replace(b, description=f"a model {MARKUP}") for b in snap.backends)
    app = VramApp(FixedSource(replace(snap, backends=backends)), "attached to /tmp/x.sock",
                  clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, CommandPalette), "the palette")
        await pilot.press(*"Backend details")
        await until(pilot, lambda: app.screen.query(".option-list--option")
                    or app.screen.query_one(OptionList).option_count, "hits")
        await pilot.pause(0.3)
        options = app.screen.query_one(OptionList)
        assert any(MARKUP in str(options.get_option_at_index(i).prompt)
                   for i in range(options.option_count))
        assert app.is_running


def test_saving_over_a_device_or_pipe_is_refused_and_leaves_it_be(tmp_path: Path) -> None:
    """(As root, saving a result to /dev/null replaced the device with a file.)  A pipe
    stands in for the device; a link is followed; a NUL in a path is an OSError the dialog
    shows, not a ValueError that ends the app."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        write_copy(b"data", fifo, "r.json")
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    real = tmp_path / "real.json"
    real.write_bytes(b"old")
    (tmp_path / "link").symlink_to(real)
    assert write_copy(b"new", tmp_path / "link", "r.json") == real
    assert (tmp_path / "link").is_symlink() and real.read_bytes() == b"new"
    with pytest.raises(OSError, match="NUL"):
        write_copy(b"data", f"{tmp_path}/a\0b", "r.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link", "real.json"]


@aio
async def test_a_refused_submit_keeps_the_dialog_and_what_was_typed() -> None:
    """The engine refuses (here: the backend went away in a reload): the dialog stays open,
    says why, keeps the payload; submitted again (twice, quickly), it makes one job."""
    source = FixedSource(demo_snapshot())
    submit = source.submit
    refuse = [True]

    def flaky(backend: str, payload: bytes = b"", **kw: Any) -> str:
        if refuse[0]:
            raise UnknownBackend(backend, ("echo",))
        return submit(backend, payload, **kw)

    source.submit = flaky  # type: ignore[method-assign]
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        dialog = await open_submit_dialog(pilot, "sdxl-sim")
        dialog.query_one("#payload", TextArea).text = '{"steps": 4242}'
        dialog.query_one("#priority", Input).value = "7"
        await pilot.press("ctrl+s")
        error = dialog.query_one("#dialog-error", Static)
        await until(pilot, lambda: "not submitted" in str(error.render()), "the refusal")
        assert "sdxl-sim" in str(error.render()) and app.screen is dialog
        assert dialog.query_one("#payload", TextArea).text == '{"steps": 4242}'
        assert dialog.query_one("#priority", Input).value == "7"
        refuse[0] = False
        await pilot.press("ctrl+s", "ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, Dashboard), "the dialog to close")
        await pilot.pause(0.3)
        assert [c for c in source.calls if c[0] == "submit"] == [
            ("submit", ("sdxl-sim", b'{"steps": 4242}', 7))]
        assert "Submitted j-00000fixed to sdxl-sim." in notes(app)


def test_the_dialog_takes_the_priorities_the_engine_takes() -> None:
    assert priority_problem(str(PRIORITY_MAX)) is None
    assert priority_problem(str(PRIORITY_MIN)) is None
    assert "between" in (priority_problem(str(PRIORITY_MAX + 1)) or "")


@aio
async def test_priority_keys_stop_at_the_engines_limits() -> None:
    snap = demo_snapshot()
    top = replace(snap.queued[0], priority=PRIORITY_MAX)
    source = FixedSource(replace(snap, queued=(top, *snap.queued[1:])))
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        jobs = app.screen.query_one(JobsTable)
        jobs.focus()
        jobs.move_cursor(jobs.get_row_index(top.id))
        await pilot.press("plus")
        await pilot.pause()
        assert f"already at the highest priority ({PRIORITY_MAX})" in notes(app)
        assert not [c for c in source.calls if c[0] == "set_priority"]
        await pilot.press("minus")
        await until(pilot, lambda: ("set_priority", (top.id, PRIORITY_MAX - 1)) in source.calls,
                    "one step down")


HOSTILE_LOG = (b"loading\n\x1b[31mERROR\x1b[0m boom\n 10%|#  \r100%|#####\r\n"
               b"title \x1b]0;pwned\x07 clear \x1b[2J clip \x1b]52;c;aGk=\x07 \xe2\x80\xaeevil\n")


@aio
async def test_a_worker_log_with_escape_sequences_is_shown_inert() -> None:
    """What a model's code prints goes to its log, and the log box shows it: its colours
    are dropped, a progress bar shows its last state, and no title, clear-screen, clipboard
    or bidi sequence reaches the terminal."""
    source = FixedSource(demo_snapshot())

    def logs(backend: str, *, lines: int = 50, offset: int | None = None) -> LogChunk:
        data = HOSTILE_LOG if offset is None else b""
        return LogChunk(f"/x/{backend}.log", data, len(HOSTILE_LOG))

    source.logs = logs  # type: ignore[method-assign]
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await shown(pilot)
        app.open_backend("echo")
        await until(pilot, lambda: isinstance(app.screen, BackendDetail)
                    and app.screen.logs_read, "the log")
        await pilot.pause()
        shown_lines = [t.plain for t in app.screen.query_one(RewrapLog)._source]
        assert shown_lines[:3] == ["loading", "ERROR boom", "100%|#####"]
        assert not any(c in "".join(shown_lines) for c in "\x1b\x07\r\u202e"), shown_lines
        assert "\\x1b]0;pwned" in shown_lines[3] and "\\u202eevil" in shown_lines[3]
