"""A worker that speaks vramd's JSON lines over its stdin/stdout, as the engine sees it.

:class:`VramdWorkerHandle` presents exactly the interface of :class:`WorkerHandle`
(``supervisor.workers.base.Worker``): the same states (starting → initializing → ready ⇄ busy →
stopping; crashed, cold), the same calls on the observer, the same supervision — the worker
runs in its own session (its own process group), its stderr goes to the backend's log file,
its memory is read from the GPU by its pids, and a kill signals the whole group.

The conversation (``jsonl``): on start, ``load {kwargs}`` (the backend's ``vramd.load_kwargs``)
and ``ready`` makes it READY. A job's payload is the JSON object sent as ``generate {request}``
(keys starting with ``_`` are dropped, as vramd drops them); ``progress {pct, msg}`` is the
job's progress; ``done {result}`` ends it — ``result`` as JSON data, or, when the result says
``status: error``, a failure (``error_code: CANCELLED``: cancelled); ``error`` fails it. When
a request's ``vramd.load_keys`` differ from those the worker loaded with (on
``vramd.shape_keys`` when given), ``load`` with them goes first, as vramd reloads. Cancel is
``abort``; stop is ``unload`` then ``shutdown`` (then SIGTERM, then SIGKILL of the group after
the grace). ``ping()`` sends ``ping`` and resolves on ``pong``. A running job that sends no
event for ``vramd.event_timeout`` is taken as hung: its worker is killed, as vramd does.

vramd's worker loop answers ``ping`` only between jobs (its main thread runs the adapter's
``generate``): while BUSY, a ping waits for the job; the event timeout is the liveness check.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import math
import signal
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.clock import monotonic

from ..backends.schema import VramdSettings
from . import process
from .handle import CANCELLED_STATUS, Outcome, WorkerObserver, WorkerState
from .jsonl import (
    CMD_ABORT,
    CMD_GENERATE,
    CMD_LOAD,
    CMD_PING,
    CMD_SHUTDOWN,
    CMD_UNLOAD,
    DEFAULT_MAX_LINE,
    ERR_CANCELLED,
    EVENT_DONE,
    EVENT_ERROR,
    EVENT_PONG,
    EVENT_PROGRESS,
    EVENT_READY,
    EVENT_UNLOADED,
    Garbage,
    LineDecoder,
    encode,
)
from .supervised import SupervisedProcess

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024
MAX_PENDING_PINGS = 16
MAX_QUEUED = 64  # jobs handed over while one runs (the engine gives one at a time)
MAX_LOGGED_TRACEBACK = 16 * 1024
MAX_NOTES = 200  # lines of ours in the worker's log, per worker process
STALE_ABORT = "cancelled before start"  # vramd's reply to a generate that met an old abort
FOOTPRINT_KEY = "footprint_key"  # vramd never passes it to load: it only sizes admission


@dataclass(slots=True)
class _Job:
    job_id: str
    wire_id: int
    request: dict[str, Any]
    line: bytes  # the generate command, encoded once
    abort_sent: bool = False
    retried: bool = False


class VramdWorkerHandle(SupervisedProcess):
    """The engine's view of one vramd worker process (touched only on the engine loop)."""

    def __init__(
        self,
        *,
        backend: str,
        name: str,
        gpu: int,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str | None,
        log_path: Path,
        observer: WorkerObserver,
        settings: VramdSettings | None = None,
        unload_frees_vram: bool = True,
        max_line: int = DEFAULT_MAX_LINE,
    ) -> None:
        super().__init__(backend=backend, name=name, gpu=gpu, argv=argv, env=env, cwd=cwd,
                         log_path=log_path, observer=observer)
        self.settings = settings or VramdSettings()
        self.unload_frees_vram = unload_frees_vram
        self.features = frozenset({"cancel", "progress"})
        self.reported_vram_mib: int | None = None  # the worker's own figure at "ready"
        self._idle_since = monotonic()  # pings count only from here while idle
        self._decoder = LineDecoder(max_line)
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._current: _Job | None = None
        self._queued: deque[_Job] = deque()
        self._loaded: dict[str, Any] = dict(self.settings.load_kwargs)
        self._loading = False  # a load was sent and its "ready" has not come yet
        self._abort_may_stick = False  # an abort may have reached the worker after its job
        self._pings: deque[tuple[float, asyncio.Future[float | None]]] = deque()
        self._event_timer: asyncio.TimerHandle | None = None
        self._last_error: str | None = None  # why it is about to exit, for the exit reason
        self._garbage = 0
        self._notes = 0

    # -- start ------------------------------------------------------------------------------
    async def start(self) -> None:
        """The worker in a new session: commands on its stdin, events on its stdout, its
        stderr logged."""
        if not await self._start_process(pipes=True):
            return
        loop = asyncio.get_running_loop()
        self._reader = loop.create_task(self._read_events())
        loop.create_task(self._watch_exit())
        if self._stopping:  # stopped before it was even running
            self._send_stop()
            return
        self._loading = True
        self._write(encode(CMD_LOAD, kwargs=self._loaded))
        self.status_marks.append((time.time(), "initializing"))
        self._set_state(WorkerState.INITIALIZING)

    async def _read_events(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        stdout = self.proc.stdout
        try:
            while True:
                data = await stdout.read(READ_CHUNK)
                items = self._decoder.feed(data) if data else self._decoder.end()
                for item in items:
                    try:
                        self._on_item(item)
                    except Exception:  # a bug here must not stop the events that follow
                        log.exception("worker %s: handling %r", self.name, item)
                if not data:
                    break
        except (ConnectionError, OSError):  # the pipe broke: the exit watcher reports it
            pass
        if not self._exited.is_set() and not self._stopping:
            # A worker that closed its stdout can no longer answer: it is done for.
            asyncio.get_running_loop().create_task(self._reap_mute())

    async def _reap_mute(self) -> None:
        if await self._wait_exit(1.0):
            return
        self._last_error = "it closed its stdout (vramd's event channel) but lived on"
        self._log_note(f"{self._last_error}: killing it")
        if self.ready_at is None and self.init_error is None:
            self.init_error = self._last_error
        self.kill()

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        if self._reader is not None:
            # Events written just before the exit still count (a done, an error). A child
            # that kept the pipe open must not hold the exit up.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._reader), 1.0)
            self._reader.cancel()
        self.exit_code = code
        self._cancel_event_timer()
        for _sent, future in self._pings:
            if not future.done():
                future.set_result(None)
        self._pings.clear()
        self._current = None
        self._queued.clear()
        expected = self._stopping
        self._gone()
        if expected:
            reason = "stopped"
        elif self.init_error:
            reason = f"initialize failed: {self.init_error}"
        else:
            reason = f"worker exited with code {code}"
            if self._last_error:
                reason += f" ({self._last_error})"
        self._set_state(WorkerState.COLD if expected else WorkerState.CRASHED)
        self.observer.worker_exited(self, code, reason)

    @property
    def data(self) -> object | None:
        """The channel requests go through (the worker's stdin), None once it is gone."""
        if self.proc is None or self._exited.is_set() or self.proc.stdin is None:
            return None
        return self.proc.stdin

    # -- events -----------------------------------------------------------------------------
    def _on_item(self, item: dict[str, Any] | Garbage) -> None:
        if isinstance(item, Garbage):
            self._garbage += 1
            if self._garbage <= 5:
                self._log_note(f"not a vramd event on stdout: {item.problem}")
            if item.too_long and self._current is not None:
                self._finish(self._current, Outcome(ok=False, status_code=502, error=(
                    f"the worker sent a line over {self._decoder.max_line} bytes (its "
                    "result?): dropped")))
            return
        event = item["event"]
        if self._current is not None:
            self._arm_event_timer()  # any sign of life during a job
        if event == EVENT_READY:
            self._on_ready(item)
        elif event == EVENT_PROGRESS:
            job = self._current
            if job is not None:
                fraction = _fraction(item.get("pct"))
                msg = item.get("msg")
                self.observer.request_progress(job.job_id, fraction,
                                               str(msg) if msg is not None else "")
        elif event == EVENT_DONE:
            if self._current is not None:
                self._on_done(self._current, item.get("result"))
        elif event == EVENT_ERROR:
            self._on_error(item)
        elif event == EVENT_PONG:
            if self._pings:
                sent, future = self._pings.popleft()
                if not future.done():
                    future.set_result(monotonic() - sent)
        elif event == EVENT_UNLOADED:
            pass  # the shutdown that follows it is already on its way
        # vram_budget and events of later vramd versions: nothing to do

    def _on_ready(self, item: Mapping[str, Any]) -> None:
        self._loading = False
        vram = item.get("vram_mib")
        if isinstance(vram, int) and not isinstance(vram, bool):
            self.reported_vram_mib = vram
        if self._stopping:
            return
        if self.state in (WorkerState.STARTING, WorkerState.INITIALIZING):
            self.status_marks.append((time.time(), "ready"))
            self._set_state(WorkerState.READY)
            self._next()

    def _on_error(self, item: Mapping[str, Any]) -> None:
        error = str(item.get("error") or "the worker reported an error")
        code = item.get("error_code")
        trace = item.get("traceback")
        if isinstance(trace, str) and trace:
            self._log_note(f"{error} [{code}]\n{trace[-MAX_LOGGED_TRACEBACK:]}")
        if self._loading:
            # A failed load is fatal to a vramd worker (it exits 1).
            if self.ready_at is None:
                self.init_error = error
            else:
                self._last_error = error
            if self._current is not None:
                self._finish(self._current, Outcome(ok=False, error=f"loading again with "
                                                    f"{self._loaded}: {error}"))
            return
        job = self._current
        if job is None:
            self._log_note(f"error event outside a job: {error} [{code}]")
            return
        cancelled = code == ERR_CANCELLED
        text = error if cancelled or not code else f"{error} [{code}]"
        self._finish(job, Outcome(ok=False, error=text, cancelled=cancelled,
                                  status_code=CANCELLED_STATUS if cancelled else 500))

    def _on_done(self, job: _Job, result: Any) -> None:
        if isinstance(result, Mapping) and result.get("status") == "error":
            code = result.get("error_code")
            error = str(result.get("error") or "the worker reported an error")
            cancelled = code == ERR_CANCELLED
            if cancelled and not job.abort_sent and error == STALE_ABORT and not job.retried \
                    and self._abort_may_stick:
                # An abort meant for the job before reached the worker after that job had
                # ended, and vramd keeps it for the next generate: this one. Run it again.
                self._abort_may_stick = False
                job.retried = True
                self._write(job.line)
                return
            text = error if cancelled or not code else f"{error} [{code}]"
            outcome = Outcome(ok=False, error=text, cancelled=cancelled,
                              status_code=CANCELLED_STATUS if cancelled else 500)
        else:
            try:
                data = json.dumps(result, ensure_ascii=False).encode("utf-8")
            except (TypeError, ValueError, RecursionError) as exc:
                outcome = Outcome(ok=False, status_code=502,
                                  error=f"result is not JSON data: {type(exc).__name__}")
            else:
                outcome = Outcome(ok=True, data=data,
                                  headers={"Content-Type": "application/json"})
        self._finish(job, outcome)

    def _finish(self, job: _Job, outcome: Outcome) -> None:
        if job.abort_sent and not outcome.cancelled:
            self._abort_may_stick = True  # the abort may have come after the job's end
        if self._current is job:
            self._current = None
            self._idle_since = monotonic()
            self._cancel_event_timer()
        self.observer.request_done(self, job.job_id, outcome)
        self._next()

    def _next(self) -> None:
        """Start the next handed-over job, or settle as READY."""
        if self._current is not None or self._exited.is_set():
            return
        if self._queued and self.hot and not self._stopping:
            self._begin(self._queued.popleft())
        elif self.state == WorkerState.BUSY:
            self._set_state(WorkerState.READY)

    # -- requests ---------------------------------------------------------------------------
    def send(self, job_id: str, payload: bytes, *, stream: bool,
             metadata: dict[str, Any] | None = None, deadline: float | None = None) -> int:
        """Hand a job over (its payload must be a JSON object: vramd's request)."""
        wire_id = next(self._ids)
        request, problem = _request_of(payload)
        line = b""
        if problem is None:
            try:
                line = encode(CMD_GENERATE, request=request)
            except (TypeError, ValueError, RecursionError) as exc:
                problem = f"the request cannot be sent as JSON lines: {exc}"
        if problem is not None:
            self._fail_soon(job_id, Outcome(ok=False, status_code=400, error=problem))
            return wire_id
        job = _Job(job_id, wire_id, request, line)
        if self._current is None and self.hot and not self._stopping:
            self._begin(job)
        elif len(self._queued) >= MAX_QUEUED:
            self._fail_soon(job_id, Outcome(ok=False, status_code=503, error=(
                f"{self.name} already holds {MAX_QUEUED} jobs waiting")))
        else:
            self._queued.append(job)
        return wire_id

    def _begin(self, job: _Job) -> None:
        self._current = job
        load = self._reload_for(job.request)
        if load is not None:
            if not self.unload_frees_vram:
                self._current = None
                self._fail_soon(job.job_id, Outcome(ok=False, status_code=409, error=(
                    f"the request needs {self.backend} loaded with {load}, not "
                    f"{self._loaded}; its unload frees no VRAM (unload_frees_vram: false), so "
                    "it is not loaded again in place: respawn it with those settings as "
                    "vramd.load_kwargs, or send requests that match")))
                return
            self._loaded = load
            self._loading = True
            self._write(encode(CMD_LOAD, kwargs=load))  # values came from a JSON request
        if not self._write(job.line):
            return  # the worker is gone: its exit fails the job
        self._arm_event_timer()
        self._set_state(WorkerState.BUSY)

    def _reload_for(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        """The load kwargs ``request`` needs, when they differ from those loaded."""
        keys = self.settings.load_keys
        if not keys:
            return None
        wanted = {k: request[k] for k in keys if k in request and k != FOOTPRINT_KEY}
        if not any(k in wanted and self._loaded.get(k) != wanted[k]
                   for k in self.settings.reload_keys):
            return None
        return {**self.settings.load_kwargs, **wanted}

    def _fail_soon(self, job_id: str, outcome: Outcome) -> None:
        """Fail a job on the next loop turn (never inside the engine's own call)."""
        asyncio.get_running_loop().call_soon(self._fail_now, job_id, outcome)

    def _fail_now(self, job_id: str, outcome: Outcome) -> None:
        self.observer.request_done(self, job_id, outcome)
        self._next()

    def cancel(self, job_id: str) -> bool:
        """Ask the worker to stop the job (``abort``); a job not started yet leaves at once."""
        job = self._current
        if job is not None and job.job_id == job_id:
            if not job.abort_sent:
                job.abort_sent = self._write(encode(CMD_ABORT))
            return job.abort_sent
        for queued in self._queued:
            if queued.job_id == job_id:
                self._queued.remove(queued)
                self._fail_soon(job_id, Outcome(ok=False, cancelled=True,
                                                status_code=CANCELLED_STATUS,
                                                error="cancelled before it started"))
                return True
        return False

    def ping(self) -> None:
        """The engine's liveness ping: vramd's ``ping`` unless one is unanswered, and only
        between jobs (a busy vramd worker answers after its job; meanwhile the event timeout
        watches it)."""
        if self._pings or self._current is not None or not self.hot:
            return
        future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._pings.append((monotonic(), future))
        if not self._write(encode(CMD_PING)):
            self._pings.pop()

    def ping_overdue(self, now: float) -> float:
        """Seconds the oldest ping has waited for its ``pong`` while the worker was idle."""
        if self._current is not None or not self._pings:
            return 0.0
        return max(0.0, now - max(self._pings[0][0], self._idle_since))

    async def round_trip(self, timeout: float = 5.0) -> float | None:
        """Send vramd's ``ping``: the seconds until its ``pong``, or None (no answer within
        ``timeout``, or the worker is gone). A busy vramd worker answers after its job."""
        if self._exited.is_set() or self.proc is None or len(self._pings) >= MAX_PENDING_PINGS:
            return None
        future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
        self._pings.append((monotonic(), future))
        if not self._write(encode(CMD_PING)):
            self._pings.pop()
            return None
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        return None  # its late pong still resolves this future, keeping later ones in order

    # -- writing ----------------------------------------------------------------------------
    def _write(self, line: bytes) -> bool:
        proc = self.proc
        stdin = proc.stdin if proc is not None else None
        if stdin is None or stdin.is_closing() or self._exited.is_set():
            return False
        try:
            stdin.write(line)
        except (ConnectionError, OSError, RuntimeError):
            return False
        return True

    def _log_note(self, text: str) -> None:
        """A line of ours in the worker's log, where its own stderr goes (a few hundred)."""
        self._notes += 1
        if self._notes > MAX_NOTES:
            return
        if self._notes == MAX_NOTES:
            text = "further notes of vramtui about this worker are left out"
        try:
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(f"[vramtui] {self.name}: {text}\n")
        except OSError:
            log.warning("worker %s: %s", self.name, text)

    # -- the event timeout ------------------------------------------------------------------
    def _arm_event_timer(self) -> None:
        self._cancel_event_timer()
        limit = self.settings.event_timeout_s
        if limit is not None and self._current is not None and not self._exited.is_set():
            self._event_timer = asyncio.get_running_loop().call_later(limit, self._hung, limit)

    def _cancel_event_timer(self) -> None:
        if self._event_timer is not None:
            self._event_timer.cancel()
            self._event_timer = None

    def _hung(self, limit: float) -> None:
        self._event_timer = None
        job = self._current
        if job is None or self._exited.is_set():
            return
        self._last_error = (f"no event for {limit:g} s while running job {job.job_id} "
                            "(vramd.event_timeout): killed as hung")
        self._log_note(self._last_error)
        self.kill()

    # -- stop -------------------------------------------------------------------------------
    def _ask_to_go(self) -> None:
        if self.proc is not None:
            self._send_stop()

    def _send_stop(self) -> None:
        # vramd's loop runs its commands in order: unload, then shutdown; the end of stdin
        # after them is its other way out.
        sent = self._write(encode(CMD_UNLOAD)) and self._write(encode(CMD_SHUTDOWN))
        proc = self.proc
        if proc is not None and proc.stdin is not None and not proc.stdin.is_closing():
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                proc.stdin.close()
        if not sent and self.pid is not None:
            process.signal_group(self.pid, signal.SIGTERM)



def _fraction(pct: Any) -> float | None:
    """vramd's ``pct`` (0..1, or null) as a progress fraction."""
    if isinstance(pct, bool) or not isinstance(pct, int | float):
        return None
    try:
        value = float(pct)
    except OverflowError:
        return 1.0 if pct > 0 else 0.0
    return min(1.0, max(0.0, value)) if math.isfinite(value) else None


def _request_of(payload: bytes) -> tuple[dict[str, Any], str | None]:
    """vramd's request from a job's payload: a JSON object (empty payload: ``{}``)."""
    if not payload.strip():
        return {}, None
    try:
        request = json.loads(payload)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return {}, f"a vramd worker takes a JSON object as its request; this is not JSON: {exc}"
    if not isinstance(request, dict):
        return {}, (f"a vramd worker takes a JSON object as its request, not a JSON "
                    f"{type(request).__name__}")
    return {k: v for k, v in request.items() if not str(k).startswith("_")}, None
