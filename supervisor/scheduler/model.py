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

from supervisor.scheduler.expect import Expectations

#: Worker states in which a worker can take jobs (if it has a free slot).
HOT_STATES: Final = frozenset({"starting", "initializing", "ready", "busy"})
#: Every state a worker may report to the scheduler (``asleep``: its memory given back but
#: what it keeps, its process alive; a job for it wakes it).
WORKER_STATES: Final = HOT_STATES | {"stopping", "asleep"}
#: What a queued entry may ask for.
JOB_KINDS: Final = frozenset({"job", "preload", "calibration"})


def _nonneg(owner: str, name: str, value: int) -> None:
    if value < 0:
        raise ValueError(f"{owner}: {name} must be >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as admission sees it.

    ``measured_free_mib`` is the latest driver reading, or None when it is not available; it is
    never trusted alone (it lags behind allocations), see ``plan``. ``reserve_mib`` is kept
    free for the driver and foreign processes and is never handed out. ``foreign_mib`` is what
    processes that are not ours hold (orphans of an earlier engine included), from the
    memory ledger. ``leaving_mib`` is what exited workers still hold until their processes
    have left the GPU (it comes back, like a stopping worker's). A ``draining`` GPU finishes
    what runs and admits nothing new; its idle workers are evicted.
    """

    index: int
    total_mib: int
    measured_free_mib: int | None
    reserve_mib: int = 0
    foreign_mib: int = 0
    draining: bool = False
    leaving_mib: int = 0
    closed_why: str = ""  # set for a yielded GPU only: why it is closed (it drains too)

    def __post_init__(self) -> None:
        owner = f"GPU{self.index}"
        _nonneg(owner, "total_mib", self.total_mib)
        _nonneg(owner, "reserve_mib", self.reserve_mib)
        _nonneg(owner, "foreign_mib", self.foreign_mib)
        _nonneg(owner, "leaving_mib", self.leaving_mib)
        if self.measured_free_mib is not None:
            _nonneg(owner, "measured_free_mib", self.measured_free_mib)

    @property
    def usable_mib(self) -> int:
        """What admission may ever hand out on this GPU: total - reserve."""
        return self.total_mib - self.reserve_mib


@dataclass(frozen=True, slots=True)
class BackendInfo:
    """What the scheduler needs to know about one backend (model): its admission footprint.

    The figures come from the memory ledger (``supervisor.ledger``), which merges what the
    descriptor declares with what was measured. ``peak_mib`` None means the footprint is
    unknown: such a backend runs alone on a GPU. ``activation_mib`` is the part of the peak
    that exists only while a job runs; None means the split is unknown, and then the whole
    peak counts as resident (an idle worker holds ``peak``), and each job beyond the first
    may need a whole peak more (see ``holds_mib``). ``safety_mib`` is added per running job.
    ``allowed_gpus`` None means every GPU. ``priority`` is informational here (the engine
    uses it as a job's default priority; the queue orders by ``QueuedJob.priority``); it only
    breaks ties between equally cheap evictions. ``reload_cost_s`` is what a (re)load costs,
    learned from measured start-to-ready times; ``wake_cost_s`` what waking a sleeping worker
    costs (measured wakes; the descriptor's ``wake_cost`` before any). ``sleep_residual_mib``
    is what a worker of it keeps on its GPU asleep, and ``sleep_host_mib`` the host memory its
    sleep takes (measured, else the descriptor's priors): what sleeping it would free and cost.
    ``address``: the fixed ``host:port`` its server listens on (None: a port picked at each
    start, or a worker); no two backends of one address run at once.
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
    wake_cost_s: float = 1.0
    sleep_residual_mib: int = 0
    sleep_host_mib: int = 0
    address: str | None = None

    def __post_init__(self) -> None:
        owner = f"backend {self.name!r}"
        _nonneg(owner, "sleep_residual_mib", self.sleep_residual_mib)
        _nonneg(owner, "sleep_host_mib", self.sleep_host_mib)
        if not (self.wake_cost_s >= 0 and math.isfinite(self.wake_cost_s)):
            raise ValueError(f"{owner}: wake_cost_s must be finite and >= 0")
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
    def holds_pin(self) -> bool:
        """Whether ``pinned`` keeps its worker: only once its footprint is known. Unmeasured,
        it holds its GPU alone, and pinned there every other job would wait for ever (a
        llama-swap ``persistent`` group imported with no memory figures); so until a job of
        it is measured it leaves, like any idle worker, when room is needed."""
        return self.pinned and self.peak_mib is not None

    def holds_mib(self, jobs: int) -> int:
        """What a worker of this backend holds with ``jobs`` running, safety included.

        Known split: ``resident + jobs * (activation + safety)``. Unknown split: the whole
        peak while idle, and ``jobs * (peak + safety)`` with jobs running (with R unknown in
        [0, peak], R + n * (peak - R) is largest at R = 0 for n >= 1). 0 when unmeasured (the
        engine reserves the whole GPU for such a worker).
        """
        peak = self.peak_mib
        if peak is None:
            return 0
        if jobs <= 0:
            return peak - (self.activation_mib or 0)
        if self.activation_mib is None:
            return jobs * (peak + self.safety_mib)
        return peak - self.activation_mib + jobs * (self.activation_mib + self.safety_mib)

    @property
    def idle_mib(self) -> int:
        """What an idle worker holds: resident memory (the whole peak if the split is unknown)."""
        return self.holds_mib(0)

    def need_mib(self, active: int) -> int:
        """What one more job needs on a live worker that runs ``active`` jobs."""
        return self.holds_mib(active + 1) - self.holds_mib(active)

    @property
    def cold_need_mib(self) -> int | None:
        """A job that must spawn the worker: peak + safety (None when peak is unknown)."""
        return None if self.peak_mib is None else self.holds_mib(1)


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """The one worker process of a backend.

    ``reserved_mib`` is what the memory ledger says it holds right now: the larger of what its
    figures imply (``BackendInfo.holds_mib`` for its jobs, or the whole GPU for an unmeasured
    backend) and what was last observed of its processes; a ``stopping`` worker keeps it until
    its processes have left the GPU. ``idle_since`` is when its last job ended (None: unknown,
    treated as "just now"). A worker that does not ``accept`` new jobs (it used more than it
    declared, and is evicted once its job ends) gets none; ``over_declared`` marks such a
    worker, and makes it the first to evict when room is needed. An ``asleep`` worker holds
    what it keeps asleep (``reserved_mib``); ``can_sleep``: this (ready, idle) worker may be
    put to sleep rather than stopped when its room is needed. ``loading_for``: while it
    starts (a spawn still loading, not a wake), the highest priority of the jobs admitted to
    it, which none has begun yet (None otherwise): its load may be given up for a job of
    higher priority, those jobs back in the queue (``Evict.requeue``), until
    ``SchedulerConfig.max_patience_s`` after ``loading_since`` (when the first of them was
    first found blocked, else submitted: a job held that long is held no more).
    ``loading_submitted_at``: when the first of them was submitted; their priorities age from
    there, as in the queue, so ``loading_for`` aged from it is at least the aged priority of
    each of them (aged from ``loading_since``, a later time, a load could be given up for a
    job it outranks in the queue, and started again at once).
    ``running_priority``: the highest priority of the jobs it runs (None while it runs none):
    the memory they give back when they end is worth waiting for only to work of at most
    that priority. ``leaves_at``: the soonest its keep-alive may unload it if no job comes:
    an idle worker's time; for a busy one, its keep-alive from now (it counts from its jobs'
    end); None while nothing unloads it (kept for ever, pinned, a tunnel open).
    """

    backend: str
    gpu: int
    state: str
    active_jobs: int = 0
    reserved_mib: int = 0
    idle_since: float | None = None
    accepting: bool = True
    over_declared: bool = False
    can_sleep: bool = False
    loading_for: int | None = None
    loading_since: float | None = None
    loading_submitted_at: float | None = None
    running_priority: int | None = None
    leaves_at: float | None = None

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
    ``Plan.passed`` returns); ``blocked_since`` is when it was first found first in line for
    a GPU and blocked for memory (``Plan.blocked``): its patience counts from there, not from
    its submission, so a job that waited in a backlog is not forced at once. ``kind`` is what
    it asks for: ``job`` (a request for the backend's worker), ``preload`` (start the worker
    without a job, in room nobody waits for) or ``calibration`` (a measuring run of the
    backend that needs a GPU to itself).
    """

    job_id: str
    backend: str
    priority: int = 0
    seq: int = 0
    submitted_at: float = 0.0
    passed: int = 0
    kind: str = "job"
    blocked_since: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in JOB_KINDS:
            raise ValueError(f"job {self.job_id!r}: kind must be one of {sorted(JOB_KINDS)}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Tunables.

    ``patience_factor`` and ``max_patience_s`` bound how long a job first in line for a GPU
    lets hot work of its own priority go on before the switch it needs: ``patience_factor``
    times the switch's cost (its own load plus the reloads of the evicted backends that still
    have queued jobs), at most ``max_patience_s`` (the hard bound against starvation).
    ``aging_interval_s`` may be ``math.inf`` to disable aging.
    """

    patience_factor: float = 4.0
    max_patience_s: float = 300.0
    aging_interval_s: float = 60.0
    max_queue_depth: int = 512

    def __post_init__(self) -> None:
        if not (self.patience_factor >= 0 and math.isfinite(self.patience_factor)):
            raise ValueError(f"patience_factor must be finite and >= 0, got "
                             f"{self.patience_factor}")
        if not (self.max_patience_s >= 0 and math.isfinite(self.max_patience_s)):
            raise ValueError(f"max_patience_s must be finite and >= 0, got "
                             f"{self.max_patience_s}")
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
    re-keyed by ``WorkerInfo.backend``). ``queued_counts`` is the number of queued entries
    of each ``(kind, backend)``: the engine should keep it incrementally (O(1) per enqueue
    or dequeue) and pass it, since counting 10,000 jobs here costs about half a
    millisecond; when omitted it is counted. It lets ``plan`` stop walking once nothing
    that could still start has a job left, and tells which backends still have work
    waiting (a switch away from them costs a reload). Containers are copied into immutable
    ones (the plan's ``waiting`` view reads ``queue`` lazily, so it must not change
    underneath; a tuple is kept as is). ``sleep_host_room_mib`` is the host memory that
    sleeping workers may still take (``sleep_host_budget`` less what sleepers hold).
    ``expected``: how each backend's requests are expected to arrive
    (``supervisor.scheduler.expect``); None: nothing is expected beyond the queue.
    """

    gpus: Sequence[GpuState]
    backends: Mapping[str, BackendInfo]
    workers: Mapping[str, WorkerInfo] = field(default_factory=dict)
    queue: Sequence[QueuedJob] = ()
    queued_counts: Mapping[tuple[str, str], int] | None = None
    calibrating: Mapping[int, str] = field(default_factory=dict)  # GPU -> the backend of
    # the calibration run that holds it now
    sleep_host_room_mib: int = 0
    expected: Expectations | None = None

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
        counts = self.queued_counts
        if counts is None:
            counts = Counter((job.kind, job.backend) for job in queue)
        object.__setattr__(self, "queued_counts", MappingProxyType(dict(counts)))
        object.__setattr__(self, "calibrating", MappingProxyType(dict(self.calibrating)))


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``job_id`` on ``backend``'s worker on ``gpu``.

    ``spawn`` is True when the worker does not exist yet (the engine spawns it there).
    ``reserve_mib`` is what the start takes from the GPU's budget: ``holds_mib(1)`` for a
    spawn, ``need_mib(active)`` for a job on a live worker, the GPU's whole usable memory for
    an unmeasured spawn or a calibration (0 for later jobs on it), ``idle_mib`` for a preload.
    ``kind`` is the queued entry's kind (a preload starts the worker only; a calibration
    starts the engine's measuring run on ``gpu``).
    """

    job_id: str
    backend: str
    gpu: int
    spawn: bool
    reserve_mib: int
    kind: str = "job"


@dataclass(frozen=True, slots=True)
class Evict:
    """Stop the idle worker of ``backend`` on ``gpu``; ``frees_mib`` is its reservation. With
    ``sleep``, put it to sleep instead: ``frees_mib`` is then what sleeping gives back (its
    reservation less what it keeps asleep). With ``requeue``, the worker is still loading for
    jobs of lower priority (``WorkerInfo.loading_for``): its load is given up and those jobs
    go back to the queue; ``given_up_for``, the backend whose request needs its room, when
    that is why (the caller tells ``expect.Learner.given_up``)."""

    backend: str
    gpu: int
    frees_mib: int
    reason: str
    sleep: bool = False
    others: bool = False  # it makes room for strangers' memory (the device is over-committed)
    requeue: bool = False
    given_up_for: str | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """One decision.

    ``starts`` in queue order; ``evictions`` cheapest first; ``passed`` maps job id -> new
    passed count, only for jobs whose count changed; ``waiting`` maps every queued job that is
    not started to a short human reason (a lazy, read-only view: cheap to build even with a
    10,000-job queue). ``revisit_at`` is the earliest time at which the same snapshot would
    give another plan (a barrier's patience runs out), None when time alone changes nothing
    but aging. ``blocked`` maps each job first found blocked at the head in this plan to
    now (the engine stores it as the job's ``blocked_since``).
    """

    starts: tuple[Start, ...]
    evictions: tuple[Evict, ...]
    passed: Mapping[str, int]
    waiting: Mapping[str, str]
    revisit_at: float | None = None
    blocked: Mapping[str, float] = field(default_factory=dict)
