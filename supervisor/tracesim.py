"""A trace replayed through the real scheduler, on simulated time: hours in milliseconds.

A ``Trace`` names GPUs, backends (load time, resident and activation memory, safety,
concurrency) and jobs (arrival, backend, duration, priority). ``simulate`` plays it as the
engine does: at every event — an arrival, a worker ready, a job's end, a worker gone, a
barrier's patience running out (``Plan.revisit_at``), a keep-alive expiring — it builds the
inputs with the engine's own ``admission.decide_inputs`` (the memory ledger's book, from what
each worker really holds) and applies ``plan()`` (or another policy with the same signature,
for comparisons): evictions stop workers, starts spawn them or dispatch jobs. Reload costs
are learned from the simulated loads exactly as the engine learns them.

The ``Result`` has the makespan, the loads, how busy the GPUs were, each job's wait by
priority and every start in order — what ``bench/trace.py`` prints and what the tests compare
with the engine on the simulated GPU. The simulation also checks that the real memory of
every GPU never exceeds its total (``Result.overcommitted``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .admission import WorkerFacts, decide_inputs, reload_cost_s
from .ledger import Device
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

    def info(self, loads: Sequence[float]) -> BackendInfo:
        return BackendInfo(
            name=self.name, peak_mib=self.resident_mib + self.activation_mib,
            activation_mib=self.activation_mib, safety_mib=self.safety_mib,
            priority=self.priority, allowed_gpus=self.gpus, concurrency=self.concurrency,
            reload_cost_s=reload_cost_s(self.reload_cost_s, loads),
        )


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

    def wait_p(self, priority: int, q: float) -> float:
        waits = sorted(self.waits.get(priority, []))
        if not waits:
            return math.nan
        return waits[min(len(waits) - 1, int(q * len(waits)))]


@dataclass
class _Worker:
    name: str
    backend: str
    gpu: int
    state: str  # starting, ready, busy, stopping
    ready_at: float
    jobs: list[str] = field(default_factory=list)  # running
    pending: list[str] = field(default_factory=list)  # admitted while it starts
    idle_since: float | None = None

    def memory(self, b: TraceBackend) -> int:
        if self.state == "starting":
            return 0
        return b.resident_mib + len(self.jobs) * b.activation_mib


class _Sim:
    def __init__(self, trace: Trace, policy: Policy, config: SchedulerConfig,
                 tick_s: float) -> None:
        self.trace = trace
        self.policy = policy
        self.config = config
        self.tick_s = tick_s
        self.backends = {b.name: b for b in trace.backends}
        self.loads: dict[str, list[float]] = {b.name: [] for b in trace.backends}
        self.workers: dict[str, _Worker] = {}  # backend -> its one worker
        self.queue: list[QueuedJob] = []
        self.jobs = {j.id: j for j in trace.jobs}
        self.started_at: dict[str, float] = {}
        self.events: list[tuple[float, int, str, str]] = []
        self.seq = itertools.count()
        self.generation = itertools.count(1)
        self.starts: list[tuple[float, str, str, int, bool]] = []
        self.busy: dict[int, float] = dict.fromkeys(range(len(trace.gpus)), 0.0)
        self.busy_since: dict[int, float] = {}
        self.overcommitted = False
        self.n_loads = 0
        self.done: set[str] = set()
        self.last_end = 0.0

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
        for w in self.workers.values():
            b = self.backends[w.backend]
            mem = w.memory(b)
            used[w.gpu] += mem
            facts.append(WorkerFacts(
                name=w.name, backend=w.backend, gpu=w.gpu, state=w.state,
                jobs=len(w.jobs) + len(w.pending), observed_mib=mem if w.state != "starting"
                else None, idle_since=w.idle_since))
        devices = [Device(g, total, used[g], max(0, total - used[g]))
                   for g, total in enumerate(self.trace.gpus)]
        infos = {n: b.info(self.loads[n]) for n, b in self.backends.items()}
        snap, _book = decide_inputs(devices, infos, facts, tuple(self.queue))
        p = self.policy(snap, now, self.config)
        for ev in p.evictions:
            w = self.workers.get(ev.backend)
            if w is not None and w.state == "ready" and not w.jobs:
                w.state = "stopping"
                self.push(now + self.backends[w.backend].stop_s, "gone", w.name)
        passed, blocked = dict(p.passed), dict(p.blocked)
        if passed or blocked:
            self.queue = [QueuedJob(q.job_id, q.backend, q.priority, q.seq, q.submitted_at,
                                    passed.get(q.job_id, q.passed), q.kind,
                                    blocked.get(q.job_id, q.blocked_since))
                          for q in self.queue]
        started = set()
        for s in p.starts:
            started.add(s.job_id)
            b = self.backends[s.backend]
            w = self.workers.get(s.backend)
            if s.spawn or w is None:
                w = _Worker(f"{s.backend}#{next(self.generation)}", s.backend, s.gpu,
                            "starting", now + b.load_s)
                self.workers[s.backend] = w
                self.n_loads += 1
                self.push(w.ready_at, "ready", w.name)
            self.starts.append((now, s.job_id, s.backend, s.gpu, s.spawn))
            if w.state == "starting":
                w.pending.append(s.job_id)
            else:
                self.run(w, s.job_id, now)
        if started:
            self.queue = [q for q in self.queue if q.job_id not in started]
        if p.revisit_at is not None and p.revisit_at > now:
            self.push(p.revisit_at, "revisit", "")
        return p

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
                      self.overcommitted, unfinished)

    def handle(self, kind: str, what: str, now: float, seqs: itertools.count[int]) -> None:
        if kind == "arrive":
            j = self.jobs[what]
            self.queue.append(QueuedJob(j.id, j.backend, j.priority, next(seqs), now))
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
            self.last_end = max(self.last_end, now)
            if not w.jobs:
                w.state, w.idle_since = "ready", now
        elif kind == "gone":
            w = self.worker_named(what)
            if w is not None and w.state == "stopping":
                del self.workers[w.backend]

    def expire_keep_alive(self, now: float) -> None:
        for w in self.workers.values():
            b = self.backends[w.backend]
            if (w.state == "ready" and not w.jobs and w.idle_since is not None
                    and now - w.idle_since >= b.keep_alive_s):
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
) -> Result:
    """Replay ``trace`` through ``policy`` (the real ``plan`` unless given)."""
    result = _Sim(trace, policy, config or SchedulerConfig(), tick_s).simulate(max_time)
    result.policy = name
    return result
