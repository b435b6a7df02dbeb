"""One running worker process of a backend: its state, its two connections, its requests.

A :class:`WorkerHandle` starts the process, follows its status events (starting →
initializing → ready ⇄ busy → stopping), sends requests and turns replies, stream chunks,
progress and errors into calls on its :class:`WorkerObserver` (the engine).  It notices a crash
from the process exit or a lost socket, and stops gracefully: SHUTDOWN, then SIGTERM, then
SIGKILL to the worker's process group after the grace.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from worker_sdk.events import (
    Cancel,
    Chunk,
    EndOfStream,
    EnvelopeReply,
    ErrorReply,
    Event,
    Progress,
    Reply,
    Request,
    Shutdown,
    SleepReply,
    SleepRequest,
    Status,
    WakeReply,
    WakeRequest,
)
from worker_sdk.protocol import ProtocolError

from . import process
from .supervised import SleepOutcome, SupervisedProcess, WorkerState
from .wire import WireConnection, WireListener

log = logging.getLogger(__name__)


# A cancelled request's status (nginx's "client closed request"), as worker_sdk's workers
# answer one: also what a job whose answer had begun records once it is cancelled.
CANCELLED_STATUS = 499


@dataclass(slots=True)
class Outcome:
    """How one request ended, as the worker said it."""

    ok: bool
    data: bytes | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    status_code: int = 200
    error: str | None = None
    cancelled: bool = False
    too_large: bool = False  # the result went over the limit: what came of it is dropped
    # a model server stopped answering (why; supervisor/servers/handle.py): the engine kills
    # it, and this job ends as its running jobs do then (retried once, or failed)
    unanswered: str | None = None


@dataclass(slots=True)
class Pending:
    wire_id: int
    job_id: str
    stream: bool
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0  # bytes of result received so far (data, or the chunks in all)
    overflowed: bool = False  # over the result limit: failed; what still comes is dropped


OVERFLOW_GRACE_S = 5.0  # a worker that goes on past the result limit this long is killed


class WorkerObserver(Protocol):
    def worker_state(self, handle: WorkerHandle) -> None: ...

    def worker_exited(self, handle: WorkerHandle, code: int | None, reason: str) -> None: ...

    def request_done(self, handle: WorkerHandle, job_id: str, outcome: Outcome) -> None: ...

    def request_progress(self, job_id: str, fraction: float | None, text: str) -> None: ...

    def request_chunk(self, job_id: str, chunk: bytes) -> None: ...

    def request_head(self, job_id: str, status: int, headers: dict[str, str]) -> None:
        """A streamed answer's status and headers, before its first chunk (model servers)."""
        ...


class WorkerHandle(SupervisedProcess):
    """The engine's view of one worker process (touched only on the engine loop)."""

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
        listener: WireListener,
        observer: WorkerObserver,
        plain_stream: bool = False,
        max_result: int | None = None,
    ) -> None:
        super().__init__(backend=backend, name=name, gpu=gpu, argv=argv, env=env, cwd=cwd,
                         log_path=log_path, observer=observer)
        self.listener = listener
        self.plain_stream = plain_stream
        self.max_result = max_result  # bytes of one request's result (None: no limit)
        self.control: WireConnection | None = None
        self.data: WireConnection | None = None
        self.inflight: dict[int, Pending] = {}
        self.by_job: dict[str, int] = {}
        self._said_ready = False  # the worker said "ready" (maybe before its data socket came)
        self._asked: dict[int, asyncio.Future[SleepOutcome]] = {}  # sleeps and wakes
        self._lost_reason: str | None = None  # why the engine killed it (not an init failure)

    # -- start ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.listener.claim(self.name, self)
        if await self._start_process():
            asyncio.get_running_loop().create_task(self._watch_exit())

    def _start_failed(self) -> None:
        self.listener.release(self.name)

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        code = await self.proc.wait()
        self.exit_code = code
        self.listener.release(self.name)
        for conn in (self.control, self.data):
            if conn is not None:
                conn.on_lost = None
                conn.close()
        expected = self._stopping
        self._gone()
        for fut in self._asked.values():
            if not fut.done():
                fut.set_result(SleepOutcome(False, f"the worker exited (code {code})"))
        if expected:
            reason = "stopped"
        elif self.init_error:
            reason = f"initialize failed: {self.init_error}"
        elif self._lost_reason:
            reason = self._lost_reason
        else:
            reason = f"worker exited with code {code}"
        self._set_state(WorkerState.COLD if expected else WorkerState.CRASHED)
        self.observer.worker_exited(self, code, reason)

    def attach(self, conn: WireConnection, is_control: bool) -> None:
        old = self.control if is_control else self.data
        if old is not None and old is not conn:  # a new session supersedes the old socket
            old.on_lost = None
            old.close("superseded by a new registration")
        conn.on_lost = lambda why: self._connection_lost(why, conn.closed_by_engine)
        if is_control:
            self.control = conn
            conn.on_event = self._on_control
        else:
            self.data = conn
            conn.on_event = self._on_data
            conn.on_refused = self._on_refused
        self.features = conn.features
        if self.control is not None and self.data is not None and \
                self.state == WorkerState.STARTING:
            self._set_state(WorkerState.INITIALIZING)
        self._maybe_ready()

    def registration_refused(self, why: str) -> None:
        """The worker's registration broke the protocol: it will never be ready."""
        self._connection_lost(f"its registration was refused: {why}", by_engine=True)

    def _maybe_ready(self) -> None:
        """READY once the worker said so AND both of its connections are attached."""
        if (self._said_ready and self.control is not None and self.data is not None
                and not self._stopping and self.state in (WorkerState.STARTING,
                                                          WorkerState.INITIALIZING)):
            self._set_state(WorkerState.READY)

    def _connection_lost(self, why: str, by_engine: bool = False) -> None:
        if self._stopping or self._exited.is_set():
            return
        if by_engine:  # (a protocol error, or a worker that does not read its socket)
            self._lost_reason = f"the engine cut the worker off: {why}"
        # A worker without its sockets is useless.  It usually died (its exit follows at
        # once); if it is still there after a moment, it is killed: either way it is a crash.
        asyncio.get_running_loop().create_task(self._reap_lost(why))

    async def _reap_lost(self, why: str) -> None:
        if await self._wait_exit(1.0):
            return
        log.warning("worker %s: %s but the process lives on; killing it", self.name, why)
        self._lost_reason = f"{self._lost_reason or why}; killed by the engine"
        self.kill()

    # -- liveness ---------------------------------------------------------------------------
    def ping(self) -> None:
        """Send a PING on the control socket unless one is still unanswered.

        Every worker answers PING with PONG from its control thread, busy in predict or not
        (verda-io's workers too), so a ping left unanswered means a hung or stopped process.
        """
        control = self.control
        if control is None or control.closed or control.oldest_unanswered_ping_s() is not None:
            return
        control.ping()

    def ping_overdue(self, now: float) -> float:
        """Seconds the oldest unanswered ping has waited for its PONG (0: none outstanding)."""
        control = self.control
        waited = control.oldest_unanswered_ping_s(now) if control is not None else None
        return 0.0 if waited is None else max(0.0, waited)

    def _on_control(self, event: Event) -> None:
        """A typed control event (the conversation validated it)."""
        if isinstance(event, Status):
            status = event.status
            stamp = event.timestamp
            self.status_marks.append((stamp if stamp is not None else time.time(), status))
            if status == "failed":
                self.init_error = event.error or "initialize failed"
            elif status == "ready" and not self._stopping and \
                    self.state != WorkerState.ASLEEP:  # (only its wake's answer wakes it)
                self._said_ready = True
                if self.state in (WorkerState.STARTING, WorkerState.INITIALIZING):
                    self._maybe_ready()
                else:
                    self._set_state(WorkerState.BUSY if self.inflight else WorkerState.READY)
            elif status == "initializing" and self.state == WorkerState.STARTING:
                self._set_state(WorkerState.INITIALIZING)
        elif isinstance(event, Progress):
            self._on_progress(event)

    def _on_progress(self, event: Progress) -> None:
        """A request's progress (on the control socket, or in order with its chunks on the
        data socket: ``data-progress``)."""
        pending = self.inflight.get(event.request)
        if pending is not None:
            self.observer.request_progress(pending.job_id, event.fraction, event.message)

    # -- requests ---------------------------------------------------------------------------
    def send(self, job_id: str, payload: bytes, *, stream: bool,
             metadata: dict[str, Any] | None = None, deadline: float | None = None) -> int:
        assert self.data is not None
        wire_id = self.data.next_id()
        self.data.send(Request(wire_id, payload, job_id, metadata or {}, deadline, stream))
        self.inflight[wire_id] = Pending(wire_id, job_id, stream)
        self.by_job[job_id] = wire_id
        if self.state == WorkerState.READY:
            self._set_state(WorkerState.BUSY)
        return wire_id

    def cancel(self, job_id: str) -> bool:
        """Ask the worker to cancel; False when the worker cannot be asked (no extension)."""
        wire_id = self.by_job.get(job_id)
        control = self.control
        if wire_id is None or control is None or "cancel" not in control.features:
            return False
        control.send(Cancel(control.next_id(), wire_id))
        return True

    def _finish(self, wire_id: int, outcome: Outcome) -> None:
        pending = self.inflight.pop(wire_id, None)
        if pending is None:
            return
        self.by_job.pop(pending.job_id, None)
        if not self.inflight and self.state == WorkerState.BUSY:
            self._set_state(WorkerState.READY)
        self.observer.request_done(self, pending.job_id, outcome)

    def _on_data(self, event: Event) -> None:
        """A typed reply (the conversation matched it to an open request and validated it)."""
        if type(event) is Progress:
            self._on_progress(event)
            return
        if type(event) is SleepReply or type(event) is WakeReply:
            fut = self._asked.get(event.id)
            if fut is not None and not fut.done():
                error = event.error or "it failed" if event.status == "error" else None
                kept = getattr(event, "kept_mib", None)
                fut.set_result(SleepOutcome(error is None, error, kept,
                                            getattr(event, "host_mib", None)))
            return
        pending = self.inflight.get(event.id)
        if pending is None:
            return
        cls = type(event)
        final = cls is not Chunk
        if pending.overflowed:  # failed already: drop the rest, forget it when it ends
            if final:
                self._end_overflowed(pending)
            return
        data = getattr(event, "data", None)
        if self._over_limit(pending, len(data) if data is not None else 0, final):
            return
        if cls is Reply:
            self._finish(event.id, Outcome(ok=True, data=bytes(event.data)))  # type: ignore
        elif cls is Chunk:
            chunk = bytes(event.data)  # type: ignore[attr-defined]
            pending.chunks.append(chunk)
            self.observer.request_chunk(pending.job_id, chunk)
        elif cls is EndOfStream:
            self._finish(event.id, Outcome(ok=True, data=b"".join(pending.chunks)))
        elif isinstance(event, EnvelopeReply):
            self._finish(event.id, Outcome(ok=True, data=bytes(event.data),
                                           headers=dict(event.headers),
                                           status_code=event.status_code))
        elif isinstance(event, ErrorReply):
            self._finish(event.id, Outcome(ok=False, error=event.error,
                                           status_code=event.status_code,
                                           cancelled=event.kind == "cancelled"))

    def _over_limit(self, pending: Pending, nbytes: int, final: bool) -> bool:
        """Count ``nbytes`` more of ``pending``'s result.  Past the limit the job fails at
        once; a request still going is cancelled (and its worker killed if it goes on)."""
        pending.size += nbytes
        limit = self.max_result
        if limit is None or pending.size <= limit:
            return False
        pending.overflowed = True
        pending.chunks.clear()
        asked = False if final else self.cancel(pending.job_id)
        self.observer.request_done(self, pending.job_id, Outcome(
            ok=False, status_code=507, too_large=True,
            error=(f"the result is over the engine's limit of {limit / 1048576:g} MiB for one "
                   f"job ({pending.size} bytes so far; EngineConfig.max_result_bytes, "
                   "VRAMTUI_MAX_RESULT_MIB)"
                   + ("" if final else "; the request was cancelled" if asked
                      else "; the rest of it is dropped"))))
        if final:
            self._end_overflowed(pending)
        else:
            asyncio.get_running_loop().call_later(OVERFLOW_GRACE_S, self._overflow_expired,
                                                  pending)
        return True

    def _overflow_expired(self, pending: Pending) -> None:
        if self.inflight.get(pending.wire_id) is pending and not self.exited:
            log.warning("worker %s goes on past the result limit of job %s; killing it",
                        self.name, pending.job_id)
            self.kill()

    def _end_overflowed(self, pending: Pending) -> None:
        """A request that already failed for its size has ended: forget it quietly."""
        self.inflight.pop(pending.wire_id, None)
        self.by_job.pop(pending.job_id, None)
        if not self.inflight and self.state == WorkerState.BUSY:
            self._set_state(WorkerState.READY)

    def _on_refused(self, exc: ProtocolError) -> None:
        """A reply the conversation refused fails its request (the worker keeps serving)."""
        fut = self._asked.get(exc.message_id) if exc.message_id is not None else None
        if fut is not None and not fut.done():
            fut.set_result(SleepOutcome(False, f"the worker sent a malformed answer: {exc}"))
        if exc.message_id is not None and exc.message_id in self.inflight:
            self._finish(exc.message_id, Outcome(
                ok=False, status_code=502, error=f"the worker sent a malformed reply: {exc}"))

    # -- sleep ------------------------------------------------------------------------------
    async def sleep(self, level: int, timeout: float) -> SleepOutcome:
        data = self.data
        if self.state != WorkerState.READY or self.inflight or data is None \
                or "sleep" not in self.features:
            return SleepOutcome(False, f"it cannot sleep now (it is {self.state.value})")
        self._set_state(WorkerState.ASLEEP)
        return await self._ask(SleepRequest(data.next_id(), level), timeout)

    async def wake(self, timeout: float) -> SleepOutcome:
        data = self.data
        if self.state != WorkerState.ASLEEP or data is None:
            return SleepOutcome(False, f"it is not asleep (it is {self.state.value})")
        outcome = await self._ask(WakeRequest(data.next_id()), timeout)
        if outcome.ok and self.state == WorkerState.ASLEEP and not self._stopping:
            self._set_state(WorkerState.READY)
        return outcome

    async def _ask(self, event: Event, timeout: float) -> SleepOutcome:
        data = self.data
        assert data is not None
        fut: asyncio.Future[SleepOutcome] = asyncio.get_running_loop().create_future()
        self._asked[event.id] = fut
        try:
            data.send(event)
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            return SleepOutcome(False, f"no answer within {timeout:g} s")
        finally:
            self._asked.pop(event.id, None)

    # -- stop -------------------------------------------------------------------------------
    def _ask_to_go(self) -> None:
        """A shutdown message, now (before anything else runs), else SIGTERM."""
        control = self.control
        if control is not None and not control.closed:
            control.send(Shutdown(control.next_id()))
        elif self.pid is not None:
            process.signal_group(self.pid, signal.SIGTERM)

