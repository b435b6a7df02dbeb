"""`Supervisor`: the one API every face uses — commands, immutable snapshots, events.

Thread-safe: each command is handed to the engine loop (``call_soon_threadsafe``) and its
answer comes back through a future, so callers on any thread never touch engine state.
``wait`` blocks until :mod:`supervisor.doors.watch` hears of the job's end, without a round
trip through the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import logging
import os
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from . import eventloop, operations
from .apispec import METHODS
from .backends.errors import display_path
from .backends.loader import default_layers, load_backends, named_layers
from .doors.watch import JobEnd
from .engine import Engine, EngineConfig
from .engine.config import reserve_problem, reserve_unknown
from .errors import EngineRunning, EngineStopped, VramtuiError
from .events import EngineEvent, Subscription
from .gpu.errors import BadGpuSpec
from .gpu.select import open_probe
from .jobs import JobView
from .jobs.query import DEFAULT_LIMIT
from .limits import Limits, raise_open_file_limit
from .paths import Paths
from .results import (
    CancelResult,
    DescriptorInfo,
    JobRequest,
    LogChunk,
    ReloadResult,
    ReportFile,
    YieldInfo,
)
from .snapshot import EngineSnapshot
from .units import digits
from .validate import check_seconds

T = TypeVar("T")
_CALL_TIMEOUT = 30.0
log = logging.getLogger("supervisor")


class Service(Protocol):
    """Something that lives on the engine loop beside the engine (the control server).

    ``start`` is called on the loop once the engine is up (raise to fail the start);
    ``close`` is awaited on the loop after the engine has stopped.
    """

    def start(self) -> None: ...

    async def close(self) -> None: ...


class EngineLock:
    """An exclusive ``flock`` on the runtime directory's lock file, holding our pid."""

    def __init__(self, path: Path, socket: Path | None = None) -> None:
        self.path = path
        self.socket = socket
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                owner = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            where = f", control socket {self.socket}" if self.socket is not None else ""
            exc = EngineRunning(
                f"another vramtui engine (pid {owner}{where}) already runs in "
                f"{self.path.parent}; attach to it, or stop it first"
            )
            exc.pid = int(owner) if digits(owner) else None
            exc.socket = str(self.socket) if self.socket is not None else None
            raise exc from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


class Supervisor:
    """The engine behind one facade; build it with :meth:`from_config`."""

    def __init__(self, engine: Engine, paths: Paths) -> None:
        self.engine = engine
        self.paths = paths
        self._lock = EngineLock(paths.lock_path, paths.control_socket)
        self._services: list[Service] = []
        self._handle_signals = False
        self._signalled = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._done = threading.Event()
        self.limits = Limits()  # what from_config read from the environment

    @classmethod
    def from_config(
        cls,
        *,
        gpus: str = "auto",
        backends: Sequence[str | os.PathLike[str]] = (),
        paths: Paths | None = None,
        config: EngineConfig | None = None,
        environ: Mapping[str, str] = os.environ,
    ) -> Supervisor:
        """Read the configuration and build an engine (not started yet)."""
        limits = Limits.from_env(environ)
        paths = (paths or Paths.from_env(environ)).ensure()
        probe, notice = open_probe(gpus, ledger_dir=paths.sim_dir, host_reserve_mib=(
            config or EngineConfig()).host_reserve_mib)
        if config is not None and config.gpu_reserve_mib:
            totals = {d.index: d.total_mib for d in probe.devices()}
            why = reserve_problem(config.gpu_reserve_mib, totals)
            if why is not None:
                probe.close()
                raise BadGpuSpec(why)
            unknown = reserve_unknown(config.gpu_reserve_mib, totals)
            if unknown is not None:
                notice = f"{notice}; {unknown}" if notice else unknown
        named = named_layers([Path(b) for b in backends], environ)
        layers = default_layers(paths.config_dir, [Path(b) for b in backends], environ)
        loaded = load_backends(layers, environ=environ, demo_fallback=not named)
        engine = Engine(
            layers=layers,
            environ=environ,
            probe=probe,
            probe_notice=notice,
            backends=loaded.backends,
            descriptor_errors=tuple(str(e) for e in loaded.errors),
            paths=paths,
            config=config,
            descriptor_warnings=tuple((w.backend, str(w)) for w in loaded.warnings),
        )
        engine.descriptors.demo = loaded.demo
        engine.descriptors.where = ", ".join(display_path(p) for p in named) or \
            display_path(paths.backends_dir)
        sup = cls(engine, paths)
        sup.limits = limits
        return sup

    # -- running --------------------------------------------------------------------------
    def add_service(self, service: Service) -> None:
        """Run ``service`` on the engine loop from start to stop (add it before starting)."""
        self._services.append(service)

    def _on_started(self, error: BaseException | None) -> None:
        self._start_error = error
        self._started.set()

    def _engine_started(self, error: BaseException | None) -> None:
        if error is None:
            try:
                for service in self._services:
                    service.start()
            except BaseException as exc:  # noqa: BLE001 - reported through start/run
                error = exc
                self.engine.request_stop()
        self._on_started(error)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self._signalled:
            log.warning("%s again: stopping now (running jobs are interrupted)", name)
            self.engine.request_stop(now=True)
            return
        self._signalled = True
        log.info("%s: stopping — no new jobs, running jobs get their stop grace", name)
        self.engine.request_stop()

    def _on_reload_signal(self) -> None:
        """SIGHUP: read the descriptors again (the engine logs what changed)."""
        log.info("SIGHUP: reloading the backend descriptors")
        try:
            job = operations.reload(self.engine)
        except VramtuiError as exc:
            log.warning("SIGHUP: %s", exc)
            return
        assert isinstance(job, operations.Blocking) and job.then is not None
        then = job.then

        def done(fut: asyncio.Future[Any]) -> None:
            try:
                then(fut.result())
            except Exception:  # noqa: BLE001 - a bad reload must not stop the engine
                log.exception("SIGHUP: reloading the descriptors failed")

        assert self._loop is not None
        self._loop.run_in_executor(None, job.work).add_done_callback(done)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        raise_open_file_limit()
        handled: list[int] = []
        if self._handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(signum, self._on_signal, signum)
                handled.append(signum)
            self._loop.add_signal_handler(signal.SIGHUP, self._on_reload_signal)
            handled.append(signal.SIGHUP)
        try:
            await self.engine.main(self._engine_started)
        finally:
            for service in reversed(self._services):
                try:
                    await service.close()
                except Exception:  # noqa: BLE001 - closing must go on
                    log.exception("closing %s failed", type(service).__name__)
            for signum in handled:
                self._loop.remove_signal_handler(signum)
            self._lock.release()
            self._done.set()

    def start_in_thread(self, timeout: float = 30.0) -> Supervisor:
        """Run the engine on a daemon thread (the embedded engine); returns once it is up."""
        if self._thread is not None:
            raise VramtuiError("this supervisor was already started")
        self._lock.acquire()
        self._thread = threading.Thread(target=self._thread_main, name="vramtui-engine",
                                        daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise VramtuiError(f"the engine did not start within {timeout:g} s")
        if self._start_error is not None:
            raise self._start_error
        return self

    def _thread_main(self) -> None:
        try:
            eventloop.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported through start_in_thread
            if not self._started.is_set():
                self._on_started(exc)

    def run(self, *, handle_signals: bool | None = None) -> None:
        """Run the engine on this thread until :meth:`stop` is called (from elsewhere).

        On the main thread (or with ``handle_signals=True``) SIGTERM and SIGINT stop it
        gracefully, as :meth:`stop` does.
        """
        if handle_signals is None:
            handle_signals = threading.current_thread() is threading.main_thread()
        self._handle_signals = handle_signals
        self._lock.acquire()
        eventloop.run(self._main())
        if self._start_error is not None:
            raise self._start_error

    def stop(self, timeout: float | None = None) -> None:
        """Take no new jobs, let running ones finish within their grace, stop the workers.

        ``timeout`` defaults to the longest stop grace of any backend plus 15 s; past it, the
        workers are killed so that none outlives the engine.  A longer one than a thread can
        wait (``threading.TIMEOUT_MAX``, about 292 years) is that: it raised OverflowError.
        """
        if timeout is None:
            graces = [rt.spec.timeouts.stop_grace_s for rt in self.engine.backends.values()]
            timeout = max(graces, default=10.0) + 15.0
        if not timeout <= threading.TIMEOUT_MAX:  # (NaN too)
            timeout = threading.TIMEOUT_MAX
        loop = self._loop
        if loop is not None and not self._done.is_set():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.engine.request_stop)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        elif loop is not None:
            self._done.wait(timeout)
        if not self._done.is_set():
            self._kill_workers()

    def _kill_workers(self) -> None:
        """Last resort when the engine did not stop in time: no worker may outlive us.

        Reads the engine's state from this thread, which is safe only because the engine is
        stuck or gone; it only sends SIGKILL to the process groups the engine started.
        """
        self.engine.kill_all_workers()

    def __enter__(self) -> Supervisor:
        return self.start_in_thread()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._started.is_set() and not self._done.is_set()

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = self._loop
        if loop is None or self._done.is_set() or not self._started.is_set():
            raise EngineStopped("the engine is not running; start it first")
        if self._thread is threading.current_thread():
            return fn(*args, **kwargs)
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                fut.set_exception(exc)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:
            raise EngineStopped("the engine stopped") from None
        return fut.result(_CALL_TIMEOUT)

    def _op(self, method: str, /, **given: Any) -> Any:
        """Call API method ``method`` on the engine loop: the arguments checked by its entry in
        :data:`supervisor.apispec.METHODS`, the work done by :mod:`supervisor.operations`
        (what the control server does too); file reads happen here, off the loop."""
        kwargs = METHODS[method].check(given)
        result = self._call(getattr(operations, method), self.engine, **kwargs)
        if isinstance(result, operations.Blocking):
            value = result.work()
            return value if result.then is None else self._call(result.then, value)
        return result

    # -- commands (each method's arguments and result: supervisor.apispec) ---------------------
    def submit(self, backend: str, payload: bytes = b"", *, priority: int | None = None,
               timeout: float | None = None, metadata: dict[str, Any] | None = None,
               stream: bool = False) -> str:
        """Queue a job; returns its id once the engine accepted it."""
        return self._op("submit", backend=backend, payload=payload, priority=priority,
                        timeout=timeout, metadata=metadata, stream=stream)

    def wait(self, job_id: str, timeout: float | None = None) -> JobView:
        """Block until the job ends; its final view (.state, .data, .error, …)."""
        METHODS["wait"].check({"job_id": job_id, "timeout": timeout})
        timeout = check_seconds(timeout, "wait timeout", allow_zero=True)
        end = JobEnd.of(self.engine, job_id)
        if end is None:
            view = self.job(job_id)
            if view.finished:
                return view
            end = JobEnd.of(self.engine, job_id)
            if end is None:
                return self.job(job_id)
        return end.result(timeout)

    def job(self, job_id: str) -> JobView:
        """The job now (``position`` is its place in the queue while it waits)."""
        return self._op("job", job_id=job_id)

    def jobs(self, *, state: str | None = None, backends: Sequence[str] = (),
             limit: int = DEFAULT_LIMIT) -> tuple[JobView, ...]:
        """The jobs held, without their results, in the order of
        :func:`supervisor.jobs.query.list_jobs` (``state``: "queued,running", "active",
        "finished"; ``backends``: only theirs; at most ``limit``, within its limits)."""
        return self._op("jobs", state=state, backends=backends, limit=limit)

    def job_request(self, job_id: str, *, limit: int = 65536) -> JobRequest:
        """The request the job was submitted with (its first ``limit`` bytes), while kept."""
        return self._op("job_request", job_id=job_id, limit=limit)

    def cancel(self, job_id: str) -> JobView:
        return self._op("cancel", job_id=job_id)

    def cancel_many(self, job_ids: Sequence[str]) -> list[CancelResult]:
        """Cancel several jobs; one result each (an unknown job's says so)."""
        return list(self._op("cancel_many", job_ids=job_ids))

    def retry(self, job_id: str) -> str:
        """Run a finished job's request again as a new job; the new job's id."""
        return self._op("retry", job_id=job_id)

    def set_priority(self, job_id: str, priority: int) -> JobView:
        """Give a queued job another priority (higher runs first)."""
        return self._op("set_priority", job_id=job_id, priority=priority)

    def evict(self, backend: str) -> None:
        self._op("evict", backend=backend)

    def respawn(self, backend: str) -> None:
        self._op("respawn", backend=backend)

    def preload(self, backend: str) -> None:
        self._op("preload", backend=backend)

    def kill(self, backend: str) -> None:
        """SIGKILL a (stuck) backend's worker now; its jobs fail, saying so."""
        self._op("kill", backend=backend)

    def sleep(self, backend: str) -> None:
        """Put a backend's idle worker to sleep (its GPU memory given back, its process kept)."""
        self._op("sleep", backend=backend)

    def wake(self, backend: str) -> None:
        """Wake a backend's sleeping worker (once what waking takes fits)."""
        self._op("wake", backend=backend)

    def zero(self) -> list[str]:
        return list(self._op("zero"))

    def drain(self, gpu: int, on: bool = True) -> tuple[int, ...]:
        """Drain a GPU (running work finishes, nothing new admitted there), or reopen it."""
        return self._op("drain", gpu=gpu, on=on)

    def yield_gpus(self, gpus: Sequence[int] = (), *, for_s: float | None = None,
                   now: bool = False, by: str = "") -> tuple[YieldInfo, ...]:
        """Hand GPUs over to programs we do not manage, until resumed or ``for_s`` ends."""
        return self._op("yield_gpus", gpus=list(gpus), for_s=for_s, now=now, by=by)

    def resume_gpus(self, gpus: Sequence[int] = ()) -> tuple[int, ...]:
        """Take yielded GPUs back (none: all of them)."""
        return self._op("resume_gpus", gpus=list(gpus))

    def reload(self) -> ReloadResult:
        """Read the backend descriptors again and apply what changed."""
        return self._op("reload")

    def descriptor(self, backend: str) -> DescriptorInfo:
        """A backend's layers (each file's entry for it) and its effective descriptor."""
        return self._op("descriptor", backend=backend)

    def calibration_report(self, backend: str, *, name: str | None = None) -> ReportFile:
        """A backend's latest calibration report (or the one named), as JSON bytes."""
        return self._op("calibration_report", backend=backend, name=name)

    def calibrate(self, backend: str, *, repeats: int = 3, request: bytes | None = None,
                  settle_s: float = 1.0) -> str:
        """Queue a calibration run of ``backend``; its job id (the result is the summary)."""
        return self._op("calibrate", backend=backend, repeats=repeats, request=request,
                        settle_s=settle_s)

    def snapshot(self, *, light: bool = False) -> EngineSnapshot:
        """The engine now (``light``: without the GPUs' history, recent jobs and the log)."""
        return self._op("snapshot", light=light)

    def logs(self, backend: str, *, lines: int = 50, offset: int | None = None) -> LogChunk:
        """The last ``lines`` of a backend's worker log, or what follows ``offset``."""
        return self._op("logs", backend=backend, lines=lines, offset=offset)

    def subscribe(self, *, kinds: Sequence[str] | None = None, maxsize: int = 1000,
                  callback: Callable[[EngineEvent], Any] | None = None) -> Subscription:
        """Events as they happen (bounded; ``lagged`` says when some were dropped)."""
        METHODS["subscribe"].check({"kinds": kinds, "maxsize": maxsize, "callback": callback})
        return self.engine.events.subscribe(
            maxsize=maxsize, kinds=frozenset(kinds) if kinds else None, callback=callback
        )
