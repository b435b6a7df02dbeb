"""In-process fakes behind the engine's seams: a GPU reader, a worker factory, a worker.

The engine receives its GPU reader, its worker factory and its clock; with these fakes its
rules (admission, eviction, queue order, cancel, timeouts, liars, recovery) run in
milliseconds, without a process.  A :class:`FakeWorker` has the same handle interface as a
real one (``start``, ``send``, ``cancel``, ``begin_stop``, ``stop``, ``kill``, pings, pids) and
reports to the engine exactly as a real handle does, through its observer, on the engine
loop.  What it does is scripted per backend (:class:`Script`: load time, memory, job time,
result, failures, how it sleeps and wakes when it can), or driven step by step by the test
(``manual=True``: ``ready()``, ``reply()``, ``progress()``, ``chunk()``, ``crash()``,
``hang()``).  Its memory is held on the
:class:`FakeGpu`, which the engine reads through its sampler like any probe, so the
engine's ledger is checked against a truth it does not compute.

``fake_engine(...)`` builds an engine on these fakes behind the real facade.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from supervisor.backends.schema import BackendSpec, build_spec
from supervisor.clock import monotonic
from supervisor.engine import Engine, EngineConfig
from supervisor.facade import Supervisor
from supervisor.gpu.model import GpuReading, ProcessReading
from supervisor.paths import Paths
from supervisor.workers.handle import Outcome, WorkerObserver
from supervisor.workers.states import HOT, WorkerState, check
from supervisor.workers.supervised import SleepOutcome

T = TypeVar("T")
_pids = itertools.count(4_000_000)


class FakeGpu:
    """A GPU reader over memory the fake workers declare (a truth the engine reads)."""

    source = "fake"
    simulated = True
    driver_version = None

    def __init__(self, sizes_mib: list[int]) -> None:
        self.sizes_mib = list(sizes_mib)
        self.peak: dict[int, int] = {}  # the most each GPU ever held
        self.overcommits: list[tuple[int, int]] = []  # (GPU, MiB held) over its size
        self._held: dict[int, tuple[int, int]] = {}  # pid -> (gpu, MiB)
        self._lock = threading.Lock()

    def hold(self, pid: int, gpu: int, mib: int) -> None:
        with self._lock:
            self._held[pid] = (gpu, mib)
            used = sum(m for g, m in self._held.values() if g == gpu)
        self.peak[gpu] = max(self.peak.get(gpu, 0), used)
        if used > self.sizes_mib[gpu]:
            self.overcommits.append((gpu, used))

    def release(self, pid: int) -> None:
        with self._lock:
            self._held.pop(pid, None)

    def used(self, gpu: int) -> int:
        with self._lock:
            return sum(mib for g, mib in self._held.values() if g == gpu)

    def devices(self) -> list[GpuReading]:
        return [GpuReading(i, f"FAKE{i}", total, self.used(i), max(0, total - self.used(i)),
                           None, None, None) for i, total in enumerate(self.sizes_mib)]

    def processes(self) -> list[ProcessReading]:
        with self._lock:
            return [ProcessReading(pid, gpu, mib, True) for pid, (gpu, mib) in self._held.items()]

    def close(self) -> None:
        pass


@dataclass
class Script:
    """How a fake backend's workers behave unless the test drives them (``manual``)."""

    load_s: float = 0.0  # from start to ready
    weights_mib: int = 0  # held from ready on
    activation_mib: int = 0  # held more while a job runs
    job_s: float = 0.0  # a job's time
    stop_s: float = 0.0  # from being asked to go to its exit
    result: bytes | None = None  # a job's answer (None: its payload, echoed)
    fail_start: str | None = None  # the start fails with this error
    fail_jobs: str | None = None  # every job fails with this error
    chunks: int = 0  # a job streams this many chunks before it ends
    honours_cancel: bool = True
    manual: bool = False  # the test calls ready(), reply(), … itself
    # It can sleep (it offers "sleep"), keeping this much on its GPU; None: it cannot.
    sleep_keeps_mib: int | None = None
    # honest; keeps (its sleep gives nothing back); lies (it says it keeps sleep_keeps_mib
    # but gives nothing back); grows (it takes its memory back while asleep, unasked);
    # creeps (half a second after its sleep it takes creep_mib back, unasked);
    # sleep-fails, sleep-hangs, wake-fails, wake-hangs, wake-crashes (its process dies in
    # the wake: a crash in the hook, the OOM killer)
    sleep_mode: str = "honest"
    creep_mib: int = 0
    sleep_s: float = 0.0  # a sleep's time
    wake_s: float = 0.0  # a wake's time


class FakeWorker:
    """One fake worker process of a backend (see the module doc)."""

    def __init__(self, factory: FakeWorkers, spec: BackendSpec, gpu: int, name: str,
                 observer: WorkerObserver, script: Script) -> None:
        self.factory = factory
        self.spec = spec
        self.backend = spec.name
        self.name = name
        self.gpu = gpu
        self.observer = observer
        self.script = script
        self.log_path = Path("/dev/null")
        self.state = WorkerState.STARTING
        self.pid: int | None = None
        self.features: frozenset[str] = frozenset(
            {"cancel"} | ({"sleep"} if script.sleep_keeps_mib is not None else set()))
        self.sleeps: list[int] = []  # the level of each sleep it was asked
        self.wakes = 0
        self.started_at = time.monotonic()
        self.ready_at: float | None = None
        self.init_error: str | None = None
        self.exit_code: int | None = None
        self.status_marks: list[tuple[float, str]] = []
        self.requests: dict[str, bytes] = {}  # running jobs: id -> payload
        self.sent: list[str] = []  # every job it was given, in order
        self.metadata: dict[str, dict[str, Any]] = {}  # what came with each job
        self.hung = False
        self._ping_sent: float | None = None
        self._exited = asyncio.Event()
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- what the engine reads --------------------------------------------------------------
    @property
    def hot(self) -> bool:
        return self.state in HOT

    @property
    def exited(self) -> bool:
        return self._exited.is_set()

    @property
    def command_pid(self) -> int | None:
        return self.pid

    @property
    def data(self) -> Any:
        return self if self.hot else None

    def pids(self, on_gpu: Collection[int]) -> set[int]:
        return {self.pid} if self.pid is not None and not self.exited else set()

    def known_descendants(self) -> set[int]:
        return set()

    # -- the life of the process ------------------------------------------------------------
    def _set(self, state: WorkerState) -> None:
        if state == self.state:
            return
        check(self.state, state)
        self.state = state
        if state == WorkerState.READY and self.ready_at is None:
            self.ready_at = time.monotonic()
        self.observer.worker_state(self)  # type: ignore[arg-type]

    def _later(self, delay: float, fn: Callable[[], None]) -> None:
        assert self._loop is not None
        self._loop.call_later(delay, self._unless_gone(fn))

    def _unless_gone(self, fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            if not self.exited:
                fn()
        return run

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.pid = next(_pids)
        self.factory.started(self)
        if self.script.fail_start is not None:
            self.init_error = self.script.fail_start
            self._later(self.script.load_s, lambda: self._exit(1, crash=True))
            return
        self._set(WorkerState.INITIALIZING)
        if not self.script.manual:
            self._later(self.script.load_s, self.ready)

    def ready(self) -> None:
        """The model loaded: it holds its weights and takes requests."""
        self.factory.gpu.hold(self.pid or 0, self.gpu, self.script.weights_mib)
        self.status_marks.append((time.time(), "ready"))
        self._set(WorkerState.READY)

    def _exit(self, code: int | None, *, crash: bool) -> None:
        if self.exited:
            return
        self.factory.gpu.release(self.pid or 0)
        self.exit_code = code
        self._exited.set()
        expected = self._stopping and not crash
        self._set(WorkerState.COLD if expected else WorkerState.CRASHED)
        if expected:
            reason = "stopped"
        elif self.init_error:
            reason = f"initialize failed: {self.init_error}"
        else:
            reason = f"worker exited with code {code}"
        self.observer.worker_exited(self, code, reason)  # type: ignore[arg-type]

    def crash(self, code: int = 1) -> None:
        """The process dies."""
        self._exit(code, crash=True)

    def hang(self) -> None:
        """It stops answering (pings, requests) but does not exit."""
        self.hung = True

    def begin_stop(self) -> None:
        if self._stopping or self.exited:
            return
        self._stopping = True
        self._set(WorkerState.STOPPING)
        if not self.hung:
            self._later(self.script.stop_s, lambda: self._exit(0, crash=False))

    async def stop(self, grace: float = 10.0) -> None:
        if self.exited:
            return
        self.begin_stop()
        if await self.wait_exited(grace):
            return
        self.kill()

    def kill(self) -> None:
        """SIGKILL: from any thread, as a real handle's."""
        if not self.exited and self._loop is not None:
            self._loop.call_soon_threadsafe(
                self._unless_gone(lambda: self._exit(-9, crash=not self._stopping)))

    async def wait_exited(self, timeout: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._exited.wait(), timeout)
        return self.exited

    # -- sleep ------------------------------------------------------------------------------
    async def sleep(self, level: int, timeout: float) -> SleepOutcome:
        script = self.script
        if self.state != WorkerState.READY or self.requests or "sleep" not in self.features:
            return SleepOutcome(False, f"it cannot sleep now (it is {self.state.value})")
        self._set(WorkerState.ASLEEP)
        self.sleeps.append(level)
        done = await self._hook(script.sleep_s, timeout, script.sleep_mode == "sleep-hangs")
        if done is not None:
            return done
        keeps = script.sleep_keeps_mib or 0
        mode = script.sleep_mode
        if mode == "sleep-fails":
            return SleepOutcome(False, "RuntimeError: cannot release the weights")
        if mode in ("keeps", "lies"):
            return SleepOutcome(True, None, keeps if mode == "lies" else None, 0)
        self.factory.gpu.hold(self.pid or 0, self.gpu, keeps)
        if mode == "grows":
            self._later(0.05, lambda: self.factory.gpu.hold(self.pid or 0, self.gpu,
                                                             script.weights_mib))
        elif mode == "creeps":
            self._later(0.5, lambda: self.factory.gpu.hold(self.pid or 0, self.gpu,
                                                            keeps + script.creep_mib))
        return SleepOutcome(True, None, keeps, 0)

    async def wake(self, timeout: float) -> SleepOutcome:
        script = self.script
        if self.state != WorkerState.ASLEEP:
            return SleepOutcome(False, f"it is not asleep (it is {self.state.value})")
        self.wakes += 1
        done = await self._hook(script.wake_s, timeout, script.sleep_mode == "wake-hangs")
        if done is not None:
            return done
        if script.sleep_mode == "wake-fails":
            return SleepOutcome(False, "RuntimeError: the weights are gone")
        if script.sleep_mode == "wake-crashes":
            self.crash(-9)
            return SleepOutcome(False, "the worker exited")
        self.factory.gpu.hold(self.pid or 0, self.gpu, script.weights_mib)
        if not self._stopping:
            self._set(WorkerState.READY)
        return SleepOutcome(True)

    async def _hook(self, seconds: float, timeout: float, hangs: bool) -> SleepOutcome | None:
        """The hook's time (None: it returned), or how it did not."""
        if hangs or seconds > timeout:
            await self.wait_exited(timeout)
            return SleepOutcome(False, "the worker exited" if self.exited
                                else f"no answer within {timeout:g} s")
        # (a worker that exits meanwhile answers at once, as a real one's handle does)
        exited = await self.wait_exited(seconds) if seconds > 0 else self.exited
        return SleepOutcome(False, "the worker exited") if exited else None

    # -- liveness ---------------------------------------------------------------------------
    def ping(self) -> None:
        if self._ping_sent is None:
            self._ping_sent = time.monotonic()
            if not self.hung:
                self._later(0.0, self._pong)

    def _pong(self) -> None:
        self._ping_sent = None

    def ping_overdue(self, now: float) -> float:
        return 0.0 if self._ping_sent is None else max(0.0, now - self._ping_sent)

    # -- requests ---------------------------------------------------------------------------
    def send(self, job_id: str, payload: bytes, *, stream: bool,
             metadata: dict[str, Any] | None = None, deadline: float | None = None) -> int:
        self.requests[job_id] = payload
        self.sent.append(job_id)
        self.metadata[job_id] = dict(metadata or {})
        self.factory.gpu.hold(self.pid or 0, self.gpu,
                              self.script.weights_mib + self.script.activation_mib)
        self._set(WorkerState.BUSY)
        if not self.script.manual and not self.hung:
            for i in range(self.script.chunks):
                self._later(self.script.job_s * i / max(1, self.script.chunks),
                            lambda i=i: self.chunk(job_id, b"chunk %d" % i))
            self._later(self.script.job_s, lambda: self._auto_reply(job_id))
        return len(self.sent)

    def _auto_reply(self, job_id: str) -> None:
        if job_id not in self.requests:
            return
        if self.script.fail_jobs is not None:
            self.fail(job_id, self.script.fail_jobs)
        else:
            self.reply(job_id, self.script.result if self.script.result is not None
                       else self.requests[job_id])

    def progress(self, job_id: str, fraction: float, text: str = "") -> None:
        self.observer.request_progress(job_id, fraction, text)

    def chunk(self, job_id: str, data: bytes) -> None:
        if job_id in self.requests:
            self.observer.request_chunk(job_id, data)

    def reply(self, job_id: str, data: bytes) -> None:
        self._end(job_id, Outcome(ok=True, data=data))

    def fail(self, job_id: str, error: str) -> None:
        self._end(job_id, Outcome(ok=False, error=error, status_code=500))

    def _end(self, job_id: str, outcome: Outcome) -> None:
        if self.requests.pop(job_id, None) is None:
            return
        if not self.requests:
            self.factory.gpu.hold(self.pid or 0, self.gpu, self.script.weights_mib)
            self._set(WorkerState.READY)
        self.observer.request_done(self, job_id, outcome)  # type: ignore[arg-type]

    def cancel(self, job_id: str) -> bool:
        if job_id not in self.requests or not self.script.honours_cancel or self.hung:
            return False
        self._later(0.0, lambda: self._end(job_id, Outcome(ok=False, error="cancelled",
                                                          cancelled=True)))
        return True


class FakeWorkers:
    """The worker factory: makes fake workers by the backends' scripts, and remembers them."""

    def __init__(self, gpu: FakeGpu, scripts: Mapping[str, Script] | None = None) -> None:
        self.gpu = gpu
        self.scripts = dict(scripts or {})
        self.made: list[FakeWorker] = []
        self.running: set[int] = set()  # pids the engine told us launched and not exited

    async def start(self) -> list[str]:
        return []

    def make(self, spec: BackendSpec, gpu: int, name: str,
             observer: WorkerObserver) -> FakeWorker:
        worker = FakeWorker(self, spec, gpu, name, observer,
                            self.scripts.get(spec.name, Script()))
        self.made.append(worker)
        return worker

    def started(self, worker: FakeWorker) -> None:
        """The fake process exists (called by the worker itself)."""

    def launched(self, worker: Any) -> None:
        if worker.pid is not None:
            self.running.add(worker.pid)

    def exited(self, worker: Any) -> None:
        self.running.discard(worker.pid)

    def check(self) -> str | None:
        return None

    async def close(self) -> None:
        pass

    def of(self, backend: str) -> list[FakeWorker]:
        return [w for w in self.made if w.backend == backend]

    def live(self, backend: str) -> FakeWorker | None:
        return next((w for w in reversed(self.of(backend)) if not w.exited), None)


def spec(name: str, **fields: Any) -> BackendSpec:
    """A backend from descriptor keys (YAML spelling), as the loader would build it."""
    data: dict[str, Any] = {"command": ["/bin/true"], **fields}
    return build_spec(name, data, base_dir=lambda _key: Path("/"), source="test")


@dataclass
class FakeEngine:
    """A started engine on fakes, behind the real facade."""

    sup: Supervisor
    gpu: FakeGpu
    workers: FakeWorkers
    root: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def engine(self) -> Engine:
        return self.sup.engine

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the engine loop (where fake workers and the engine live); its
        result."""
        loop = self.engine.run.loop
        assert loop is not None
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                fut.set_exception(exc)

        loop.call_soon_threadsafe(run)
        return fut.result(10)

    def worker(self, backend: str) -> FakeWorker:
        w = self.workers.live(backend)
        assert w is not None, f"no live worker of {backend}"
        return w


@contextlib.contextmanager
def fake_engine(backends: Mapping[str, Mapping[str, Any]], *, gpus: list[int] | None = None,
                scripts: Mapping[str, Script] | None = None,
                config: EngineConfig | None = None, journal: bool = False,
                root: Path | None = None,
                clock: Callable[[], float] = monotonic) -> Iterator[FakeEngine]:
    """An engine on a :class:`FakeGpu` of ``gpus`` (MiB each; one 8 GiB by default) whose
    backends (descriptor keys by name) run :class:`FakeWorker`\\ s by ``scripts``; ``root``
    (kept) for its directories, e.g. to start a second engine on the first one's journal."""
    keep = root is not None
    root = root or Path(tempfile.mkdtemp(prefix="vt-fake-", dir="/tmp"))
    gpu = FakeGpu(gpus or [8192])
    workers = FakeWorkers(gpu, scripts)
    paths = Paths(root / "cfg", root / "state", root / "run").ensure()
    cfg = config or EngineConfig(reserve_mib=0, tick_s=0.02, sample_hz=100.0,
                                 ping_interval_s=0.05)
    cfg.journal = journal
    engine = Engine(probe=gpu, probe_notice=None,
                    backends={name: spec(name, **fields) for name, fields in backends.items()},
                    descriptor_errors=(), paths=paths, config=cfg, workers=workers,
                    clock=clock)
    sup = Supervisor(engine, paths)
    sup.start_in_thread()
    try:
        yield FakeEngine(sup, gpu, workers, root)
    finally:
        sup.stop(timeout=10)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
