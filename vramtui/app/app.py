"""`VramApp`: the control centre.  It holds the latest engine snapshot and never waits on the
engine: a timer (at most 4 Hz) wakes a thread worker that takes ``api.snapshot()``; a tick
while a snapshot is still on its way is skipped, so polls never overlap.  Events from
``subscribe(callback=...)`` run on the engine thread; they are queued and handed to the UI with
one coalescing message.  Commands go through the facade in thread workers, after a
confirmation for destructive ones (unless --no-confirm), and never in --readonly.

``m`` queues a calibration (``api.calibrate``) and opens its screen
(``screens/calibration_screen.py``); with the simulated demo backends loaded (the snapshot's
notice says so), ``d`` submits a demo workload to them (``vramtui/demo.py``).  The screens
are in ``screens/``, one per module, their widgets in ``widgets/``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial
from typing import Any

from textual.app import App
from textual.binding import Binding
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import get_current_worker

from supervisor.api import EngineAPI
from supervisor.events import EngineEvent, Subscription
from supervisor.jobs import JobState, JobView
from supervisor.snapshot import EngineSnapshot
from supervisor.validate import PRIORITY_MAX, PRIORITY_MIN
from vramtui.demo import DemoRequest, demo_loaded, demo_plan, submit_workload
from vramtui.output import drain_ended_text

from . import fmt
from .commands import VramCommands
from .fmt import Clocks
from .screens.backend_detail import BackendDetail
from .screens.calibration_screen import CalibrationScreen
from .screens.confirm_dialog import ConfirmDialog
from .screens.dashboard import Dashboard
from .screens.drain_dialog import DrainDialog
from .screens.help_screen import HelpScreen
from .screens.job_detail import JobDetail
from .screens.reload_screen import ReloadScreen
from .screens.save_data_dialog import SaveDataDialog
from .screens.snapshot_screen import SnapshotScreen
from .screens.submit_dialog import SubmitDialog, SubmitRequest

MAX_HZ = 4.0
GRAPH_WINDOWS = (60.0, 600.0)
CALIBRATION_REPEATS = 3
# A second respawn of the worker a respawn was already asked of does nothing for this long
# (or until another worker shows): r pressed twice fast restarts the backend once.
RESPAWN_HOLD_S = 30.0

class UiCall(Message):
    """A call handed to the UI thread from a worker thread (never blocks the sender)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.fn, self.args, self.kwargs = fn, args, kwargs


class EngineNudge(Message):
    """Engine events are waiting in the app's queue; pending nudges coalesce into one."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, EngineNudge)


WEB_PARENT_ENV = "VRAMTUI_WEB_PARENT"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class VramApp(App[int]):
    """The vramtui control centre; give it any `EngineAPI` and a mode string."""

    CSS_PATH = "vramtui.tcss"
    TITLE = "vramtui"
    COMMANDS = App.COMMANDS | {VramCommands}
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (36, "-tall")]
    BINDINGS = [
        Binding("question_mark", "help", "Help", key_display="?", id="help",
                tooltip="Every key, colour and mode"),
        Binding("q", "quit", "Quit", id="quit", tooltip="Leave vramtui"),
    ]

    def __init__(self, api: EngineAPI, mode: str, *, readonly: bool = False,
                 confirm: bool = True, clocks: Clocks | None = None,
                 refresh_hz: float = MAX_HZ, retry_s: float = 2.0,
                 reconnect: Callable[[], EngineAPI] | None = None,
                 embedded: bool | None = None, calibration_settle_s: float = 1.0,
                 theme: str | None = None) -> None:
        super().__init__()
        if theme is not None:
            if theme not in self.available_themes:
                raise ValueError(f"unknown theme {theme!r}; themes: "
                                 + ", ".join(sorted(self.available_themes)))
            self.theme = theme
        self.api = api
        self.mode = mode
        self.readonly = readonly
        self.confirm = confirm
        self.clocks = clocks or Clocks()
        self.poll_interval = 1.0 / min(MAX_HZ, max(0.1, refresh_hz))
        self.retry_s = retry_s
        self.reconnect = reconnect
        self.embedded = mode == "embedded" if embedded is None else embedded
        self.snap: EngineSnapshot | None = None
        self.gone: str | None = None
        self.last_ok_wall: float | None = None
        self.graph_window = GRAPH_WINDOWS[0]
        self.filter_text = ""
        self.polls = 0
        self.renders = 0
        # job id -> (wall t, fraction, text) as reported by the worker
        self.progress: OrderedDict[str, deque[tuple[float, float | None, str]]] = OrderedDict()
        self._events: deque[EngineEvent] = deque(maxlen=10_000)
        self._sub: Subscription | None = None
        self._sub_api: EngineAPI | None = None
        self._polling = False
        self._wake = threading.Event()
        self._retry_at = 0.0
        self._closing_down = False
        self.calibration_settle_s = calibration_settle_s
        self.calibrations: OrderedDict[str, str] = OrderedDict()  # job id -> backend
        self._demo_seen = False
        # backend -> (the pid a respawn was asked of, until when a second r does nothing)
        self._respawns: dict[str, tuple[int | None, float]] = {}
        # A browser session lives only as long as the server that started it (its pid is in
        # WEB_PARENT_ENV): once that is gone, nobody can see this app any more.
        parent = os.environ.get(WEB_PARENT_ENV, "")
        self._web_parent = int(parent) if parent.isdigit() else None

    def get_default_screen(self) -> Screen[Any]:
        return Dashboard()

    # ============================================================== threads -> UI =========
    def ui(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run ``fn`` on the UI thread soon; safe from any thread, never blocks."""
        if threading.get_ident() == self._thread_id:
            fn(*args, **kwargs)
        else:
            self.post_message(UiCall(fn, args, kwargs))

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """A toast whose text is shown as it is, never read as markup (whatever ``markup``
        says: a screen's ``notify`` passes True): it carries what the engine and the user
        said (an error's words, a typed path), where a ``[/]`` would raise in the middle of
        a render and take the app down."""
        super().notify(message, title=title, severity=severity, timeout=timeout,
                       markup=False)

    def on_ui_call(self, message: UiCall) -> None:
        message.fn(*message.args, **message.kwargs)

    # ============================================================== polling ===============
    def on_mount(self) -> None:
        self.run_worker(self._poller, thread=True, group="poll", exit_on_error=False,
                        name="snapshot poller")
        self.set_interval(self.poll_interval, self._tick, name="poll")
        self._poll_now()

    def _tick(self) -> None:
        """At most 4 times a second: ask for a snapshot unless one is on its way."""
        if self._web_parent is not None and not _alive(self._web_parent):
            self.exit(message="the browser dashboard's server went away")
            return
        if self.gone is not None and time.monotonic() < self._retry_at:
            return
        self._poll_now()

    def _poll_now(self) -> None:
        if self._polling or self._closing_down:
            return
        self._polling = True
        self._wake.set()

    def _poller(self) -> None:
        """A thread worker: one snapshot per request, so polls never overlap."""
        worker = get_current_worker()
        while not worker.is_cancelled and not self._closing_down:
            if not self._wake.wait(0.5):
                continue
            self._wake.clear()
            if worker.is_cancelled or self._closing_down:
                return
            self._poll_once()

    def _poll_once(self) -> None:
        api = self.api
        try:
            if self.gone is not None and self.reconnect is not None:
                api = self.reconnect()
            snap = api.snapshot()
            if self._sub_api is not api:
                self._subscribe(api)
        except Exception as exc:  # noqa: BLE001 - any failure means "the engine is gone"
            self.ui(self._poll_failed, exc)
            return
        self.ui(self._poll_done, snap, api)

    def _subscribe(self, api: EngineAPI) -> None:
        old = self._sub
        self._sub = api.subscribe(kinds=["job"], callback=self._on_engine_event)
        self._sub_api = api
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()

    def _on_engine_event(self, event: EngineEvent) -> None:
        """On the ENGINE thread: queue the event and nudge the UI (nudges coalesce)."""
        self._events.append(event)
        self.post_message(EngineNudge())

    def on_engine_nudge(self, _: EngineNudge) -> None:
        while self._events:
            event = self._events.popleft()
            job = event.job
            if job is None:
                continue
            ring = self.progress.get(job.id)
            if ring is None:
                ring = self.progress[job.id] = deque(maxlen=300)
                while len(self.progress) > 300:
                    self.progress.popitem(last=False)
            point = (event.t, job.progress, job.progress_text)
            if job.progress is not None and (not ring or ring[-1][1:] != point[1:]):
                ring.append(point)

    def _poll_done(self, snap: EngineSnapshot, api: EngineAPI) -> None:
        self._polling = False
        self.polls += 1
        if self.gone is not None:
            self.notify("The engine is back.", title="vramtui")
        self.gone = None
        self.api = api
        self.snap = snap
        self.last_ok_wall = self.clocks.wall()
        self._respawns_seen(snap)
        demo = self.demo_mode
        if demo != self._demo_seen:
            self._demo_seen = demo
            for screen in self.screen_stack:
                screen.refresh_bindings()
        self.render_snapshot()

    def _poll_failed(self, exc: BaseException) -> None:
        self._polling = False
        first = self.gone is None
        self.gone = str(exc) or exc.__class__.__name__
        if first and self.snap is not None:
            self.notify(f"The engine is gone: {self.gone}. Retrying every {self.retry_s:g} s.",
                        severity="error", title="vramtui")
        self._retry_at = time.monotonic() + self.retry_s
        self.render_snapshot()

    def render_snapshot(self) -> None:
        """Hand the latest snapshot to the top snapshot screen (hidden ones are skipped)."""
        for screen in reversed(self.screen_stack):
            if isinstance(screen, SnapshotScreen):
                screen.refresh_snapshot()
                self.renders += 1
                break

    async def _on_exit_app(self) -> None:
        self._closing_down = True
        self._wake.set()
        if self._sub is not None:
            with contextlib.suppress(Exception):
                self._sub.close()
        await super()._on_exit_app()

    # ============================================================== commands ==============
    def _refuse_readonly(self, what: str) -> bool:
        if self.readonly:
            self.notify(f"Read-only: {what} is off (started with --readonly).",
                        severity="warning")
        return self.readonly

    def _confirmed(self, title: str, body: str, go: Callable[[], None]) -> None:
        if not self.confirm:
            go()
            return

        def answer(ok: bool | None) -> None:
            if ok:
                go()

        self.push_screen(ConfirmDialog(title, body), answer)

    def run_command(self, label: str, call: Callable[[EngineAPI], Any],
                    done: Callable[[Any], str]) -> None:
        """Run a facade call in a thread worker; report the outcome as a notification."""
        self.run_worker(partial(self._command_thread, label, call, done), thread=True,
                        group="command", exit_on_error=False, name=label)

    def _command_thread(self, label: str, call: Callable[[EngineAPI], Any],
                        done: Callable[[Any], str]) -> None:
        try:
            result = call(self.api)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            kind = exc.__class__.__name__
            if kind == "NothingToDo":  # (not loaded, asleep already, not yielded): no failure
                self.ui(self.notify, f"{exc}.", severity="warning")
                return
            self.ui(self.notify, f"{label}: {exc}", severity="error", timeout=8,
                    title="refused" if kind == "Refused" else "failed")
            return
        self.ui(self.notify, done(result))

    def _backend_line(self, name: str) -> str:
        b = self.snap.backend(name) if self.snap is not None else None
        if b is None:
            return name
        where = f"pid {b.pid} on GPU{b.gpu}" if b.pid else "no worker running"
        mem = f", {fmt.mib(b.observed_mib)} resident" if b.observed_mib else ""
        return f"{name} is {b.state} ({where}{mem})"

    def request_evict(self, name: str) -> None:
        if self._refuse_readonly("evict"):
            return
        view = self.snap.backend(name) if self.snap is not None else None
        if view is not None and view.pid is None and view.state in ("cold", "failed"):
            self.notify(f"{name} is not loaded: nothing to evict.", severity="warning")
            return
        self._confirmed(f"Evict {name}?",
                        f"{self._backend_line(name)}.\nIts worker stops and its memory is "
                        "freed; the next job for it starts a new one.",
                        lambda: self.run_command(f"evict {name}", lambda api: api.evict(name),
                                                 lambda _: f"Evicting {name}."))

    def request_respawn(self, name: str) -> None:
        if self._refuse_readonly("respawn"):
            return
        b = self.snap.backend(name) if self.snap is not None else None
        pid = b.pid if b is not None else None  # the worker shown when r was pressed

        def go() -> None:
            sent = self._respawns.get(name)
            # (no worker shown: the one asked of is stopping, its new one not started yet)
            if sent is not None and pid in (sent[0], None) and time.monotonic() < sent[1]:
                which = f"worker (pid {pid})" if pid else "worker"
                self.notify(f"{name}'s {which} is already being respawned: nothing done "
                            "twice (r again once its new worker shows).", severity="warning")
                return
            self._respawns[name] = (pid, time.monotonic() + RESPAWN_HOLD_S)
            self.run_command(f"respawn {name}", call, lambda _: f"Respawning {name}.")

        def call(api: EngineAPI) -> None:  # (in a thread worker)
            try:
                api.respawn(name)
            except Exception:
                self.ui(self._respawns.pop, name, None)  # refused: r may ask again
                raise

        self._confirmed(f"Respawn {name}?",
                        f"{self._backend_line(name)}.\nIts worker is stopped and a new "
                        "process started (failures are forgotten).", go)

    def _respawns_seen(self, snap: EngineSnapshot) -> None:
        """A respawn is done once its backend shows another worker than the one it was
        asked of (an r pressed then acts on the new one)."""
        for name, (pid, _until) in list(self._respawns.items()):
            b = snap.backend(name)
            if b is None or (b.pid is not None and b.pid != pid):
                del self._respawns[name]

    def request_preload(self, name: str) -> None:
        if self._refuse_readonly("preload"):
            return
        self.run_command(f"preload {name}", lambda api: api.preload(name),
                         lambda _: f"Preloading {name}.")

    def request_sleep_wake(self, name: str) -> None:
        """Wake the backend when it sleeps, else put it to sleep (the engine says why not)."""
        if self._refuse_readonly("sleep_wake"):
            return
        b = self.snap.backend(name) if self.snap is not None else None
        if b is not None and b.state == "asleep":
            self.run_command(f"wake {name}", lambda api: api.wake(name),
                             lambda _: f"Waking {name}.")
        else:
            self.run_command(f"sleep {name}", lambda api: api.sleep(name),
                             lambda _: f"Putting {name} to sleep (its GPU memory is given "
                                       "back; its next job wakes it).")

    def request_cancel(self, job_id: str) -> None:
        if self._refuse_readonly("cancel"):
            return
        snap = self.snap
        view = None
        if snap is not None:
            view = next((j for j in (*snap.running, *snap.queued, *snap.recent)
                         if j.id == job_id), None)
        if view is not None and view.finished:
            self.notify(f"Job {job_id} already {view.state.value}.", severity="warning")
            return
        # The job as it was shown when the key was pressed: the dialog names it, and the
        # cancel goes to it (by id), wherever the table has moved it since.
        shown = "" if view is None else f" ({view.backend}, {view.state.value}" + (
            f", position {view.position}" if view.position else "") + ")"
        what = (f"It is {view.state.value} on {view.backend}"
                + (f" ({view.progress * 100:.0f}%)" if view.progress is not None else "")
                if view is not None else "")

        def go() -> None:
            now = self._view(job_id)
            if now is not None and now.finished:
                self.notify(f"Job {job_id} had already {now.state.value}: nothing cancelled.",
                            severity="warning")
                return
            self.run_command(f"cancel {job_id}", lambda api: api.cancel(job_id),
                             lambda v: f"Job {job_id}: {v.state.value}"
                             + (" (stopping)" if not v.finished else "") + ".")

        self._confirmed(f"Cancel job {job_id}{shown}?", f"{what}.\nThe worker is asked to "
                        "stop; a worker that does not is killed after the grace.", go)

    def _view(self, job_id: str) -> JobView | None:
        snap = self.snap
        if snap is None:
            return None
        return next((j for j in (*snap.running, *snap.queued, *snap.recent) if j.id == job_id),
                    None)

    def request_cancel_many(self, job_ids: list[str], done: Callable[[], None]) -> None:
        if self._refuse_readonly("cancel"):
            return
        listing = ", ".join(job_ids[:6]) + (f" and {len(job_ids) - 6} more"
                                            if len(job_ids) > 6 else "")

        def summary(results: list[Any]) -> str:
            self.ui(done)
            gone = sum(1 for r in results if r.state == "cancelled")
            stopping = sum(1 for r in results if r.state in ("running", "starting"))
            other = len(results) - gone - stopping
            return (f"Cancelled {gone} job(s)" + (f", {stopping} stopping" if stopping else "")
                    + (f"; {other} had already ended or are unknown" if other else "") + ".")

        self._confirmed(f"Cancel {len(job_ids)} jobs?",
                        f"{listing}.\nQueued ones are dropped; running ones are asked to stop "
                        "(killed after the grace).",
                        lambda: self.run_command(f"cancel {len(job_ids)} jobs",
                                                 lambda api: api.cancel_many(job_ids), summary))

    def request_retry(self, job_id: str) -> None:
        if self._refuse_readonly("retry"):
            return
        view = self._view(job_id)
        if view is not None and not view.finished:
            self.notify(f"Job {job_id} is {view.state.value}: only a finished job can be "
                        "retried.", severity="warning")
            return
        self.run_command(f"retry {job_id}", lambda api: api.retry(job_id),
                         lambda new: f"Retrying {job_id} as {new}.")

    def request_priority_step(self, job_id: str, delta: int) -> None:
        if self._refuse_readonly("changing a priority"):
            return
        view = self._view(job_id)
        if view is None or view.state is not JobState.QUEUED:
            what = view.state.value if view is not None else "not waiting"
            self.notify(f"Job {job_id} is {what}: only a queued job's priority can change.",
                        severity="warning")
            return
        new = view.priority + delta
        if not PRIORITY_MIN <= new <= PRIORITY_MAX:
            end = "highest" if delta > 0 else "lowest"
            self.notify(f"Job {job_id} is already at the {end} priority ({view.priority}).",
                        severity="warning")
            return
        self.run_command(f"priority of {job_id}", lambda api: api.set_priority(job_id, new),
                         lambda v: f"Job {job_id}: priority {v.priority}"
                         + (f", position {v.position} in the queue." if v.position else "."))

    def request_kill(self, name: str) -> None:
        if self._refuse_readonly("kill"):
            return
        b = self.snap.backend(name) if self.snap is not None else None
        if b is None or b.pid is None:
            self.notify(f"{name} has no worker process to kill.", severity="warning")
            return
        jobs = f"; its {b.running} running job(s) fail" if b.running else ""
        self._confirmed(f"Kill {name}'s worker?",
                        f"{self._backend_line(name)}.\nSIGKILL now, no grace{jobs}.  For a "
                        "worker that is stuck; evict (e) stops one that answers.",
                        lambda: self.run_command(f"kill {name}", lambda api: api.kill(name),
                                                 lambda _: f"Killed {name}'s worker."))

    def request_drain(self) -> None:
        if self._refuse_readonly("drain"):
            return
        snap = self.snap
        if snap is None or not snap.gpus:
            return

        def go(choice: tuple[int, bool] | None) -> None:
            if choice is None:
                return
            gpu, on = choice
            yielded = any(g.index == gpu and g.yielded_by is not None for g in snap.gpus)
            self.run_command(f"drain GPU{gpu}", lambda api: api.drain(gpu, on),
                             lambda _: (f"GPU{gpu} draining: running work finishes, "
                                        "nothing new is admitted there." if on
                                        else drain_ended_text(gpu, yielded) + "."))

        if len(snap.gpus) == 1:
            g = snap.gpus[0]
            if g.draining:
                self._confirmed(f"Open GPU{g.index} again?", "It admits new work again.",
                                lambda: go((g.index, False)))
            else:
                self._confirmed(f"Drain GPU{g.index}?", "Its running work finishes; nothing "
                                "new is admitted there (queued jobs wait).  D again opens it.",
                                lambda: go((g.index, True)))
            return
        self.push_screen(DrainDialog([(g.index, g.name, g.draining) for g in snap.gpus]), go)

    def request_yield(self, gpu: int | None = None, now: bool = False) -> None:
        """Hand a GPU over to programs we do not manage, or take a yielded one back; ``now``
        cancels the jobs running there (always asked first)."""
        if self._refuse_readonly("yield"):
            return
        snap = self.snap
        if snap is None or not snap.gpus:
            return
        if gpu is None and len(snap.gpus) > 1:
            self.push_screen(DrainDialog(
                [(g.index, g.name, g.yielded_by is not None) for g in snap.gpus],
                "Yield a GPU", "A yielded GPU is left to programs vramtui does not manage: "
                "its running jobs finish, its models are unloaded, queued jobs wait or run "
                "elsewhere.  Choose one to yield (or to resume):",
                ("in use: yield it", "YIELDED: resume it")),
                lambda c: None if c is None else self._yield_or_resume(c[0], c[1], now))
            return
        g = next((x for x in snap.gpus if gpu in (None, x.index)), None)
        if g is None:
            return
        on = now or g.yielded_by is None
        if not on:
            self._confirmed(f"Resume GPU{g.index}?", f"It is {g.yielded_text}; jobs run "
                            "there again.", lambda: self._yield_or_resume(g.index, False))
            return
        what = ("its running jobs are CANCELLED now" if now else "its running jobs finish")
        self._confirmed(f"Yield GPU{g.index}{' now' if now else ''}?",
                        f"Nothing of ours runs there until resumed (Y again): {what}, its "
                        "models are unloaded, queued jobs wait or run on another GPU.",
                        lambda: self._yield_or_resume(g.index, True, now))

    def _yield_or_resume(self, gpu: int, on: bool, now: bool = False) -> None:
        if not on:
            self.run_command(f"resume GPU{gpu}", lambda api: api.resume_gpus([gpu]),
                             lambda _: f"GPU{gpu} resumed: jobs run there again.")
            return
        import getpass

        by = f"{getpass.getuser()} (tui)"
        self.run_command(f"yield GPU{gpu}",
                         lambda api: api.yield_gpus([gpu], now=now, by=by),
                         lambda _: f"GPU{gpu} yielded: nothing of ours runs there until "
                         "resumed (Y).")

    def request_reload(self) -> None:
        if self._refuse_readonly("reload"):
            return

        def reload_thread() -> None:
            try:
                result = self.api.reload()
            except Exception as exc:  # noqa: BLE001 - shown to the user
                self.ui(self.notify, f"reload: {exc}", severity="error", timeout=8,
                        title="failed")
                return
            self.ui(self.push_screen, ReloadScreen(result))

        self.run_worker(reload_thread, thread=True, group="command", exit_on_error=False,
                        name="reload")

    def request_save_result(self, job_id: str) -> None:
        def fetch() -> None:
            try:
                view = self.api.job(job_id)
            except Exception as exc:  # noqa: BLE001 - shown to the user
                self.ui(self.notify, f"save: {exc}", severity="error")
                return
            data = view.data if view.data is not None else b"".join(view.chunks)
            if view.state is not JobState.SUCCEEDED:
                self.ui(self.notify, f"Job {job_id} is {view.state.value}: no result to save.",
                        severity="warning")
                return
            kind = str(view.headers.get("Content-Type", ""))
            ext = ".json" if "json" in kind else ".png" if "png" in kind else ".bin"
            self.ui(self.push_screen, SaveDataDialog(
                f"Save the result of {job_id}", f"{view.backend}'s result"
                + (f" ({kind})" if kind else ""), f"{job_id}{ext}", data), saved)

        def saved(path: object) -> None:
            if path is not None:
                self.notify(f"Saved the result to {fmt.short_path(str(path))}.")

        self.run_worker(fetch, thread=True, group="command", exit_on_error=False,
                        name="save result")

    def request_zero(self) -> None:
        if self._refuse_readonly("evict all idle"):
            return
        idle = [b.name for b in self.snap.backends
                if b.pid and not b.running and b.state not in ("stopping",)] \
            if self.snap is not None else []
        listing = ", ".join(idle) if idle else "none right now"
        self._confirmed("Evict every idle backend?",
                        f"Idle workers: {listing}.\nBusy ones are left alone.",
                        lambda: self.run_command(
                            "evict all idle", lambda api: api.zero(),
                            lambda names: "Evicting " + (", ".join(names) or "nothing: no "
                                                         "idle worker") + "."))

    def request_calibrate(self, name: str | None) -> None:
        if self._refuse_readonly("calibrate"):
            return
        if name is None:
            self.notify("Select a backend to calibrate first.", severity="warning")
            return
        b = self.snap.backend(name) if self.snap is not None else None
        declared = b.declared_peak_mib if b is not None else None
        first = (f"Its worker (pid {b.pid}) stops first; a fresh one" if b is not None and b.pid
                 else "A fresh worker")
        self._confirmed(
            f"Calibrate {name}?",
            f"{self._backend_line(name)}.\n{first} runs alone on a GPU through "
            f"load, {CALIBRATION_REPEATS} requests and unload, sampled at 20 Hz (it waits for "
            "a GPU to itself; idle workers there are evicted).\nIf it earns at least medium "
            "confidence, the engine writes an overlay with the measured figures and "
            "admission uses them at once.",
            partial(self._start_calibration, name, declared))

    def _start_calibration(self, name: str, declared: int | None) -> None:
        self.run_worker(partial(self._calibrate_thread, name, declared), thread=True,
                        group="command", exit_on_error=False, name=f"calibrate {name}")

    def _calibrate_thread(self, name: str, declared: int | None) -> None:
        try:
            job_id = self.api.calibrate(name, repeats=CALIBRATION_REPEATS,
                                        settle_s=self.calibration_settle_s)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.ui(self.notify, f"calibrate {name}: {exc}", severity="error", timeout=8,
                    title="refused" if exc.__class__.__name__ == "Refused" else "failed")
            return
        self.ui(self.open_calibration, job_id, name, declared)

    def open_calibration(self, job_id: str, backend: str,
                         declared: int | None = None) -> None:
        self.calibrations[job_id] = backend
        while len(self.calibrations) > 20:
            self.calibrations.popitem(last=False)
        self.push_screen(CalibrationScreen(job_id, backend, declared))

    def request_cancel_calibration(self, job_id: str, backend: str, phase: str) -> None:
        if self._refuse_readonly("cancel"):
            return
        where = f" (in phase {phase})" if phase else ""
        self._confirmed(f"Cancel the calibration of {backend}?",
                        f"Job {job_id}{where}: its worker is stopped, and no report and no "
                        "overlay are written; admission keeps the descriptor's figures.",
                        lambda: self.run_command(
                            f"cancel {job_id}", lambda api: api.cancel(job_id),
                            lambda v: f"Calibration of {backend}: "
                            + ("cancelling." if not v.finished else f"{v.state.value}.")))

    # -- the demo ---------------------------------------------------------------------------
    @property
    def demo_mode(self) -> bool:
        """The engine loaded the simulated demo backends (it says so in its notice)."""
        return demo_loaded(self.snap)

    def request_demo_workload(self) -> None:
        if self._refuse_readonly("the demo workload"):
            return
        snap = self.snap
        if snap is None or not self.demo_mode:
            self.notify("The demo workload needs the simulated demo backends (loaded when no "
                        "backend is configured).", severity="warning")
            return
        self.run_worker(partial(self._demo_thread, demo_plan(snap)), thread=True,
                        group="command", exit_on_error=False, name="demo workload")

    def _demo_thread(self, plan: list[DemoRequest]) -> None:
        done = submit_workload(self.api, plan)
        self.ui(self.notify, done.summary(), title="demo workload", timeout=10,
                severity="warning" if done.refused else "information")

    def open_submit(self, backend: str | None = None) -> None:
        if self._refuse_readonly("submit") or self.snap is None:
            return
        if not self.snap.backends:
            self.notify("No backend is configured: nothing to submit to.  Add a descriptor "
                        "(~/.config/vramtui/backends.d/NAME.yaml), then L reloads.",
                        severity="warning")
            return

        def send(req: SubmitRequest) -> str:  # (in the dialog's thread worker)
            return self.api.submit(req.backend, req.payload, priority=req.priority)

        def submitted(done: tuple[SubmitRequest, str] | None) -> None:
            if done is not None:
                self.notify(f"Submitted {done[1]} to {done[0].backend}.")

        self.push_screen(SubmitDialog(list(self.snap.backends), backend, send), submitted)

    def open_job(self, job_id: str) -> None:
        snap = self.snap
        view = None
        if snap is not None:
            view = next((j for j in (*snap.running, *snap.queued, *snap.recent)
                         if j.id == job_id), None)
        if view is not None and view.kind == "calibration":
            self.open_calibration(job_id, view.backend)
        elif job_id in self.calibrations:
            self.open_calibration(job_id, self.calibrations[job_id])
        else:
            self.push_screen(JobDetail(job_id))

    def open_backend(self, name: str) -> None:
        self.push_screen(BackendDetail(name))

    def toggle_graph_window(self) -> None:
        i = GRAPH_WINDOWS.index(self.graph_window)
        self.graph_window = GRAPH_WINDOWS[(i + 1) % len(GRAPH_WINDOWS)]
        self.notify(f"Memory graphs: last {self.graph_window / 60:g} minutes.")
        self.render_snapshot()

    def set_filter(self, text: str) -> None:
        if text != self.filter_text:
            self.filter_text = text
            self.render_snapshot()

    def dashboard_action(self, action: str) -> None:
        """Run a dashboard action (for the palette), from whatever screen is on top."""
        dash = next((s for s in self.screen_stack if isinstance(s, Dashboard)), None)
        if dash is None:
            return
        while self.screen is not dash and len(self.screen_stack) > 1:
            self.pop_screen()
        getattr(dash, f"action_{action}")()

    # ============================================================== app keys ==============
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def _busy(self) -> int:
        snap = self.snap
        return len(snap.running) + len(snap.queued) if snap is not None else 0

    def _quit_body(self) -> str:
        """The quit dialog's text, read again while it is open (the count stays true)."""
        busy = self._busy()
        now = (f"{busy} jobs are running or queued" if busy else
               "No job is running or queued now")
        return (f"{now} in this embedded engine, and quitting stops it.\nRunning jobs get "
                "their backend's stop grace to finish; queued ones stay in the journal and "
                "run when vramtui starts again, as does a job the stop cut short (marked "
                "interrupted).")

    async def action_quit(self) -> None:
        if self.embedded and self.confirm and self._busy() and self.gone is None:
            def answer(ok: bool | None) -> None:
                if ok:
                    self.exit(0)

            self.push_screen(ConfirmDialog("Quit vramtui?", self._quit_body(),
                                           live=self._quit_body), answer)
            return
        self.exit(0)
