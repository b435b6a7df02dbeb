"""Eviction choice: what a worker costs to evict, and the cheapest sufficient set.

Cost of evicting a worker = ``reload_cost_s * recency`` with
``recency = 1 / (1 + idle_seconds / 60)``: a worker used a moment ago is likely to be needed
again, so it is dearer; one idle for an hour costs a fraction of its reload time; one whose
backend still has queued jobs costs ``QUEUED_WORK_FACTOR`` times more (it would be loaded
again soon; the planner applies it, since only it sees the queue). A worker that used more
than it declared costs nothing: it is the first to go. Candidates are taken idle before busy
(a busy one leaves only once its jobs end), then cheapest first (ties: the one that frees
more — what the ledger says it holds, not what it declared —, then lower backend priority,
then name, so the choice is deterministic), only until the need is met, and any candidate
the final set can do without is dropped again (most expensive first).

Sleep or stop. A worker that can sleep (it has the hooks, waking it is cheaper than loading
it again, and the host memory its sleep takes fits what sleepers may still take) is offered
asleep: it then costs its *wake* (not its reload) and frees its reservation less what it keeps
asleep. When sleeping frees too little for the need, the cheapest set of *stopped* workers is
chosen instead, and each of them that may sleep after all, the need still met, sleeps (the
largest saving first): so a model is stopped only when even what it keeps asleep is needed.
Stopping a worker that sleeps already costs its reload less its wake.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from supervisor.scheduler.model import BackendInfo, WorkerInfo

#: How much dearer a worker whose backend still has queued jobs is to evict.
QUEUED_WORK_FACTOR = 2.0
#: A sleep is worth it only when it gives back at least this much (and a tenth of what the
#: worker holds); the engine stops a worker whose measured sleep gave back less.
MIN_SLEEP_GAIN_MIB = 256


def sleep_gain_enough(held_mib: int, keeps_mib: int) -> bool:
    """Whether going from ``held_mib`` to ``keeps_mib`` gives enough back to be a sleep."""
    return held_mib - keeps_mib >= max(MIN_SLEEP_GAIN_MIB, held_mib // 10)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A worker that may be evicted, with its precomputed cost; with ``sleep``, it is put to
    sleep (keeping ``keeps_mib``, taking ``host_mib`` of host memory) rather than stopped,
    which would cost ``stop_cost``."""

    worker: WorkerInfo
    cost: float
    priority: int
    sleep: bool = False
    keeps_mib: int = 0
    host_mib: int = 0
    stop_cost: float = 0.0

    @property
    def frees_mib(self) -> int:
        if self.sleep:
            return max(0, self.worker.reserved_mib - self.keeps_mib)
        return self.worker.reserved_mib

    @property
    def order(self) -> tuple[bool, float, int, int, str]:
        """Sort key: idle first, cheapest first, then larger frees, lower priority, name."""
        return (self.worker.active_jobs > 0, self.cost, -self.frees_mib,
                self.priority, self.worker.backend)

    def stopped(self) -> Candidate:
        """The same worker, stopped rather than put to sleep."""
        if not self.sleep:
            return self
        return replace(self, sleep=False, keeps_mib=0, host_mib=0, cost=self.stop_cost)


def eviction_cost(worker: WorkerInfo, info: BackendInfo | None, now: float,
                  undo_s: float | None = None) -> float:
    """``undo_s * 1 / (1 + idle_seconds / 60)``, where ``undo_s`` is what undoing the
    eviction costs (by default a reload; stopping a sleeping worker costs its reload less its
    wake); 0 for a worker with no descriptor or one that used more than it declared."""
    if info is None or worker.over_declared:
        return 0.0
    if undo_s is None:
        undo_s = info.reload_cost_s
        if worker.state == "asleep":
            undo_s = max(0.0, info.reload_cost_s - info.wake_cost_s)
    idle = 0.0 if worker.idle_since is None else max(0.0, now - worker.idle_since)
    return undo_s / (1.0 + idle / 60.0)


def may_sleep(worker: WorkerInfo, info: BackendInfo | None, host_room_mib: int) -> bool:
    """Whether evicting ``worker`` may put it to sleep: it can, it is idle and ready, waking
    it is cheaper than loading it again, and its sleep's host memory fits."""
    return (info is not None and worker.can_sleep and worker.state == "ready"
            and not worker.active_jobs and not worker.over_declared
            and info.wake_cost_s < info.reload_cost_s
            and info.sleep_host_mib <= host_room_mib
            and sleep_gain_enough(worker.reserved_mib, info.sleep_residual_mib))


def choose(candidates: Sequence[Candidate], have_mib: int, need_mib: int,
           host_room_mib: float = math.inf) -> list[Candidate] | None:
    """The cheapest-first minimal set whose frees lift ``have_mib`` to ``need_mib``, sleeping
    where sleeping suffices (see the module doc); the sleepers' host memory stays within
    ``host_room_mib``.

    ``candidates`` must already be sorted by ``Candidate.order``. Returns ``[]`` when
    ``have_mib`` already suffices, None when even all of them would not.
    """
    if have_mib >= need_mib:
        return []
    chosen = _cheapest(candidates, have_mib, need_mib, host_room_mib)
    if chosen is not None or not any(c.sleep for c in candidates):
        return chosen
    stops = sorted((c.stopped() for c in candidates), key=lambda c: c.order)
    chosen = _cheapest(stops, have_mib, need_mib, math.inf)
    if chosen is None:
        return None
    return _sleep_where_it_suffices(chosen, candidates, have_mib, need_mib, host_room_mib)


def _sleep_where_it_suffices(chosen: list[Candidate], offered: Sequence[Candidate],
                             have_mib: int, need_mib: int, host_room_mib: float
                             ) -> list[Candidate]:
    """``chosen`` (all stopped), each one put to sleep instead while the need is still met,
    the largest saving first."""
    asleep = {c.worker.backend: c for c in offered if c.sleep}
    out = list(chosen)
    total = have_mib + sum(c.frees_mib for c in out)
    host = host_room_mib
    for i in sorted(range(len(out)), key=lambda i: out[i].cost
                    - asleep[out[i].worker.backend].cost
                    if out[i].worker.backend in asleep else -math.inf, reverse=True):
        sleeper = asleep.get(out[i].worker.backend)
        if sleeper is None or sleeper.host_mib > host:
            continue
        if total - out[i].frees_mib + sleeper.frees_mib >= need_mib:
            total += sleeper.frees_mib - out[i].frees_mib
            host -= sleeper.host_mib
            out[i] = sleeper
    return out


def _cheapest(candidates: Sequence[Candidate], have_mib: int, need_mib: int,
              host_room_mib: float) -> list[Candidate] | None:
    chosen: list[Candidate] = []
    total = have_mib
    host = host_room_mib
    for cand in candidates:
        if cand.sleep:
            if cand.host_mib > host:
                continue  # its sleep does not fit the host: it is not offered asleep here
            host -= cand.host_mib
        chosen.append(cand)
        total += cand.frees_mib
        if total >= need_mib:
            break
    else:
        return None
    # The last one taken was needed; an earlier, smaller one may have become redundant.
    for cand in sorted(chosen[:-1], key=lambda c: c.order, reverse=True):
        if total - cand.frees_mib >= need_mib:
            chosen.remove(cand)
            total -= cand.frees_mib
    return chosen
