"""Where the engine's workers come from: the seam a test puts a fake worker behind.

The engine receives a :class:`WorkerFactory` (as Ollama's scheduler receives its runner
factory): ``make`` builds a worker handle (not started) for a backend on a GPU, and the
factory is told when a worker's process launched and when it exited.  :class:`ProcessWorkers`
is the real one: each worker is a process of its own (its own venv), speaking our wire
protocol over the worker sockets (:class:`~.handle.WorkerHandle`) or vramd's JSON lines
(:class:`~.vramd.VramdWorkerHandle`); it owns the listening worker sockets and the lifeline
that kills every worker group when the engine dies (and, at the next start, the leftovers of
one that died).  ``tests/fake_worker.py`` holds the in-process one.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Protocol

from ..backends.schema import BackendSpec
from ..gpu.host import ENGINE_MARK
from ..paths import Paths
from .base import Worker
from .handle import WorkerHandle, WorkerObserver
from .lifeline import RUN_MARK, WORKER_MARK, Lifeline, kill_leftovers
from .vramd import VramdWorkerHandle
from .wire import WireListener


class WorkerFactory(Protocol):
    """What the engine needs to make, launch and forget workers."""

    async def start(self) -> list[str]:
        """Get ready (before any worker); lines to note (e.g. leftovers killed)."""
        ...

    def make(self, spec: BackendSpec, gpu: int, name: str,
             observer: WorkerObserver) -> Worker:
        """A worker of ``spec`` on ``gpu`` (not started yet), reporting to ``observer``."""
        ...

    def launched(self, worker: Worker) -> None:
        """``worker``'s process is running (it must die with the engine)."""
        ...

    def exited(self, worker: Worker) -> None:
        """``worker``'s process is gone."""
        ...

    def check(self) -> str | None:
        """Now and then: what keeps workers from outliving the engine still works (a line to
        note when it had to be mended)."""
        ...

    async def close(self) -> None:
        """After the last worker stopped."""
        ...


class ProcessFollower(Protocol):
    """What follows the engine's processes (the host device reads their memory itself)."""

    def track(self, pid: int) -> None:
        """A worker's process started: it is ours from now on."""
        ...

    def own(self, pid: int) -> None:
        """A process of the engine itself (the lifeline): on no device."""
        ...


class ProcessWorkers:
    """Real worker processes (see the module doc)."""

    def __init__(self, paths: Paths, *, simulated: bool, max_result: int | None,
                 host_gpus: frozenset[int] = frozenset(),
                 follower: ProcessFollower | None = None,
                 gpu_total_mib: Callable[[int], int | None] = lambda gpu: None,
                 budget_mib: Callable[[str], int | None] = lambda backend: None) -> None:
        self.paths = paths
        self.follower = follower  # told the workers' pids and the lifeline's (the host device)
        # for a server's ${VRAM_MIB} and ${VRAM_FRACTION}: its GPU's size, its admitted peak
        self.gpu_total_mib = gpu_total_mib
        self.budget_mib = budget_mib
        self.simulated = simulated
        self.host_gpus = host_gpus  # the host device: its workers see no GPU
        self.max_result = max_result
        self.listener = WireListener(str(paths.worker_control_socket),
                                     str(paths.worker_data_socket))
        self.lifeline = Lifeline(paths.worker_records_dir)

    async def start(self) -> list[str]:
        # Workers an earlier engine left behind die before anything is requeued: a job never
        # executes twice at once.
        leftovers = await asyncio.get_running_loop().run_in_executor(
            None, kill_leftovers, self.lifeline.records_dir)
        self.lifeline.start()
        self._own_lifeline()
        try:
            await self.listener.start()
        except BaseException:
            self.lifeline.close()
            raise
        return leftovers

    def make(self, spec: BackendSpec, gpu: int, name: str,
             observer: WorkerObserver) -> Worker:
        env = dict(os.environ)
        if not spec.server:  # a server's env has macros: filled in by its launch
            env.update(spec.env)
        env["PYTHONUNBUFFERED"] = "1"
        env["VRAMTUI_BACKEND"] = spec.name
        env[ENGINE_MARK] = str(os.getpid())  # its children, orphaned, are still ours
        env[RUN_MARK] = self.lifeline.run  # and the lifeline kills them with the engine
        env[WORKER_MARK] = f"{self.lifeline.run}.{os.urandom(6).hex()}"  # and its stop
        if gpu in self.host_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ""  # on the host device: no GPU to take by mistake
            env.pop("VRAMTUI_SIM_DIR", None)
        elif self.simulated:
            env["VRAMTUI_SIM_DIR"] = str(self.paths.sim_dir)
            env["VRAMTUI_SIM_GPU"] = str(gpu)
        else:
            # NVML numbers GPUs in PCI bus order; CUDA's default order is fastest first, so
            # without this the worker could land on another GPU than the one admitted.
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
            env.setdefault("CUDA_VISIBLE_DEVICES", str(gpu))
            env.pop("VRAMTUI_SIM_DIR", None)
        cwd = str(spec.cwd) if spec.cwd else None
        log_path = self.paths.worker_log_path(spec.name)
        if spec.server:
            from ..servers.handle import ServerHandle
            from ..servers.launch import plan_launch

            launch = plan_launch(spec, gpu, env, self.gpu_total_mib(gpu),
                                 self.budget_mib(spec.name))
            return ServerHandle(spec=spec, name=name, gpu=gpu, launch=launch, cwd=cwd,
                                log_path=log_path, observer=observer,
                                max_result=self.max_result)
        if spec.protocol == "vramd":
            return VramdWorkerHandle(
                backend=spec.name, name=name, gpu=gpu, argv=spec.command, env=env, cwd=cwd,
                log_path=log_path, observer=observer, settings=spec.vramd,
                unload_frees_vram=spec.unload_frees_vram,
            )
        argv = list(spec.command) + [
            "--control-socket", str(self.paths.worker_control_socket),
            "--data-socket", str(self.paths.worker_data_socket),
            "--name", name,
        ]
        return WorkerHandle(
            backend=spec.name, name=name, gpu=gpu, argv=argv, env=env, cwd=cwd,
            log_path=log_path, listener=self.listener, observer=observer,
            plain_stream=spec.stream, max_result=self.max_result,
        )

    def launched(self, worker: Worker) -> None:
        if worker.pid is not None and not worker.exited:
            self.lifeline.add(worker.pid, worker.backend)
            if self.follower is not None:
                self.follower.track(worker.pid)

    def exited(self, worker: Worker) -> None:
        if worker.pid is not None:
            self.lifeline.remove(worker.pid)

    def check(self) -> str | None:
        """A lifeline that is gone is started again (the host device told of its new pid)."""
        old = self.lifeline.revive()
        if old is None:
            return None
        self._own_lifeline()
        return (f"the lifeline (pid {old}), the watcher that kills the workers if the engine "
                f"dies, was gone; started it again (pid {self.lifeline.pid}), watching every "
                "live worker")

    def _own_lifeline(self) -> None:
        """The lifeline (just started) is the engine's own: on no device."""
        if self.follower is not None and self.lifeline.pid is not None:
            self.follower.own(self.lifeline.pid)

    async def close(self) -> None:
        await self.listener.close()
        self.lifeline.close()
