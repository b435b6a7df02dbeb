"""Eviction choice: what a worker costs to evict, and the cheapest sufficient set.

Cost of evicting a worker = ``reload_cost_s * recency`` with
``recency = 1 / (1 + idle_seconds / 60)``: a worker used a moment ago is likely to be needed
again, so it is dearer; one idle for an hour costs a fraction of its reload time. A worker
that used more than it declared costs nothing: it is the first to go. Candidates are taken
idle before busy (a busy one leaves only once its jobs end), then cheapest first (ties: the
one that frees more — what the ledger says it holds, not what it declared —, then lower
backend priority, then name, so the choice is deterministic), only until the need is met,
and any candidate the final set can do without is dropped again (most expensive first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.scheduler.model import BackendInfo, WorkerInfo


@dataclass(frozen=True, slots=True)
class Candidate:
    """An idle worker that may be evicted, with its precomputed cost."""

    worker: WorkerInfo
    cost: float
    priority: int

    @property
    def frees_mib(self) -> int:
        return self.worker.reserved_mib

    @property
    def order(self) -> tuple[bool, float, int, int, str]:
        """Sort key: idle first, cheapest first, then larger frees, lower priority, name."""
        return (self.worker.active_jobs > 0, self.cost, -self.worker.reserved_mib,
                self.priority, self.worker.backend)


def eviction_cost(worker: WorkerInfo, info: BackendInfo | None, now: float) -> float:
    """``reload_cost_s * 1 / (1 + idle_seconds / 60)``; 0 for a worker with no descriptor or
    one that used more than it declared."""
    if info is None or worker.over_declared:
        return 0.0
    idle = 0.0 if worker.idle_since is None else max(0.0, now - worker.idle_since)
    return info.reload_cost_s / (1.0 + idle / 60.0)


def choose(candidates: Sequence[Candidate], have_mib: int, need_mib: int) -> list[Candidate] | None:
    """The cheapest-first minimal set whose frees lift ``have_mib`` to ``need_mib``.

    ``candidates`` must already be sorted by ``Candidate.order``. Returns ``[]`` when
    ``have_mib`` already suffices, None when even all of them would not.
    """
    if have_mib >= need_mib:
        return []
    chosen: list[Candidate] = []
    total = have_mib
    for cand in candidates:
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
