"""The worker pool: which backends exist, and each one's live worker.

:class:`WorkerPool` owns the :class:`~.runtime.BackendRuntime` of every configured backend,
and starts and stops their workers through the injected
:class:`~supervisor.workers.factory.WorkerFactory` (real processes, or a test's fakes).  A
worker is spawned for a GPU admission chose, stopped gracefully (its running jobs may be let
finish first), or evicted: from the instant it is asked to go it takes no new job.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping

from ..backends.schema import BackendSpec
from ..errors import UnknownBackend
from ..workers.base import Worker
from ..workers.factory import WorkerFactory
from ..workers.handle import WorkerObserver
from .loop import EngineLoop
from .runtime import BackendRuntime

Clock = Callable[[], float]
HURRIED_GRACE_S = 1.0  # a worker's grace in a stop asked now (a second SIGTERM, stop --now)


class WorkerPool:
    """Every backend's runtime, and the starting and stopping of their workers."""

    def __init__(self, specs: Mapping[str, BackendSpec], factory: WorkerFactory,
                 loop: EngineLoop, clock: Clock) -> None:
        self.factory = factory
        self._runtimes = {name: BackendRuntime(spec) for name, spec in specs.items()}
        self._loop = loop
        self._clock = clock
        self.hurrying = False  # a stop asked now: running jobs are not waited for
        self._hurried = asyncio.Event()  # set with it: cuts short the stops under way

    # -- the backends ---------------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self._runtimes

    def __iter__(self) -> Iterator[str]:
        return iter(self._runtimes)

    def __len__(self) -> int:
        return len(self._runtimes)

    def get(self, name: str) -> BackendRuntime | None:
        return self._runtimes.get(name)

    def runtime(self, name: str) -> BackendRuntime:
        rt = self._runtimes.get(name)
        if rt is None:
            raise UnknownBackend(name, self._runtimes)
        return rt

    def runtimes(self) -> list[BackendRuntime]:
        return list(self._runtimes.values())

    def admitted_on(self, gpus: set[int]) -> list[str]:
        """The jobs admitted to the live workers on ``gpus``."""
        return [job_id for rt in self._runtimes.values()
                if rt.worker is not None and rt.worker.gpu in gpus for job_id in rt.admitted]

    def items(self) -> list[tuple[str, BackendRuntime]]:
        return list(self._runtimes.items())

    def mapping(self) -> Mapping[str, BackendRuntime]:
        """Read-only, live."""
        return self._runtimes

    def add(self, spec: BackendSpec) -> BackendRuntime:
        rt = self._runtimes[spec.name] = BackendRuntime(spec)
        return rt

    def remove(self, name: str) -> None:
        del self._runtimes[name]

    def live(self) -> list[BackendRuntime]:
        """The backends with a worker."""
        return [rt for rt in self._runtimes.values() if rt.worker is not None]

    # -- workers --------------------------------------------------------------------------------
    def spawn(self, rt: BackendRuntime, gpu: int, observer: WorkerObserver) -> Worker:
        """A new worker of ``rt`` on ``gpu``, starting (the start itself runs as a task)."""
        rt.generation += 1
        rt.new_worker()
        worker = self.factory.make(rt.spec, gpu, f"{rt.spec.name}#{rt.generation}", observer)
        rt.worker = worker
        self._loop.spawn(self.launch(worker))
        return worker

    async def launch(self, worker: Worker) -> None:
        """Start ``worker``'s process, and tell the factory it runs."""
        await worker.start()
        if worker.pid is not None and not worker.exited:
            self.factory.launched(worker)

    def evict_now(self, rt: BackendRuntime, grace: float | None = None) -> None:
        """Stop ``rt``'s worker: it takes no job from this instant, then goes, within
        ``grace`` (default its backend's ``stop_grace``; 0 for a load given up: a worker
        finishes its load before it reads any request to stop, and a load keeps nothing)."""
        if rt.worker is not None:
            rt.worker.begin_stop()  # synchronously: a step already queued must not use it
            self._loop.spawn(self.stop(
                rt, grace=rt.spec.timeouts.stop_grace_s if grace is None else grace))

    async def stop(self, rt: BackendRuntime, grace: float, drain: bool = False) -> None:
        """Stop ``rt``'s worker within ``grace``; with ``drain``, its running jobs get that
        grace to finish, and the worker a short one after."""
        worker = rt.worker
        if worker is None:
            return
        if drain and rt.admitted:
            deadline = self._clock() + grace
            while rt.admitted and self._clock() < deadline and not worker.exited \
                    and not self.hurrying:
                await asyncio.sleep(0.05)
            grace = min(grace, 2.0)  # stop() must end within grace + a few seconds
        if self.hurrying:
            await worker.stop(grace=min(grace, HURRIED_GRACE_S))
            return
        # A stop asked now (hurry) while this one waits out its grace cuts it short: the
        # wait is given up, and the worker stopped again on the hurried grace (its asking to
        # go is not repeated: SIGTERM, then SIGKILL, within a few seconds).
        stopping = asyncio.ensure_future(worker.stop(grace=grace))
        hurried = asyncio.ensure_future(self._hurried.wait())
        try:
            await asyncio.wait((stopping, hurried), return_when=asyncio.FIRST_COMPLETED)
        finally:
            hurried.cancel()
            if not stopping.done():
                stopping.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stopping
        if stopping.cancelled():
            await worker.stop(grace=min(grace, HURRIED_GRACE_S))
        else:
            stopping.result()

    async def stop_all(self) -> None:
        """Every worker, its running jobs given their backend's stop grace to finish."""
        await asyncio.gather(*(self.stop(rt, grace=rt.spec.timeouts.stop_grace_s, drain=True)
                               for rt in self.live()), return_exceptions=True)

    def hurry(self) -> None:
        """Stop waiting for running jobs, and cut short the stop graces under way (see
        :mod:`.stopping`)."""
        self.hurrying = True
        self._hurried.set()

    def kill_all(self) -> None:
        """SIGKILL every worker now (the engine is stuck or gone: no worker may outlive it)."""
        for rt in list(self._runtimes.values()):
            if rt.worker is not None:
                rt.worker.kill()
