"""One running HTTP model server of a backend, presented to the engine as a worker.

:class:`ServerHandle` has the interface of ``supervisor.workers.base.Worker`` and the states
of ``supervisor/workers/states.py``: it is ``starting`` from its spawn (its own session, so
its own process group; stdout and stderr to the backend's bounded log), ``initializing``
while its ``http.health`` path answers anything but 200 (polled, quickly at first),
``ready`` once it answers 200 (``health: none``: once its port takes a connection), ``busy``
while it serves jobs, ``stopping`` once asked to go (``http.stop``, else SIGTERM to its group;
the engine's stop then SIGKILLs the group after ``timeouts.stop_grace``), and ``cold`` or
``crashed`` at its end (whatever else of its group is left is killed then too). A server that
exits or never becomes healthy reports the tail of its log with the reason.

Each job is one HTTP request to the server (``supervisor/servers/request.py``), made over the
handle's kept-alive connections (``supervisor/servers/wire.py``: written at once when one is
idle): its answer's status and end-to-end headers come first (``observer.request_head``),
then, for a streamed job, each piece of its body in the turn of the loop it arrived in
(``request_chunk``), unchanged; a job that is not streamed gets the whole body as its
result. Health checks, pings, sleep and wake go over aiohttp, off the requests' path. A 5xx
answer fails the job, with what the server said. A cancelled job closes its connection, so
the server stops generating. Answers are bounded by the result limit (an endless stream
fails there), and by ``timeouts.idle`` (an answer silent that long fails its job, its
connection closed: a server hung mid-answer whose health still answers). A server whose
answers went silent so :data:`STOPPED_AFTER` times in a row, nothing generated between nor
for another request meanwhile (:class:`.wire.Silent`), stopped answering: it takes no
more jobs, and the outcome of the job that saw it says so (``Outcome.unanswered``), for the
engine to kill it (its running jobs, that one too, fail or are retried once as when a
server dies).

A server whose descriptor has ``http.sleep`` and ``http.wake`` offers ``sleep``: the engine's
sleep makes it ``asleep`` and sends the sleep request (``supervisor/servers/calls.py``), its
wake sends the wake request and makes it ``ready`` again once that answered 2xx. What it keeps
asleep is not its word: the engine measures it. ``ping`` is an HTTP request to
the health path; any answer counts as alive, so a server that stops answering is overdue and
the engine kills it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import signal
import time
from pathlib import Path
from typing import Any

from yarl import URL

from supervisor.clock import monotonic

from ..backends.http import HttpCall
from ..backends.schema import BackendSpec
from ..workers import process
from ..workers.handle import CANCELLED_STATUS, Outcome, WorkerObserver
from ..workers.states import WorkerState
from ..workers.supervised import SleepOutcome, SupervisedProcess
from .calls import call
from .launch import Launch
from .listener import listeners_of, pinned, trusted_uids
from .request import combined, end_to_end, upstream_of
from .wire import Exchange, Link, Silent, WireError

log = logging.getLogger(__name__)

# A server that refuses when its slots are full (503: koboldcpp's "busy") may not have freed
# the slot of a request whose client just went, which the engine counts free at once: a 503
# is asked again once, this long after (or after its Retry-After, at most BUSY_MAX_S).
BUSY_RETRY_S = 0.25
BUSY_MAX_S = 2.0
FIRST_POLL_S = 0.02  # the health path is polled this often for its first …
FAST_POLL_FOR_S = 3.0  # … seconds (a small model is up in a fraction of one) …
SLOW_POLL_S = 0.1  # … then this often while it loads
HEALTH_TIMEOUT_S = 30.0  # one health request that takes longer is given up (a ping stays due)
TAIL_BYTES = 600  # of its log, in the reason a server failed to start
SNIPPET = 300  # characters of a 5xx answer in the job's error
# Answers silent past timeouts.idle in a row (nothing generated between) that say a server
# stopped answering. One is not enough: closing its connection freed the slot of a request
# that was merely stuck (a prefill longer than the limit, a sampler stuck on one grammar),
# and a kill costs a reload and every other job the server holds; a second in a row with
# nothing generated between tells a stuck generation loop from one stuck request.
STOPPED_AFTER = 2


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def log_tail(path: Path, since: int = 0, nbytes: int = TAIL_BYTES) -> str:
    """The last lines of a log written past offset ``since``, on one line (`` | `` between
    them); '' when there are none."""
    size = log_size(path)
    if size < since:  # rotated since
        since = 0
    text = process.tail(path, min(nbytes, size - since))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if size - since > nbytes and lines:
        lines = lines[1:]  # the first may be cut
    return " | ".join(lines[-3:])


def one_line(data: bytes, limit: int = SNIPPET) -> str:
    text = " ".join(data[: limit * 4].decode("utf-8", "replace").split())
    return text[:limit] + ("…" if len(text) > limit else "")


class ServerHandle(SupervisedProcess):
    """The engine's view of one model server process (touched only on the engine loop)."""

    def __init__(self, *, spec: BackendSpec, name: str, gpu: int, launch: Launch,
                 cwd: str | None, log_path: Path, observer: WorkerObserver,
                 max_result: int | None = None) -> None:
        super().__init__(backend=spec.name, name=name, gpu=gpu, argv=launch.argv,
                         env=launch.env, cwd=cwd, log_path=log_path, observer=observer)
        assert spec.http is not None
        self.spec = spec
        self.http = spec.http
        self.url = launch.url  # its base URL: the doors' /upstream goes there too
        self.launch = launch
        self.max_result = max_result
        # retry: a job it dies under before answering may run again (once)
        self.features = frozenset({"cancel", "retry"}
                                  | ({"sleep"} if self.http.can_sleep else set()))
        self._session: Any = None  # an aiohttp.ClientSession once started (health, pings)
        self._link = Link(self.url, spec.timeouts.idle_s)  # the jobs' connections
        self._jobs: dict[str, asyncio.Task[None]] = {}
        self._exchanges: dict[str, Exchange] = {}
        self._cancelled: set[str] = set()
        self._busy: set[str] = set()  # jobs waiting to ask again after a 503
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ping_sent: float | None = None
        self._ping_task: asyncio.Task[None] | None = None
        self._unanswering = False  # it stopped answering (STOPPED_AFTER): it takes no job
        self._log_from = 0  # the size of its log when it started: its own lines come after

    # -- start ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Spawn the server, then poll its health path until it is ready."""
        try:
            import aiohttp
        except ImportError as exc:
            self._refuse(f"an http: backend needs aiohttp ({exc}): pip install 'vramtui[http]'")
            return
        if self.launch.port is None and await self._connects():
            self._refuse(f"something already listens on {self.url} (http.url): stop it, or "
                         "let the engine pick a free port with ${PORT}")
            return
        self._log_from = log_size(self.log_path)
        # Under the reaper: a server's launcher that daemonizes (forks twice, leaves its
        # session, clears its environment) leaves its daemon in the tree walked from its pid.
        if not await self._start_process(reaped=True):
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10.0),
            auto_decompress=False, skip_auto_headers=("User-Agent", "Accept-Encoding"))
        self._spawn(self._watch_exit())
        if self._stopping:  # stopped before it was even running
            self._send_stop()
            return
        self.status_marks.append((time.time(), "initializing"))
        self._set_state(WorkerState.INITIALIZING)
        self._spawn(self._until_ready())

    def _refuse(self, why: str) -> None:
        self.init_error = why
        self._set_state(WorkerState.CRASHED)
        self._exited.set()
        self.observer.worker_exited(self, None, why)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _until_ready(self) -> None:
        limit = self.http.ready_timeout_s
        deadline = self.started_at + limit if limit is not None else math.inf
        while not self._exited.is_set() and not self._stopping:
            seen = self._check_listener()
            if seen is False:
                return  # another user's: stopped
            # Where the kernel lists no listener, the server has not bound yet, or its port is
            # forwarded into a container (a NAT rule, its listener in another network
            # namespace): it is asked without its key, and once it answers, the table is read
            # again: a listener that came meanwhile must be the server's own.
            # (one health request is given up at the deadline: a server that takes the
            # connection and never answers is not waited for past its ready_timeout)
            if await self._healthy(min(HEALTH_TIMEOUT_S,
                                       max(0.05, deadline - monotonic())),
                                   secret=seen is not None):
                if self._exited.is_set() or self._stopping or self._check_listener() is False:
                    return
                self.status_marks.append((time.time(), "ready"))
                self._link.spare()  # the first request finds a connection open
                self._set_state(WorkerState.READY)
                return
            if monotonic() >= deadline:
                self.init_error = f"not healthy after {limit:g} s (http.ready_timeout)" + (
                    f"; no listener on {self.url} was seen" if seen is None else "")
                self.kill()
                return
            fast = monotonic() - self.started_at < FAST_POLL_FOR_S
            if await self._wait_exit(FIRST_POLL_S if fast else SLOW_POLL_S):
                return

    def _check_listener(self) -> bool | None:
        """Who listens on the server's port (:mod:`.listener`): True, the server itself (its
        URL pinned to the address it holds), or a host whose sockets cannot be seen; None,
        nobody that the kernel lists; False, another user, and the server is stopped."""
        held = listeners_of(self.url)
        if held is None:
            return True
        if squatters := sorted(held - trusted_uids()):
            self.init_error = (
                f"another user (uid {', '.join(map(str, squatters))}) listens on "
                f"{self.url}, the server's port: nothing was sent there; " + (
                    "the next start picks another port" if self.launch.port is not None
                    else "free that port (http.url names it)"))
            self.kill()
            return False
        if not held:
            return None
        self._pin(pinned(self.url))  # a localhost URL goes to the address it holds only
        return True

    def _pin(self, url: str) -> None:
        """Send everything to ``url`` from now on (:func:`.listener.pinned`: the address that
        the server's listener holds, in place of ``localhost``, whose other address another
        user could listen on)."""
        if url == self.url:
            return
        self.url = url
        self.launch = dataclasses.replace(self.launch, url=url)
        self._link.close()
        self._link = Link(url, self.spec.timeouts.idle_s)

    async def _healthy(self, timeout: float = HEALTH_TIMEOUT_S, secret: bool = True) -> bool:
        """Ready: its health path answers 200 within ``timeout`` (``health: none``: its port
        connects); ``secret``: with its ``${API_KEY}``."""
        if self.http.health is None:
            return await self._connects()
        status = await self._get_status(self.http.health, timeout=timeout, secret=secret)
        return status == 200

    async def _get_status(self, path: str, timeout: float, secret: bool = True) -> int | None:
        import aiohttp

        try:
            async with self._session.get(self.url + path, allow_redirects=False,
                                         headers=self.launch.auth_headers if secret else None,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                return int(resp.status)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def _connects(self) -> bool:
        url = URL(self.url)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(url.host, port), 2.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _watch_exit(self) -> None:
        assert self.proc is not None and self.pid is not None
        code = await self.proc.wait()
        process.signal_group(self.pid, signal.SIGKILL)  # what is left of its tree goes too
        self.exit_code = code
        expected = self._stopping
        self._gone()
        for task in list(self._tasks) + list(self._jobs.values()):
            if task is not asyncio.current_task():
                task.cancel()
        self._jobs.clear()
        self._link.close()
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
        if expected:
            reason = "stopped"
        else:
            why = self.init_error or f"server exited with code {code}"
            if self.ready_at is None:
                why = f"initialize failed: {why}"
            tail = log_tail(self.log_path, self._log_from)
            reason = f"{why}; its log ends: {tail}" if tail else why
            if self.ready_at is None:
                self.init_error = reason.removeprefix("initialize failed: ")
        self._set_state(WorkerState.COLD if expected else WorkerState.CRASHED)
        self.observer.worker_exited(self, code, reason)

    @property
    def data(self) -> object | None:
        """Itself while it can take a request; None otherwise."""
        if self._exited.is_set() or self._stopping or self._session is None or not self.hot \
                or self._unanswering:
            return None
        return self

    # -- requests ---------------------------------------------------------------------------
    def send(self, job_id: str, payload: bytes, *, stream: bool,
             metadata: dict[str, Any] | None = None, deadline: float | None = None) -> int:
        """Make the job's HTTP request of the server (written now when a connection is
        idle); its end comes as ``request_done``."""
        up = upstream_of(self.spec, payload, metadata)
        ex, sink = self._begin(job_id, up, stream, first=True)
        self._jobs[job_id] = self._spawn(self._forward(job_id, ex, sink, up))
        if self.state == WorkerState.READY:
            self._set_state(WorkerState.BUSY)
        return len(self._jobs)

    def _begin(self, job_id: str, up: Any, stream: bool, *, first: bool
               ) -> tuple[Exchange, _JobSink]:
        """The job's request, written now when a connection is idle (``first``: a 503 of the
        server's is held back, to be asked again)."""
        sink = _JobSink(self, job_id, stream, hold_busy=first)
        # llama-server closes a connection after a stream without saying so: a streamed
        # answer's connection is never used again (a spare is opened in its place).
        ex = self._link.begin(up.method, up.path, {**up.headers, **self.launch.auth_headers},
                              up.body, sink, reuse=not stream)
        self._exchanges[job_id] = ex
        return ex, sink

    async def _forward(self, job_id: str, ex: Exchange, sink: _JobSink, up: Any) -> None:
        outcome: Outcome | None = None
        try:
            if ex.cancelled:
                raise asyncio.CancelledError
            await self._link.complete(ex)
            if sink.busy:  # its slot not free yet (see BUSY_RETRY_S): asked again, once
                self._busy.add(job_id)
                try:
                    await asyncio.sleep(sink.retry_after())
                finally:
                    self._busy.discard(job_id)
                ex, sink = self._begin(job_id, up, sink.stream, first=False)
                await self._link.complete(ex)
            outcome = self._too_large() if sink.too_large else sink.outcome()
        except asyncio.CancelledError:
            if job_id not in self._cancelled:
                raise
            self._cancelled.discard(job_id)
            outcome = Outcome(ok=False, cancelled=True, status_code=CANCELLED_STATUS,
                              error="cancelled (its connection to the server was closed)")
        except (OSError, TimeoutError, ValueError) as exc:
            if await self._wait_exit(0.5) or self._stopping:
                return  # the server's end fails the job, with its reason
            what = str(exc) or type(exc).__name__
            if isinstance(exc, WireError) and sink.status:
                what = f"its answer broke off: {what}"
            outcome = Outcome(ok=False, status_code=502,
                              error=f"{self.backend}'s server failed the request: {what}",
                              unanswered=self._stopped_answering(exc))
        except Exception as exc:  # noqa: BLE001 - a fault of ours: the job fails, never hangs
            log.exception("forwarding job %s to %s failed", job_id, self.backend)
            ex.cancel()
            outcome = Outcome(ok=False, status_code=502, error=(
                f"the engine failed forwarding the request to {self.backend}'s server: "
                f"{type(exc).__name__}: {str(exc)[:200]} (a bug: please report it)"))
        finally:
            self._jobs.pop(job_id, None)
            self._exchanges.pop(job_id, None)
        if outcome is not None and not self._exited.is_set():
            self.observer.request_done(self, job_id, outcome)
        if not self._jobs and self.state == WorkerState.BUSY:
            self._set_state(WorkerState.READY)

    def _stopped_answering(self, exc: Exception) -> str | None:
        """Why the server stopped answering, when ``exc`` is the silence that shows it
        (:data:`STOPPED_AFTER` in a row): from now on it takes no job."""
        if not isinstance(exc, Silent) or exc.in_a_row < STOPPED_AFTER:
            return None
        self._unanswering = True
        alive = ""  # (its last health check answered, and none is due)
        if self._ping_sent is None:
            alive = f" while {self.http.health} answered" if self.http.health is not None \
                else " while its port took connections"
        return f"{exc.in_a_row} requests in a row silent for {exc.idle_s:g} s (timeouts.idle)" \
            + alive

    def _too_large(self) -> Outcome:
        return Outcome(ok=False, too_large=True, status_code=502, error=(
            f"{self.backend}'s answer went over the result limit of {self.max_result} bytes "
            "(an endless stream?); its connection was closed (VRAMTUI_MAX_RESULT_MIB)"))

    def ended(self, status: int, headers: dict[str, str], data: bytes | None,
              said: bytes) -> Outcome:
        if status >= 500:  # failed; answered to its client as the server answered it
            text = one_line(said) or "(no body)"
            return Outcome(ok=False, status_code=status if status <= 599 else 502,
                           headers=headers, data=data,
                           error=f"{self.backend}'s server answered HTTP {status}: {text}")
        return Outcome(ok=True, data=data, headers=headers, status_code=status)

    def cancel(self, job_id: str) -> bool:
        """Close the job's connection to the server (it stops generating)."""
        task = self._jobs.get(job_id)
        ex = self._exchanges.get(job_id)
        if task is not None and job_id in self._busy:  # waiting to ask again: it asks not
            self._cancelled.add(job_id)
            task.cancel()
            return True
        if task is None or task.done() or ex is None:
            return False
        self._cancelled.add(job_id)
        if ex.running:
            task.cancel()  # (its exchange closes its connection)
        else:  # not begun yet: it ends as cancelled as soon as it runs
            ex.cancel()
        return True

    # -- sleep ------------------------------------------------------------------------------
    async def sleep(self, level: int, timeout: float) -> SleepOutcome:
        """``asleep`` from now on, then its ``http.sleep`` request (``level`` is in its path,
        as written); how it went."""
        if self.state != WorkerState.READY or self._jobs or self.data is None \
                or self.http.sleep is None:
            return SleepOutcome(False, f"it cannot sleep now (it is {self.state.value})")
        self._set_state(WorkerState.ASLEEP)
        return await self._call(self.http.sleep, timeout)

    async def wake(self, timeout: float) -> SleepOutcome:
        """Its ``http.wake`` request; ``ready`` again once that answered 2xx."""
        if self.state != WorkerState.ASLEEP or self.http.wake is None or self._session is None:
            return SleepOutcome(False, f"it is not asleep (it is {self.state.value})")
        outcome = await self._call(self.http.wake, timeout)
        if outcome.ok and self.state == WorkerState.ASLEEP and not self._stopping:
            self._set_state(WorkerState.READY)
        return outcome

    async def _call(self, what: HttpCall, timeout: float) -> SleepOutcome:
        error = await call(self._session, self.url, what, timeout, self.launch.auth_headers)
        if error is not None and self._exited.is_set():
            error = f"the server exited (code {self.exit_code}) during {what}"
        return SleepOutcome(error is None, error)

    # -- liveness -----------------------------------------------------------------------------
    def ping(self) -> None:
        """An HTTP request to its health path, unless one is under way; any answer counts (a
        sleeping server is pinged too: one that hangs asleep is killed as any other)."""
        if self._ping_task is not None or self._session is None \
                or not (self.hot or self.state == WorkerState.ASLEEP):
            return
        if self._ping_sent is None:
            self._ping_sent = monotonic()
        self._ping_task = self._spawn(self._ping())

    async def _ping(self) -> None:
        try:
            status = await self._get_status(self.http.health or "/", timeout=HEALTH_TIMEOUT_S) \
                if self.http.health is not None else (200 if await self._connects() else None)
        finally:
            self._ping_task = None
        if status is not None:
            self._ping_sent = None  # it answered: alive (a failure leaves the ping due)

    def ping_overdue(self, now: float) -> float:
        """Seconds since the first of the pings it has not answered (0: none)."""
        return 0.0 if self._ping_sent is None else max(0.0, now - self._ping_sent)

    # -- stop -------------------------------------------------------------------------------
    def _ask_to_go(self) -> None:
        if self.proc is not None:
            self._send_stop()

    def _send_stop(self) -> None:
        if self.launch.stop is None:
            if self.pid is not None:
                process.signal_group(self.pid, signal.SIGTERM)
            return
        self._spawn(self._run_stop(self.launch.stop))

    async def _run_stop(self, argv: tuple[str, ...]) -> None:
        try:
            proc = await process.spawn(argv, env=self.env, cwd=self.cwd, log_path=self.log_path)
        except (OSError, ValueError) as exc:
            log.warning("%s: its stop command %s cannot start (%s); sending SIGTERM", self.name,
                        argv[0], exc)
            if self.pid is not None:
                process.signal_group(self.pid, signal.SIGTERM)
            return
        try:
            await asyncio.wait_for(proc.wait(), self.spec.timeouts.stop_grace_s)
        except TimeoutError:
            process.signal_group(proc.pid, signal.SIGKILL)
        finally:
            if proc.returncode is None:
                process.signal_group(proc.pid, signal.SIGKILL)


class _JobSink:
    """One job's answer as it comes: the head to the observer, each piece of a streamed body
    to the observer as it arrives (in the turn of the loop it arrived in), another body
    collected; bounded by the result limit."""

    __slots__ = ("handle", "job_id", "stream", "status", "headers", "size", "body",
                 "too_large", "hold_busy", "busy")

    def __init__(self, handle: ServerHandle, job_id: str, stream: bool,
                 hold_busy: bool = False) -> None:
        self.handle = handle
        self.job_id = job_id
        self.stream = stream
        self.hold_busy = hold_busy  # a 503 is not the answer yet: it will be asked again
        self.busy = False  # it answered 503, held back
        self.status = 0
        self.headers: dict[str, str] = {}
        self.size = 0
        self.body = bytearray()  # a collected body; a streamed 5xx's first bytes
        self.too_large = False

    def head(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status = status
        self.headers = combined(end_to_end(headers, also=("content-length",)))
        self.busy = self.hold_busy and status == 503
        if self.stream and not self.busy:
            self.handle.observer.request_head(self.job_id, status, self.headers)

    def retry_after(self) -> float:
        """How long to wait before asking again: its ``Retry-After`` (seconds), if short."""
        try:
            said = float(next((v for k, v in self.headers.items()
                               if k.lower() == "retry-after"), ""))
        except ValueError:
            return BUSY_RETRY_S
        return min(BUSY_MAX_S, max(BUSY_RETRY_S, said)) if math.isfinite(said) \
            else BUSY_RETRY_S

    def data(self, data: bytes) -> bool:
        self.size += len(data)
        limit = self.handle.max_result
        if limit is not None and self.size > limit:
            self.too_large = True
            return False
        if self.busy:  # (a 503 held back: it is asked again, this body is no answer)
            return True
        if not self.stream:
            self.body += data
            return True
        if self.status >= 500 and len(self.body) < SNIPPET * 4:
            self.body += data
        self.handle.observer.request_chunk(self.job_id, data)
        return True

    def outcome(self) -> Outcome:
        body = bytes(self.body)
        return self.handle.ended(self.status, self.headers, None if self.stream else body,
                                 body)
