"""The TUI against a real embedded engine on the simulated GPU, with real worker processes.

Every key is checked against the processes themselves: evict really stops the worker, respawn
gives a new pid, cancel really cancels.  Waits poll with a deadline (``pilot.pause``), never a
bare sleep.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from engine_support import ROOT, engine, sim_backend
from fixed_source import FixedSource, demo_snapshot, fixed_clocks
from proc_state import gone
from rich.console import Console
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.widgets import Input, TextArea
from waiting import wait_until_async

from supervisor import JobState, Supervisor
from vramtui.app import VramApp
from vramtui.app.screens.backend_detail import BackendDetail
from vramtui.app.screens.calibration_screen import CalibrationScreen
from vramtui.app.screens.confirm_dialog import ConfirmDialog
from vramtui.app.screens.dashboard import DASHBOARD_BINDINGS, Dashboard
from vramtui.app.screens.help_screen import HelpScreen
from vramtui.app.screens.job_detail import JobDetail
from vramtui.app.screens.save_data_dialog import SaveDataDialog as SaveReportDialog
from vramtui.app.screens.submit_dialog import SubmitDialog
from vramtui.app.widgets.backends_table import BackendsTable
from vramtui.app.widgets.engine_header import EngineHeader
from vramtui.app.widgets.event_log import EventLog
from vramtui.app.widgets.gpu_panel import GpuPanel
from vramtui.app.widgets.jobs_table import JobsTable
from vramtui.app.widgets.phase_chart import PhaseChart
from vramtui.demo import DEMO_WORKLOAD
from vramtui.peaks import over_declared_line, size_to_declare, suggested_peak_mib


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on its own event loop (no async pytest plugin needed)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return run


WIDE = (160, 48)
NARROW = (80, 24)


def backends() -> list[dict[str, object]]:
    return [sim_backend("alpha", 1024, 256), sim_backend("beta", 512, 256, priority=3)]


@contextmanager
def real_engine() -> Iterator[Supervisor]:
    with engine(backends(), gpus="sim:8GiB") as sup:
        yield sup


def alive(pid: int | None) -> bool:
    return pid is not None and not gone(pid)


async def until(pilot: Pilot[int], predicate: Callable[[], object], what: str,
                timeout: float = 20.0) -> object:
    """Wait for ``predicate`` while the app runs (``wait_until_async``, the pilot's pause)."""
    return await wait_until_async(predicate, timeout, what, pause=lambda: pilot.pause(0.05))


async def rendered(pilot: Pilot[int], polls: int = 1) -> None:
    """Wait for ``polls`` more snapshots to reach the screen."""
    app: VramApp = pilot.app  # type: ignore[assignment]
    target = app.polls + polls
    await until(pilot, lambda: app.polls >= target, f"{polls} snapshot(s)")
    await pilot.pause()


def state(sup: Supervisor, name: str) -> tuple[str, int | None]:
    b = sup.snapshot().backend(name)
    assert b is not None
    return b.state, b.pid


async def preload(pilot: Pilot[int], sup: Supervisor, name: str) -> int:
    sup.preload(name)
    await until(pilot, lambda: state(sup, name)[0] == "ready", f"{name} ready")
    pid = state(sup, name)[1]
    assert pid is not None and alive(pid)
    await rendered(pilot)
    return pid


async def select_backend(pilot: Pilot[int], name: str) -> None:
    table = pilot.app.screen.query_one(BackendsTable)
    table.focus()
    table.move_cursor(row=table.get_row_index(name))
    await pilot.pause()
    assert table.selected_key() == name


def text_of(widget: Any) -> str:
    """What a Static shows, as plain text (tables and groups rendered)."""
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(widget.content)
    return console.file.getvalue()  # type: ignore[attr-defined]


def notes(app: VramApp) -> str:
    return "\n".join(n.message for n in app._notifications)


def req(**kw: object) -> bytes:
    return json.dumps(kw).encode()


# ------------------------------------------------------------------------------ dashboard


@pytest.mark.process
@aio
async def test_dashboard_shows_the_real_engine() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=WIDE) as pilot:
            await rendered(pilot)
            header = app.screen.query_one(EngineHeader)
            text = header.render().plain
            assert "embedded" in text and "SIMULATED GPU" in text and "queue" in text
            table = app.screen.query_one(BackendsTable)
            assert table.keys() == ["alpha", "beta"]
            panels = list(app.screen.query(GpuPanel))
            assert len(panels) == 1 and "SIM" in str(panels[0].border_title)
            assert panels[0].graph.display
            log = app.screen.query_one(EventLog)
            await until(pilot, lambda: any("engine started" in t.plain for t in log._source),
                        "the engine's log in the event log")


@pytest.mark.process
@aio
async def test_preload_then_evict_asks_first_and_really_stops_the_worker() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            await select_backend(pilot, "alpha")
            await pilot.press("p")  # preload through the UI
            await until(pilot, lambda: state(sup, "alpha")[0] == "ready", "alpha ready")
            pid = state(sup, "alpha")[1]
            assert alive(pid)
            await rendered(pilot)
            table = app.screen.query_one(BackendsTable)
            assert str(table.get_cell("alpha", "pid")) == str(pid)

            await pilot.press("e")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("n")  # changed my mind
            assert isinstance(app.screen, Dashboard)
            await rendered(pilot, 2)
            assert state(sup, "alpha") == ("ready", pid) and alive(pid)

            await pilot.press("e")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await until(pilot, lambda: not alive(pid), "the worker process to exit")
            await until(pilot, lambda: state(sup, "alpha") == ("cold", None), "alpha cold")
            await rendered(pilot)
            assert str(table.get_cell("alpha", "state")).startswith("cold")


@pytest.mark.process
@aio
async def test_respawn_gives_a_new_process() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            old = await preload(pilot, sup, "beta")
            await select_backend(pilot, "beta")
            await pilot.press("r")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await until(pilot, lambda: state(sup, "beta")[0] == "ready"
                        and state(sup, "beta")[1] not in (None, old), "a new beta worker")
            new = state(sup, "beta")[1]
            assert alive(new)
            await until(pilot, lambda: not alive(old), "the old worker to exit")


@pytest.mark.process
@aio
async def test_cancel_a_running_and_a_queued_job() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            running = sup.submit("alpha", req(steps=1000, step_s=0.02))
            await until(pilot, lambda: sup.job(running).state is JobState.RUNNING, "running")
            queued = sup.submit("alpha", req(steps=1))
            await until(pilot, lambda: app.snap is not None and
                        [j.id for j in app.snap.queued] == [queued], "the queued job shown")
            await rendered(pilot)
            await pilot.press("q")  # jobs are running in this embedded engine: it asks first
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("n")
            jobs = app.screen.query_one(JobsTable)
            jobs.focus()
            jobs.move_cursor(row=jobs.get_row_index(running))
            await pilot.press("c")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await until(pilot, lambda: sup.job(running).state is JobState.CANCELLED,
                        "the running job cancelled")
            # the queued one then starts; cancel it too (or it is already done)
            jobs.move_cursor(row=jobs.get_row_index(queued))
            await pilot.press("c")
            if isinstance(app.screen, ConfirmDialog):
                await pilot.press("y")
                await until(pilot, lambda: sup.job(queued).finished, "the second job ended")
            else:
                assert sup.job(queued).finished
            assert sup.job(running).progress is not None and sup.job(running).progress < 1


@pytest.mark.process
@aio
async def test_zero_evicts_every_idle_worker() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            pids = [await preload(pilot, sup, "alpha"), await preload(pilot, sup, "beta")]
            await pilot.press("z")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await until(pilot, lambda: not any(alive(p) for p in pids), "both workers gone")
            await until(pilot, lambda: [state(sup, n)[0] for n in ("alpha", "beta")]
                        == ["cold", "cold"], "both cold")


@pytest.mark.process
@aio
async def test_no_confirm_acts_at_once() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded", confirm=False)
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            pid = await preload(pilot, sup, "alpha")
            await select_backend(pilot, "alpha")
            await pilot.press("e")
            assert isinstance(app.screen, Dashboard)  # no dialog
            await until(pilot, lambda: not alive(pid), "alpha's worker gone")


@pytest.mark.process
@aio
async def test_readonly_changes_nothing() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded", readonly=True)
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            assert "READ-ONLY" in app.screen.query_one(EngineHeader).render().plain
            pid = await preload(pilot, sup, "alpha")
            job = sup.submit("alpha", req(steps=400, step_s=0.02))
            await until(pilot, lambda: sup.job(job).state is JobState.RUNNING, "running")
            await select_backend(pilot, "alpha")
            for key in ("e", "r", "z", "s", "m", "X", "L", "D", "R"):
                await pilot.press(key)
                assert isinstance(app.screen, Dashboard), key
            await select_backend(pilot, "beta")
            await pilot.press("p")
            jobs = app.screen.query_one(JobsTable)
            await rendered(pilot)
            jobs.focus()
            await pilot.press("c")
            assert isinstance(app.screen, Dashboard)
            # the palette's commands refuse too
            app.request_evict("alpha")
            app.request_cancel(job)
            await rendered(pilot, 2)
            assert state(sup, "alpha") == ("busy", pid) and alive(pid)
            assert state(sup, "beta") == ("cold", None)
            assert sup.job(job).state is JobState.RUNNING
            assert "Read-only" in notes(app)
            sup.cancel(job)


# ------------------------------------------------------------------------------ views


@pytest.mark.process
@aio
async def test_filter_narrows_tables_and_escape_clears_it() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            await pilot.press("slash")
            box = app.screen.query_one("#filter", Input)
            assert box.display and box.has_focus
            await pilot.press("b", "e", "t")
            await pilot.press("q")  # typed into the filter, not a quit
            await pilot.press("backspace")
            await rendered(pilot)
            table = app.screen.query_one(BackendsTable)
            assert table.keys() == ["beta"]
            await pilot.press("enter")
            assert table.has_focus and app.filter_text == "bet"
            await pilot.press("escape")
            await rendered(pilot)
            assert table.keys() == ["alpha", "beta"]
            assert not box.display


@pytest.mark.process
@aio
async def test_detail_screens_for_a_backend_and_a_finished_job() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=WIDE) as pilot:
            await rendered(pilot)  # subscribed to the engine's events from here on
            job = sup.submit("alpha", req(steps=3, step_s=0.02), metadata={"who": "pilot"})
            await until(pilot, lambda: sup.job(job).finished, "the job to finish")
            assert sup.job(job).state is JobState.SUCCEEDED
            # the worker's progress reports came as events: 0 %, 33 %, 67 %, 100 %
            await until(pilot, lambda: len(app.progress.get(job, ())) >= 4, "progress events")
            await rendered(pilot)
            await select_backend(pilot, "alpha")
            await pilot.press("enter")
            assert isinstance(app.screen, BackendDetail)
            assert app.screen.backend_name == "alpha"
            pid = state(sup, "alpha")[1]
            await until(pilot, lambda: str(pid) in text_of(app.screen.query_one("#about")),
                        "the worker pid in the details")
            await until(pilot, lambda: "simmodel" in text_of(app.screen.query_one("#descriptor")),
                        "the descriptor")
            log = app.screen.query_one("#worker-log")
            await until(pilot, lambda: len(log._source) > 0, "the worker's log tail")
            await pilot.press("escape")
            assert isinstance(app.screen, Dashboard)

            jobs = app.screen.query_one(JobsTable)
            jobs.focus()
            jobs.move_cursor(row=jobs.get_row_index(job))
            await pilot.press("enter")
            assert isinstance(app.screen, JobDetail) and app.screen.job_id == job
            await until(pilot, lambda: "succeeded" in text_of(app.screen.query_one("#result")),
                        "the result")
            body = text_of(app.screen.query_one("#result"))
            assert '"steps": 3' in body and "200" in body
            assert "pilot" in text_of(app.screen.query_one("#meta"))
            timeline = text_of(app.screen.query_one("#timeline"))
            assert "running" in timeline and "succeeded" in timeline
            assert "step 2/3" in timeline and "100% done" in timeline
            await pilot.press("b")  # on to its backend
            assert isinstance(app.screen, BackendDetail)
            await pilot.press("escape", "escape")
            assert isinstance(app.screen, Dashboard)


@pytest.mark.process
@aio
async def test_submit_dialog_runs_a_real_job() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            await select_backend(pilot, "beta")
            await pilot.press("s")
            assert isinstance(app.screen, SubmitDialog)
            app.screen.query_one("#payload", TextArea).text = '{"steps": 2, "step_s": 0.01}'
            app.screen.query_one("#priority", Input).value = "7"
            await pilot.press("ctrl+s")
            assert isinstance(app.screen, Dashboard)

            def done() -> object:
                snap = sup.snapshot()
                return [j for j in snap.recent if j.backend == "beta" and j.priority == 7
                        and j.state is JobState.SUCCEEDED]

            (job,) = await until(pilot, done, "the submitted job to succeed")  # type: ignore[misc]
            assert json.loads(job.data)["steps"] == 2
            await until(pilot, lambda: f"Submitted {job.id}" in notes(app), "a notice")


@pytest.mark.process
@aio
async def test_help_lists_every_key_and_graph_and_calibrate_keys() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            body = text_of(app.screen.query_one("#help-body"))
            for b in DASHBOARD_BINDINGS:
                if b.show:
                    assert b.tooltip in body, b.action
                    assert b.id and b.tooltip  # every binding has an id and a tooltip
            await pilot.press("escape")
            assert isinstance(app.screen, Dashboard)

            graph = app.screen.query_one(GpuPanel).graph
            await pilot.press("t")
            await rendered(pilot)
            # at 80x24 the graph gives its rows to the events; it follows once shown
            assert app.graph_window == 600 and not graph.display
            await pilot.press("t")
            assert app.graph_window == 60
            assert app.screen.check_action("demo", ()) is False  # not the demo backends
            await select_backend(pilot, "alpha")
            await pilot.press("m")
            assert isinstance(app.screen, ConfirmDialog)
            assert "Calibrate alpha?" in str(app.screen.title_text)
            await pilot.press("n")
            assert isinstance(app.screen, Dashboard)


@pytest.mark.process
@aio
async def test_command_palette_evicts_a_named_backend() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            pid = await preload(pilot, sup, "beta")
            await pilot.press("ctrl+p")
            assert isinstance(app.screen, CommandPalette)
            await pilot.press(*"evict beta")
            await until(pilot, lambda: app.screen.query("CommandList")
                        and app.screen.query_one("CommandList").option_count > 0,
                        "palette hits")
            await pilot.pause(0.2)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, ConfirmDialog), "the dialog")
            await pilot.press("y")
            await until(pilot, lambda: not alive(pid), "beta's worker gone")


@pytest.mark.process
@aio
async def test_mouse_click_selects_and_opens() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            table = app.screen.query_one(BackendsTable)
            row_y = 2 + table.get_row_index("beta")  # the top border, the header
            await pilot.click(BackendsTable, offset=(4, row_y))
            assert table.selected_key() == "beta"
            await pilot.click(BackendsTable, offset=(4, row_y))
            await until(pilot, lambda: isinstance(app.screen, BackendDetail), "the details")
            assert app.screen.backend_name == "beta"


# ------------------------------------------------------------------------------ calibration


def calibration_backend(name: str, predict_s: float = 0.2) -> dict[str, object]:
    """examples/calibration/steady.py: 256 MiB context + 1000 weights + 500 while predicting
    (peak 1756 MiB), declared at 6 GiB."""
    return {
        "name": name,
        "script": str(ROOT / "examples" / "calibration" / "steady.py"),
        "vram": "6GiB",
        "env": {"SIM_WEIGHTS_MIB": "1000", "SIM_ACTIVATION_MIB": "500", "SIM_LOAD_S": "0.05",
                "SIM_PREDICT_S": str(predict_s)},
        "timeouts": {"stop_grace": "3s", "start": "20s"},
    }


async def calibration_screen(pilot: Pilot[int], name: str) -> CalibrationScreen:
    app: VramApp = pilot.app  # type: ignore[assignment]
    await select_backend(pilot, name)
    await pilot.press("m")
    assert isinstance(app.screen, ConfirmDialog)
    await pilot.press("y")
    screen = await until(pilot, lambda: isinstance(app.screen, CalibrationScreen)
                         and app.screen, "the calibration screen")
    assert isinstance(screen, CalibrationScreen) and screen.backend == name
    return screen


@pytest.mark.process
@aio
async def test_k_calibrates_to_the_end_shows_the_results_and_saves_the_report(
        tmp_path: Any) -> None:
    with engine([calibration_backend("steady")]) as sup:
        app = VramApp(sup, "embedded", calibration_settle_s=0.2)
        async with app.run_test(size=WIDE) as pilot:
            await rendered(pilot)
            screen = await calibration_screen(pilot, "steady")
            await until(pilot, lambda: screen.report is not None, "the report", timeout=60)
            view = screen.view
            assert view is not None and view.state is JobState.SUCCEEDED, view
            # live, the chart had the GPU's readings and the phases from the job's events
            assert screen.live and max(v for _t, v in screen.live) >= 1700
            phases = [p for _t, p in screen.live_bands(view)]
            assert phases[0] == "start" and "predict-1" in phases and "shutdown" in phases
            # then the worker's own 20 Hz samples with the marks as bands, the peak line
            report, record = screen.report, screen.record
            assert report is not None and record is not None and report.peak is not None
            assert abs(report.peak.value_mib - 1756) <= 64
            chart = screen.query_one(PhaseChart)
            assert [p for _t, p in chart._bands] == list(record.phases)
            assert chart._peak == report.peak.value_mib and any(chart.columns)
            status = text_of(screen.query_one("#cal-status"))
            assert f"peak {report.peak.value_mib} MiB" in status and "succeeded" in status
            results = text_of(screen.query_one("#cal-results"))
            for word in ("context", "weights", "activation", "peak", "spread", "confidence",
                         "6.0 GiB"):  # the declared peak before
                assert word in results, word
            summary = json.loads(view.data or b"{}")
            overlay = summary["overlay"]
            assert Path(overlay).is_file()
            saved = text_of(screen.query_one("#cal-save"))
            assert "overlay written" in saved and Path(overlay).name in saved
            assert Path(summary["report"]).name in saved
            # the engine admits by the measured peak now
            b = sup.snapshot().backend("steady")
            assert b is not None and b.declared_peak_mib == report.peak.value_mib

            await pilot.press("w")  # save a copy of the report
            assert isinstance(app.screen, SaveReportDialog)
            target = tmp_path / "copy.json"
            app.screen.query_one(Input).value = str(target)
            await pilot.press("enter")
            await until(pilot, lambda: target.is_file(), "the copy")
            assert target.read_bytes() == Path(summary["report"]).read_bytes()
            assert isinstance(app.screen, CalibrationScreen)
            assert "copy.json" in text_of(screen.query_one("#cal-save"))

            # the backend's details show the latest report's headline
            await pilot.press("escape")
            app.open_backend("steady")
            await until(pilot, lambda: isinstance(app.screen, BackendDetail)
                        and app.screen.query("#calibration"), "the backend's details")
            await until(pilot, lambda: report.headline() in text_of(
                app.screen.query_one("#calibration")), "the report's headline")
            assert Path(summary["report"]).name in text_of(app.screen.query_one("#calibration"))


@pytest.mark.process
@aio
async def test_cancel_a_running_calibration_writes_no_overlay() -> None:
    with engine([calibration_backend("slow", predict_s=5)]) as sup:
        app = VramApp(sup, "embedded", calibration_settle_s=0.2)
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            screen = await calibration_screen(pilot, "slow")
            await until(pilot, lambda: screen.view is not None
                        and screen.view.progress_text.startswith("predict"), "predicting",
                        timeout=30)
            assert "predict" in text_of(screen.query_one("#cal-status"))
            await pilot.press("c")
            assert isinstance(app.screen, ConfirmDialog)
            await pilot.press("y")
            await until(pilot, lambda: screen.view is not None and screen.view.finished,
                        "the run to end")
            assert screen.view.state is JobState.CANCELLED
            assert sup.job(screen.job_id).state is JobState.CANCELLED
            assert "Cancelled" in text_of(screen.query_one("#cal-status"))
            assert "no overlay" in text_of(screen.query_one("#cal-save"))
            assert screen.check_action("cancel_run", ()) is False
            assert screen.check_action("save", ()) is None
            backends_d = sup.paths.backends_dir
            assert not backends_d.exists() or not list(backends_d.glob("*.yaml"))
            b = sup.snapshot().backend("slow")
            assert b is not None and b.declared_peak_mib == 6 * 1024


# ------------------------------------------------------------------------------ learning


@pytest.mark.process
@aio
async def test_a_backend_using_more_than_declared_is_flagged_with_a_suggested_peak() -> None:
    # declared 1 GiB; the simulated model holds 1 GiB of weights + 1 GiB while it runs
    greedy = sim_backend("greedy", 1024, 1024, vram="1GiB")
    with engine([greedy]) as sup:
        app = VramApp(sup, "embedded")
        async with app.run_test(size=WIDE) as pilot:
            await rendered(pilot)
            job = sup.submit("greedy", req(steps=8, step_s=0.2))  # 1.6 s: sampled at 2 Hz
            await until(pilot, lambda: sup.job(job).finished, "the job")
            b = await until(pilot, lambda: (v := sup.snapshot().backend("greedy"))
                            and v.over_declared and v, "greedy over its declared peak")
            suggested = suggested_peak_mib(b)  # type: ignore[arg-type]
            assert suggested is not None and suggested % 64 == 0
            assert suggested >= b.observed_p95_mib * 1.05  # type: ignore[union-attr]
            table = app.screen.query_one(BackendsTable)
            # one figure everywhere: the table, the details and `vramtui backends` agree
            said = size_to_declare(suggested)
            assert said in (over_declared_line(b) or "")  # type: ignore[arg-type]
            short = said.replace(" GiB", "G").replace(" MiB", "M")
            await until(pilot, lambda: f"set peak {short}"
                        in str(table.get_cell("greedy", "error")), "the flag in the table")
            assert str(table.get_cell("greedy", "peak")).endswith("!")
            await select_backend(pilot, "greedy")
            await pilot.press("enter")
            assert isinstance(app.screen, BackendDetail)
            await until(pilot, lambda: "vram.peak" in text_of(app.screen.query_one("#fp-text")),
                        "the suggestion in the details")
            footprint = text_of(app.screen.query_one("#fp-text"))
            assert f"vram.peak: {said}" in footprint
            assert "more than the declared peak" in footprint and "declared" in footprint


# ------------------------------------------------------------------------------ demo


@pytest.mark.process
@aio
async def test_d_submits_the_demo_workload_when_the_demo_backends_are_loaded() -> None:
    with engine([], gpus="sim:24GiB") as sup:  # nothing configured: the demo backends
        app = VramApp(sup, "embedded")
        async with app.run_test(size=WIDE) as pilot:
            await rendered(pilot)
            assert app.demo_mode
            log = app.screen.query_one(EventLog)
            assert any("press d to run a demo workload" in t.plain for t in log._source)
            assert app.screen.check_action("demo", ()) is True
            assert not sup.snapshot().running and not sup.snapshot().queued
            await pilot.press("d")

            def demo_jobs() -> list[str]:
                snap = sup.snapshot()
                return [j.id for j in (*snap.running, *snap.queued, *snap.recent)
                        if "demo" in j.metadata]

            await until(pilot, lambda: len(demo_jobs()) == len(DEMO_WORKLOAD), "12 jobs")
            ids = demo_jobs()
            assert {sup.job(i).backend for i in ids} == {b for b, _r, _p in DEMO_WORKLOAD}
            jobs = app.screen.query_one(JobsTable)
            await until(pilot, lambda: set(ids) <= set(jobs.keys()), "the jobs in the table")
            await until(pilot, lambda: "Submitted 12 demo jobs" in notes(app), "a notice")
            await until(pilot, lambda: sup.snapshot().running, "a demo job running")
            for i in ids:
                sup.cancel(i)
        app = VramApp(sup, "embedded", readonly=True)
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            # read-only: not offered in the footer, and pressing it says why
            assert app.demo_mode and app.screen.check_action("demo", ()) is False
            await pilot.press("d")
            await rendered(pilot)
            assert "Read-only" in notes(app)
            assert len([j for j in sup.snapshot().recent if "demo" in j.metadata]) == 12


# ------------------------------------------------------------------------------ engine gone


@pytest.mark.process
@aio
async def test_engine_gone_is_shown_and_the_app_keeps_working() -> None:
    with real_engine() as sup:
        app = VramApp(sup, "embedded", retry_s=0.2)
        async with app.run_test(size=NARROW) as pilot:
            await rendered(pilot)
            sup.stop(timeout=30)
            await until(pilot, lambda: app.gone is not None, "the engine gone")
            await pilot.pause()
            assert "ENGINE GONE" in app.screen.query_one(EngineHeader).render().plain
            assert app.screen.query_one("#banner").display
            await pilot.press("t")  # still responsive
            assert app.graph_window == 600
            await pilot.press("e")  # a command fails with a notice, nothing hangs
            if isinstance(app.screen, ConfirmDialog):
                await pilot.press("y")
            await until(pilot, lambda: "not running" in notes(app) or "stopped" in notes(app),
                        "the failure reported")


@aio
async def test_engine_comes_back_after_a_gap() -> None:
    source = FixedSource(demo_snapshot())
    app = VramApp(source, "attached to /tmp/x.sock", clocks=fixed_clocks(), retry_s=0.1)
    async with app.run_test(size=NARROW) as pilot:
        await rendered(pilot)
        source.fail = True
        await until(pilot, lambda: app.gone is not None, "gone")
        source.fail = False
        await until(pilot, lambda: app.gone is None, "back")
        assert "The engine is back." in notes(app)
