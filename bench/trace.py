"""Scheduling policies on traces: makespan, loads, GPU busy fraction, waits per priority.

Not a test. Run: ``.venv/bin/python bench/trace.py [--engine] [--seed N] [--seeds N]``. Each
trace is replayed by ``supervisor.tracesim`` (the real ``plan()`` and the engine's admission
inputs, on simulated time) under five policies, and a lower bound:

- ``vramtui``: the real scheduler (patience against switch cost, packing, expected arrivals);
- ``no-expect``: the same, told nothing of how requests arrive (the scheduler before issue
  28);
- ``fifo-1``: one job at a time, in submission order, the needed model loaded and idle ones
  evicted (least recently used first) when it does not fit;
- ``vramd``: vramd's rule: one job at a time, priority bands then FIFO, a cold head may be
  passed 3 times by jobs whose model is hot, then it goes; only GPU0 is used;
- ``bound``: a lower bound no policy can beat (see ``lower_bound``).

Traces: the interleaved case of issue 11 (A and B cannot be resident together, C and D fit
beside either; 40 jobs at once), a vramd-like card (6 GiB, ten models of which no two fit
together with a job running, a batch of 100 jobs with loads up to 60 s), a 4-GPU box with
50 backends and bursts, interactive jobs arriving over a batch, and a stream of jobs for ten
smaller models arriving faster than a small card can serve them (there several models fit
together; its bound counts which jobs and loads can share the card, ``packing_bound`` by their
sizes, ``conflict_bound`` pair by pair, and ``reload_bound`` the reloads its arrivals force on
the models that cannot run a job beside each other, found exactly). Issue 28's traces: a chat
model asked every 1.5 s at priority 10 beside a batch at priority 0 of a model that fits
beside it and one that fits beside nothing, and the same batch beside Poisson and bursty
chats; their
ratio is to the bound of a policy that serves the chat at once (``served_bound``).
``--engine-chat`` plays issue 28's trace through the real engine (real simulated workers).
``--seeds N`` also sums the random traces up over N seeds (one seed can flatter a policy).
``--engine`` also runs the interleaved trace through the real engine with simulated workers
(loads 1 s, jobs 0.3 s) and prints its makespan and loads beside the simulator's, with the
engine's measured load times.

Loads given up: two traces of a review in which a stream's requests gave up the load of a
model that needs its room again and again (the hold let the big model evict the chat's, or
the chat model left by its keep-alive), replayed by the real scheduler and by the same
scheduler not told which loads were given up for whom (``forgetful``: as it was before it
remembered them), with loads, loads given up, the chat's waits and the longest wait of the
work below it.

Sleepers: traces whose models can sleep (``@worker_sdk.sleep``/``@wake``), each replayed by
the real scheduler with and without the sleep hooks, makespan, loads and wakes side by side:
the issue's two 9 GiB models on a 12 GiB card taking turns (load 3 s, wake 0.3 s), and four
vLLM-sized models on a 24 GiB card (loads 20-60 s, wakes 0.5-3 s) with requests arriving
interleaved.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from supervisor import arrivals  # noqa: E402
from supervisor.scheduler.model import (  # noqa: E402
    Evict,
    Plan,
    QueuedJob,
    SchedulerConfig,
    Snapshot,
    Start,
)
from supervisor.scheduler.plan import plan  # noqa: E402
from supervisor.tracesim import (  # noqa: E402
    Result,
    Trace,
    TraceBackend,
    TraceJob,
    exclusive,
    simulate,
)

GIB = 1024


# --------------------------------------------------------------------------- baselines


def _plan(starts: Sequence[Start] = (), evictions: Sequence[Evict] = (),
          passed: dict[str, int] | None = None) -> Plan:
    return Plan(tuple(starts), tuple(evictions), MappingProxyType(passed or {}),
                MappingProxyType({}))


def _busy(snap: Snapshot) -> bool:
    return any(w.active_jobs or w.state in ("starting", "initializing", "stopping")
               for w in snap.workers.values()) or any(g.leaving_mib for g in snap.gpus)


def _one(snap: Snapshot, job: QueuedJob, gpus: Sequence[int]) -> Plan:
    """Start ``job`` alone: on its hot worker or spawned where it fits; else evict idle
    workers (least recently used first) on the GPU with the most room, for the next step."""
    info = snap.backends[job.backend]
    w = snap.workers.get(job.backend)
    held = {g.index: sum(x.reserved_mib for x in snap.workers.values() if x.gpu == g.index)
            for g in snap.gpus}
    room = {g.index: g.total_mib - held[g.index] for g in snap.gpus if g.index in gpus}
    if w is not None:
        need, candidates = info.need_mib(0), [w.gpu]
    else:
        need, candidates = info.holds_mib(1), list(room)
    fits = [g for g in candidates if room.get(g, -1) >= need]
    if fits:
        g = max(fits, key=lambda i: room[i])
        return _plan([Start(job.job_id, job.backend, g, w is None, need)])
    g = max((c for c in candidates if c in room), key=lambda i: room[i])
    idle = sorted((x for x in snap.workers.values()
                   if x.gpu == g and x.state == "ready" and x.backend != job.backend),
                  key=lambda x: x.idle_since or 0.0)  # least recently used first
    evictions, freed = [], room[g]
    for x in idle:
        if freed >= need:
            break
        evictions.append(Evict(x.backend, g, x.reserved_mib, "lru"))
        freed += x.reserved_mib
    return _plan(evictions=evictions)


def fifo_one_at_a_time(snap: Snapshot, now: float, config: SchedulerConfig) -> Plan:
    if _busy(snap) or not snap.queue:
        return _plan()
    job = min(snap.queue, key=lambda j: j.seq)
    return _one(snap, job, [g.index for g in snap.gpus])


def vramd_rule(snap: Snapshot, now: float, config: SchedulerConfig, limit: int = 3) -> Plan:
    if _busy(snap) or not snap.queue:
        return _plan()
    order = sorted(snap.queue, key=lambda j: (-j.priority, j.seq))
    head = order[0]
    hot = {name for name, w in snap.workers.items() if w.state == "ready"}
    if head.backend not in hot and head.passed < limit:
        other = next((j for j in order[1:] if j.backend in hot), None)
        if other is not None:
            p = _one(snap, other, [0])
            return _plan(p.starts, p.evictions, {head.job_id: head.passed + 1})
    return _one(snap, head, [0])


# --------------------------------------------------------------------------- lower bound


def lower_bound(trace: Trace) -> float:
    """The largest of bounds that no policy can beat (seconds from the first arrival):

    - each job: its arrival, plus its backend's load unless a load could have finished
      before it arrived, plus its duration;
    - each backend: its first arrival, one load, then its jobs back to back (one worker runs
      ``concurrency`` jobs at once);
    - memory-time: every job holds its backend's peak for its duration, every backend its
      resident for at least one load; all of it must fit in the GPUs' total over the span;
    - on a one-GPU trace, backends that cannot be resident together (pairwise) each need a
      load and their work, one after another; and from any arrival time on, the jobs of those
      backends arriving then or later, one after another, with a load for every backend
      among them but one;
    - ``packing_bound``, ``conflict_bound`` and ``reload_bound``.
    """
    first = min(j.at for j in trace.jobs)
    by = {b.name: b for b in trace.backends}
    work: dict[str, float] = {}
    for j in trace.jobs:
        work[j.backend] = work.get(j.backend, 0.0) + j.duration_s
    bounds = []
    for j in trace.jobs:
        b = by[j.backend]
        load = max(0.0, b.load_s - (j.at - first))
        bounds.append(j.at + load + j.duration_s - first)
    bounds.extend(alone_ends(trace).values())
    area = 0.0
    for name, total in work.items():
        b = by[name]
        area += b.resident_mib * b.load_s + (b.resident_mib + b.activation_mib) * total
    bounds.append(area / sum(trace.gpus))
    bounds.append(packing_bound(trace))
    bounds.append(conflict_bound(trace))
    bounds.append(reload_bound(trace))
    if len(trace.gpus) == 1:
        size = trace.gpus[0]
        # (a backend's jobs run ``concurrency`` at a time: its work over that, one after another)
        serial = {n: w / by[n].concurrency for n, w in work.items()}
        clique = _heaviest_clique(sorted(serial), by, serial, size)
        bounds.append(sum(by[n].load_s + serial[n] for n in clique))
        # With release dates: from any arrival time t on, the clique's jobs arriving then or
        # later run one after another, and all but one of their backends (at most one can
        # be resident at t) must be loaded after t.
        members = set(clique)
        later = sorted((j for j in trace.jobs if j.backend in members), key=lambda j: j.at)
        for i, j in enumerate(later):
            rest = later[i:]
            names_after = {x.backend for x in rest}
            loads = [by[n].load_s for n in names_after]
            bounds.append(j.at - first + sum(x.duration_s / by[x.backend].concurrency
                                             for x in rest)
                          + sum(loads) - max(loads))
    return max(bounds)


def alone_ends(trace: Trace) -> dict[str, float]:
    """When each backend's work could end at the soonest, from the trace's first arrival:
    its first arrival, one load, then its jobs back to back (one worker runs
    ``concurrency`` jobs at once)."""
    first = min(j.at for j in trace.jobs)
    by = {b.name: b for b in trace.backends}
    start: dict[str, float] = {}
    work: dict[str, float] = {}
    for j in trace.jobs:
        start[j.backend] = min(start.get(j.backend, math.inf), j.at - first)
        work[j.backend] = work.get(j.backend, 0.0) + j.duration_s
    return {n: start[n] + by[n].load_s + work[n] / by[n].concurrency for n in work}


def packing_bound(trace: Trace) -> float:
    """On a one-GPU trace, a bound that counts how jobs and loads can share the GPU (0 on
    more GPUs). Weigh each job and load by what it takes of the GPU (a job what admission
    gives it, its peak and safety: the bound holds for the policies that admit by the
    engine's figures, as all of this bench's do; a load its resident): 1 above two thirds of
    it, 1/2 above a third, 0 below; whatever runs at once weighs at most 1 (a dual feasible
    function of bin packing), so the GPU needs at least the weighted sum of their times. From
    any arrival time t on: the jobs arriving then or later, and the loads of their backends
    but those of the (at most two) counted ones that may be resident at t."""
    if len(trace.gpus) != 1:
        return 0.0
    size = trace.gpus[0]
    first = min(j.at for j in trace.jobs)
    by = {b.name: b for b in trace.backends}

    def weight(mib: int) -> float:
        return 1.0 if 3 * mib > 2 * size else 0.5 if 3 * mib > size else 0.0

    best = 0.0
    for t in sorted({j.at for j in trace.jobs}):
        rest = [j for j in trace.jobs if j.at >= t]
        jobs = sum(weight(by[j.backend].resident_mib + by[j.backend].activation_mib
                          + by[j.backend].safety_mib)
                   * j.duration_s for j in rest)
        loads = {n: weight(by[n].resident_mib) * by[n].load_s for n in {j.backend for j in rest}}
        counted = sorted((n for n in loads if loads[n] > 0), key=lambda n: -loads[n])
        resident = max((loads[a] + loads[b] for i, a in enumerate(counted)
                        for b in counted[i + 1:]
                        if by[a].resident_mib + by[b].resident_mib <= size),
                       default=max((loads[n] for n in counted), default=0.0))
        best = max(best, t - first + jobs + sum(loads.values()) - resident)
    return best


Kind = tuple[str, str]  # ("job" or "load", backend)


def conflict_bound(trace: Trace) -> float:
    """On a one-GPU trace with no sleepers (0 otherwise), a bound that counts which jobs and
    loads can never be on the GPU at once. Kinds of work: each backend's jobs, and its
    loads. Two kinds conflict when their figures do not fit the GPU together (a job: its
    peak and safety, as admission gives it; a load: its resident), and a backend's loads and
    its jobs never overlap (one worker per backend). From any arrival time t on, a set of
    pairwise conflicting kinds runs one after another: the work of the jobs arriving then or
    later (over the backend's concurrency), and a load of each of their backends, less the
    loads of those that may be resident at t (the heaviest set of them that fits the GPU
    together; none at the first arrival). The heaviest such set, exactly (two kinds per
    backend, pruned); where ``packing_bound`` halves every job that might share the GPU,
    this counts the pairs that actually cannot."""
    if len(trace.gpus) != 1 or any(b.wake_s is not None for b in trace.backends):
        return 0.0
    size = trace.gpus[0]
    first = min(j.at for j in trace.jobs)
    by = {b.name: b for b in trace.backends}

    def mib(kind: Kind) -> int:
        b = by[kind[1]]
        return b.resident_mib + (b.activation_mib + b.safety_mib if kind[0] == "job" else 0)

    def conflict(x: Kind, y: Kind) -> bool:
        return x[1] == y[1] or mib(x) + mib(y) > size

    def allowance(loads: list[Kind]) -> float:
        """The most load time the backends resident at t could save: a set fitting together."""
        best = 0.0
        for mask in range(1, 1 << len(loads)):
            chosen = [by[loads[i][1]] for i in range(len(loads)) if mask >> i & 1]
            if sum(b.resident_mib for b in chosen) <= size:
                best = max(best, sum(b.load_s for b in chosen))
        return best

    best = 0.0
    for t in sorted({j.at for j in trace.jobs}):
        work: dict[str, float] = {}
        for j in trace.jobs:
            if j.at >= t:
                work[j.backend] = work.get(j.backend, 0.0) + j.duration_s
        kinds = [(("job", n), w / by[n].concurrency) for n, w in work.items()] \
            + [(("load", n), by[n].load_s) for n in work]
        # (nothing is loaded before the first arrival: no allowance there)
        best = max(best, t - first + _heaviest_conflicting(
            kinds, conflict, allowance if t > first else lambda _loads: 0.0))
    return best


def _heaviest_conflicting(kinds: list[tuple[Kind, float]],
                          conflict: Callable[[Kind, Kind], bool],
                          allowance: Callable[[list[Kind]], float]) -> float:
    """The most weight of pairwise conflicting kinds, less the allowance of its loads
    (exact branch and bound, heaviest first)."""
    kinds = sorted(kinds, key=lambda k: -k[1])
    heaviest = 0.0

    def grow(chosen: list[Kind], at: int, weight: float) -> None:
        nonlocal heaviest
        if weight + sum(w for _, w in kinds[at:]) <= heaviest:
            return  # (the allowance only takes away)
        if at == len(kinds):
            heaviest = max(heaviest, weight - allowance([k for k in chosen if k[0] == "load"]))
            return
        kind, w = kinds[at]
        if all(conflict(kind, c) for c in chosen):
            grow([*chosen, kind], at + 1, weight + w)
        grow(chosen, at + 1, weight)

    grow([], 0, 0.0)
    return heaviest


#: The most job-count vectors ``reload_bound`` walks for one set of backends (beyond, the set
#: is left out: the bound stays valid, only less tight).
RELOAD_BOUND_VECTORS = 60_000


def reload_bound(trace: Trace) -> float:
    """On a one-GPU trace with no sleepers (0 otherwise), a bound that counts the reloads the
    arrivals force, which the bounds above cannot: for each maximal set of backends (of
    concurrency 1) whose jobs pairwise cannot run at once, the least makespan of their jobs
    alone, found exactly over every order. It is a relaxation (whatever a policy does with
    the whole trace, restricted to these jobs, is one of the orders it weighs): the jobs run
    one after another, each backend's in arrival order (an exchange argument: swapping two of
    one backend's jobs changes nothing else); a backend stays resident through another's job
    only if its resident fits beside that job's peak and safety with the others kept; a
    backend not resident needs its load before its job, and the load is free when it could
    run beside the job before (a load that cannot run beside a job can neither run during it
    nor end before it, for the backend would then be resident beside it), else it starts
    when that job ends; nothing is loaded before the first arrival. Other backends' memory
    is not counted (that only allows more). A set whose job-count vectors exceed
    ``RELOAD_BOUND_VECTORS`` is left out."""
    if len(trace.gpus) != 1 or any(b.wake_s is not None for b in trace.backends):
        return 0.0
    size = trace.gpus[0]
    by = {b.name: b for b in trace.backends}
    used = {j.backend for j in trace.jobs}
    names = sorted(n for n in used if by[n].concurrency == 1)

    def peak(n: str) -> int:
        return by[n].resident_mib + by[n].activation_mib + by[n].safety_mib

    best = 0.0
    for group in _maximal_exclusive_sets(names, lambda a, b: peak(a) + peak(b) > size):
        vectors = 1
        for n in group:
            vectors *= 1 + sum(1 for j in trace.jobs if j.backend == n)
        if vectors <= RELOAD_BOUND_VECTORS:
            best = max(best, _least_makespan(trace, group, size))
    return best


def _maximal_exclusive_sets(names: list[str], exclusive: Callable[[str, str], bool]
                            ) -> list[list[str]]:
    """Every maximal set of ``names`` pairwise ``exclusive`` (Bron-Kerbosch, no pivot: the
    backends of one trace are few)."""
    found: list[list[str]] = []

    def grow(chosen: list[str], candidates: list[str], excluded: list[str]) -> None:
        if not candidates and not excluded:
            found.append(chosen)
            return
        for i, n in enumerate(candidates):
            grow([*chosen, n], [m for m in candidates[i + 1:] if exclusive(n, m)],
                 [m for m in [*excluded, *candidates[:i]] if exclusive(n, m)])

    grow([], names, [])
    return found


def _least_makespan(trace: Trace, group: list[str], size: int) -> float:
    """``reload_bound``'s relaxation for one set of backends, solved exactly: a walk over
    states (jobs done per backend, resident set, last backend) keeping the earliest end of
    each, states with a superset of residents and no later end dominating, and states that
    cannot beat an order found first (by the same walk, keeping only the most promising
    states of each step) left out."""
    by = {b.name: b for b in trace.backends}
    first = min(j.at for j in trace.jobs)
    k = len(group)
    resident = [by[n].resident_mib for n in group]
    peaks = [by[n].resident_mib + by[n].activation_mib + by[n].safety_mib for n in group]
    load = [by[n].load_s for n in group]
    jobs = [sorted((j.at - first, j.duration_s) for j in trace.jobs if j.backend == n)
            for n in group]
    total = [len(x) for x in jobs]
    # what is left of each backend's work after its first c jobs
    left = [[sum(d for _a, d in x[c:]) for c in range(len(x) + 1)] for x in jobs]
    kept: dict[tuple[int, int], list[int]] = {}

    def keep(mask: int, z: int) -> list[int]:
        """The largest sets of residents that fit beside ``z``'s job (z among them)."""
        got = kept.get((mask, z))
        if got is None:
            others = [b for b in range(k) if b != z and mask >> b & 1]
            room = size - peaks[z]
            got = []
            for r in range(len(others), -1, -1):
                for sub in itertools.combinations(others, r):
                    if sum(resident[b] for b in sub) <= room:
                        m = 1 << z
                        for b in sub:
                            m |= 1 << b
                        if not any(m | g == g for g in got):
                            got.append(m)
            kept[(mask, z)] = got
        return got

    def begin(z: int, c: int, mask: int, last: int, t: float) -> float:
        arrival = jobs[z][c][0]
        if mask >> z & 1:
            return max(arrival, t)
        if last < 0:
            return max(arrival, t + load[z])
        if resident[z] + peaks[last] <= size:  # (loaded beside the job before)
            return max(arrival, t)
        return max(arrival, t + load[z])

    def walk(upper: float, width: int | None) -> float:
        """The least makespan below ``upper`` (``upper`` when there is none): exactly, or
        keeping the ``width`` most promising states of each step (an order, not a bound)."""
        frontier: dict[tuple[tuple[int, ...], int, int], float] = {((0,) * k, 0, -1): 0.0}
        for _ in range(sum(total)):
            reached: dict[tuple[tuple[int, ...], int], list[tuple[float, int]]] = {}
            for (done, mask, last), t in frontier.items():
                rest = sum(left[b][done[b]] for b in range(k))
                for z in range(k):
                    c = done[z]
                    if c == total[z]:
                        continue
                    duration = jobs[z][c][1]
                    end = begin(z, c, mask, last, t) + duration
                    if end + rest - duration >= upper:
                        continue  # (cannot beat it)
                    after = done[:z] + (c + 1,) + done[z + 1:]
                    for m in keep(mask, z):
                        reached.setdefault((after, z), []).append((end, m))
            frontier = {}
            for (after, z), ends in reached.items():
                ends.sort()
                best: list[tuple[float, int]] = []
                for end, m in ends:
                    if not any(m | g == g for _e, g in best):
                        best.append((end, m))
                for end, m in best:
                    frontier[(after, m, z)] = end
            if width is not None and len(frontier) > width:
                promise = {key: t + sum(left[b][key[0][b]] for b in range(k))
                           for key, t in frontier.items()}
                frontier = {key: frontier[key] for key in
                            sorted(frontier, key=promise.__getitem__)[:width]}
            if not frontier:
                return upper
        return min(upper, *frontier.values())

    # An order found first, by a narrow walk, bounds the exact one's.
    return walk(walk(math.inf, 64), None)


def served_bound(trace: Trace) -> float | None:
    """A lower bound for the policies that serve the top priority's requests without a
    reload (the chat model stays resident through its stream), on a one-GPU trace with
    several priorities; None otherwise. The top priority's backends stay resident from their
    first request to the end of their last; the backends that cannot run a job beside one
    of them resident do all their work after that, a load each, one after another (the
    heaviest pairwise exclusive set of them, as in ``lower_bound``). A backend that can run
    beside the streams but not beside any of that set does its work before the set's first
    load, or adds what it does later to the end: the set starts no sooner than that work,
    from its first arrival, could be done."""
    prios = {j.priority for j in trace.jobs}
    if len(trace.gpus) != 1 or len(prios) < 2:
        return None
    size = trace.gpus[0]
    top = max(prios)
    by = {b.name: b for b in trace.backends}
    first = min(j.at for j in trace.jobs)
    streams = {j.backend for j in trace.jobs if j.priority == top}
    end = max(j.at + j.duration_s for j in trace.jobs if j.priority == top) - first
    work: dict[str, float] = {}
    for j in trace.jobs:
        if j.backend not in streams:  # (over its concurrency: one after another)
            work[j.backend] = work.get(j.backend, 0.0) + j.duration_s / by[j.backend].concurrency
    after = sorted(n for n in work
                   if any(by[n].resident_mib + by[n].activation_mib + by[n].safety_mib
                          + by[s].resident_mib > size for s in streams))
    if not after:
        return None
    clique = _heaviest_clique(after, by, work, size)
    ends = alone_ends(trace)
    ready = max((ends[n] for n in work if n not in clique
                 and all(exclusive(by[n], by[m], size) for m in clique)), default=0.0)
    return max(end, ready) + sum(by[n].load_s + work[n] for n in clique)


def _heaviest_clique(names: list[str], by: dict[str, TraceBackend], work: dict[str, float],
                     size: int) -> list[str]:
    """The pairwise exclusive backends with the most load + work between them (exact for up
    to 20 backends, greedy beyond)."""
    weight = {n: by[n].load_s + work[n] for n in names}
    if len(names) > 20:
        clique: list[str] = []
        for n in sorted(names, key=lambda n: -weight[n]):
            if all(exclusive(by[n], by[m], size) for m in clique):
                clique.append(n)
        return clique
    best: list[str] = []
    best_w = -1.0

    def grow(chosen: list[str], rest: list[str], w: float) -> None:
        nonlocal best, best_w
        if w + sum(weight[n] for n in rest) <= best_w:
            return
        if not rest:
            best, best_w = list(chosen), w
            return
        head, tail = rest[0], rest[1:]
        if all(exclusive(by[head], by[m], size) for m in chosen):
            grow([*chosen, head], tail, w + weight[head])
        grow(chosen, tail, w)

    grow([], sorted(names, key=lambda n: -weight[n]), 0.0)
    return best


# --------------------------------------------------------------------------- traces


def interleaved() -> Trace:
    backends = (TraceBackend("A", 1.0, 12 * GIB, 512), TraceBackend("B", 1.0, 12 * GIB, 512),
                TraceBackend("C", 1.0, 4 * GIB + 512, 256),
                TraceBackend("D", 1.0, 4 * GIB + 512, 256))
    jobs = tuple(TraceJob(f"{n}{i}", 0.0, n, 0.3) for i in range(10) for n in "ABCD")
    return Trace("interleaved (issue 11)", (24 * GIB,), backends, jobs)


def vramd_card(rng: random.Random) -> Trace:
    """vramd's headline case: a batch for ten models on a 6 GiB card (one at a time: no two
    fit together with a job running), loads up to 60 s, submitted interleaved (each job for
    a model other than the one before)."""
    backends = tuple(
        TraceBackend(f"m{i}", rng.uniform(10.0, 60.0), rng.randint(3_000, 4_500),
                     rng.randint(300, 1_000), safety_mib=384)
        for i in range(10))
    jobs = []
    last = None
    for k in range(100):
        b = rng.choice([x for x in backends if x is not last])
        last = b
        jobs.append(TraceJob(f"j{k}", 0.0, b.name, rng.uniform(2.0, 10.0)))
    return Trace("vramd-like card: 6 GiB, ten models, a batch", (6 * GIB,), backends,
                 tuple(jobs))


def small_card_stream(rng: random.Random) -> Trace:
    """Jobs for ten models arriving faster than a 6 GiB card can serve them."""
    backends = tuple(
        TraceBackend(f"m{i}", rng.uniform(2.0, 8.0), rng.randint(800, 3_500),
                     rng.randint(200, 1_000), safety_mib=384)
        for i in range(10))
    jobs = []
    t = 0.0
    for k in range(60):
        t += rng.expovariate(0.5)
        b = rng.choice(backends[:4] if rng.random() < 0.6 else backends)
        jobs.append(TraceJob(f"j{k}", round(t, 3), b.name, rng.uniform(1.0, 6.0)))
    return Trace("6 GiB card, a stream beyond its capacity", (6 * GIB,), backends,
                 tuple(jobs))


def box_bursts(rng: random.Random) -> Trace:
    backends = tuple(
        TraceBackend(f"b{i:02d}", rng.uniform(5.0, 30.0), rng.randint(2, 30) * GIB,
                     rng.randint(1, 6) * GIB, safety_mib=512, concurrency=rng.choice((1, 1, 2)))
        for i in range(50))
    jobs = []
    k = 0
    for burst in range(6):
        at = burst * 60.0
        for b in rng.sample(backends, 6):
            for _ in range(rng.randint(4, 10)):
                jobs.append(TraceJob(f"j{k}", round(at + rng.uniform(0, 2.0), 3), b.name,
                                     rng.uniform(0.5, 5.0)))
                k += 1
    return Trace("4-GPU box: 50 backends, bursts", (80 * GIB,) * 4, backends, tuple(jobs))


def interactive_and_batch(rng: random.Random) -> Trace:
    """A batch for three big models (never two resident together) at priority 0, and
    interactive jobs for three small ones at priority 10 arriving all along."""
    batch = tuple(TraceBackend(f"batch{i}", rng.uniform(20.0, 40.0), 13 * GIB, 2 * GIB,
                               safety_mib=512) for i in range(3))
    chat = tuple(TraceBackend(f"chat{i}", rng.uniform(3.0, 5.0), rng.randint(2, 3) * GIB,
                              GIB // 2, safety_mib=512, priority=10) for i in range(3))
    jobs = [TraceJob(f"b{k}", 0.0, batch[k % 3].name, rng.uniform(10.0, 30.0), 0)
            for k in range(24)]
    t = 0.0
    for k in range(80):
        t += rng.expovariate(0.15)
        jobs.append(TraceJob(f"i{k}", round(t, 3), rng.choice(chat).name,
                             rng.uniform(0.5, 2.0), 10))
    return Trace("interactive (priority 10) over a batch (0)", (24 * GIB,), batch + chat,
                 tuple(jobs))


def chat_beside_batch() -> Trace:
    """Issue 28's case on 24 GiB: a chat model (12 GiB, loads in 2 s) answers a request
    every 1.5 s for 30 s at priority 10; a batch at priority 0, submitted at once 3 s in,
    mixes a model that fits beside it (7 + 3 GiB, eight 2 s jobs) with one that fits beside
    nothing (16 + 4 GiB, loads in 4 s, four 3 s jobs)."""
    llm = TraceBackend("chat-llm", 2.0, 11 * GIB, GIB, safety_mib=128, priority=10)
    small = TraceBackend("embed", 1.0, 7 * GIB, 3 * GIB, safety_mib=128)
    big = TraceBackend("big", 4.0, 16 * GIB, 4 * GIB, safety_mib=128)
    chat = arrivals.jobs(arrivals.periodic(1.5, 28.5), llm.name, 0.3, 10, prefix="chat")
    batch = tuple(TraceJob(f"embed-{i}", 3.0, small.name, 2.0) for i in range(8)) + \
        tuple(TraceJob(f"big-{i}", 3.0, big.name, 3.0) for i in range(4))
    return Trace("chat every 1.5 s beside a batch (issue 28)", (24 * GIB,),
                 (llm, small, big), chat + batch)


def later_batch(base: Trace, at: float) -> tuple[TraceJob, ...]:
    return tuple(dataclasses.replace(j, at=at) for j in base.jobs if j.priority == 0)


def chat_poisson(rng: random.Random) -> Trace:
    """The same batch, submitted 5 s into a chat whose requests arrive at random (Poisson,
    one per 2 s on average) for 40 s."""
    base = chat_beside_batch()
    chat = arrivals.jobs(arrivals.poisson(0.5, 40.0, rng), "chat-llm", 0.3, 10,
                         prefix="chat")
    batch = later_batch(base, 5.0)
    return Trace("Poisson chat (1 per 2 s) beside the batch", base.gpus, base.backends,
                 chat + batch)


def chat_bursts(rng: random.Random) -> Trace:
    """The same batch, submitted 5 s into bursts of four chat requests every 6 s for 40 s."""
    base = chat_beside_batch()
    chat = arrivals.jobs(arrivals.bursts(6.0, 4, 40.0, rng, spread=1.0), "chat-llm", 0.3, 10,
                         prefix="chat")
    batch = later_batch(base, 5.0)
    return Trace("bursts of chat (4 every 6 s) beside the batch", base.gpus, base.backends,
                 chat + batch)


def beside_the_chats_room() -> Trace:
    """A review's trace (stop 59) on two 24 GiB GPUs: the chat's model (10 + 1 GiB) asked
    every 3.5 s at priority 10; six big jobs on the other GPU at 11.5 s; at 12.65 s four
    jobs of priority 2 for a model (12 + 1 GiB, loads in 4 s) that fits beside the chat's
    idle model but leaves no room for its next job. Loaded there, it made the chat's next
    requests wait for its load and its jobs (p95 4.6 s); it is now held like an eviction."""
    chat = TraceBackend("chat-llm", 1.0, 10 * GIB, GIB, safety_mib=128, priority=10)
    beside = TraceBackend("beside", 4.0, 12 * GIB, GIB, safety_mib=128, priority=2)
    big = TraceBackend("big", 2.5, 14 * GIB, 4 * GIB, safety_mib=128)
    jobs = arrivals.jobs(arrivals.periodic(3.5, 24.5, start=7.0), chat.name, 0.3, 10,
                         prefix="chat")
    jobs += tuple(TraceJob(f"big-{i}", 11.5, big.name, 3.0) for i in range(6))
    jobs += tuple(TraceJob(f"beside-{i}", 12.65, beside.name, 2.0, 2) for i in range(4))
    return Trace("a load beside the chat's model, in the room of its next job",
                 (24 * GIB, 24 * GIB), (chat, beside, big), jobs)


def two_sleepers() -> Trace:
    """The issue's case: two 9 GiB models on a 12 GiB card (load 3 s, asleep 300 MiB, wake
    0.3 s), a job for a then b, four times, each 5 s after the one before."""
    backends = tuple(TraceBackend(n, 3.0, 8704, 512, wake_s=0.3, residual_mib=300)
                     for n in "ab")
    jobs = tuple(TraceJob(f"j{i}", i * 5.0, "ab"[i % 2], 0.1) for i in range(8))
    return Trace("two 9 GiB models taking turns on 12 GiB", (12 * GIB,), backends, jobs)


def vllm_sleepers(rng: random.Random) -> Trace:
    """Four vLLM-sized models (9-11 GiB, loads 20-60 s, wakes 0.5-3 s, 500 MiB asleep) on a
    24 GiB card, requests arriving interleaved for ten minutes."""
    backends = tuple(
        TraceBackend(f"llm{i}", rng.uniform(20.0, 60.0), rng.randint(8_500, 10_500),
                     rng.randint(512, 1_024), safety_mib=512, wake_s=rng.uniform(0.5, 3.0),
                     residual_mib=500, host_mib=rng.randint(8_000, 10_000))
        for i in range(4))
    jobs = []
    t = 0.0
    for k in range(80):
        t += rng.expovariate(1 / 7.5)
        jobs.append(TraceJob(f"j{k}", round(t, 3), rng.choice(backends).name,
                             rng.uniform(1.0, 8.0)))
    return Trace("four vLLM-sized models on 24 GiB, interleaved", (24 * GIB,), backends,
                 tuple(jobs), 64 * GIB)


def without_sleep(trace: Trace) -> Trace:
    """The same trace, its workers without sleep hooks."""
    return Trace(trace.name, trace.gpus,
                 tuple(dataclasses.replace(b, wake_s=None) for b in trace.backends),
                 trace.jobs, trace.sleep_host_budget_mib)


def sleep_rows(trace: Trace) -> list[str]:
    out = []
    for hooks, t in (("with", trace), ("without", without_sleep(trace))):
        r = simulate(t)
        problems = (" OVERCOMMIT" if r.overcommitted else "") + \
            (f" {len(r.unfinished)} UNFINISHED" if r.unfinished else "")
        out.append(f"  {hooks:8} {r.makespan_s:9.1f} {r.loads:6d} {r.sleeps:6d} {r.wakes:6d}  "
                   f"{r.wait_p(0, 0.5):7.1f} / {r.wait_p(0, 0.95):7.1f}{problems}")
    return out


def evict_then_give_up() -> Trace:
    """A review's trace: a chat every 3.5 s (priority 10, its model may wait 30 s:
    ``target_wait``) beside four big jobs (priority 5, loads 2.5 s) that fit beside nothing:
    the hold lets the big model evict the idle chat model, and the chat's next request comes
    during the big load and gives it up: 65 loads given up, 3 once remembered. Once three
    big jobs have run, a request whose wait for the load, the longest of them and its
    reload is within its target lets the load go on: without the memory, 49 now."""
    chat = TraceBackend("chat", 0.92, 18438, 773, target_wait_s=30.0)
    big = TraceBackend("big", 2.54, 28796, 2252, keep_alive_s=0.5)
    jobs = arrivals.jobs(arrivals.periodic(3.5, 600.0), "chat", 0.5, 10, prefix="chat")
    jobs += tuple(TraceJob(f"big{i}", 30.0, "big", 5.0, 5) for i in range(4))
    return Trace("a chat lets a big model evict it, then gives its load up", (48 * GIB,),
                 (chat, big), jobs)


def keep_alive_give_up() -> Trace:
    """Another review's trace: the chat model leaves 1 s after each request (its
    ``keep_alive``), so each request reloads it, and a stream of lower jobs (priority 8)
    that fit beside its idle model, not beside a chat job, takes the room its next request
    needs. No moment is better: after a request's reload and job, the gap left is shorter
    than their load, so they are started and given up (51, 52 before the target counted:
    their wait, with the longest of their jobs, mostly passes the chat's 5 s target)."""
    chat = TraceBackend("chat", 1.8, 24 * GIB, 2 * GIB, concurrency=3, keep_alive_s=1.0,
                        target_wait_s=5.0)
    other = TraceBackend("other", 1.45, 20 * GIB, 4 * GIB, keep_alive_s=1.0)
    jobs = arrivals.jobs(arrivals.periodic(3.5, 200.0), "chat", 0.45, 10, prefix="chat")
    jobs += arrivals.jobs(arrivals.periodic(200.0 / 30, 200.0, start=1.0), "other", 0.12, 8,
                          prefix="low")
    return Trace("a chat model that leaves by its keep-alive", (48 * GIB,), (chat, other),
                 jobs)


def leaves_between_requests() -> Trace:
    """A chat every 5 s whose model leaves 0.5 s after each request (its ``keep_alive``),
    beside ten big jobs (priority 5, loads 2.5 s) that come at random and fit beside
    nothing: a big load started late in a gap is given up for the next request, and the
    moment after that request is better (the chat's model reloads, runs its job and leaves,
    and the load fits in the rest of the gap)."""
    rng = random.Random(1)
    chat = TraceBackend("chat", 0.6, 24 * GIB, 2 * GIB, keep_alive_s=0.5)
    big = TraceBackend("big", 2.5, 28 * GIB, 4 * GIB, keep_alive_s=0.5)
    jobs = arrivals.jobs(arrivals.periodic(5.0, 300.0), "chat", 0.3, 10, prefix="chat")
    jobs += tuple(TraceJob(f"big{i}", round(rng.uniform(5, 250), 2), "big", 1.5, 5)
                  for i in range(10))
    return Trace("a chat model that leaves between requests", (48 * GIB,), (chat, big), jobs)


def forgetful(snap: Snapshot, now: float, config: SchedulerConfig) -> Plan:
    """The real scheduler, not told which loads were given up for whom (before it was)."""
    if snap.expected is not None:
        snap = dataclasses.replace(snap, expected=dataclasses.replace(snap.expected,
                                                                      given_up={}),
                                   queued_counts=None)
    return plan(snap, now, config)


def give_up_rows(trace: Trace) -> list[str]:
    out = []
    config = SchedulerConfig(aging_interval_s=math.inf, max_patience_s=60.0)
    for name, policy in (("vramtui", None), ("forgetful", forgetful)):
        r = simulate(trace, config=config, name=name, max_time=1e5) if policy is None \
            else simulate(trace, config=config, policy=policy, name=name, max_time=1e5)
        lower = [r.started_at[j.id] - j.at for j in trace.jobs if j.priority < 10]
        out.append(f"  {name:9} {r.makespan_s:9.1f} {r.loads:6d} {len(r.given_up):6d}  "
                   f"{r.wait_p(10, 0.95):8.1f} {max(r.waits[10]):6.1f}  {max(lower):9.1f}")
    return out


# --------------------------------------------------------------------------- the engine


def engine_interleaved() -> tuple[Result, dict[str, float]]:
    """The interleaved trace through the real engine with simulated workers."""
    sys.path.insert(0, str(ROOT / "tests"))
    from engine_support import engine, sim_backend

    specs = []
    for b in interleaved().backends:
        spec = sim_backend(b.name, b.resident_mib - 256, b.activation_mib, load_s=1.0,
                           steps=3, step_s=0.1)
        spec.update(safety="0MiB", keep_alive="10m")
        specs.append(spec)
    with engine(specs, gpus="sim:24GiB") as sup:
        t0 = time.monotonic()
        ids = [sup.submit(j.backend, b'{"steps": 3, "step_s": 0.1}')
               for j in interleaved().jobs]
        views = [sup.wait(i, 300) for i in ids]
        makespan = time.monotonic() - t0
        log = [line.text for line in sup.snapshot().log]
    loads: dict[str, float] = {}
    for v in views:
        marks = {state: t for t, state, _ in v.history}
        if "starting" in marks and "running" in marks and v.backend not in loads:
            loads[v.backend] = marks["running"] - marks["starting"]
    n_loads = sum(1 for text in log if text.startswith("starting "))
    waits = {0: [v.started_at - v.submitted_at for v in views if v.started_at is not None]}
    result = Result("interleaved", "engine", makespan, n_loads, math.nan, waits, [], False)
    return result, loads


# --------------------------------------------------------------------------- the table


POLICIES = (("vramtui", None), ("no-expect", None), ("fifo-1", fifo_one_at_a_time),
            ("vramd", vramd_rule))


def row(r: Result, bound: float) -> str:
    prios = sorted(r.waits)
    waits = "  ".join(f"p{p}: {r.wait_p(p, 0.5):7.1f} / {r.wait_p(p, 0.95):7.1f}" for p in prios)
    busy = "      -" if math.isnan(r.busy_fraction) else f"{r.busy_fraction:7.2f}"
    return (f"  {r.policy:9} {r.makespan_s:9.1f} {r.makespan_s / bound:7.2f}x {r.loads:6d} "
            f"{busy}  {waits}")


def random_traces(rng: random.Random) -> list[Trace]:
    """The random traces, drawn from ``rng`` in this order."""
    return [vramd_card(rng), box_bursts(rng), interactive_and_batch(rng),
            small_card_stream(rng)]


def seed_summary(first: int, n: int) -> None:
    """The random traces over ``n`` seeds from ``first``: per policy, the mean and worst
    makespan over the bound, the mean loads, and the top priority's wait p95 (mean, worst),
    where a trace has several priorities. One seed can flatter a policy: seed 11's
    interactive trace ran at 1.04x while seeds 12-16 ran at 1.37-1.69x, chat p95 20 s."""
    rows: dict[str, dict[str, list[tuple[float, int, float, int]]]] = {}
    names: list[str] = []
    for seed in range(first, first + n):
        for trace in random_traces(random.Random(seed)):
            if trace.name not in rows:
                names.append(trace.name)
            top = max(j.priority for j in trace.jobs)
            several = len({j.priority for j in trace.jobs}) > 1
            bound = lower_bound(trace)
            for name, policy in POLICIES:
                r = simulate(trace, name=name, expect=name != "no-expect") if policy is None \
                    else simulate(trace, policy=policy, name=name)
                wait = r.wait_p(top, 0.95) if several else math.nan
                rows.setdefault(trace.name, {}).setdefault(name, []).append(
                    (r.makespan_s / bound, r.loads, wait, seed))
    print(f"the random traces over seeds {first}-{first + n - 1}:")
    print(f"  {'policy':9} {'mean /bound':>11} {'worst':>13} {'loads':>6}  top priority's wait "
          "p95 s: mean / worst")
    for trace_name in names:
        print(trace_name)
        for name, got in rows[trace_name].items():
            worst = max(got)
            waits = [w for _, _, w, _ in got if not math.isnan(w)]
            wait = (f"{sum(waits) / len(waits):7.1f} / {max(waits):7.1f}" if waits else "      -")
            print(f"  {name:9} {sum(g[0] for g in got) / len(got):10.2f}x "
                  f"{worst[0]:5.2f}x (s{worst[3]}) {sum(g[1] for g in got) / len(got):6.1f}  "
                  f"{wait}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=11, help="for the random traces")
    parser.add_argument("--seeds", type=int, default=0, metavar="N",
                        help="also summarize the random traces over N seeds from --seed "
                        "(about 5 s a seed)")
    parser.add_argument("--engine", action="store_true",
                        help="also run the interleaved trace through the real engine")
    parser.add_argument("--engine-chat", action="store_true",
                        help="also run issue 28's chat-beside-a-batch trace through the real "
                        "engine (about a minute)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    *drawn, stream = random_traces(rng)
    traces = [interleaved(), *drawn, stream]
    chat_rng = random.Random(args.seed + 28)  # (the traces above stay as they were)
    traces += [chat_beside_batch(), chat_poisson(chat_rng), chat_bursts(chat_rng),
               beside_the_chats_room()]
    print(f"  {'policy':9} {'makespan s':>9} {'/bound':>8} {'loads':>6} {'busy':>7}  "
          "wait p50 / p95 s, per priority")
    for trace in traces:
        bound = plain = lower_bound(trace)
        served = served_bound(trace)
        also = ""
        if served is not None and served > bound:
            also = f"; {served:.1f} s serving the top priority at once (the ratio's)"
            bound = served
        print(f"{trace.name}: {len(trace.jobs)} jobs, {len(trace.backends)} backends, "
              f"{len(trace.gpus)} GPU(s); lower bound {plain:.1f} s{also}")
        for name, policy in POLICIES:
            started = time.perf_counter()
            r = simulate(trace, name=name, expect=name != "no-expect") if policy is None \
                else simulate(trace, policy=policy, name=name)
            took = (time.perf_counter() - started) * 1000
            problems = (" OVERCOMMIT" if r.overcommitted else "") + \
                (f" {len(r.unfinished)} UNFINISHED" if r.unfinished else "")
            print(row(r, bound) + f"   ({took:.0f} ms simulated){problems}")
        if trace is stream:
            print(f"  (its bounds: packing {packing_bound(trace):.1f} s, conflicts "
                  f"{conflict_bound(trace):.1f} s, reloads {reload_bound(trace):.1f} s: no "
                  "schedule finishes before the largest)")
    print()
    print("sleep hooks: the same trace with and without them (vramtui's scheduler)")
    print(f"  {'hooks':8} {'makespan s':>9} {'loads':>6} {'sleeps':>6} {'wakes':>6}  "
          "wait p50 / p95 s")
    for trace in (two_sleepers(), vllm_sleepers(rng)):
        print(f"{trace.name}: {len(trace.jobs)} jobs, {len(trace.backends)} backends")
        for line in sleep_rows(trace):
            print(line)
    print()
    print("loads given up for a stream's request, remembered or not (aging off, patience 60 s)")
    print(f"  {'policy':9} {'makespan s':>9} {'loads':>6} {'given':>6}  {'chat p95':>8} "
          f"{'max':>6}  {'lower max':>9}  (waits, s)")
    for trace in (evict_then_give_up(), keep_alive_give_up(), leaves_between_requests()):
        print(f"{trace.name}: {len(trace.jobs)} jobs, {len(trace.backends)} backends")
        for line in give_up_rows(trace):
            print(line)
    if args.engine:
        trace = interleaved()
        real, loads = engine_interleaved()
        mean_load = sum(loads.values()) / len(loads) if loads else 1.0
        backends = tuple(TraceBackend(b.name, loads.get(b.name, mean_load), b.resident_mib,
                                      b.activation_mib) for b in trace.backends)
        sim = simulate(Trace(trace.name, trace.gpus, backends, trace.jobs), name="sim")
        print("interleaved through the real engine (loads measured there: "
              + ", ".join(f"{n} {s:.2f} s" for n, s in sorted(loads.items())) + ")")
        bound = lower_bound(Trace(trace.name, trace.gpus, backends, trace.jobs))
        print(row(real, bound))
        print(row(sim, bound) + "   (the simulator, with the engine's load times)")
    if args.seeds > 0:
        print()
        seed_summary(args.seed, args.seeds)
    if args.engine_chat:
        engine_chat()
    return 0


def engine_chat() -> None:
    """Issue 28's trace through the real engine, real simulated workers, on sim:24GiB."""
    sys.path.insert(0, str(ROOT / "tests"))
    from engine_support import play_trace

    trace = chat_beside_batch()
    bound = max(served_bound(trace) or 0.0, lower_bound(trace))
    played = play_trace(trace, "sim:24GiB")
    bad = {t: s for t, s in played.states.items() if s != "succeeded"}
    real = Result(trace.name, "engine", played.makespan_s, played.loads, math.nan,
                  played.waits, [], False)
    print(f"{trace.name} through the real engine (simulated workers, sim:24GiB); bound "
          f"{bound:.1f} s")
    print(row(real, bound) + (f"   {len(bad)} NOT SUCCEEDED" if bad else
                              "   every job succeeded"))
    sim = simulate(trace, name="sim")
    print(row(sim, bound) + "   (the simulator)")
    batch_at = min(j.at for j in trace.jobs if j.priority == 0)
    beside = [j for j in trace.jobs if j.priority == 10 and j.at >= batch_at]

    def p95(waits: list[float]) -> float:
        return sorted(waits)[math.ceil(0.95 * len(waits)) - 1]

    chat = [j for j in trace.jobs if j.priority == 10]
    print(f"  chat wait p95: {p95([played.job_waits[j.id] for j in chat]):.2f} s (the first "
          f"requests wait for the cold load); once the batch is queued "
          f"{p95([played.job_waits[j.id] for j in beside]):.2f} s (the simulator "
          f"{p95([sim.started_at[j.id] - j.at for j in beside]):.2f} s)")


if __name__ == "__main__":
    sys.exit(main())
