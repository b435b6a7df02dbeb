"""A trace replayed through the real scheduler, on simulated time: hours in milliseconds.

A ``Trace`` names GPUs, backends (load time, resident and activation memory, safety,
concurrency, and for a backend whose workers can sleep: its sleep and wake times, what it
keeps on its GPU asleep and takes in host memory) and jobs (arrival, backend, duration,
priority). ``simulate`` plays it as the engine does: at every event — an arrival, a worker
ready, a job's end, a worker gone, asleep or awake, a barrier's patience running out
(``Plan.revisit_at``), a keep-alive expiring — it builds the inputs with the engine's own
``admission.decide_inputs`` (the memory ledger's book, from what each worker really holds)
and applies ``plan()`` (or another policy with the same signature, for comparisons):
evictions stop workers or put them to sleep, starts spawn them, wake them or dispatch jobs.
Reload and wake costs are learned from the simulated loads and wakes exactly as the engine
learns them.

The ``Result`` has the makespan, the loads, the sleeps and wakes, how busy the GPUs were,
each job's wait by priority and every start in order — what ``bench/trace.py`` prints and
what the tests compare with the engine on the simulated GPU. The simulation also checks that
the real memory of every GPU never exceeds its total (``Result.overcommitted``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from .admission import WorkerFacts, decide_inputs, loading_facts, reload_cost_s, wake_cost_s
from .ledger import Device
from .scheduler.expect import Learner
from .scheduler.model import BackendInfo, Plan, QueuedJob, SchedulerConfig, Snapshot
from .scheduler.order import queue_sort_key
from .scheduler.plan import plan as real_plan

Policy = Callable[[Snapshot, float, SchedulerConfig], Plan]


@dataclass(frozen=True, slots=True)
class TraceBackend:
    name: str
    load_s: float  # start to ready
    resident_mib: int  # held from ready until the worker is gone
    activation_mib: int  # held more per running job
    safety_mib: int = 0
    concurrency: int = 1
    priority: int = 0
    gpus: tuple[int, ...] | None = None
    keep_alive_s: float = 300.0
    stop_s: float = 0.05  # eviction to memory gone
    reload_cost_s: float | None = None  # the descriptor's prior (None: the engine's default)
    wake_s: float | None = None  # asleep to ready (None: its workers cannot sleep)
    sleep_s: float = 0.05  # asked to sleep until what it gives back is gone
    residual_mib: int = 300  # what it keeps on its GPU asleep
    host_mib: int = 0  # the host memory its sleep takes
    wake_cost_s: float | None = None  # the descriptor's prior
    target_wait_s: float | None = None  # how long its next request may wait (None: default)
    known_job_s: float | None = None  # its jobs' time, known before the trace (an engine
    # restarted after running them: ``engine.timings``); None: learned from its first job

    def info(self, loads: Sequence[float], wakes: Sequence[float] = ()) -> BackendInfo:
        reload = reload_cost_s(self.reload_cost_s, loads)
        return BackendInfo(
            name=self.name, peak_mib=self.resident_mib + self.activation_mib,
            activation_mib=self.activation_mib, safety_mib=self.safety_mib,
            priority=self.priority, allowed_gpus=self.gpus, concurrency=self.concurrency,
            reload_cost_s=reload, wake_cost_s=wake_cost_s(self.wake_cost_s, wakes, reload),
            sleep_residual_mib=self.residual_mib, sleep_host_mib=self.host_mib,
        )


def exclusive(a: TraceBackend, b: TraceBackend, size_mib: int) -> bool:
    """On a GPU of ``size_mib``, neither can run a job while the other is resident."""
    def peak(x: TraceBackend) -> int:
        return x.resident_mib + x.activation_mib + x.safety_mib

    return peak(a) + b.resident_mib > size_mib and peak(b) + a.resident_mib > size_mib


@dataclass(frozen=True, slots=True)
class TraceJob:
    id: str
    at: float
    backend: str
    duration_s: float
    priority: int = 0


@dataclass(frozen=True)
class Trace:
    name: str
    gpus: tuple[int, ...]  # MiB per GPU
    backends: tuple[TraceBackend, ...]
    jobs: tuple[TraceJob, ...]
    sleep_host_budget_mib: int = 1 << 40  # host memory sleepers may take (default: plenty)

    def backend(self, name: str) -> TraceBackend:
        return next(b for b in self.backends if b.name == name)


@dataclass
class Result:
    trace: str
    policy: str
    makespan_s: float
    loads: int
    busy_fraction: float  # of GPU time with at least one job running
    waits: dict[int, list[float]]  # priority -> each job's wait from arrival to start
    starts: list[tuple[float, str, str, int, bool]]  # (t, job, backend, gpu, spawned)
    overcommitted: bool
    unfinished: list[str] = field(default_factory=list)
    sleeps: int = 0
    wakes: int = 0
    started_at: dict[str, float] = field(default_factory=dict)  # job -> when it ran
    evicted: list[tuple[float, str]] = field(default_factory=list)  # (t, backend) stopped by plan
    given_up: list[tuple[float, str, str]] = field(default_factory=list)  # (t, backend, why):
    # loads given up (``Evict.requeue``), their jobs back in the queue

    def wait_p(self, priority: int, q: float) -> float:
        """The ``q`` quantile of the waits of ``priority`` (nearest rank)."""
        waits = sorted(self.waits.get(priority, []))
        if not waits:
            return math.nan
        return waits[min(len(waits) - 1, max(0, math.ceil(q * len(waits)) - 1))]


@dataclass
class _Worker:
    name: str
    backend: str
    gpu: int
    state: str  # starting, ready, busy, stopping; falling (asleep), asleep, waking
    ready_at: float
    jobs: list[str] = field(default_factory=list)  # running
    pending: list[str] = field(default_factory=list)  # admitted while it starts (or wakes)
    idle_since: float | None = None
    wake_wanted: bool = False  # a job came while it fell asleep
    kept: bool = False  # it slept: it holds what it keeps asleep (also while it stops)

    def memory(self, b: TraceBackend) -> int:
        if self.state == "starting":
            return 0
        if self.state == "asleep" or (self.state == "stopping" and self.kept):
            return b.residual_mib
        return b.resident_mib + len(self.jobs) * b.activation_mib

    def facts(self, b: TraceBackend, now: float, admitted: Sequence[QueuedJob] = (),
              running: Sequence[int] = ()) -> WorkerFacts:
        """This worker as the engine reports it to admission at ``now`` (``admitted``: the
        jobs admitted to it while it loads; ``running``: the priorities of those it runs)."""
        mem = self.memory(b)
        jobs = len(self.jobs) + len(self.pending)
        # (the soonest its keep-alive may unload it: counted from its jobs' end)
        leaves_at = None if not math.isfinite(b.keep_alive_s) else b.keep_alive_s + (
            self.idle_since if self.idle_since is not None and not jobs else now)
        if self.state in ("falling", "asleep"):
            return WorkerFacts(name=self.name, backend=self.backend, gpu=self.gpu,
                               state="asleep", observed_mib=mem, idle_since=self.idle_since,
                               sleep_mib=b.residual_mib, falling=self.state == "falling",
                               leaves_at=leaves_at)
        loading = loading_facts(admitted if self.state == "starting" else ())
        state = "starting" if self.state == "waking" else self.state
        return WorkerFacts(name=self.name, backend=self.backend, gpu=self.gpu, state=state,
                           jobs=jobs, observed_mib=mem if self.state != "starting" else None,
                           idle_since=self.idle_since,
                           can_sleep=b.wake_s is not None and self.state == "ready",
                           **loading._asdict(),
                           running_priority=max(running, default=None),
                           leaves_at=leaves_at)


class _Sim:
    def __init__(self, trace: Trace, policy: Policy, config: SchedulerConfig,
                 tick_s: float, expect: bool) -> None:
        self.trace = trace
        self.learner = Learner() if expect else None
        if self.learner is not None:
            for b in trace.backends:
                if b.known_job_s is not None:
                    self.learner.ran(b.name, b.known_job_s)
        self.targets = {b.name: b.target_wait_s for b in trace.backends
                        if b.target_wait_s is not None}
        self.policy = policy
        self.config = config
        self.tick_s = tick_s
        self.backends = {b.name: b for b in trace.backends}
        self.loads: dict[str, list[float]] = {b.name: [] for b in trace.backends}
        self.wakes: dict[str, list[float]] = {b.name: [] for b in trace.backends}
        self.n_sleeps = 0
        self.workers: dict[str, _Worker] = {}  # backend -> its one worker
        self.queue: list[QueuedJob] = []
        self.jobs = {j.id: j for j in trace.jobs}
        self.started_at: dict[str, float] = {}
        self.events: list[tuple[float, int, str, str]] = []
        self.seq = itertools.count()
        self.generation = itertools.count(1)
        self.starts: list[tuple[float, str, str, int, bool]] = []
        self.evicted: list[tuple[float, str]] = []
        self.given_up: list[tuple[float, str, str]] = []
        self.busy: dict[int, float] = dict.fromkeys(range(len(trace.gpus)), 0.0)
        self.busy_since: dict[int, float] = {}
        self.overcommitted = False
        self.n_loads = 0
        self.done: set[str] = set()
        self.last_end = 0.0
        self.admitted: dict[str, QueuedJob] = {}  # each started job as it was queued

    def push(self, t: float, kind: str, what: str) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, what))

    # -- memory, as the ledger would observe it ----------------------------------------------
    def check_memory(self) -> None:
        used = dict.fromkeys(range(len(self.trace.gpus)), 0)
        for w in self.workers.values():
            used[w.gpu] += w.memory(self.backends[w.backend])
        for g, total in enumerate(self.trace.gpus):
            if used[g] > total:
                self.overcommitted = True

    def busy_mark(self, now: float) -> None:
        running = {w.gpu for w in self.workers.values() if w.jobs}
        for g in self.busy:
            if g in running and g not in self.busy_since:
                self.busy_since[g] = now
            elif g not in running and g in self.busy_since:
                self.busy[g] += now - self.busy_since.pop(g)

    # -- one scheduling step -----------------------------------------------------------------
    def step(self, now: float) -> Plan:
        used = dict.fromkeys(range(len(self.trace.gpus)), 0)
        facts = []
        host = 0
        for w in self.workers.values():
            b = self.backends[w.backend]
            used[w.gpu] += w.memory(b)
            facts.append(w.facts(b, now, [self.admitted[j] for j in w.pending],
                                 [self.jobs[j].priority for j in w.jobs]))
            if w.state in ("falling", "asleep", "waking"):
                host += b.host_mib
        devices = [Device(g, total, used[g], max(0, total - used[g]))
                   for g, total in enumerate(self.trace.gpus)]
        infos = {n: b.info(self.loads[n], self.wakes[n]) for n, b in self.backends.items()}
        expected = None if self.learner is None else self.learner.view(now, self.targets)
        snap, _book = decide_inputs(devices, infos, facts, tuple(self.queue),
                                    sleep_host_room_mib=self.trace.sleep_host_budget_mib - host,
                                    expected=expected)
        p = self.policy(snap, now, self.config)
        for ev in p.evictions:
            w = self.workers.get(ev.backend)
            b = self.backends[ev.backend]
            if w is not None and ev.requeue and w.state == "starting":
                self.given_up.append((now, w.backend, ev.reason))
                if self.learner is not None and ev.given_up_for is not None:
                    self.learner.given_up(w.backend, ev.given_up_for,
                                          now - (w.ready_at - b.load_s))
                self.requeue(w, now)
                continue
            if w is None or w.jobs or w.pending:
                continue
            if ev.sleep and w.state == "ready" and b.wake_s is not None:
                w.state = "falling"
                self.n_sleeps += 1
                self.push(now + b.sleep_s, "asleep", w.name)
            elif w.state in ("ready", "asleep"):
                w.state = "stopping"
                self.evicted.append((now, w.backend))
                self.push(now + b.stop_s, "gone", w.name)
        passed, blocked = dict(p.passed), dict(p.blocked)
        if passed or blocked:
            self.queue = [replace(q, passed=passed.get(q.job_id, q.passed),
                                  blocked_since=blocked.get(q.job_id, q.blocked_since))
                          for q in self.queue]
        started = set()
        for s in p.starts:
            started.add(s.job_id)
            self.admitted[s.job_id] = next(q for q in self.queue if q.job_id == s.job_id)
            b = self.backends[s.backend]
            w = self.workers.get(s.backend)
            if s.spawn or w is None:
                w = _Worker(f"{s.backend}#{next(self.generation)}", s.backend, s.gpu,
                            "starting", now + b.load_s)
                self.workers[s.backend] = w
                self.n_loads += 1
                self.push(w.ready_at, "ready", w.name)
            self.starts.append((now, s.job_id, s.backend, s.gpu, s.spawn))
            if w.state == "asleep":
                self.wake(w, now)
            elif w.state == "falling":
                w.wake_wanted = True
            if w.state in ("starting", "falling", "waking"):
                w.pending.append(s.job_id)
            else:
                self.run(w, s.job_id, now)
        if started:
            self.queue = [q for q in self.queue if q.job_id not in started]
        if p.revisit_at is not None and p.revisit_at > now:
            self.push(p.revisit_at, "revisit", "")
        return p

    def requeue(self, w: _Worker, now: float) -> None:
        """Give ``w``'s load up: it stops, the jobs admitted to it go back to the queue."""
        self.queue.extend(self.admitted[j] for j in w.pending)
        self.queue.sort(key=queue_sort_key)
        w.pending.clear()
        w.state = "stopping"
        self.push(now + self.backends[w.backend].stop_s, "gone", w.name)

    def wake(self, w: _Worker, now: float) -> None:
        wake_s = self.backends[w.backend].wake_s or 0.0
        w.state, w.wake_wanted, w.kept = "waking", False, False
        self.push(now + wake_s, "woken", w.name)

    def run(self, w: _Worker, job_id: str, now: float) -> None:
        job = self.jobs[job_id]
        w.jobs.append(job_id)
        w.state = "busy"
        w.idle_since = None
        self.started_at[job_id] = now
        self.push(now + job.duration_s, "end", job_id)

    def worker_named(self, name: str) -> _Worker | None:
        return next((w for w in self.workers.values() if w.name == name), None)

    # -- the loop ----------------------------------------------------------------------------
    def simulate(self, max_time: float) -> Result:
        for j in sorted(self.trace.jobs, key=lambda j: (j.at, j.id)):
            self.push(j.at, "arrive", j.id)
        seqs = itertools.count(1)
        now = 0.0
        next_tick = math.inf
        while True:
            t_event = self.events[0][0] if self.events else math.inf
            t = min(t_event, next_tick if self.queue else math.inf)
            if t == math.inf or t > max_time:
                break
            now = t
            while self.events and self.events[0][0] <= now:  # one step per instant
                _t, _seq, kind, what = heapq.heappop(self.events)
                self.handle(kind, what, now, seqs)
            self.expire_keep_alive(now)
            self.step(now)
            self.check_memory()
            self.busy_mark(now)
            next_tick = now + self.tick_s
        self.busy_mark(now)
        waits: dict[int, list[float]] = {}
        for j in self.trace.jobs:
            if j.id in self.started_at:
                waits.setdefault(j.priority, []).append(self.started_at[j.id] - j.at)
        first = min((j.at for j in self.trace.jobs), default=0.0)
        makespan = self.last_end - first
        busy = sum(self.busy.values()) / (len(self.trace.gpus) * makespan) if makespan else 0.0
        unfinished = sorted(set(self.jobs) - self.done)
        return Result(self.trace.name, "", makespan, self.n_loads, busy, waits, self.starts,
                      self.overcommitted, unfinished, self.n_sleeps,
                      sum(len(w) for w in self.wakes.values()), dict(self.started_at),
                      list(self.evicted), list(self.given_up))

    def handle(self, kind: str, what: str, now: float, seqs: itertools.count[int]) -> None:
        if kind == "arrive":
            j = self.jobs[what]
            self.queue.append(QueuedJob(j.id, j.backend, j.priority, next(seqs), now))
            if self.learner is not None:
                self.learner.arrived(j.backend, j.priority, now)
            self.queue.sort(key=queue_sort_key)
        elif kind == "ready":
            w = self.worker_named(what)
            if w is None or w.state != "starting":
                return
            b = self.backends[w.backend]
            self.loads[w.backend].append(b.load_s)
            w.state = "ready"
            w.idle_since = now
            for job_id in w.pending:
                self.run(w, job_id, now)
            w.pending.clear()
        elif kind == "end":
            job = self.jobs[what]
            w = self.workers.get(job.backend)
            if w is None or what not in w.jobs:
                return
            w.jobs.remove(what)
            self.done.add(what)
            if self.learner is not None:
                self.learner.ran(job.backend, job.duration_s)
            self.last_end = max(self.last_end, now)
            if not w.jobs:
                w.state, w.idle_since = "ready", now
        elif kind == "gone":
            w = self.worker_named(what)
            if w is not None and w.state == "stopping":
                del self.workers[w.backend]
        elif kind == "asleep":
            w = self.worker_named(what)
            if w is not None and w.state == "falling":
                w.state, w.kept = "asleep", True
                if w.wake_wanted:
                    self.wake(w, now)
        elif kind == "woken":
            w = self.worker_named(what)
            if w is None or w.state != "waking":
                return
            self.wakes[w.backend].append(self.backends[w.backend].wake_s or 0.0)
            w.state = "ready"
            w.idle_since = now
            for job_id in w.pending:
                self.run(w, job_id, now)
            w.pending.clear()

    def expire_keep_alive(self, now: float) -> None:
        for w in self.workers.values():
            b = self.backends[w.backend]
            if (w.state in ("ready", "asleep") and not w.jobs and not w.pending
                    and w.idle_since is not None and now - w.idle_since >= b.keep_alive_s):
                w.state = "stopping"
                self.push(now + b.stop_s, "gone", w.name)


def simulate(
    trace: Trace,
    *,
    policy: Policy = real_plan,
    name: str = "vramtui",
    config: SchedulerConfig | None = None,
    tick_s: float = 0.5,
    max_time: float = 1e7,
    expect: bool = True,
) -> Result:
    """Replay ``trace`` through ``policy`` (the real ``plan`` unless given); with
    ``expect``, the scheduler is told how requests are expected to arrive, learned from the
    arrivals so far as the engine learns them (``supervisor.scheduler.expect``)."""
    result = _Sim(trace, policy, config or SchedulerConfig(), tick_s, expect).simulate(max_time)
    result.policy = name
    return result
