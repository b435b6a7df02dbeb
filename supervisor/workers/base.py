"""What the engine needs of a worker handle, whatever protocol the worker speaks.

:class:`Worker` is the common interface of :class:`~supervisor.workers.handle.WorkerHandle`
(our wire protocol, over the worker sockets) and
:class:`~supervisor.workers.vramd.VramdWorkerHandle` (vramd's JSON lines over stdin/stdout);
``Engine.make_worker`` picks one by the backend's ``protocol``. Both call the same
:class:`~supervisor.workers.handle.WorkerObserver`, with ``Outcome``s, and go through the
same ``WorkerState``s; both live on the engine loop only.

The engine reads ``data`` (None: requests cannot be sent yet) and ``known_descendants()``
(pids seen to belong to the worker), and pings every hot worker (``ping``, ``ping_overdue``).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .handle import SleepOutcome, WorkerState


@runtime_checkable
class Worker(Protocol):
    """One worker process of a backend, as the engine sees it."""

    backend: str
    name: str
    gpu: int
    log_path: Path
    state: WorkerState
    pid: int | None
    features: frozenset[str]
    ready_at: float | None
    init_error: str | None
    exit_code: int | None
    status_marks: list[tuple[float, str]]  # (wall time, "initializing" | "ready" …)

    @property
    def hot(self) -> bool:
        """READY or BUSY: it can take a request."""
        ...

    @property
    def command_pid(self) -> int | None:
        """The pid of the command its descriptor names, as shown (``pid`` leads its group:
        a reaper, for a model server)."""
        ...

    @property
    def exited(self) -> bool: ...

    @property
    def data(self) -> Any:
        """The channel requests go through; None while it cannot take one."""
        ...

    async def start(self) -> None:
        """Spawn the process (its own session) and begin its start-up; never raises."""
        ...

    def send(self, job_id: str, payload: bytes, *, stream: bool,
             metadata: dict[str, Any] | None = None, deadline: float | None = None) -> int:
        """Hand a job over; its end comes as ``observer.request_done``."""
        ...

    def cancel(self, job_id: str) -> bool:
        """Ask the worker to stop a job; False when it cannot be asked."""
        ...

    def begin_stop(self) -> None:
        """Take no more jobs and ask the worker to exit, now."""
        ...

    async def sleep(self, level: int, timeout: float) -> SleepOutcome:
        """Ask a ready, idle worker that offered ``sleep`` in its ``features`` to give its
        memory back, its process alive (``asleep`` from the call on); how it went."""
        ...

    async def wake(self, timeout: float) -> SleepOutcome:
        """Ask a sleeping worker to take its memory again (``ready`` once it did)."""
        ...

    async def stop(self, grace: float = 10.0) -> None:
        """Ask, then SIGTERM, then SIGKILL the process group; returns once it exited."""
        ...

    def kill(self) -> None:
        """SIGKILL the process group now (reported as a crash)."""
        ...

    async def wait_exited(self, timeout: float) -> bool: ...

    def pids(self, on_gpu: Collection[int]) -> set[int]:
        """The worker's process and its descendants among ``on_gpu`` (for per-process GPU
        memory)."""
        ...

    def known_descendants(self) -> set[int]:
        """Descendants seen so far (they may outlive the worker on the GPU)."""
        ...

    def ping(self) -> None:
        """Send a liveness ping, unless one is outstanding (or the worker cannot answer now)."""
        ...

    def ping_overdue(self, now: float) -> float:
        """Seconds the outstanding ping has waited (0: none, or none expected now)."""
        ...
