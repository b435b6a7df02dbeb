"""The admission decision: ``plan(snapshot, now, config) -> Plan``.

Pure: no I/O, no clock reads, no threads, no randomness; the same snapshot and time give the
same plan. What it decides, in the order of the (aged) queue:

Memory. Per GPU, ``budget = min(total - reservations - foreign, measured free) - reserve``;
with no reading, ``total - reservations - foreign - reserve``. Reservations are what the memory
ledger says each worker holds (never less than what was observed of it); the driver's free
figure lags, so it is never trusted alone, and a missing reading can never mean "everything
fits". A job on a live worker ("hot": starting, initializing, ready or busy, with a free
slot) needs what one more job adds to that worker (``BackendInfo.need_mib``); a job that must
spawn its worker ("cold") needs ``holds_mib(1)`` (peak + safety). A backend whose peak is
unknown runs alone: it spawns only on an empty GPU and reserves all of it (and so is not held
there by ``pinned`` until it is measured: ``BackendInfo.holds_pin``).

Placement (cold): among allowed GPUs, the one that fits now with the most room left; else the
job is blocked for memory and, on the GPU it can have for the least cost, it becomes that
GPU's *barrier*: the first job waiting there, with the set of workers (idle or busy) whose
leaving makes it fit (memory of workers already stopping counts as coming back).

Patience, not thrash. A barrier weighs the switch it needs against waiting: the switch costs
its own load plus the reload of every evicted backend that still has queued jobs
(``reload_cost_s``, learned from measured loads). While it has waited — since it was first
found blocked there — less than ``patience_factor`` times that cost (at most
``max_patience_s``), hot work of at least its own priority goes on beside it, so that
interleaved submissions are served in batches (its aging brings it first in line but does
not end that patience early: work of its own priority submitted after it still goes on);
once its patience is spent it is *forced*: its victims take no new job and leave as soon as
they are idle. A worker still loading with no job (its jobs were cancelled, or a preload) and
none of its backend queued is idle too: a load nobody waits for never keeps a job from its
room. An idle victim is evicted at once unless a patient barrier keeps its batch
(it has queued jobs, and the next one fits once the jobs running there end) — no GPU idles
while a job waits. Before evicting anyone, a barrier that would fit once the jobs running on
its GPU give their memory back waits for that instead, up to ``patience_factor`` times what
the eviction would cost (a job of a priority above every job running there: at most its
target wait, ``expect``). Work that fits in the room the barrier does not need (other GPUs,
or beside it) always starts: jobs of models that fit beside each other run at once.
Lower-priority work never takes the room a barrier waits for. No job starves: aging lifts a
waiting job one level per ``aging_interval_s`` until it is first in line, and then it waits
at most ``max_patience_s`` plus the running jobs of its victims.

Expected arrivals. With ``Snapshot.expected`` (``supervisor.scheduler.expect``), a job that
would evict the worker of a stream of higher priority than its own first counts what that
costs the stream's next request (the chance it comes while the job loads and runs and the
worker reloads, times that time); beyond the stream's target wait, the job takes another GPU
where the workers it needs gone are idle with nothing queued, and no stream holds it so; with
none, it waits (for a gap long enough, or the stream's end, at most ``max_patience_s``)
without becoming a barrier, so work that fits beside the stream goes on, and its reason says
what it waits for. A load that fits beside a stream's idle worker but leaves no room for its
next job is held the same way, counting no reload (``_beside_hold``). A worker
whose stream is alive is dearer to evict, as one with queued jobs is, and a patient barrier
keeps an idle victim whose stream of at least its priority is due within a reload. An idle
victim whose stream above the barrier's priority is alive leaves last: not while another
victim still runs a job (its room is needed too, so the stream's worker leaving earlier only
opens a window in which its next request must wait for the barrier and a reload). A stream
taken as ended may not have: when its next request comes while the worker that took its room
still loads for jobs of lower priority (``WorkerInfo.loading_for``) and evicting idle
workers there could not make that room, that load is given up and those jobs go back to the
queue (``Evict.requeue``), so the request waits for its own model's reload, not for that
load, a job and the reload (``_undo_loads``) — unless its target wait covers those
(``_may_wait_until``): then it waits, and the load goes on. The engine tells its
``expect.Learner`` for whose request (``Evict.given_up_for``); the next load of that
backend waits while the next request of a stream that gave one up (the last
``expect.GIVEN_UP_BY``) would likely give it up again and a better moment comes after it
(``_doomed``, ``expect.Expectations.gives_up``): one load given up, not one per request.

Sleep. A worker may be ``asleep``: it holds what it keeps asleep, and a job for it wakes it,
admitted like a load by what waking adds (``holds_mib(1)`` less what it keeps) — passing a
barrier only in room the barrier does not need. When room is needed, an idle worker that can
sleep is put to sleep rather than stopped when that is cheaper to undo (its wake against its
reload) and frees enough (``evict.choose``); a sleeping worker is stopped like an idle one when
even what it keeps is needed. Sleepers' host memory stays within
``Snapshot.sleep_host_room_mib``.

Kinds. A ``preload`` starts a worker without a job (or wakes a sleeping one), only in room
nobody waits for, never evicting (but for a fixed address: see ``_address_taken``); a
``calibration`` needs an empty GPU, like an unmeasured backend, and closes it for the rest of
the plan. A draining GPU, or one held by a calibration run (``calibrating``), admits nothing,
and a draining GPU's idle workers are evicted; on a yielded one (``GpuState.closed_why``) a
load or wake under way is given up too, its jobs back in the queue.

Others. When what our workers hold plus strangers' memory (``GpuState.foreign_mib``, counted
with hysteresis by ``strangers``) exceeds a GPU, its idle workers are evicted (or put to
sleep), cheapest to undo first, until it fits (``Evict.others``); running jobs are never
touched, and nothing is admitted there while its budget is negative.

Speed. The walk stops as soon as no later job could start (every backend settled), keeps a
per-backend verdict so a skipped job costs one dict lookup, reads the queue through
``order.ordered_runs`` (no sort), and builds ``Plan.waiting`` as a lazy view.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from supervisor.scheduler import evict, expect
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
from supervisor.scheduler.order import aging_bonus, ordered_runs

DEFAULT_CONFIG = SchedulerConfig()
#: After walking this many queue positions across several runs (aging interleaves the
#: priority bands), filter the rest down to the backends that can still start.
_NARROW_AFTER = 512
#: The soonest a job held for a stream's next request is looked at again.
MIN_REVISIT_S = 0.1

Key = tuple[str, str]  # (kind, backend): what one verdict covers


def plan(snapshot: Snapshot, now: float, config: SchedulerConfig = DEFAULT_CONFIG) -> Plan:
    """Decide which queued jobs start where, and which idle workers to evict first."""
    return _Planner(snapshot, now, config).run()


def key_of(job: QueuedJob) -> Key:
    """What a job's verdict is shared with: the jobs of the same kind and backend."""
    return (job.kind, job.backend)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _Waiting(Mapping[str, str]):
    """Read-only job id -> reason for every queued job that was not started.

    Jobs the walk looked at carry their own reason or their key's verdict; jobs it never
    reached (it stopped early) get their key's verdict or the default reason.
    """

    __slots__ = ("_queue", "_backends", "_started", "_explicit", "_verdicts", "_default",
                 "_index")

    def __init__(
        self,
        queue: Sequence[QueuedJob],
        backends: Mapping[str, BackendInfo],
        started: set[str],
        explicit: dict[str, str],
        verdicts: dict[Key, str],
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
        reason = self._verdicts.get(key_of(job))
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
    """The first job waiting for memory on one GPU, and what it waits for."""

    job: QueuedJob
    gpu: int
    effective: int  # its aged priority
    victims: list[WorkerInfo] = field(default_factory=list)
    slack: int = 0  # room beyond its need once its victims are gone
    forced: bool = False
    passed: int = 0
    sleepers: frozenset[str] = frozenset()  # victims put to sleep rather than stopped
    address: str | None = None  # it waits for this address too (a server that holds it)

    @property
    def why(self) -> str:
        """Why its victims leave (an eviction's reason)."""
        if self.address is not None:
            return f"{self.job.backend} listens on {self.address} too ({self.job.job_id})"
        return f"room for {self.job.job_id} on GPU{self.gpu}"

    @property
    def victim_names(self) -> set[str]:
        return {v.backend for v in self.victims}


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
        self.live_on: dict[int, list[WorkerInfo]] = {g: [] for g in gpu_ids}
        self.planned_on = dict.fromkeys(gpu_ids, 0)  # spawns decided in this plan
        # GPU -> the unmeasured backend holding it alone (None: its worker is stopping).
        self.exclusive: dict[int, str | None] = {}
        self.worker_gpu: dict[str, int] = {}  # hot backends (existing or spawned here)
        self.slots: dict[str, int] = {}
        self.active: dict[str, int] = {}
        self.spawned: set[str] = set()
        self.verdicts: dict[Key, str] = {}  # why no job of that key starts now
        self.used: set[str] = set()  # backends that got a start (not evictable)
        self.evicted: set[str] = set()
        self.stopping: set[str] = set()  # backends whose worker is on its way out
        # GPU -> why nothing new starts there (draining, held by a calibration run).
        self.closed: dict[int, str] = {}
        for g, backend in snapshot.calibrating.items():
            if g in self.gpus:
                self.closed[g] = f"GPU{g} is held by the calibration of {backend}"
        for gpu in snapshot.gpus:
            if gpu.draining:
                self.closed.setdefault(gpu.index,
                                       gpu.closed_why or f"GPU{gpu.index} is draining")

        self.asleep: dict[str, int] = {}  # backend -> what its sleeping worker keeps
        # fixed address -> the backend whose server holds it (or starts in this plan); one
        # being calibrated holds it too (its run is no worker)
        self.on_address: dict[str, str] = {}
        self.calibrating = set(snapshot.calibrating.values())
        holding = sorted((w.state != "stopping", w.backend) for w in snapshot.workers.values())
        for name in [n for _, n in holding] + sorted(self.calibrating):
            address = backends[name].address if name in backends else None
            if address is not None:  # (one stopping first: it is there until it has gone)
                self.on_address.setdefault(address, name)
        for w in snapshot.workers.values():
            name, g = w.backend, w.gpu
            info = backends.get(name)
            job_key = ("job", name)
            if g not in reserved:
                self.verdicts[job_key] = f"its worker is on GPU{g}, which is not present"
                continue
            reserved[g] += w.reserved_mib
            unmeasured = info is not None and info.peak_mib is None
            if w.state == "stopping":
                self.stopping.add(name)
                self.stopping_mib[g] += w.reserved_mib
                self.stopping_count[g] += 1
                if unmeasured:
                    self.exclusive.setdefault(g, None)
                self.verdicts[job_key] = "worker stopping"
                continue
            self.live_on[g].append(w)
            if w.state == "asleep":
                self.asleep[name] = w.reserved_mib
            if unmeasured:
                self.exclusive[g] = name
            if info is not None and info.holds_pin:
                self.pinned_floor[g] += info.idle_mib
            if info is None:
                continue
            self.worker_gpu[name] = g
            self.active[name] = w.active_jobs
            if not w.accepting:
                self.verdicts[job_key] = (
                    "its worker takes no new job (it used more than it declared; it is "
                    "evicted once idle)"
                )
                continue
            free = info.concurrency - w.active_jobs
            self.slots[name] = free
            if free <= 0:
                self.verdicts[job_key] = (
                    "worker busy" if w.state in ("ready", "busy") else "worker starting"
                )

        for gpu in snapshot.gpus:
            if gpu.leaving_mib:
                reserved[gpu.index] += gpu.leaving_mib
                self.stopping_mib[gpu.index] += gpu.leaving_mib
                self.stopping_count[gpu.index] += 1
        self.budget: dict[int, int] = {}
        for g in gpu_ids:
            gpu = self.gpus[g]
            room = gpu.total_mib - reserved[g] - gpu.foreign_mib
            free = gpu.measured_free_mib
            if free is not None and free < room:
                room = free
            self.budget[g] = room - gpu.reserve_mib
        self.reserved = reserved

        # Keys that could still start a job and still have jobs ahead in the walk.
        counts = snapshot.queued_counts
        self.queued_jobs: dict[str, int] = {
            b: n for (kind, b), n in counts.items() if kind == "job" and n > 0
        }
        self.remaining: dict[Key, int] = dict(counts)
        self.alive: set[Key] = {
            k for k, n in counts.items() if n > 0 and k not in self.verdicts
        }
        self.barriers: dict[int, _Barrier] = {}
        self.first_barrier: _Barrier | None = None
        self.starts: list[Start] = []
        self.started: set[str] = set()
        self.explicit: dict[str, str] = {}
        self.evictions: list[Evict] = []
        self.revisit_at: float | None = None
        self._queued_by: dict[str, tuple[float, int]] | None = None  # (``_queued``)
        self.blocked: dict[str, float] = {}
        # Victims whose next job could pass a patient barrier but waits for memory.
        self.waiting_victims: set[str] = set()
        self.host_room = snapshot.sleep_host_room_mib  # what sleepers may still take
        self.expected = snapshot.expected  # how requests are expected to arrive

    # ----------------------------------------------------------------- the walk

    def run(self) -> Plan:
        queue = self.snapshot.queue
        self._undo_loads()
        if self.alive and not self._walk(queue, _NARROW_AFTER):
            # A long walk through jobs that all wait: go on over the jobs that can still
            # start only. Every job already considered either started or settled its key,
            # so the filter drops exactly what was walked.
            alive, started = self.alive, self.started
            rest = [j for j in queue if key_of(j) in alive and j.job_id not in started]
            self._walk(rest, None)
        self._resolve()
        passed: dict[str, int] = {}
        default = "waiting"
        for barrier in self.barriers.values():
            if barrier.passed != barrier.job.passed:
                passed[barrier.job.job_id] = barrier.passed
        first = self.first_barrier
        if first is not None:
            default = f"behind {first.job.job_id} (waiting for memory)"
        waiting = _Waiting(queue, self.backends, self.started, self.explicit, self.verdicts,
                           default)
        return Plan(tuple(self.starts), tuple(self.evictions), MappingProxyType(passed), waiting,
                    self.revisit_at, MappingProxyType(self.blocked))

    def _walk(self, queue: Sequence[QueuedJob], narrow_after: int | None) -> bool:
        """Walk ``queue`` in effective order; False when it left off to narrow the queue."""
        verdicts = self.verdicts
        walked = 0
        for run in ordered_runs(queue, self.now, self.config.aging_interval_s):
            for job in run:
                if key_of(job) in verdicts:
                    continue
                self._consider(job)
                if not self.alive:
                    return True
            walked += len(run)
            if narrow_after is not None and walked >= narrow_after:
                return False
        return True

    def _settle(self, key: Key, reason: str) -> None:
        """No further job of ``key`` can start in this plan."""
        self.verdicts[key] = reason
        self.alive.discard(key)

    def _consider(self, job: QueuedJob) -> None:
        key = key_of(job)
        name = job.backend
        info = self.backends.get(name)
        if info is None:
            self._settle(key, f"unknown backend {name!r}")
            return
        g = self.worker_gpu.get(name)
        if g is None and self._address_taken(job, info):
            pass  # (settled: it waits for its address)
        elif job.kind == "calibration":
            self._calibration(job, info)
        elif job.kind == "preload":
            self._preload(job, info)
        elif g is None:
            self._cold(job, info)
        else:
            self._hot(job, info, g)
        left = self.remaining.get(key, 0) - 1
        self.remaining[key] = left
        if left <= 0:
            self.alive.discard(key)  # no job of it further down: nothing to wait for

    def _address_taken(self, job: QueuedJob, info: BackendInfo) -> bool:
        """Whether another backend's server holds the fixed address ``info``'s listens on
        (two servers cannot listen on one port); if so, the job has its verdict. The holder
        leaves as a worker leaves for memory: a victim of this job's barrier on its GPU, so
        its queued work of the same priority goes on first (a batch, not a switch per job)
        and then its later jobs wait; for a load (asked by name: a preload never evicts for
        memory), an idle holder goes at once; never while it is pinned, stopping
        or calibrated, nor for a job that could not start once it has gone."""
        address = info.address
        holder = None if address is None else self.on_address.get(address)
        if holder is None or holder == info.name:
            return False
        key = key_of(job)
        why = f"{holder}'s server holds {address}, which {info.name}'s listens on too"
        w = self.snapshot.workers.get(holder)
        held = self.backends.get(holder)
        allowed = self._allowed(info)
        need = info.holds_mib(1) if info.measured else 0
        if holder in self.calibrating:
            self._settle(key, f"{why}: it waits for {holder}'s calibration to end")
        elif w is None or holder in self.evicted or w.state == "stopping" \
                or w.gpu not in self.gpus:
            self._settle(key, f"{why}: it waits for it to go")
        elif held is not None and held.holds_pin:
            self._settle(key, f"{why}, and {holder} is pinned: it never leaves (give one of "
                         "them another port)")
        elif not allowed:
            self._settle(key, self._no_gpu(info))
        elif all(g in self.closed for g in allowed):
            self._settle(key, self.closed[allowed[0]])
        elif info.measured and not any(self._ever_fits(g, need) for g in allowed):
            self._settle(key, self._never(info, need, allowed))
        elif job.kind == "preload":  # asked for by name (Ollama's load): an idle holder goes
            if self._evictable(w) and not self.queued_jobs.get(holder, 0):
                self._evict([w], w.gpu, f"{info.name} is loaded and listens on {address} too")
                self._settle(key, f"{why}: it waits for it to go")
            else:
                self._settle(key, why)
        elif w.gpu in self.barriers:
            self._settle(key, self._behind(self.barriers[w.gpu]))
        elif w.gpu in allowed and (not info.measured or self._ever_fits(w.gpu, need)):
            self._make_barrier(job, info, [w.gpu], need, alone=not info.measured, own=None,
                               also=holder)
        elif self._evictable(w):  # (it cannot take the holder's place: the holder just goes)
            self._evict([w], w.gpu, f"{info.name} listens on {address} too")
            self._settle(key, f"{why}: it waits for it to go")
        else:
            self._settle(key, f"{why}: it waits for its jobs to end")
            self._settle(("job", holder), f"{info.name} waits for its address, {address}")
        return True

    def _effective(self, job: QueuedJob) -> int:
        return job.priority + aging_bonus(job.submitted_at, self.now,
                                          self.config.aging_interval_s)

    def _may_pass(self, barrier: _Barrier, job: QueuedJob, name: str, need: int,
                  *, hot: bool) -> bool:
        """May ``job`` (of backend ``name``, needing ``need``) start beside ``barrier``?

        Hot work of at least the barrier's priority goes on while the barrier is patient (its
        priority before aging: aging brought it first in line, its patience bounds the rest;
        aging it above the batch it waits beside would serve a backlog of one priority first
        come first served, a switch for every job); other work only in the room the barrier
        does not need. A victim's work is never in
        that room: it keeps the victim there.
        """
        patient = hot and not barrier.forced and (job.priority >= barrier.job.priority
                                                  or self._effective(job) >= barrier.effective)
        if name in barrier.victim_names:
            return patient
        return patient or need <= barrier.slack

    def _hot(self, job: QueuedJob, info: BackendInfo, g: int) -> None:
        name = info.name
        key = key_of(job)
        if g in self.closed:
            self._settle(key, self.closed[g])
            return
        owner = self.exclusive.get(g, name)
        if owner != name:
            self._settle(key, f"GPU{g} is held alone by {owner or 'a stopping worker'}")
            return
        need = self._hot_need(name, info)
        barrier = self.barriers.get(g)
        # A wake takes room as a load does: only beside a barrier, never its batch's turn.
        if barrier is not None and not self._may_pass(barrier, job, name, need,
                                                      hot=name not in self.asleep):
            self._settle(key, self._behind(barrier))
            return
        if need <= 0 or self.budget[g] >= need:
            # One more job (or a wake) takes room as a load does: not that of a stream's next
            # job beside it (``_beside_hold``; a second job on a loading batch model took an
            # idle chat model's, whose next request then gave that load up, and each after).
            held = self._beside_hold(job, info, g, need) if need > 0 else expect.Hold(None)
            if held.stream is not None:
                self._settle_held(job, held, self._blocked_since(job))
                return
            self._start(job, info, g, spawn=False, reserve=need)
            return
        if barrier is not None:
            if name in barrier.victim_names:
                self.waiting_victims.add(name)  # its batch may go on once memory comes back
            self._settle(key, self._short(need, g))
            return
        self._barrier_hot(job, info, g, need)

    def _hot_need(self, name: str, info: BackendInfo) -> int:
        """What one more job of ``name`` takes on its live worker: the memory one more job
        adds; for a sleeping worker, all it holds with that job, less what it keeps asleep."""
        if not info.measured:
            return 0
        keeps = self.asleep.get(name)
        if keeps is not None:
            return max(0, info.holds_mib(1) - keeps)
        return info.need_mib(self.active[name])

    def _cold(self, job: QueuedJob, info: BackendInfo) -> None:
        name = info.name
        key = key_of(job)
        allowed = self._allowed(info)
        if not allowed:
            self._settle(key, self._no_gpu(info))
            return
        if info.peak_mib is None:
            self._cold_alone(job, info, allowed, kind="job")
            return
        need = info.holds_mib(1)
        fits: list[int] = []  # where it fits now, the most room left first
        for g in allowed:
            if g in self.exclusive or self.budget[g] < need:
                continue
            barrier = self.barriers.get(g)
            if barrier is not None and not self._may_pass(barrier, job, name, need, hot=False):
                continue
            fits.append(g)
        fits.sort(key=lambda g: (need - self.budget[g], g))
        held: expect.Hold | None = None
        feasible = [g for g in allowed if g not in fits and self._ever_fits(g, need)]
        doubted: int | None = None  # where it fits beside a stream whose hold has ended
        for g in fits:
            hold = self._beside_hold(job, info, g, need)
            if hold.stream is None and hold.released_at > -math.inf:
                doubted = g if doubted is None else doubted
                continue
            if hold.stream is None:
                if not self._doomed(job, info, [g], need):
                    self._start(job, info, g, spawn=True, reserve=need)
                return
            held = held or hold
        if doubted is not None:
            # The stream's hold there has ended, but the stream may not have: where the
            # workers it needs gone are idle with nothing queued and no stream of theirs, it
            # takes their room instead, for nothing anyone waits for (a chat request waited
            # 6 s for a 7 s load put beside its idle model, where another GPU's idle batch
            # model could have left).
            free = self._free_switch(job, info, [g for g in feasible if g not in self.barriers],
                                     need)
            if free is not None:
                self._make_barrier(job, info, [free], need, alone=False, own=None)
            elif not self._doomed(job, info, [doubted], need):
                self._start(job, info, doubted, spawn=True, reserve=need)
            return
        # Where it fits, a stream holds it (``_beside_hold``): it may still take the room of
        # other work on another GPU, as a blocked job does; else it waits for the stream.
        if held is not None and all(g in self.barriers for g in feasible):
            self._settle_held(job, held, self._blocked_since(job))
            return
        if not feasible:
            self._settle(key, self._never(info, need, allowed))
            return
        free = [g for g in feasible if g not in self.barriers]
        if not free:
            self._settle(key, self._behind(self.barriers[feasible[0]]))
            return
        if not self._doomed(job, info, free, need):
            self._make_barrier(job, info, free, need, alone=False, own=None, held=held)

    def _free_switch(self, job: QueuedJob, info: BackendInfo, gpus: list[int],
                     need: int) -> int | None:
        """Among ``gpus``, the one where ``job`` can have room most cheaply by evicting only
        idle workers with nothing queued (or none: what stops there makes it), whose leaving
        no stream's next request would feel (no hold of a stream, now or ended, there nor
        beside it once they have gone)."""
        waited = 0.0 if job.blocked_since is None else self.now - job.blocked_since
        options = []
        for g in gpus:
            option = self._option(g, need, alone=False, own=None)
            if option is None:
                continue
            cost, chosen, room = option
            victims = [c.worker for c in chosen]
            if any(v.active_jobs or self.queued_jobs.get(v.backend, 0) for v in victims):
                continue
            sleepers = frozenset(c.worker.backend for c in chosen if c.sleep)
            holds = self._switch_holds(job, info, g, need, victims, sleepers, room, waited)
            if all(h.stream is None and h.released_at == -math.inf for h in holds):
                options.append((cost, g))
        return min(options)[1] if options else None

    def _switch_holds(self, job: QueuedJob, info: BackendInfo, g: int, need: int,
                      victims: list[WorkerInfo], sleepers: frozenset[str], room: int,
                      waited: float, *, beside: bool = True) -> tuple[expect.Hold, expect.Hold]:
        """What holds ``job`` from taking ``g``'s room by evicting ``victims`` (leaving it
        ``room``): the streams of the models it evicts (``_stream_hold``); and, with
        ``beside``, when none does and none of them runs a job, those of the models that stay
        there once they have gone (``_beside_hold``: evicting them would buy nothing but
        their reloads; not for busy ones, which a barrier waits for. Held instead, it counted
        as blocked all the while, its barrier's patience spent before it formed:
        bench/trace.py's interactive trace switched batches early and took 663 s, not 600,
        and no request waited less). ``Hold(None)`` for the second when not asked."""
        hold = self._stream_hold(job, info, victims, sleepers, waited, g)
        if not beside or hold.stream is not None or any(v.active_jobs for v in victims):
            return hold, expect.Hold(None)
        return hold, self._beside_hold(job, info, g, need, left=room,
                                       leaving=frozenset(v.backend for v in victims))

    def _cold_alone(
        self, job: QueuedJob, info: BackendInfo, allowed: list[int], *, kind: str
    ) -> None:
        """An unmeasured spawn, or a calibration: an empty GPU, all of it."""
        best: int | None = None
        for g in allowed:
            if (
                self._empty(g)
                and g not in self.barriers
                and self.budget[g] > 0
                and (best is None or self.budget[g] > self.budget[best])
            ):
                best = g
        if best is not None:
            self._start(job, info, best, spawn=kind == "job", reserve=self.budget[best],
                        kind=kind)
            return
        feasible = [g for g in allowed if not self._pinned_on(g)]
        what = "runs alone (footprint unknown)" if kind == "job" else "is calibrated alone"
        if not feasible:
            self._settle(key_of(job),
                         f"{info.name} {what} but every allowed GPU holds a pinned worker")
            return
        free = [g for g in feasible if g not in self.barriers]
        if not free:
            self._settle(key_of(job), self._behind(self.barriers[feasible[0]]))
            return
        self._make_barrier(job, info, free, 0, alone=True, own=None)

    def _calibration(self, job: QueuedJob, info: BackendInfo) -> None:
        allowed = self._allowed(info)
        if not allowed:
            self._settle(key_of(job), self._no_gpu(info))
            return
        self._cold_alone(job, info, allowed, kind="calibration")

    def _preload(self, job: QueuedJob, info: BackendInfo) -> None:
        """Start a worker without a job, in room that nobody waits for; never evict."""
        name = info.name
        key = key_of(job)
        if name in self.asleep and name not in self.used:
            self._wake_preload(job, info)
            return
        if name in self.worker_gpu or name in self.stopping:
            self._settle(key, "its worker already runs")
            return
        allowed = self._allowed(info)
        if info.peak_mib is None:
            empty = [g for g in allowed if self._empty(g) and g not in self.barriers
                     and self.budget[g] > 0]
            if empty:
                g = max(empty, key=lambda i: (self.budget[i], -i))
                self._start(job, info, g, spawn=True, reserve=self.budget[g], kind="preload")
            else:
                self._settle(key, "no empty GPU for a worker whose footprint is unknown")
            return
        need = info.idle_mib
        fits = [
            g for g in allowed
            if g not in self.exclusive and self.budget[g] >= need
            and (g not in self.barriers or need <= self.barriers[g].slack)
        ]
        if not fits:
            self._settle(key, f"no room for a preload ({need} MiB) that nobody waits for")
            return
        g = max(fits, key=lambda i: (self.budget[i] - need, -i))
        self._start(job, info, g, spawn=True, reserve=need, kind="preload")

    def _wake_preload(self, job: QueuedJob, info: BackendInfo) -> None:
        """Wake a sleeping worker without a job, in room nobody waits for; never evict."""
        name = info.name
        g = self.worker_gpu[name]
        need = max(0, info.idle_mib - self.asleep[name]) if info.measured else 0
        barrier = self.barriers.get(g)
        if g in self.closed:
            self._settle(key_of(job), self.closed[g])
        elif self.budget[g] >= need and (barrier is None or need <= barrier.slack):
            self._start(job, info, g, spawn=False, reserve=need, kind="preload")
        else:
            self._settle(key_of(job), f"no room to wake it ({need} MiB) that nobody waits for")

    def _start(
        self, job: QueuedJob, info: BackendInfo, g: int, *, spawn: bool, reserve: int,
        kind: str = "job",
    ) -> None:
        name = info.name
        self.budget[g] -= reserve
        self.starts.append(Start(job.job_id, name, g, spawn, reserve, kind))
        self.started.add(job.job_id)
        barrier = self.barriers.get(g)
        if barrier is not None:
            barrier.slack -= reserve
            barrier.passed += 1
        if info.address is not None:
            self.on_address[info.address] = name
        if kind == "calibration":
            self.calibrating.add(name)
            self.closed[g] = f"GPU{g} is held by the calibration of {name}"
            self._settle(("job", name), f"{name} is being calibrated")
            self._settle(key_of(job), f"{name} is being calibrated")
            self._sweep()
            return
        self.used.add(name)
        woken = self.asleep.pop(name, None) is not None
        if kind == "preload" and woken:  # a wake without a job
            self._settle(key_of(job), "its worker is waking")
            if self.barriers:
                self._sweep()
            return
        if spawn:
            self.worker_gpu[name] = g
            jobs = 1 if kind == "job" else 0
            self.active[name] = jobs
            self.slots[name] = info.concurrency - jobs
            self.spawned.add(name)
            self.planned_on[g] += 1
            if info.peak_mib is None:
                self.exclusive[g] = name
            if kind == "preload":
                self._settle(key_of(job), "its worker is starting")
        else:
            self.slots[name] -= 1
            self.active[name] += 1
        if self.slots[name] <= 0:
            self._settle(("job", name),
                         "worker starting" if name in self.spawned else "worker busy")
        if self.barriers:
            self._sweep()

    # ----------------------------------------------------------------- barriers

    def _barrier_hot(self, job: QueuedJob, info: BackendInfo, g: int, need: int) -> None:
        name = info.name
        gpu = self.gpus[g]
        floor = self.pinned_floor[g] - (info.idle_mib if info.holds_pin else 0)
        room = gpu.usable_mib - floor - gpu.foreign_mib
        if info.holds_mib(self.active[name] + 1) > room and info.holds_mib(1) <= room:
            # It fits once its worker's running jobs are done, not beside them.
            self._settle(key_of(job), self._short(need, g))
            return
        if info.holds_mib(1) > room:
            # Pinned neighbours (or foreign memory) leave too little beside its own resident
            # memory: relocate it.
            own = next((w for w in self.live_on[g] if w.backend == name), None)
            if own is not None and self._evictable(own):
                self._evict([own], g, f"relocate: {name} needs {need} MiB beside pinned "
                            "workers")
                self.explicit[job.job_id] = f"worker relocating off GPU{g} (pinned neighbours)"
                self._settle(key_of(job), "worker stopping")
                return
            self._settle(key_of(job), f"needs {need} MiB on GPU{g} but pinned workers there "
                         "leave too little")
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
        also: str | None = None,
        held: expect.Hold | None = None,
    ) -> None:
        """``job`` is the first blocked for memory on the GPU it can have most cheaply (or
        for the address of ``also``'s server, which must leave whatever the memory), unless
        a stream holds it there (see the comment at ``_stream_hold``'s call). ``held``: a
        stream holds it where it fits (``_cold``), so with nothing here that may leave for
        it, it waits for that stream rather than for one of these GPUs to empty."""
        options: list[tuple[tuple[int, float, int, int, int], int, list[evict.Candidate],
                            int]] = []
        for g in candidates:
            option = self._option(g, need, alone=alone, own=own, also=also)
            if option is None:
                continue
            cost, chosen, room = option
            busy = sum(1 for c in chosen if c.worker.active_jobs)
            options.append(((busy, cost, len(chosen), -room, g), g, chosen, room))
        options.sort(key=lambda o: o[0])
        best = options[0] if options else None
        barrier_key = key_of(job)
        # Patience counts from when it was first found blocked here, not from submission.
        since = self._blocked_since(job)
        waited = self.now - since
        if not alone and also is None and (best is None or best[2]):
            # Before evicting: the memory running jobs give back when they end may suffice.
            # Waiting for it costs time, evicting costs reloads: wait up to patience_factor
            # times what the eviction would cost (recently used workers are dear). Work of a
            # priority above every job running there waits no longer than its target wait:
            # a chat request does not wait out a batch job for want of evicting an idle model.
            evict_cost = best[0][1] if best is not None else math.inf
            patience = min(self.config.patience_factor * evict_cost,
                           self.config.max_patience_s)
            if self._above_running(job, candidates):
                patience = min(patience, self._target(info.name))
            returning = [(self.budget[g] + self.stopping_mib[g] + self._returning(g, own), g)
                         for g in candidates if g not in self.closed
                         and not (self.exclusive.get(g, own) not in (own, None))]
            fit = [(room - need, g) for room, g in returning if room >= need]
            if fit and waited < patience:
                room, g = max(fit)
                barrier = _Barrier(job, g, self._effective(job), [], room, False, job.passed)
                if math.isfinite(patience):
                    due = since + patience
                    if self.revisit_at is None or due < self.revisit_at:
                        self.revisit_at = due
                self._add_barrier(barrier)
                reason = (f"needs {need} MiB: waiting for the jobs running on GPU{g} to give "
                          "their memory back, rather than evict"
                          + (f" (at most {patience - waited:.0f} s more)"
                             if math.isfinite(patience) else ""))
                self.explicit[job.job_id] = reason
                self._settle(barrier_key, reason)
                return
        if best is None and held is not None:
            self._settle_held(job, held, since)
            return
        if best is None:
            # Nothing that may leave suffices now (starting workers, pinned ones...): wait on
            # the GPU with the most coming back, taking nothing from anyone.
            g = max(candidates, key=lambda i: (self.budget[i] + self.stopping_mib[i], -i))
            # What it leaves to others: the room it will never need, even once everything
            # that may leave has left.
            gpu = self.gpus[g]
            ever = gpu.usable_mib - gpu.foreign_mib - self.pinned_floor[g]
            slack = 0 if alone else max(0, ever - need)
            self._add_barrier(_Barrier(job, g, self._effective(job), [], slack, False,
                                       job.passed))
            reason = (f"waiting for {also}'s server to leave its address" if also
                      else f"runs alone (footprint unknown): waiting for GPU{g} to empty"
                      if alone else self._short(need, g))
            self.explicit[job.job_id] = reason
            self._settle(barrier_key, reason)
            return
        # Held by a stream on the cheapest GPU (``_stream_hold``: evicting a stream's worker
        # there would cost its next request more than its target), the job takes the next
        # GPU where the workers it needs gone are idle, none with queued work, and no stream
        # holds it either: they leave at once, for nothing anyone waits for. (Taking the room
        # of a batch there instead, its work then queued behind this job's, left the
        # stream's GPU idle: a trace took 465 s, not 312.) With none, it waits on the
        # cheapest, and says why.
        for option in options:
            _, g, chosen, room = option
            if held is not None and any(
                    c.worker.active_jobs or self.queued_jobs.get(c.worker.backend, 0)
                    for c in chosen):
                continue
            victims = [c.worker for c in chosen]
            sleepers = frozenset(c.worker.backend for c in chosen if c.sleep)
            hold, beside = self._switch_holds(job, info, g, need, victims, sleepers, room,
                                              waited, beside=not alone and also is None)
            if beside.stream is not None:
                hold = beside
            if hold.stream is None:
                released = hold.released_at
                break
            held = held or hold
        else:
            assert held is not None
            self._settle_held(job, held, since)
            return
        barrier = _Barrier(job, g, self._effective(job), victims, room, False, job.passed,
                           sleepers, info.address if also else None)
        # The switch costs its own load (a wake, for a sleeping worker), and undoing every
        # eviction whose backend still has queued jobs (a wake for those put to sleep).
        switch = self._undo_s(info, info.name in self.asleep) + sum(
            self._undo_s(self.backends[v.backend], v.backend in sleepers)
            for v in victims
            if v.backend in self.backends and self.queued_jobs.get(v.backend, 0) > 0
        )
        limit = self.config.max_patience_s
        patience = min(self.config.patience_factor * switch, limit)
        # Held by a stream until ``released``, it was blocked only from then: its patience
        # counts from there (never past ``max_patience_s`` from when it was first blocked).
        patient_since = max(since, released)
        barrier.forced = self.now - patient_since >= patience or waited >= limit or not any(
            self.queued_jobs.get(v.backend, 0) for v in victims
        )
        if not barrier.forced:
            due = min(patient_since + patience, since + limit)
            if self.revisit_at is None or due < self.revisit_at:
                self.revisit_at = due
        self._add_barrier(barrier)
        for v in victims:
            if barrier.forced:
                self._settle(("job", v.backend), f"its worker leaves GPU{g} for {job.job_id}")
        pending = self.stopping_count[g] + len(victims)
        what = (f"listens on {info.address}, {also}'s address" if also else "runs alone"
                if alone else f"needs {need} MiB")
        if not victims:
            reason = f"waiting for {_plural(pending, 'worker')} to stop on GPU{g}"
        elif barrier.forced:
            leave = "leaves" if len(victims) == 1 else "leave"
            reason = f"{what}: {_plural(len(victims), 'worker')} {leave} GPU{g} for it"
        else:
            left = min(patient_since + patience, since + limit) - self.now
            reason = (f"{what}: hot work on GPU{g} goes on for up to {left:.0f} s "
                      "more before the switch")
        self.explicit[job.job_id] = reason
        self._settle(barrier_key, reason)

    def _undo_loads(self) -> None:
        """A stream's request that needs the room of a worker still loading for jobs of
        lower priority, room that evicting our idle workers there could not make (a load
        given up is a load thrown away, and a 30 s load was given up a second before its
        end, where an idle chat model could leave; a busy one does not count, its job may be
        long), gives that load up: the worker stops, its jobs go back to the queue (they run
        once their turn comes again, the stream's hold deciding when), and the request waits
        for its own model's reload (or wake, or nothing: its worker there, asleep or idle,
        needs that room for the job) rather than for the load, a job and that reload (unless
        its target wait covers that: ``_may_wait_until``). Only for a request of a
        stream above those jobs that is alive (it just came; or one that waited for the
        load as its target allowed, past that): a stream the hold took as ended but was
        not, the mistake undone while it is still cheap; or for its backend's first
        requests of a priority above them (no stream yet: its priority says it goes first,
        and it waited for a load, a job and its reload); and not
        once those jobs have waited ``max_patience_s``, as the hold holds them no longer (a
        stream that never ends would starve them).

        The request must be the next to take that room, as the walk will decide: priorities
        are compared aged, as the walk orders them (a load for jobs aged above the request is
        theirs), and no job ahead of it in that order waits for room on that GPU (the room
        would be that job's). Either way the load given up would be started again by the
        walk, beside the job that waits, and given up again at every step."""
        exp = self.expected
        loading = [(w, raw, self._load_effective(raw, w.loading_submitted_at))
                   for ws in self.live_on.values() for w in ws
                   if (raw := w.loading_for) is not None]
        if exp is None or not loading:
            return
        lowest = min(aged for _, _, aged in loading)
        on = {w.gpu for w, _, _ in loading}
        claimed: set[int] = set()  # GPUs where a job ahead waits for room
        kept_for: dict[str, float] = {}  # a load kept -> what its keepers' queues take
        # Backends whose jobs fit (or will) beside what loads, or wait for room (their GPUs
        # claimed): their later jobs change nothing. Once all that could are seen, done. A
        # live worker's job waits for room too, where its worker is: to wake it, or to run
        # beside its jobs (a free slot, but no room for one more job's memory).
        seen: set[str] = set()
        unseen = {b for (_, b), n in self.snapshot.queued_counts.items() if n > 0}
        for run in ordered_runs(self.snapshot.queue, self.now, self.config.aging_interval_s):
            for job in run:
                effective = self._effective(job)
                if effective <= lowest or on <= claimed or not unseen:
                    return  # (nor anything after it: it could give up no load)
                info = self.backends.get(job.backend)
                if info is None or (job.backend in seen and job.kind != "calibration"):
                    continue  # (nothing new)
                seen.add(job.backend)
                unseen.discard(job.backend)
                where = None if job.kind == "calibration" else self.worker_gpu.get(job.backend)
                if where is not None:
                    if job.backend not in self.asleep and self.slots.get(job.backend, 0) <= 0:
                        continue  # (it waits for its worker, not for room)
                    allowed, need = [where], self._hot_need(job.backend, info)
                elif not info.measured or job.kind == "calibration":
                    claimed.update(self._allowed(info))  # (it would take a GPU whole)
                    continue
                else:
                    allowed, need = self._allowed(info), info.holds_mib(1)
                if any(self.budget[g] + self.stopping_mib[g] >= need for g in allowed):
                    continue  # it fits (or will) beside what loads
                if job.kind == "job" and job.priority > lowest and self._undo_load_for(
                        job, effective, need, allowed, loading, claimed, kept_for):
                    continue  # (a load it may wait for: a request behind it may not)
                claimed.update(allowed)

    def _undo_load_for(self, job: QueuedJob, effective: int, need: int, allowed: list[int],
                       loading: list[tuple[WorkerInfo, int, int]], claimed: set[int],
                       kept_for: dict[str, float]) -> bool:
        """Give up one load (see ``_undo_loads``) that makes ``job``'s room, if any may go;
        True when one would go but ``job`` may wait for it (``_may_wait_until``): then
        ``kept_for`` counts, for that load, what ``job``'s model's reload and queue take,
        which the requests of other models that keep it wait for too."""
        exp = self.expected
        assert exp is not None
        patience = self.config.max_patience_s  # (the hold's bound: past it, nothing holds)
        kept = False
        for w, raw, aged in loading:
            g = w.gpu
            coming = self.budget[g] + self.stopping_mib[g]
            if (aged >= effective or g not in allowed or g in claimed
                    or w.backend in self.evicted
                    or (w.loading_since is not None
                        and self.now - w.loading_since >= patience)
                    or coming + w.reserved_mib < need
                    or self._room_once_idle_leave(g, but=job.backend) >= need):
                continue
            if self._held_beside_once_gone(job, w, need):
                continue  # (a stream would hold it beside: nobody would take that room)
            may_wait = self._may_wait_until(job, w, raw, kept_for.get(w.backend, 0.0))
            if may_wait is not None:
                deadline, takes_s = may_wait
                if self.now < deadline:
                    kept = True  # (the plan looks again then)
                    kept_for[w.backend] = kept_for.get(w.backend, 0.0) + takes_s
                    if self.revisit_at is None or deadline < self.revisit_at:
                        self.revisit_at = deadline
                    continue
            elif exp.asked_above(job.backend, raw, self.now) is None:
                continue  # (a stream taken as ended)
            self._evict([w], g, f"{job.job_id} ({job.backend}, priority {job.priority}) "
                         "needs its room: its load is given up", requeue=True,
                        given_up_for=job.backend)
            self.live_on[g].remove(w)
            self.worker_gpu.pop(w.backend, None)
            self.slots.pop(w.backend, None)
            self.stopping.add(w.backend)
            return False
        return kept

    def _may_wait_until(self, job: QueuedJob, w: WorkerInfo, raw: int, before_s: float
                        ) -> tuple[float, float] | None:
        """Until when ``job`` (a stream's request, the first of its backend's queued ones
        in the walk) may wait for the load of ``w`` (for jobs of priority ``raw``) to go on,
        within its backend's target wait, and how long its model then takes (its reload and
        queued jobs: other models' requests that keep the load wait for that too); None
        when it may not. Till then that load is not given up: the stream allows that wait
        (a chat whose ``target_wait`` of 30 s let a big model in had that load given up at
        each of its requests, and the big model ran nothing while the chat went on).

        What the last of its backend's queued requests waits: the whole load (how much is
        left is not known here), the longest of the loading backend's recent jobs
        (``expect.Expectations.job_longest_s``: nothing is kept before a few have run; a
        guess can be far too short, a 27 s load and job guessed at 2 s each made a chat
        wait 53 s past its 30 s target), ``before_s`` (what requests of other models that
        keep the load take first), the request's model's reload, and its requests ahead
        (each its longest recent job, else its mean; the load is not kept for a queue of a
        model none of whose jobs has run). Counted from its earliest queued request. A
        load still going once that request has waited all but the rest is given up then
        (its mean taken short), whether or not its stream is taken as ended by then; so it
        is kept only if it could still be given up then (its jobs not aged to the
        request's priority, their patience not spent). Only for a request of a stream that
        was alive when it came, or of its backend's first requests (``lone``): a target
        covers those too."""
        exp = self.expected
        loading, mine = self.backends.get(w.backend), self.backends.get(job.backend)
        longest = None if exp is None or loading is None else \
            exp.job_longest_s.get(loading.name)
        if (exp is None or loading is None or mine is None or longest is None
                or exp.asked_above(job.backend, raw, job.submitted_at) is None):
            return None
        load = loading.reload_cost_s
        given = exp.given_up.get(loading.name)
        if given is not None:
            load = max(load, given.loaded_s)
        ahead = self.queued_jobs.get(mine.name, 1) - 1
        each = exp.job_longest_s.get(mine.name, exp.job_s.get(mine.name))
        if each is None and ahead > 0:
            return None
        queue_s = ahead * (each or 0.0) / max(1, mine.concurrency)
        back = 0.0 if mine.name in self.worker_gpu and mine.name not in self.asleep else \
            self._undo_s(mine, mine.name in self.asleep)  # (its reload, wake, or none)
        rest = longest + before_s + back + queue_s
        target = exp.target(job.backend)
        first = self._queued(mine.name)[0]
        deadline = first + target - rest
        aging = self.config.aging_interval_s
        if (load + rest > target
                or self._load_effective(raw, w.loading_submitted_at, deadline)
                >= job.priority + aging_bonus(job.submitted_at, deadline, aging)
                or (w.loading_since is not None
                    and deadline - w.loading_since >= self.config.max_patience_s)):
            return None
        return deadline, mine.reload_cost_s + queue_s + (each or 0.0) / max(1, mine.concurrency)

    def _queued(self, backend: str) -> tuple[float, int]:
        """When the earliest of ``backend``'s queued jobs was submitted, and the highest
        aged priority among them (found once a plan: the walk's first of them may be a later
        one of higher priority); ``(inf, -inf)`` when none is queued."""
        if self._queued_by is None:
            self._queued_by = {}
            for q in self.snapshot.queue:
                if q.kind == "job":
                    first, top = self._queued_by.get(q.backend, (math.inf, -math.inf))
                    self._queued_by[q.backend] = (min(first, q.submitted_at),
                                                  max(top, self._effective(q)))
        return self._queued_by.get(backend, (math.inf, -math.inf))

    def _doomed(self, job: QueuedJob, info: BackendInfo, gpus: list[int], need: int) -> bool:
        """A load for ``job`` (taking ``need`` on one of ``gpus``: the GPU where it fits now,
        or those where it would wait for room, the one with most room first) that a stream's
        next request would give up
        (see ``_undo_loads``) waits for a better moment, when one comes
        (``expect.Expectations.gives_up``: a load of its backend was given up for that
        stream before; each stream remembered for it is asked, the newest first: two streams
        taking turns would otherwise let a load that waited out one's request land in the
        other's); settles it and says so. Only where that request would need its room
        on each of ``gpus`` (``_takes_room``): not in the room a barrier leaves (the job
        first in line there, walked before, does not need it); not while the stream's model
        has a worker that will still be there when the request comes (the request runs on
        it: no load is given up for it), unless it is in the room a load needs; nor once
        ``job`` has waited ``max_patience_s``: then no load is given up. Its ``need`` stays
        its own meanwhile on that first GPU (a barrier that evicts nothing): work
        behind it takes only the room it does not need, as the load would have left it (a
        long job that took that room instead could not be given up for the request, which
        would wait for it: a review's trace, 4 s to 19 s)."""
        exp = self.expected
        given = None if exp is None or job.kind != "job" else exp.given_up.get(info.name)
        if given is None or any(g in self.barriers for g in gpus):
            return False  # (beside a barrier: in room the job first in line does not need)
        assert exp is not None
        since = job.submitted_at if job.blocked_since is None else job.blocked_since
        if self.now - since >= self.config.max_patience_s:
            return False
        for name in reversed(given.by):  # (the newest first)
            by = self.backends.get(name)
            if by is not None and self._dooms(job, info, gpus, need, by):
                return True
        return False

    def _dooms(self, job: QueuedJob, info: BackendInfo, gpus: list[int], need: int,
               by: BackendInfo) -> bool:
        """``_doomed`` for one stream's backend that gave a load of ``info`` up before."""
        exp = self.expected
        assert exp is not None
        if not all(self._takes_room(by, g, need) for g in gpus):
            return False
        # A request of it that needs room (no live worker: it stops, or left) is queued
        # above this job: it was walked first, and could not start (a job of it of this
        # job's priority or below is no such request, and gives no load up: held for it,
        # this load kept the room it waited behind, and nothing ran for 9 s in the
        # admission soak).
        live = self.worker_gpu.get(by.name)
        effective = self._effective(job)
        waiting = live is None and self._queued(by.name)[1] > effective
        stream = exp.gives_up(info.name, by.name, effective, self.now, info.reload_cost_s,
                              waiting=waiting,
                              served_s=lambda s: self._served_s(by, s))
        if stream is None:
            return False
        # Its worker stays for the request, where the load takes none of its room: on
        # another GPU, or beside the load (the load fits now).
        g = max(gpus, key=lambda i: (self.budget[i], -i))
        if self._stays(by, stream) and (live not in gpus or self.budget[g] >= need):
            return False
        due = max(stream.overdue_at, self.now + MIN_REVISIT_S)  # (its request plans anew)
        if self.revisit_at is None or due < self.revisit_at:
            self.revisit_at = due
        reason = (f"waits: a request of {stream.backend} needs the room of its load first"
                  if waiting else
                  f"waits: {stream.backend} expects a request within "
                  f"{max(stream.due_in(self.now), 0.1):.1f} s, which would take the room of "
                  "its load")
        self.explicit[job.job_id] = reason
        self._settle(key_of(job), reason)
        self._add_barrier(_Barrier(job, g, effective, [], max(0, self.budget[g] - need),
                                   False, job.passed))
        return True

    def _takes_room(self, by: BackendInfo, g: int, need: int) -> bool:
        """Whether a request of ``by`` that needs its model loaded would need the room a
        load taking ``need`` on ``g`` holds (as ``_undo_loads`` asks before giving a load
        up): ``by`` may use ``g``, fits on none of its other GPUs now (or once what stops
        there has gone), nor beside the load once the idle workers on ``g`` have left."""
        allowed = self._allowed(by)
        if g not in allowed:
            return False
        if not by.measured:
            return True  # (it takes a GPU whole)
        want = by.holds_mib(1)
        if any(self.budget[o] + self.stopping_mib[o] >= want for o in allowed if o != g):
            return False
        return self._room_once_idle_leave(g) - need < want

    def _room_once_idle_leave(self, g: int, *, but: str | None = None) -> int:
        """What ``g`` has for a newcomer once what stops there has gone and its idle workers
        (but ``but``'s: the newcomer's own, which its job needs) have left."""
        return self.budget[g] + self.stopping_mib[g] + sum(
            w.reserved_mib for w in self.live_on[g] if w.backend != but and self._evictable(w))

    def _stays(self, by: BackendInfo, stream: expect.Stream) -> bool:
        """Whether ``by`` has a worker that its keep-alive will not unload before
        ``stream``'s next request is due."""
        if by.name not in self.worker_gpu:
            return False
        w = self.snapshot.workers.get(by.name)
        return w is None or w.leaves_at is None or \
            w.leaves_at > self.now + stream.due_in(self.now)

    def _served_s(self, by: BackendInfo, stream: expect.Stream) -> float:
        """How long ``stream``'s next request (of ``by``) takes from its arrival to its
        job's end: its job's time, and its model's reload unless a worker of it stays
        (``_stays``: one that its keep-alive unloads before the request is due reloads for
        it, and the moment after that request is no better: the reload takes it)."""
        exp = self.expected
        assert exp is not None
        job_s = exp.job_time(by.name, 0.0)
        return job_s if self._stays(by, stream) else job_s + by.reload_cost_s

    def _load_effective(self, loading_for: int, submitted_at: float | None,
                        at: float | None = None) -> int:
        """The aged priority of the jobs a worker loads for (``WorkerInfo.loading_for``), at
        most: aged, as in the queue, since the first of them was submitted (until now, or
        ``at``)."""
        if submitted_at is None:
            return loading_for
        return loading_for + aging_bonus(submitted_at, self.now if at is None else at,
                                         self.config.aging_interval_s)

    def _has_work(self, backend: str) -> bool:
        """Work of ``backend`` waits or is expected: queued jobs, or a stream alive."""
        if self.queued_jobs.get(backend, 0) > 0:
            return True
        exp = self.expected
        return exp is not None and exp.alive(backend, self.now)

    def _stream_hold(self, job: QueuedJob, info: BackendInfo, victims: list[WorkerInfo],
                     sleepers: frozenset[str], waited: float, g: int, *,
                     stays: bool = False) -> expect.Hold:
        """Whether evicting ``victims`` on ``g`` for a blocked job would make the next
        request of a stream above its priority wait beyond its target (``expect.hold``): it
        then waits, for a gap long enough or the stream's end (at most ``max_patience_s``).
        When no stream holds it (``Hold.stream`` None), ``Hold.released_at`` says when the
        streams' holds on it ended (``-inf`` if none did)."""
        exp = self.expected
        limit = self.config.max_patience_s
        if exp is None or waited >= limit:
            return expect.Hold(None)
        name = info.name
        asleep = name in self.asleep
        undo = [(v.backend, 0.0 if stays else
                 self._undo_s(self.backends[v.backend], v.backend in sleepers))
                for v in victims if v.backend in self.backends]
        # Before any of its backend's jobs has run, a job that needs its victims' room is
        # taken to load and run for ``expect.UNMEASURED_FACTOR`` times the slowest of their
        # reloads and its own, each: a model that needs their room is no smaller, and taken
        # short (an unmeasured load is 1 s) a gap between bursts looked long enough for it.
        # That guess is only a guess: a gap must be ``expect.UNSURE_MARGIN`` times as long
        # as it says before the job takes it (taken short, the stream's next requests wait
        # the whole overrun), and the hold takes a smaller share of the batch it makes
        # (``expect.GUESSED_SHARE``), while the rest of the hold reads it as it is.
        own = self._undo_s(info, asleep)
        measured = name in exp.job_s
        if not measured:
            own = expect.UNMEASURED_FACTOR * max([own] + [u for _, u in undo])
        load = own if asleep or name not in self.worker_gpu else 0.0
        run_s = load + exp.job_time(name, own)
        batch_s = load + self.queued_jobs.get(name, 1) * exp.job_time(name, own)
        # Other queued work starts on the GPU in this plan, or can (a job further down the
        # walk for another live worker there with a free slot, or one that loads beside), or
        # may be on its way (the job came less than ``expect.MIN_GAP_S`` ago: the rest of a
        # batch submitted at once is, its jobs a few milliseconds apart): holding the job
        # only changes the order. Without that, and with nothing running or starting there
        # either, holding it leaves the GPU idle.
        fresh = self.now - job.submitted_at < expect.MIN_GAP_S
        beside = fresh or any(w.backend != name and self.slots.get(w.backend, 0) > 0
                              and ("job", w.backend) in self.alive for w in self.live_on[g]) \
            or any(s.gpu == g for s in self.starts) or self._loads_beside(g, {name})
        idle = not beside and not any(w.active_jobs or w.state in ("starting", "initializing")
                                      for w in self.live_on[g])
        # When the last of its victims whose work goes before the job's (of at least its
        # priority) and that had no requests above it ended its work: had the streams
        # stopped, the job could not have started before (``expect.hold``).
        prio = self._effective(job)
        free_at = max((self.now if v.idle_since is None else v.idle_since for v in victims
                       if self._goes_first(v.backend, job.priority, prio)
                       and not any(s.priority > prio for s in exp.streams.get(v.backend, ()))
                       and exp.lone_above(v.backend, prio) is None), default=-math.inf)
        return expect.hold(exp, self.now, prio, run_s, undo,
                           since=job.submitted_at, batch_s=batch_s, idle=idle, beside=beside,
                           guessed=not measured, free_at=free_at)

    def _goes_first(self, backend: str, priority: int, effective: int) -> bool:
        """Whether ``backend``'s work goes before a job's of ``priority`` (``effective`` once
        aged): its descriptor's priority is at least that, or a job of it queued is as high
        once aged."""
        info = self.backends.get(backend)
        return (info is not None and info.priority >= priority) or \
            self._queued(backend)[1] >= effective

    def _settle_held(self, job: QueuedJob, held: expect.Hold, since: float) -> None:
        """``job`` waits, held by ``held.stream`` until ``held.until`` (at most
        ``max_patience_s`` from ``since``, when it was first blocked): says why, and when
        to look again."""
        stream = held.stream
        assert stream is not None
        due = min(held.until, since + self.config.max_patience_s)
        if self.now - job.submitted_at < expect.MIN_GAP_S:
            due = min(due, job.submitted_at + expect.MIN_GAP_S)
        if self.revisit_at is None or due < self.revisit_at:
            self.revisit_at = due
        if stream.gaps:
            reason = (f"waits: {stream.backend} expects a request within "
                      f"{max(stream.due_in(self.now), 0.1):.1f} s")
        else:
            reason = (f"waits: {stream.backend} had a request {self.now - stream.last_at:.1f} s "
                      "ago, and may have more")
        self.explicit[job.job_id] = reason
        self._settle(key_of(job), reason)

    def _beside_hold(self, job: QueuedJob, info: BackendInfo, g: int, need: int, *,
                     left: int | None = None, leaving: frozenset[str] = frozenset()
                     ) -> expect.Hold:
        """Whether loading ``job``'s worker on ``g``, where it fits, would take the room
        that the next request of a stream above it needs beside it: an idle worker there
        whose next job would then not fit waits for this load and job as if it had been
        evicted, less its own reload (``_stream_hold``). A chat request waited 4.65 s for a
        4 s load of lower work and its 2 s job, put beside its idle model."""
        if self.expected is None:
            return expect.Hold(None)
        if left is None:
            left = self.budget[g] - need
        beside = [w for w in self.live_on[g]
                  if w.state == "ready" and not w.active_jobs and w.backend in self.backends
                  and w.backend not in self.evicted and w.backend not in leaving
                  and self._next_job_short(w, g, left, leaving)]
        if not beside:
            return expect.Hold(None)
        waited = 0.0 if job.blocked_since is None else self.now - job.blocked_since
        return self._stream_hold(job, info, beside, frozenset(), waited, g, stays=True)

    def _next_job_short(self, w: WorkerInfo, g: int, left: int,
                        leaving: frozenset[str]) -> bool:
        """Whether the next job of ``w`` (an idle worker on ``g``) would find no room there
        with ``left`` MiB free: not even once what stops there has gone and the idle workers
        beside it (not ``w``, nor those already counted as ``leaving``) have left, as its
        request would evict them rather than wait (as ``_undo_loads`` reads the room)."""
        spare = self.stopping_mib[g] + sum(
            v.reserved_mib for v in self.live_on[g]
            if v is not w and v.backend not in leaving and self._evictable(v))
        return left + spare < self.backends[w.backend].need_mib(0)

    def _held_beside_once_gone(self, job: QueuedJob, w: WorkerInfo, need: int) -> bool:
        """Whether ``job`` would be held beside a stream's idle worker on ``w``'s GPU
        (``_beside_hold``) once the load of ``w`` is given up: then giving it up frees room
        that nobody takes, its jobs load again, and are given up again (a loop). (``w``
        stays among the GPU's workers: its jobs, back in the queue, could load there, so
        the hold does not read the GPU as idle, as the walk will not.)"""
        info = self.backends.get(job.backend)
        if info is None or self.expected is None:
            return False
        g = w.gpu
        self.budget[g] += w.reserved_mib
        try:
            return self.budget[g] >= need and \
                self._beside_hold(job, info, g, need).stream is not None
        finally:
            self.budget[g] -= w.reserved_mib

    def _blocked_since(self, job: QueuedJob) -> float:
        """When ``job`` was first found blocked (now, if it is now: the plan says so)."""
        since = job.blocked_since
        if since is None:
            since = self.blocked[job.job_id] = self.now
        return since

    def _loads_beside(self, g: int, leaving: set[str]) -> bool:
        """Whether a queued job of a backend with no worker (none of ``leaving``) could load
        on ``g`` now, in the room it has without evicting anyone."""
        for name, n in self.queued_jobs.items():
            info = self.backends.get(name)
            if (n > 0 and name not in leaving and name not in self.worker_gpu
                    and info is not None and info.peak_mib is not None
                    and ("job", name) in self.alive and g in self._allowed(info)
                    and g not in self.exclusive and self.budget[g] >= info.holds_mib(1)):
                return True
        return False

    def _above_running(self, job: QueuedJob, gpus: list[int]) -> bool:
        """Whether jobs run on ``gpus``, all of a priority below ``job``'s."""
        running = [w.running_priority for g in gpus for w in self.live_on[g]
                   if w.running_priority is not None]
        return bool(running) and max(running) < job.priority

    def _target(self, backend: str) -> float:
        """How long a request of ``backend`` may be made to wait (``expect.Expectations``)."""
        exp = self.expected
        return exp.target(backend) if exp is not None else expect.DEFAULT_TARGET_WAIT_S

    @staticmethod
    def _undo_s(info: BackendInfo, asleep: bool) -> float:
        return info.wake_cost_s if asleep else info.reload_cost_s

    def _batch_waits(self, w: WorkerInfo, g: int) -> bool:
        """An idle victim's batch goes on soon: its next job may pass the barrier and only
        waits for memory, which comes back once the jobs running on its GPU end (a patient
        barrier keeps it)."""
        info = self.backends.get(w.backend)
        if info is None:
            return False
        exp = self.expected
        if exp is not None and w.backend not in self.queued_jobs:
            # A stream of at least the barrier's priority whose next request is due before
            # it could be loaded again keeps it too.
            barrier = self.barriers[g]
            stream = next((s for s in exp.streams.get(w.backend, ())
                           if s.priority >= barrier.effective and s.alive(self.now)), None)
            if stream is not None and stream.due_in(self.now) <= info.reload_cost_s:
                return True
        if w.backend not in self.waiting_victims:
            return False
        return info.need_mib(0) <= self.budget[g] + self._returning(g, None)

    def _returning(self, g: int, own: str | None) -> int:
        """What the jobs running on ``g`` give back when they end (their activation and
        safety; what a worker holds beyond its figures too). Not a worker's that still loads:
        its jobs have not begun, and give nothing back before its load and their runs."""
        back = 0
        for w in self.live_on[g]:
            info = self.backends.get(w.backend)
            if w.active_jobs and w.backend != own and info is not None and info.measured \
                    and w.state not in ("starting", "initializing"):
                back += max(0, w.reserved_mib - info.idle_mib)
        return back

    def _add_barrier(self, barrier: _Barrier) -> None:
        self.barriers[barrier.gpu] = barrier
        if self.first_barrier is None:
            self.first_barrier = barrier
        self._sweep()

    def _option(
        self, g: int, need: int, *, alone: bool, own: str | None, also: str | None = None
    ) -> tuple[float, list[evict.Candidate], int] | None:
        """Cheapest way to make ``need`` fit on ``g``: (cost, victims, room after).

        Victims are live workers that may leave: idle ones now, busy ones once their jobs
        end (idle first, then the cheapest); ``also`` leaves whatever the sizes (its server
        holds the address the job's must listen on).
        """
        gpu = self.gpus[g]
        if g in self.closed or (self.planned_on[g] and (alone or g in self.exclusive)):
            return None
        cands = [
            c for c in self._candidates(g) if c.worker.backend != own and self._may_leave(c.worker)
        ]
        if alone:
            cands = [c.stopped() for c in cands]  # an empty GPU: nobody may stay asleep
            if len(cands) != len(self.live_on[g]):
                return None  # something there cannot leave
            return (sum(c.cost for c in cands), cands, gpu.usable_mib)
        have = self.budget[g] + self.stopping_mib[g]
        mandatory: list[evict.Candidate] = []
        # An unmeasured worker holds the GPU alone, or a server the job's address: it must go
        # whatever the sizes.
        for holder in sorted({self.exclusive.get(g), also} - {None, own}):
            holder_cand = next((c for c in cands if c.worker.backend == holder), None)
            if holder_cand is None:
                return None
            cands.remove(holder_cand)
            holder_cand = holder_cand.stopped()
            mandatory.append(holder_cand)
            have += holder_cand.frees_mib
        rest = evict.choose(cands, have, need, self.host_room)
        if rest is None:
            return None
        chosen = mandatory + rest
        room = have + sum(c.frees_mib for c in rest) - need
        return (sum(c.cost for c in chosen), chosen, room)

    def _resolve(self) -> None:
        """After the walk: make room for strangers on over-committed GPUs, evict the idle
        victims whose batch did not go on, and the idle workers of draining GPUs."""
        for g in self.gpu_ids:
            self._room_for_others(g)
        for g, barrier in self.barriers.items():
            idle = [v for v in barrier.victims if self._evictable(v)
                    and not (not barrier.forced and self._batch_waits(v, g))
                    and not self._stream_keeps(v, barrier)]
            if idle:
                self._evict(idle, g, barrier.why, barrier.sleepers)
        for g in self.gpu_ids:
            gpu = self.gpus[g]
            if gpu.draining:
                idle = [w for w in self.live_on[g] if self._evictable(w)]
                if idle:
                    self._evict(idle, g, gpu.closed_why or f"GPU{g} is draining")
            if gpu.closed_why:  # yielded: handed over now, so a load (or wake) there is
                # given up and its jobs wait (a draining GPU lets it finish and run them)
                loading = [w for w in self.live_on[g] if w.state in ("starting", "initializing")
                           and w.backend not in self.evicted]
                if loading:
                    self._evict(loading, g, f"{gpu.closed_why}: its load is given up",
                                requeue=True)

    def _stream_keeps(self, w: WorkerInfo, barrier: _Barrier) -> bool:
        """An idle victim whose stream above the barrier's priority is alive (or that had
        its first request of such a priority less than ``max_patience_s`` ago: more may
        come) stays while another victim still runs a job: the barrier needs that one's room
        too, so evicting it now gains nothing but leaves the stream's next request, if it
        comes meanwhile, to wait for the barrier's load and run and its reload (it leaves
        with the last)."""
        exp = self.expected
        if exp is None:
            return False
        if exp.stream_above(w.backend, barrier.effective, self.now) is None:
            lone = exp.lone_above(w.backend, barrier.effective)
            if lone is None or self.now - lone.last_at >= self.config.max_patience_s:
                return False
        return any(v.active_jobs for v in barrier.victims if v is not w)

    def _room_for_others(self, g: int) -> None:
        """``g`` over-committed (what our workers hold plus strangers' memory exceeds the
        device): evict idle workers, cheapest to undo first, until it fits; running jobs are
        never touched (what they hold comes back when they end)."""
        gpu = self.gpus[g]
        if not gpu.foreign_mib:
            return
        have = gpu.total_mib - self.reserved[g] - gpu.foreign_mib + self.stopping_mib[g]
        if have >= 0:
            return
        idle = [c for c in self._candidates(g) if self._evictable(c.worker)]
        chosen = evict.choose(idle, have, 0, self.host_room)
        if chosen is None:
            chosen = [c.stopped() for c in idle]  # not enough idle: all of them, and wait
        reason = f"others hold {gpu.foreign_mib} MiB of GPU{g}"
        self._evict([c.worker for c in chosen], g, reason,
                    frozenset(c.worker.backend for c in chosen if c.sleep), others=True)

    def _evict(self, workers: list[WorkerInfo], g: int, reason: str,
               sleepers: frozenset[str] = frozenset(), *, others: bool = False,
               requeue: bool = False, given_up_for: str | None = None) -> None:
        """Stop ``workers`` on ``g`` (those named in ``sleepers`` are put to sleep; with
        ``requeue``, loading ones whose jobs go back to the queue, for a request of
        ``given_up_for`` if given)."""
        for w in workers:
            info = self.backends.get(w.backend)
            why = reason
            if info is not None and info.pinned and not info.holds_pin:
                why += ("; it is pinned, but its footprint is unknown: pinned once a job of "
                        "it is measured, or give it vram:")
            if w.backend in sleepers and info is not None:
                frees = max(0, w.reserved_mib - info.sleep_residual_mib)
                self.evictions.append(Evict(w.backend, g, frees, why, sleep=True,
                                            others=others))
                self.host_room -= info.sleep_host_mib
                self._settle(("job", w.backend), "its worker is going to sleep")
            else:
                frees = w.reserved_mib
                self.evictions.append(Evict(w.backend, g, frees, why, others=others,
                                            requeue=requeue, given_up_for=given_up_for))
                self._settle(("job", w.backend), "worker stopping")
            self.evicted.add(w.backend)
            self.stopping_mib[g] += frees
            self.stopping_count[g] += 1

    def _sweep(self) -> None:
        """Settle every key whose next job cannot start any more, whatever its priority.

        Budgets only shrink and barriers only appear during a walk, so a verdict stays true
        for the rest of it; this only ends the walk early.
        """
        for key in list(self.alive):
            kind, name = key
            info = self.backends.get(name)
            if info is None or kind != "job":
                continue
            g = self.worker_gpu.get(name)
            if g is not None:
                need = self._hot_need(name, info)
                if g in self.closed:
                    self._settle(key, self.closed[g])
                elif need > 0 and self.budget[g] < need:
                    barrier = self.barriers.get(g)
                    if barrier is not None:
                        self._settle(key, self._short(need, g))
                continue
            if info.peak_mib is None:
                continue
            need = info.holds_mib(1)
            allowed = self._allowed(info)
            if any(self.budget[i] >= need and i not in self.exclusive for i in allowed):
                continue
            feasible = [i for i in allowed if self._ever_fits(i, need)]
            if feasible and all(i in self.barriers for i in feasible):
                self._settle(key, self._behind(self.barriers[feasible[0]]))

    # ----------------------------------------------------------------- helpers

    def _allowed(self, info: BackendInfo) -> list[int]:
        ids = self.gpu_ids if info.allowed_gpus is None else sorted(
            g for g in set(info.allowed_gpus) if g in self.gpus
        )
        return [g for g in ids if g not in self.closed]

    def _no_gpu(self, info: BackendInfo) -> str:
        ids = self.gpu_ids if info.allowed_gpus is None else sorted(
            g for g in set(info.allowed_gpus) if g in self.gpus
        )
        if ids:
            return "; ".join(self.closed[g] for g in ids)
        return f"{info.name} allows no GPU that is present"

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
            if info is not None and info.holds_pin:
                return True
        return False

    def _ever_fits(self, g: int, need: int) -> bool:
        """Could ``need`` (a measured cold job) fit on ``g`` once every worker that may leave
        has left?"""
        gpu = self.gpus[g]
        return need <= gpu.usable_mib - self.pinned_floor[g] - gpu.foreign_mib

    def _may_leave(self, w: WorkerInfo) -> bool:
        """A worker that a barrier may wait for: idle, running or starting, not pinned, not
        given a job in this plan."""
        if w.state == "stopping":
            return False
        if w.backend in self.used or w.backend in self.evicted:
            return False
        info = self.backends.get(w.backend)
        return info is None or not info.holds_pin

    def _evictable(self, w: WorkerInfo) -> bool:
        """Idle and free to leave; or loading for nobody (its jobs went, a cancel, none of its
        backend waits): a load nobody waits for never keeps a job from its room."""
        if w.active_jobs or not self._may_leave(w):
            return False
        return w.state in ("ready", "asleep") or (
            w.state in ("starting", "initializing")
            and not self.queued_jobs.get(w.backend, 0))

    def _candidates(self, g: int) -> list[evict.Candidate]:
        """Every live worker on ``g`` as a candidate to leave it: put to sleep where it may
        sleep (see ``evict``), else stopped."""
        out = []
        for w in self.live_on[g]:
            info = self.backends.get(w.backend)
            # Queued work (or a stream alive): it would be loaded again soon.
            factor = evict.QUEUED_WORK_FACTOR if self._has_work(w.backend) else 1.0
            cost = evict.eviction_cost(w, info, self.now) * factor  # queued: back soon
            priority = 0 if info is None else info.priority
            if info is not None and evict.may_sleep(w, info, self.host_room):
                wake = evict.eviction_cost(w, info, self.now, info.wake_cost_s) * factor
                out.append(evict.Candidate(w, wake, priority, True, info.sleep_residual_mib,
                                           info.sleep_host_mib, cost))
            else:
                out.append(evict.Candidate(w, cost, priority, stop_cost=cost))
        out.sort(key=lambda c: c.order)
        return out

    def _behind(self, barrier: _Barrier) -> str:
        return f"behind {barrier.job.job_id} (waiting for memory on GPU{barrier.gpu})"

    def _short(self, need: int, g: int) -> str:
        return f"needs {need} MiB, {max(self.budget[g], 0)} free on GPU{g}"

    def _never(self, info: BackendInfo, need: int, allowed: list[int]) -> str:
        largest = max(allowed, key=lambda i: (self.gpus[i].usable_mib, -i))
        gpu = self.gpus[largest]
        usable = gpu.usable_mib
        if need <= usable:
            what = "pinned workers and foreign processes" if gpu.foreign_mib else \
                "pinned workers"
            return f"{info.name} needs {need} MiB but {what} leave too little on every " \
                "allowed GPU"
        return (
            f"{info.name} needs {need} MiB but the largest allowed GPU (GPU{largest}) has "
            f"{usable} MiB usable"
        )
