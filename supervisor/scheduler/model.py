"""The scheduler's vocabulary: frozen inputs (a state snapshot) and outputs (a plan).

Everything here is a plain value: frozen, slotted dataclasses, validated once at
construction so the decision code can trust them. Memory is in MiB (ints) throughout; times
are seconds on the engine's clock (whatever clock the engine also passes as ``now``).

Inputs: ``GpuState``, ``BackendInfo``, ``WorkerInfo``, ``QueuedJob``, ``SchedulerConfig``,
``Snapshot``. Outputs: ``Start``, ``Evict``, ``Plan``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final

#: Worker states in which a worker can take jobs (if it has a free slot).
HOT_STATES: Final = frozenset({"starting", "initializing", "ready", "busy"})
#: Every state a worker may report to the scheduler.
WORKER_STATES: Final = HOT_STATES | {"stopping"}


def _nonneg(owner: str, name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{owner}: {name} must be >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as admission sees it.

    ``measured_free_mib`` is the latest driver reading, or None when it is not available; it is
    never trusted alone (it lags behind allocations), see ``plan``. ``reserve_mib`` is kept
    free for the driver and foreign processes and is never handed out.
    """

    index: int
    total_mib: int
    measured_free_mib: int | None
    reserve_mib: int = 0

    def __post_init__(self) -> None:
        owner = f"GPU{self.index}"
        _nonneg(owner, "total_mib", self.total_mib)
        _nonneg(owner, "reserve_mib", self.reserve_mib)
        if self.measured_free_mib is not None:
            _nonneg(owner, "measured_free_mib", self.measured_free_mib)

    @property
    def usable_mib(self) -> int:
        """What admission may ever hand out on this GPU: total - reserve."""
        return self.total_mib - self.reserve_mib


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What the scheduler needs to know about one backend (model).

    ``peak_mib`` None means the footprint is unknown (not calibrated): such a backend runs
    alone on a GPU. ``activation_mib`` is the part of the peak that exists only while a job
    runs; None means "unknown", treated as the whole peak (resident 0), which is the
    conservative reading for a hot job. ``allowed_gpus`` None means every GPU. ``priority``
    is informational here (the engine uses it as a job's default priority; the queue orders
    by ``QueuedJob.priority``); it only breaks ties between equally cheap evictions.
    """

    name: str
    peak_mib: int | None
    activation_mib: int | None = None
    safety_mib: int = 0
    priority: int = 0
    allowed_gpus: tuple[int, ...] | None = None
    concurrency: int = 1
    pinned: bool = False
    reload_cost_s: float = 1.0

    def __post_init__(self) -> None:
        owner = f"backend {self.name!r}"
        if self.peak_mib is not None:
            _nonneg(owner, "peak_mib", self.peak_mib)
        if self.activation_mib is not None:
            _nonneg(owner, "activation_mib", self.activation_mib)
            if self.peak_mib is not None and self.activation_mib > self.peak_mib:
                raise ValueError(
                    f"{owner}: activation_mib {self.activation_mib} exceeds peak_mib "
                    f"{self.peak_mib}"
                )
        _nonneg(owner, "safety_mib", self.safety_mib)
        if self.concurrency < 1:
            raise ValueError(f"{owner}: concurrency must be >= 1, got {self.concurrency}")
        if not (self.reload_cost_s >= 0 and math.isfinite(self.reload_cost_s)):
            raise ValueError(f"{owner}: reload_cost_s must be finite and >= 0")
        if self.allowed_gpus is not None and not isinstance(self.allowed_gpus, tuple):
            object.__setattr__(self, "allowed_gpus", tuple(self.allowed_gpus))

    @property
    def measured(self) -> bool:
        """Whether the peak footprint is known."""
        return self.peak_mib is not None

    @property
    def resident_mib(self) -> int:
        """Memory held while idle: peak - activation (0 when either is unknown)."""
        if self.peak_mib is None or self.activation_mib is None:
            return 0
        return self.peak_mib - self.activation_mib

    @property
    def cold_need_mib(self) -> int | None:
        """A job that must spawn the worker: peak + safety (None when peak is unknown)."""
        return None if self.peak_mib is None else self.peak_mib + self.safety_mib

    @property
    def hot_need_mib(self) -> int:
        """A job on a live worker: activation + safety (activation unknown: peak).

        0 for an unmeasured backend: its worker already holds the whole GPU.
        """
        if self.peak_mib is None:
            return 0
        act = self.peak_mib if self.activation_mib is None else self.activation_mib
        return act + self.safety_mib


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """The one worker process of a backend.

    ``reserved_mib`` is what admission holds for it right now, kept by the engine: resident
    while idle, plus activation + safety per running job (``Start.reserve_mib`` says how much
    to add), the whole GPU (total - reserve) for an unmeasured backend, and all of it while
    ``stopping`` until the engine confirms the process left the GPU. ``idle_since`` is when
    its last job ended (None: unknown, treated as "just now").
    """

    backend: str
    gpu: int
    state: str
    active_jobs: int = 0
    reserved_mib: int = 0
    idle_since: float | None = None

    def __post_init__(self) -> None:
        owner = f"worker {self.backend!r}"
        if self.state not in WORKER_STATES:
            raise ValueError(
                f"{owner}: state must be one of {sorted(WORKER_STATES)}, got {self.state!r}"
            )
        _nonneg(owner, "active_jobs", self.active_jobs)
        _nonneg(owner, "reserved_mib", self.reserved_mib)


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """A job waiting for admission.

    ``seq`` is the submission order (unique, increasing); ``passed`` is how many times jobs
    behind it were started past it while it waited for memory (the engine stores the value
    ``Plan.passed`` returns).
    """

    job_id: str
    backend: str
    priority: int = 0
    seq: int = 0
    submitted_at: float = 0.0
    passed: int = 0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Tunables. ``aging_interval_s`` may be ``math.inf`` to disable aging."""

    affinity_limit: int = 3
    aging_interval_s: float = 60.0
    max_queue_depth: int = 512

    def __post_init__(self) -> None:
        if self.affinity_limit < 0:
            raise ValueError(f"affinity_limit must be >= 0, got {self.affinity_limit}")
        if not self.aging_interval_s > 0:
            raise ValueError(f"aging_interval_s must be > 0, got {self.aging_interval_s}")
        if self.max_queue_depth < 1:
            raise ValueError(f"max_queue_depth must be >= 1, got {self.max_queue_depth}")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole state one decision is a function of.

    Contract (see ``supervisor.scheduler.order``): ``queue`` is sorted by
    ``(-priority, seq)``; inside one priority, ``submitted_at`` does not decrease as ``seq``
    grows; job ids are unique. ``workers`` holds at most one worker per backend (it is
    re-keyed by ``WorkerInfo.backend``). ``queued_per_backend`` is the number of queued jobs
    of each backend: the engine should keep it incrementally (O(1) per enqueue/dequeue) and
    pass it, since counting 10,000 jobs here costs about half a millisecond; when omitted it
    is counted. It lets ``plan`` stop walking once no backend that could still start has a
    job left. Containers are copied into immutable ones (the plan's ``waiting`` view reads
    ``queue`` lazily, so it must not change underneath; a tuple is kept as is).
    """

    gpus: Sequence[GpuState]
    backends: Mapping[str, BackendInfo]
    workers: Mapping[str, WorkerInfo] = field(default_factory=dict)
    queue: Sequence[QueuedJob] = ()
    queued_per_backend: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        gpus = tuple(self.gpus)
        if len({g.index for g in gpus}) != len(gpus):
            raise ValueError("Snapshot: GPU indices must be unique")
        object.__setattr__(self, "gpus", gpus)
        backends = dict(self.backends)
        for key, info in backends.items():
            if key != info.name:
                raise ValueError(f"Snapshot: backend key {key!r} != name {info.name!r}")
        object.__setattr__(self, "backends", MappingProxyType(backends))
        workers: dict[str, WorkerInfo] = {}
        for w in self.workers.values():
            if w.backend in workers:
                raise ValueError(f"Snapshot: two workers for backend {w.backend!r}")
            workers[w.backend] = w
        object.__setattr__(self, "workers", MappingProxyType(workers))
        queue = tuple(self.queue)
        object.__setattr__(self, "queue", queue)
        counts = self.queued_per_backend
        counts = Counter(job.backend for job in queue) if counts is None else dict(counts)
        object.__setattr__(self, "queued_per_backend", MappingProxyType(counts))


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``job_id`` on ``backend``'s worker on ``gpu``.

    ``spawn`` is True when the worker does not exist yet (the engine spawns it there).
    ``reserve_mib`` is what the engine adds to that worker's reservation now: peak + safety
    for a spawn, activation + safety for a job on a live worker, the GPU's whole usable
    memory for an unmeasured spawn (0 for later jobs on it).
    """

    job_id: str
    backend: str
    gpu: int
    spawn: bool
    reserve_mib: int


@dataclass(frozen=True, slots=True)
class Evict:
    """Stop the idle worker of ``backend`` on ``gpu``; ``frees_mib`` is its reservation."""

    backend: str
    gpu: int
    frees_mib: int
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """One decision.

    ``starts`` in queue order; ``evictions`` cheapest first; ``passed`` maps job id -> new
    passed count, only for jobs whose count changed; ``waiting`` maps every queued job that is
    not started to a short human reason (a lazy, read-only view: cheap to build even with a
    10,000-job queue).
    """

    starts: tuple[Start, ...]
    evictions: tuple[Evict, ...]
    passed: Mapping[str, int]
    waiting: Mapping[str, str]
