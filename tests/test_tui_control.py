"""The control centre's newer keys against a real engine, and the TUI attached to a served
engine whose files it cannot read.

Truth comes from outside the app: the engine's own answers (``sup``), the worker processes
(psutil), the interpreter's audit log of every file the app opens.
"""

from __future__ import annotations

import os
import pwd
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from engine_support import engine, sim_backend
from fixed_source import FixedSource, demo_snapshot, fixed_clocks
from serve_support import make_env, new_root, reap, start_serve
from test_tui import NARROW, WIDE, aio, notes, rendered, req, select_backend, text_of, until
from textual.widgets import Input
from textual.widgets._footer import FooterKey

from supervisor.client import Client
from supervisor.jobs import JobState
from vramtui.app import VramApp
from vramtui.app.screens.backend_detail import BackendDetail
from vramtui.app.screens.calibration_screen import CalibrationScreen
from vramtui.app.screens.confirm_dialog import ConfirmDialog
from vramtui.app.screens.dashboard import Dashboard
from vramtui.app.screens.help_screen import HelpScreen
from vramtui.app.screens.job_detail import JobDetail
from vramtui.app.screens.keys import MUTATING
from vramtui.app.screens.reload_screen import ReloadScreen
from vramtui.app.screens.submit_dialog import SubmitDialog
from vramtui.app.widgets.backends_table import BackendsTable
from vramtui.app.widgets.engine_header import EngineHeader
from vramtui.app.widgets.jobs_table import JobsTable
from vramtui.app.widgets.mem_bar import bar_segments
from vramtui.app.widgets.process_table import ProcessTable


def backends() -> list[dict[str, object]]:
    return [sim_backend("alpha", 1024, 256, steps=2, step_s=0.02),
            sim_backend("beta", 512, 256, priority=3)]


@pytest.mark.process
@aio
async def test_jobs_keys_retry_priority_marks_sort_and_navigation() -> None:
    with engine(backends(), gpus="sim:8GiB") as sup:
        app = VramApp(sup, "embedded", confirm=False)
        async with app.run_test(size=WIDE) as pilot:
            await rendered(pilot)
            # (it runs until the test cancels it: 8 s was not enough on a loaded 2-core box)
            busy = sup.submit("alpha", req(steps=6000, step_s=0.02))
            await until(pilot, lambda: sup.job(busy).state is JobState.RUNNING, "running")
            low, high = sup.submit("alpha", b""), sup.submit("alpha", b"")
            done = sup.submit("beta", req(steps=1, step_s=0.01))
            sup.wait(done, 30)
            await rendered(pilot, 2)
            jobs = app.screen.query_one(JobsTable)
            jobs.focus()
            # j/k and G/g move the cursor like the arrows and End/Home
            await pilot.press("g")
            assert jobs.cursor_row == 0
            await pilot.press("j", "j")
            assert jobs.cursor_row == 2
            await pilot.press("k")
            assert jobs.cursor_row == 1
            await pilot.press("G")
            assert jobs.cursor_row == jobs.row_count - 1
            # + raises the selected queued job's priority: it moves ahead of the other
            jobs.move_cursor(jobs.get_row_index(high))
            await pilot.press("plus")
            await until(pilot, lambda: sup.job(high).priority == 1, "priority 1")
            assert sup.job(high).position == 1 and sup.job(low).position == 2
            await until(pilot, lambda: "priority 1" in notes(app), "the toast")
            # R retries a finished job: a new job with the same request
            await rendered(pilot)
            jobs.move_cursor(jobs.get_row_index(done))
            await pilot.press("R")
            await until(pilot, lambda: "Retrying" in notes(app), "the retry")
            snap = sup.snapshot()
            again = [j for j in (*snap.running, *snap.queued, *snap.recent)
                     if j.backend == "beta" and j.id != done]
            assert again
            # space marks jobs; c cancels every marked one (and only those)
            await rendered(pilot)
            for job in (low, high):
                jobs.move_cursor(jobs.get_row_index(job))
                await pilot.press("space")
            assert jobs.marked == {low, high}
            await pilot.press("c")
            await until(pilot, lambda: sup.job(low).finished and sup.job(high).finished,
                        "the marked jobs cancelled")
            assert sup.job(low).state is sup.job(high).state is JobState.CANCELLED
            assert sup.job(busy).state is JobState.RUNNING  # not marked: untouched
            await until(pilot, lambda: not jobs.marked, "the marks cleared")
            # o sorts by a column (the header says which); a click on a header too
            backends_table = app.screen.query_one(BackendsTable)
            backends_table.focus()
            await pilot.press("o")
            await rendered(pilot)
            assert backends_table.sort_by == "name" and not backends_table.sort_reverse
            await pilot.press("O")
            await rendered(pilot)
            assert backends_table.keys() == ["beta", "alpha"]
            await pilot.click(BackendsTable, offset=(40, 1))  # the PID column's header
            await rendered(pilot)
            assert backends_table.sort_by not in (None, "name")
            sup.cancel(busy)


@pytest.mark.process
@aio
async def test_kill_drain_reload_and_the_process_list() -> None:
    with engine(backends(), gpus="sim:8GiB") as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=WIDE) as pilot:
            sup.preload("alpha")
            await until(pilot, lambda: sup.snapshot().backend("alpha").state == "ready",
                        "alpha ready")
            pid = sup.snapshot().backend("alpha").pid
            # v: the GPU's processes, the worker named by its backend
            await rendered(pilot)
            await pilot.press("v")
            procs = app.screen.query_one(ProcessTable)
            await until(pilot, lambda: f"0:{pid}" in procs.keys(),  # noqa: SIM118
                        "the worker on the GPU")
            assert text_of_cell(procs.get_cell(f"0:{pid}", "owner")) == "alpha"
            assert procs.get_cell(f"0:{pid}", "user") == pwd.getpwuid(os.getuid()).pw_name
            await pilot.press("v")
            # X kills the selected backend's worker, after asking
            await select_backend(pilot, "alpha")
            await pilot.press("X")
            assert isinstance(app.screen, ConfirmDialog) and "Kill alpha" in \
                app.screen.title_text
            await pilot.press("y")
            await until(pilot, lambda: not psutil.pid_exists(pid) or psutil.Process(pid)
                        .status() == psutil.STATUS_ZOMBIE, "the worker killed")
            # D drains the (only) GPU, after asking; D again opens it
            await pilot.press("D")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await until(pilot, lambda: sup.snapshot().gpus[0].draining, "GPU0 draining")
            await rendered(pilot)
            assert "DRAINING" in app.screen.query_one(EngineHeader).render().plain
            await pilot.press("D", "y")
            await until(pilot, lambda: not sup.snapshot().gpus[0].draining, "GPU0 open")
            # L reloads the descriptors and shows what changed
            await pilot.press("L")
            await until(pilot, lambda: isinstance(app.screen, ReloadScreen), "the diff")
            assert "nothing changed" in str(app.screen.query_one("#dialog-body").content)
            await pilot.press("escape")
            assert isinstance(app.screen, Dashboard)


def text_of_cell(cell: object) -> str:
    return cell.plain if hasattr(cell, "plain") else str(cell)  # type: ignore[attr-defined]


@aio
async def test_readonly_offers_no_changing_key_and_says_why() -> None:
    app = VramApp(FixedSource(demo_snapshot()), "embedded", readonly=True,
                  clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await rendered(pilot)
        offered = {k.action for k in app.screen.query(FooterKey) if k.display}
        assert offered and not offered & MUTATING, offered
        for key in ("e", "c", "X", "D", "L", "s", "m"):
            await pilot.press(key)
            assert isinstance(app.screen, Dashboard), key
        assert notes(app).count("Read-only") >= 7
        assert not [c for c in app.api.calls if c[0] != "logs"]  # type: ignore[attr-defined]


@aio
async def test_the_footer_fits_at_every_width_and_help_covers_every_key() -> None:
    app = VramApp(FixedSource(demo_snapshot()), "embedded", clocks=fixed_clocks())
    for width in (60, 80, 120, 160):
        async with app.run_test(size=(width, 30)) as pilot:
            await rendered(pilot)
            shown = [k for k in app.screen.query(FooterKey) if k.display]
            assert sum(k.size.width for k in shown) <= width, width
            assert {"help", "quit"} <= {k.action for k in shown}
        app = VramApp(FixedSource(demo_snapshot()), "embedded", clocks=fixed_clocks())
    async with app.run_test(size=NARROW) as pilot:
        await rendered(pilot)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        body = text_of(app.screen.query_one("#help-body"))
        for words in ("↑ ↓  k j", "PgUp PgDn", "g G", "mouse", "column header", "space",
                      "NO_COLOR", "theme", "R retry", "X kill"):
            assert words in body, words


@aio
async def test_the_header_follows_the_engine_pid_and_the_submit_priority_is_checked() -> None:
    source = FixedSource(demo_snapshot())
    app = VramApp(source, "attached to the engine at /x.sock", clocks=fixed_clocks())
    async with app.run_test(size=WIDE) as pilot:
        await rendered(pilot)
        header = app.screen.query_one(EngineHeader)
        assert "attached pid 40999" in header.render().plain
        from dataclasses import replace

        source.snapshot_value = replace(source.snapshot_value, pid=51234)  # it restarted
        await rendered(pilot, 2)
        assert "pid 51234" in header.render().plain and "40999" not in header.render().plain
        app.open_submit("sdxl-sim")
        await pilot.pause()
        assert isinstance(app.screen, SubmitDialog)
        box = app.screen.query_one("#priority", Input)
        box.value = "high"
        await pilot.pause()
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SubmitDialog)  # refused, saying why
        assert "whole number" in str(app.screen.query_one("#dialog-error").content)
        box.value = "-12"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: any(c[0] == "submit" for c in source.calls), "submitted")
        assert next(c for c in source.calls if c[0] == "submit")[1][2] == -12


def test_no_color_keeps_the_memory_bar_readable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = VramApp(FixedSource(demo_snapshot()), "embedded")
    assert app.no_color
    chars = [char for _name, char, _mib, _style in bar_segments(demo_snapshot().gpus[0])]
    assert len(set(chars)) == len(chars)  # ours, reserved, over, foreign, free


# ------------------------------------------------------------------ attached, files unreadable


@contextmanager
def as_user(uid: int, gid: int) -> Iterator[None]:
    """This whole process (every thread) with another effective uid and gid, then back."""
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


_opened: list[str] = []
_watch: list[str] = []
_hook_lock = threading.Lock()


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _watch and args and isinstance(args[0], str | bytes | Path):
        path = os.fsdecode(args[0])  # type: ignore[arg-type]
        if any(path.startswith(w) for w in _watch):
            with _hook_lock:
                _opened.append(path)


sys.addaudithook(_audit)


@pytest.mark.process
@aio
async def test_attached_to_an_engine_whose_files_it_cannot_read_every_screen_works() -> None:
    """A served engine of root; the TUI as user nobody (when run as root), attached over the
    socket, opens every screen; and, whoever runs it, the app opens no file of the engine's
    state or config directory (the interpreter's audit hook sees every open)."""
    nobody = pwd.getpwnam("nobody") if os.geteuid() == 0 else None
    root = new_root()
    os.chmod(root, 0o711)
    backend = sim_backend("alpha", 1024, 256, steps=3, step_s=0.02, load_s=0.02)
    served = start_serve(make_env(root, [backend]), root,
                         *(["--allow-group", str(nobody.pw_gid)] if nobody else []))
    try:
        state = served.paths.state_dir
        c = served.client()
        job = c.submit("alpha", req(steps=3, step_s=0.02), metadata={"who": "attached"})
        c.wait(job, 60)
        calibration = c.calibrate("alpha", repeats=1, settle_s=0.1)
        assert c.wait(calibration, 120).state is JobState.SUCCEEDED
        c.close()
        assert (state / "calibration").is_dir() and (state / "logs" / "alpha.log").exists()
        _watch[:] = [str(state), str(served.paths.config_dir)]
        _opened.clear()
        who = as_user(nobody.pw_uid, nobody.pw_gid) if nobody else _no_change()
        with who:
            if nobody is not None:
                with pytest.raises(PermissionError):
                    os.listdir(state)  # truly unreadable for this TUI
            api = Client(served.socket)
            app = VramApp(api, "attached to the engine at " + str(served.socket))
            async with app.run_test(size=WIDE) as pilot:
                await rendered(pilot)
                await select_backend(pilot, "alpha")
                await pilot.press("enter")
                assert isinstance(app.screen, BackendDetail)
                await until(pilot, lambda: app.screen.static_shown, "descriptor and report")
                assert "simmodel" in text_of(app.screen.query_one("#descriptor"))
                assert "confidence" in text_of(app.screen.query_one("#calibration"))
                log = app.screen.query_one("#worker-log")
                await until(pilot, lambda: any("ready" in t.plain for t in log._source),
                            "the worker's log")
                await pilot.press("escape")
                app.open_job(job)
                await until(pilot, lambda: isinstance(app.screen, JobDetail)
                            and app.screen.request_shown, "the job screen")
                assert '"steps": 3' in text_of(app.screen.query_one("#request"))
                await until(pilot, lambda: "succeeded" in text_of(
                    app.screen.query_one("#result")), "its result")
                await pilot.press("escape")
                app.open_calibration(calibration, "alpha")
                screen = await until(pilot, lambda: isinstance(app.screen, CalibrationScreen)
                                     and app.screen.report is not None and app.screen,
                                     "the calibration report")
                assert isinstance(screen, CalibrationScreen) and screen.report_data
                await pilot.press("escape")
                for key, kind in (("question_mark", HelpScreen), ("s", SubmitDialog)):
                    await pilot.press(key)
                    assert isinstance(app.screen, kind)
                    await pilot.press("escape")
                await pilot.press("v")
                await until(pilot, lambda: app.screen.query_one(ProcessTable).row_count >= 0,
                            "processes")
                await pilot.press("L")
                await until(pilot, lambda: isinstance(app.screen, ReloadScreen), "reload")
                await pilot.press("escape")
                assert "cannot" not in notes(app) and "denied" not in notes(app).lower()
            api.close()
        assert _opened == [], _opened  # not one file of the engine's, tried or read
    finally:
        _watch.clear()
        reap(served)


@contextmanager
def _no_change() -> Iterator[None]:
    yield
