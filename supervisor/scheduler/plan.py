"""The admission decision: ``plan(snapshot, now, config) -> Plan``.

Pure: no I/O, no clock reads, no threads, no randomness; the same snapshot and time give the
same plan. What it decides, in the order of the (aged) queue:

Memory. Per GPU, ``budget = min(measured free, total - reservations) - reserve``; with no
reading, ``total - reservations - reserve``. The driver's free figure lags, so it is never
trusted alone, and a missing reading can never mean "everything fits". A job on a live
worker ("hot": starting, initializing, ready or busy, with a free slot) needs activation +
safety on that worker's GPU; a job that must spawn its worker ("cold") needs peak + safety.
A backend whose peak is unknown runs alone: it spawns only on a GPU with no reservations and
no workers and reserves all of it (total - reserve); nothing else is admitted there meanwhile.

Placement (cold): among allowed GPUs, the one that fits now with the most room left; else the
job is blocked for memory and, if it is the first such job, it picks the GPU it can have for
the least eviction cost (idle workers only; memory of workers already stopping counts as
coming back, so if that suffices nothing more is evicted).

Walk. Started jobs take memory and worker slots as the walk goes. A job whose worker is busy
(no slot) or stopping waits without blocking anyone. The first job blocked for memory is the
barrier: it alone may evict; behind it only hot jobs that fit may start, each one adding to
its ``passed``; when that reaches ``affinity_limit`` nothing more starts behind it. A job that
could not fit even on an empty allowed GPU (beside pinned workers) is never a barrier.

Speed. The walk stops as soon as no later job could start (a forced barrier, or every backend
settled), keeps a per-backend verdict so a skipped job costs one dict lookup, reads the queue
through ``order.ordered_runs`` (no sort), and builds ``Plan.waiting`` as a lazy view.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from supervisor.scheduler import evict
from supervisor.scheduler.model import (
    BackendInfo,
    Evict,
    GpuState,
    Plan,
    QueuedJob,
    SchedulerConfig,
    Snapshot,
    Start,
    WorkerInfo,
)
from supervisor.scheduler.order import ordered_runs

DEFAULT_CONFIG = SchedulerConfig()
#: After walking this many queue positions across several runs (aging interleaves the
#: priority bands), filter the rest down to the backends that can still start.
_NARROW_AFTER = 512


def plan(snapshot: Snapshot, now: float, config: SchedulerConfig = DEFAULT_CONFIG) -> Plan:
    """Decide which queued jobs start where, and which idle workers to evict first."""
    return _Planner(snapshot, now, config).run()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _Waiting(Mapping[str, str]):
    """Read-only job id -> reason for every queued job that was not started.

    Jobs the walk looked at carry their own reason or their backend's verdict; jobs it never
    reached (it stopped early) get their backend's verdict or the reason it stopped.
    """

    __slots__ = (
        "_queue",
        "_backends",
        "_started",
        "_explicit",
        "_verdicts",
        "_default",
        "_index",
    )

    def __init__(
        self,
        queue: Sequence[QueuedJob],
        backends: Mapping[str, BackendInfo],
        started: set[str],
        explicit: dict[str, str],
        verdicts: dict[str, str],
        default: str,
    ) -> None:
        self._queue = queue
        self._backends = backends
        self._started = started
        self._explicit = explicit
        self._verdicts = verdicts
        self._default = default
        self._index: dict[str, QueuedJob] | None = None

    def __getitem__(self, job_id: str) -> str:
        reason = self._explicit.get(job_id)
        if reason is not None:
            return reason
        if job_id in self._started:
            raise KeyError(job_id)
        if self._index is None:
            self._index = {job.job_id: job for job in self._queue}
        job = self._index[job_id]  # KeyError when not queued
        reason = self._verdicts.get(job.backend)
        if reason is not None:
            return reason
        if job.backend not in self._backends:
            return f"unknown backend {job.backend!r}"
        return self._default

    def __iter__(self) -> Iterator[str]:
        started = self._started
        for job in self._queue:
            if job.job_id not in started:
                yield job.job_id

    def __len__(self) -> int:
        return len(self._queue) - len(self._started)

    def __repr__(self) -> str:
        return f"<waiting: {len(self)} jobs>"


@dataclass(slots=True)
class _Barrier:
    job: QueuedJob
    passed: int
    forced: bool


class _Planner:
    """One decision's working state; ``run`` walks the queue once."""

    def __init__(self, snapshot: Snapshot, now: float, config: SchedulerConfig) -> None:
        self.snapshot = snapshot
        self.now = now
        self.config = config
        self.backends = backends = snapshot.backends
        self.gpus: dict[int, GpuState] = {g.index: g for g in snapshot.gpus}
        gpu_ids = sorted(self.gpus)
        self.gpu_ids = gpu_ids

        reserved = dict.fromkeys(gpu_ids, 0)
        self.stopping_mib = dict.fromkeys(gpu_ids, 0)
        self.stopping_count = dict.fromkeys(gpu_ids, 0)
        self.pinned_floor = dict.fromkeys(gpu_ids, 0)  # what pinned workers never give back
        self.pinned_alone: set[int] = set()  # GPUs held by a pinned unmeasured worker
        self.live_on: dict[int, list[WorkerInfo]] = {g: [] for g in gpu_ids}
        self.planned_on = dict.fromkeys(gpu_ids, 0)  # spawns decided in this plan
        # GPU -> the unmeasured backend holding it alone (None: its worker is stopping).
        self.exclusive: dict[int, str | None] = {}
        self.worker_gpu: dict[str, int] = {}  # hot backends (existing or spawned here)
        self.slots: dict[str, int] = {}
        self.spawned: set[str] = set()
        self.verdicts: dict[str, str] = {}  # backend -> why none of its jobs starts now
        self.used: set[str] = set()  # backends that got a start (not evictable)
        self.evicted: set[str] = set()

        for w in snapshot.workers.values():
            name, g = w.backend, w.gpu
            info = backends.get(name)
            if g not in reserved:
                self.verdicts[name] = f"its worker is on GPU{g}, which is not present"
                continue
            reserved[g] += w.reserved_mib
            unmeasured = info is not None and info.peak_mib is None
            if w.state == "stopping":
                self.stopping_mib[g] += w.reserved_mib
                self.stopping_count[g] += 1
                if unmeasured:
                    self.exclusive.setdefault(g, None)
                self.verdicts[name] = "worker stopping"
                continue
            self.live_on[g].append(w)
            if unmeasured:
                self.exclusive[g] = name
            if info is not None and info.pinned:
                if unmeasured:
                    self.pinned_alone.add(g)
                self.pinned_floor[g] += info.resident_mib
            if info is None:
                continue
            self.worker_gpu[name] = g
            free = info.concurrency - w.active_jobs
            self.slots[name] = free
            if free <= 0:
                self.verdicts[name] = (
                    "worker busy" if w.state in ("ready", "busy") else "worker starting"
                )

        self.budget: dict[int, int] = {}
        for g in gpu_ids:
            gpu = self.gpus[g]
            room = gpu.total_mib - reserved[g]
            free = gpu.measured_free_mib
            if free is not None and free < room:
                room = free
            self.budget[g] = room - gpu.reserve_mib
        self.reserved = reserved

        # Backends that could still start a job and still have jobs ahead in the walk.
        self.remaining: dict[str, int] = dict(snapshot.queued_per_backend)
        self.alive: set[str] = {
            n for n in backends if n not in self.verdicts and self.remaining.get(n, 0) > 0
        }
        self.barrier: _Barrier | None = None
        self.stopped = False
        self.starts: list[Start] = []
        self.started: set[str] = set()
        self.explicit: dict[str, str] = {}
        self.evictions: list[Evict] = []

    # ----------------------------------------------------------------- the walk

    def run(self) -> Plan:
        verdicts = self.verdicts
        queue = self.snapshot.queue
        if self.alive and not self._walk(queue, _NARROW_AFTER):
            # A long walk through jobs that all wait: go on over the jobs of the backends that
            # can still start only. Every job already considered either started or settled
            # its backend, so the filter drops exactly what was walked.
            alive, started = self.alive, self.started
            rest = [j for j in queue if j.backend in alive and j.job_id not in started]
            self._walk(rest, None)
        barrier = self.barrier
        passed: dict[str, int] = {}
        default = "waiting"
        if barrier is not None:
            if barrier.passed != barrier.job.passed:
                passed[barrier.job.job_id] = barrier.passed
            if barrier.forced:
                default = (
                    f"behind {barrier.job.job_id}, which was passed "
                    f"{_plural(barrier.passed, 'time')} and now goes first"
                )
            else:
                default = f"behind {barrier.job.job_id} (waiting for memory)"
        waiting = _Waiting(queue, self.backends, self.started, self.explicit, verdicts, default)
        return Plan(tuple(self.starts), tuple(self.evictions), MappingProxyType(passed), waiting)

    def _walk(self, queue: Sequence[QueuedJob], narrow_after: int | None) -> bool:
        """Walk ``queue`` in effective order; False when it left off to narrow the queue."""
        verdicts = self.verdicts
        walked = 0
        for run in ordered_runs(queue, self.now, self.config.aging_interval_s):
            for job in run:
                if job.backend in verdicts:
                    continue
                self._consider(job)
                if self.stopped or not self.alive:
                    return True
            walked += len(run)
            if narrow_after is not None and walked >= narrow_after:
                return False
        return True

    def _settle(self, name: str, reason: str) -> None:
        """No further job of ``name`` can start in this plan."""
        self.verdicts[name] = reason
        self.alive.discard(name)

    def _consider(self, job: QueuedJob) -> None:
        name = job.backend
        info = self.backends.get(name)
        if info is None:
            self._settle(name, f"unknown backend {name!r}")
            return
        g = self.worker_gpu.get(name)
        if g is None:
            self._cold(job, info)
        else:
            self._hot(job, info, g)
        left = self.remaining.get(name, 0) - 1
        self.remaining[name] = left
        if left <= 0:
            self.alive.discard(name)  # no job of it further down: nothing to wait for

    def _fits(self, name: str, g: int, need: int) -> bool:
        owner = self.exclusive.get(g, name)
        return owner == name and (need <= 0 or self.budget[g] >= need)

    def _hot(self, job: QueuedJob, info: BackendInfo, g: int) -> None:
        need = info.hot_need_mib
        if self._fits(info.name, g, need):
            self._start(job, info, g, spawn=False, reserve=need)
            return
        if self.barrier is not None:
            self._settle(info.name, self._short(need, g))
            return
        self._barrier_hot(job, info, g, need)

    def _cold(self, job: QueuedJob, info: BackendInfo) -> None:
        name = info.name
        if self.barrier is not None:
            self._settle(name, f"behind {self.barrier.job.job_id} (waiting for memory)")
            return
        allowed = self._allowed(info)
        if not allowed:
            self._settle(name, f"{name} allows no GPU that is present")
            return
        if info.peak_mib is None:
            self._cold_alone(job, info, allowed)
            return
        need = info.peak_mib + info.safety_mib
        best: int | None = None
        best_room = -1
        for g in allowed:
            room = self.budget[g] - need
            if room > best_room and g not in self.exclusive:
                best, best_room = g, room
        if best is not None:
            self._start(job, info, best, spawn=True, reserve=need)
            return
        feasible = [g for g in allowed if self._ever_fits(g, need)]
        if not feasible:
            self._settle(name, self._never(info, need, allowed))
            return
        self._make_barrier(job, info, feasible, need, alone=False, own=None)

    def _cold_alone(self, job: QueuedJob, info: BackendInfo, allowed: list[int]) -> None:
        best: int | None = None
        for g in allowed:
            if (
                self._empty(g)
                and self.budget[g] > 0
                and (best is None or self.budget[g] > self.budget[best])
            ):
                best = g
        if best is not None:
            self._start(job, info, best, spawn=True, reserve=self.gpus[best].usable_mib)
            return
        feasible = [g for g in allowed if g not in self.pinned_alone and not self._pinned_on(g)]
        if not feasible:
            self._settle(
                info.name,
                f"{info.name} runs alone (footprint unknown) but every allowed GPU "
                "holds a pinned worker",
            )
            return
        self._make_barrier(job, info, feasible, 0, alone=True, own=None)

    def _start(
        self, job: QueuedJob, info: BackendInfo, g: int, *, spawn: bool, reserve: int
    ) -> None:
        name = info.name
        self.budget[g] -= reserve
        self.starts.append(Start(job.job_id, name, g, spawn, reserve))
        self.started.add(job.job_id)
        self.used.add(name)
        if spawn:
            self.worker_gpu[name] = g
            self.slots[name] = info.concurrency - 1
            self.spawned.add(name)
            self.planned_on[g] += 1
            if info.peak_mib is None:
                self.exclusive[g] = name
        else:
            self.slots[name] -= 1
        if self.slots[name] <= 0:
            self._settle(name, "worker starting" if name in self.spawned else "worker busy")
        barrier = self.barrier
        if barrier is not None:
            barrier.passed += 1
            if barrier.passed >= self.config.affinity_limit:
                barrier.forced = True
                self.stopped = True
            else:
                self._sweep()

    # ----------------------------------------------------------------- barrier

    def _barrier_hot(self, job: QueuedJob, info: BackendInfo, g: int, need: int) -> None:
        name = info.name
        gpu = self.gpus[g]
        own_floor = info.resident_mib
        floor = self.pinned_floor[g] - (own_floor if info.pinned else 0)
        if need + own_floor > gpu.usable_mib - floor:
            # Pinned neighbours leave too little beside its own resident memory: relocate it.
            own = next((w for w in self.live_on[g] if w.backend == name), None)
            if own is not None and self._evictable(own):
                self.barrier = _Barrier(job, job.passed, job.passed >= self.config.affinity_limit)
                self._evict([own], g, f"relocate: {name} needs {need} MiB beside pinned workers")
                self.explicit[job.job_id] = f"worker relocating off GPU{g} (pinned neighbours)"
                self._after_barrier()
                return
            self._settle(
                name, f"needs {need} MiB on GPU{g} but pinned workers there leave too little"
            )
            return
        self._make_barrier(job, info, [g], need, alone=False, own=name)

    def _make_barrier(
        self,
        job: QueuedJob,
        info: BackendInfo,
        candidates: list[int],
        need: int,
        *,
        alone: bool,
        own: str | None,
    ) -> None:
        """``job`` is the first blocked for memory: choose a GPU and evict for it."""
        self.barrier = _Barrier(job, job.passed, job.passed >= self.config.affinity_limit)
        best: tuple[tuple[float, int, int, int], int, list[evict.Candidate]] | None = None
        for g in candidates:
            option = self._option(g, need, alone=alone, own=own)
            if option is None:
                continue
            cost, chosen, room = option
            key = (cost, len(chosen), -room, g)
            if best is None or key < best[0]:
                best = (key, g, chosen)
        if best is None:
            g = max(candidates, key=lambda i: (self.budget[i] + self.stopping_mib[i], -i))
            if alone:
                reason = "runs alone (footprint unknown): waiting for a GPU to empty"
            else:
                reason = self._short(need, g)
        else:
            _, g, chosen = best
            what = f"{info.name} needs {need} MiB" if not alone else f"{info.name} runs alone"
            self._evict([c.worker for c in chosen], g, f"room for {job.job_id}: {what} on GPU{g}")
            pending = self.stopping_count[g]  # already counts the evictions just made
            if pending:
                reason = f"waiting for {_plural(pending, 'eviction')} on GPU{g}"
            elif alone:
                reason = f"runs alone (footprint unknown): waiting for GPU{g} to empty"
            else:
                reason = self._short(need, g)
        self.explicit[job.job_id] = reason
        self._after_barrier()

    def _after_barrier(self) -> None:
        if self.barrier is not None and self.barrier.forced:
            self.stopped = True
        else:
            self._sweep()

    def _option(
        self, g: int, need: int, *, alone: bool, own: str | None
    ) -> tuple[float, list[evict.Candidate], int] | None:
        """Cheapest way to make ``need`` fit on ``g`` now: (cost, evictions, room after)."""
        gpu = self.gpus[g]
        if self.planned_on[g] and (alone or g in self.exclusive):
            return None
        cands = [
            c for c in self._candidates(g) if c.worker.backend != own and self._evictable(c.worker)
        ]
        if alone:
            if len(cands) != len(self.live_on[g]):
                return None  # something there cannot be evicted now
            return (sum(c.cost for c in cands), cands, gpu.usable_mib)
        have = self.budget[g] + self.stopping_mib[g]
        mandatory: list[evict.Candidate] = []
        holder = self.exclusive.get(g)
        if holder is not None and holder != own:
            # An unmeasured worker holds the GPU alone: it must go whatever the sizes.
            holder_cand = next((c for c in cands if c.worker.backend == holder), None)
            if holder_cand is None:
                return None
            mandatory.append(holder_cand)
            cands.remove(holder_cand)
            have += holder_cand.frees_mib
        rest = evict.choose(cands, have, need)
        if rest is None:
            return None
        chosen = mandatory + rest
        room = have + sum(c.frees_mib for c in rest) - need
        return (sum(c.cost for c in chosen), chosen, room)

    def _evict(self, workers: list[WorkerInfo], g: int, reason: str) -> None:
        for w in workers:
            self.evictions.append(Evict(w.backend, g, w.reserved_mib, reason))
            self.evicted.add(w.backend)
            self.stopping_mib[g] += w.reserved_mib
            self.stopping_count[g] += 1
            self._settle(w.backend, "worker stopping")

    def _sweep(self) -> None:
        """With a barrier standing, settle every backend that cannot start behind it."""
        barrier = self.barrier
        assert barrier is not None
        for name in list(self.alive):
            g = self.worker_gpu.get(name)
            if g is None:
                self._settle(name, f"behind {barrier.job.job_id} (waiting for memory)")
                continue
            need = self.backends[name].hot_need_mib
            if not self._fits(name, g, need):
                self._settle(name, self._short(need, g))

    # ----------------------------------------------------------------- helpers

    def _allowed(self, info: BackendInfo) -> list[int]:
        if info.allowed_gpus is None:
            return self.gpu_ids
        return sorted(g for g in set(info.allowed_gpus) if g in self.gpus)

    def _empty(self, g: int) -> bool:
        return (
            not self.live_on[g]
            and not self.stopping_count[g]
            and not self.planned_on[g]
            and self.reserved[g] == 0
        )

    def _pinned_on(self, g: int) -> bool:
        for w in self.live_on[g]:
            info = self.backends.get(w.backend)
            if info is not None and info.pinned:
                return True
        return False

    def _ever_fits(self, g: int, need: int) -> bool:
        """Could ``need`` (a measured cold job) fit on ``g`` once every evictable worker left?"""
        if g in self.pinned_alone:
            return False
        return need <= self.gpus[g].usable_mib - self.pinned_floor[g]

    def _evictable(self, w: WorkerInfo) -> bool:
        if w.state != "ready" or w.active_jobs:
            return False
        if w.backend in self.used or w.backend in self.evicted:
            return False
        info = self.backends.get(w.backend)
        return info is None or not info.pinned

    def _candidates(self, g: int) -> list[evict.Candidate]:
        out = []
        for w in self.live_on[g]:
            info = self.backends.get(w.backend)
            out.append(
                evict.Candidate(
                    w, evict.eviction_cost(w, info, self.now), 0 if info is None else info.priority
                )
            )
        out.sort(key=lambda c: c.order)
        return out

    def _short(self, need: int, g: int) -> str:
        return f"needs {need} MiB, {max(self.budget[g], 0)} free on GPU{g}"

    def _never(self, info: BackendInfo, need: int, allowed: list[int]) -> str:
        largest = max(allowed, key=lambda i: (self.gpus[i].usable_mib, -i))
        usable = self.gpus[largest].usable_mib
        if need <= usable:
            return (
                f"{info.name} needs {need} MiB but pinned workers leave too little on every "
                "allowed GPU"
            )
        return (
            f"{info.name} needs {need} MiB but the largest allowed GPU (GPU{largest}) has "
            f"{usable} MiB usable"
        )
