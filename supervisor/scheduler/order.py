"""Queue order: priority, aging, and the pre-sorted queue contract.

The order of the queue is ``(-effective priority, seq)`` where
``effective = priority + floor((now - submitted_at) / aging_interval_s)`` (never below
``priority``), so a waiting job gains one level per interval and none starves.

Sorting 10,000 jobs on every decision would cost milliseconds, so the engine keeps the queue
pre-sorted instead, and this module only merges. The contract the engine honours:

1. ``Snapshot.queue`` is sorted by ``(-priority, seq)`` (insert with ``bisect.insort`` and
   ``queue_sort_key``; removal keeps it sorted);
2. ``seq`` is unique and grows with submission, and ``submitted_at`` (same clock as ``now``)
   never decreases as ``seq`` grows.

Then each priority band is already in effective order (an older job has aged at least as
much), and the whole order is a k-way merge of the bands (k = number of distinct
priorities). ``ordered_runs`` performs that merge lazily, yielding contiguous slices of the
queue: a run ends only where another band's head overtakes, found by bisection. With no
aging crossing a band boundary the whole queue comes back as one run, and a caller that stops
early pays only for what it walked.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from operator import attrgetter

from supervisor.scheduler.model import QueuedJob


def queue_sort_key(job: QueuedJob) -> tuple[int, int]:
    """The key the engine keeps ``Snapshot.queue`` sorted by: ``(-priority, seq)``."""
    return (-job.priority, job.seq)


def aging_bonus(submitted_at: float, now: float, aging_interval_s: float) -> int:
    """Whole aging intervals waited: ``floor((now - submitted_at) / interval)``, >= 0."""
    age = now - submitted_at
    if not age >= aging_interval_s:  # also: aging disabled (inf), clock skew, NaN
        return 0
    return math.floor(age / aging_interval_s)


def effective_priority(job: QueuedJob, now: float, aging_interval_s: float) -> int:
    """``priority`` plus the aging bonus."""
    return job.priority + aging_bonus(job.submitted_at, now, aging_interval_s)


def effective_key(job: QueuedJob, now: float, aging_interval_s: float) -> tuple[int, int]:
    """The true queue order: ``(-effective priority, seq)``. For references and tests."""
    return (-effective_priority(job, now, aging_interval_s), job.seq)


def validate_queue(queue: Sequence[QueuedJob]) -> str | None:
    """Check the contract in O(n); returns what is wrong, or None. For tests and debugging."""
    seen: set[str] = set()
    prev: QueuedJob | None = None
    for i, job in enumerate(queue):
        if job.job_id in seen:
            return f"duplicate job id {job.job_id!r} at {i}"
        seen.add(job.job_id)
        if prev is not None:
            if queue_sort_key(prev) >= queue_sort_key(job):
                return f"queue not sorted by (-priority, seq) at {i}"
            if prev.priority == job.priority and job.submitted_at < prev.submitted_at:
                return f"submitted_at decreases with seq at {i}"
        prev = job
    return None


def _neg_priority(job: QueuedJob) -> int:
    return -job.priority


_submitted_at = attrgetter("submitted_at")
_seq = attrgetter("seq")


def ordered_runs(
    queue: Sequence[QueuedJob], now: float, aging_interval_s: float
) -> Iterator[Sequence[QueuedJob]]:
    """Yield slices of ``queue`` whose concatenation is the queue in effective order.

    Lazy: cost is O(k log n) per run yielded plus the slice copies, so stopping early is
    cheap. Requires the contract in the module docstring.
    """
    n = len(queue)
    if n == 0:
        return
    # Priority bands: [lo, hi) ranges of equal priority, found by bisection.
    prios: list[int] = []
    pos: list[int] = []
    ends: list[int] = []
    i = 0
    while i < n:
        p = queue[i].priority
        j = bisect_right(queue, -p, lo=i, key=_neg_priority)
        prios.append(p)
        pos.append(i)
        ends.append(j)
        i = j
    k = len(prios)
    if k == 1:
        yield queue
        return

    interval = aging_interval_s

    def head_key(b: int) -> tuple[int, int]:
        job = queue[pos[b]]
        return (-(prios[b] + aging_bonus(job.submitted_at, now, interval)), job.seq)

    # Fast path: no band's oldest job ages past the newest job of the band above it.
    for b in range(1, k):
        tail = queue[ends[b - 1] - 1]
        tail_key = (-(prios[b - 1] + aging_bonus(tail.submitted_at, now, interval)), tail.seq)
        if head_key(b) <= tail_key:
            break
    else:
        yield queue
        return

    heads = [head_key(b) for b in range(k)]
    live = list(range(k))
    while live:
        # The band whose head comes first, and the best head among the others.
        best = live[0]
        for b in live[1:]:
            if heads[b] < heads[best]:
                best = b
        other: tuple[int, int] | None = None
        for b in live:
            if b != best and (other is None or heads[b] < other):
                other = heads[b]
        lo, hi = pos[best], ends[best]
        if other is None:
            stop = hi
        else:
            # Take the prefix of this band that sorts before `other` = (-e, s): jobs whose
            # effective priority exceeds e, then those equal to e with a smaller seq.
            level = -other[0] - prios[best]  # bonus that makes effective == e
            stop = _bonus_prefix(queue, lo, hi, level + 1, now, interval)
            if stop < hi:
                tie_end = _bonus_prefix(queue, stop, hi, level, now, interval)
                stop = bisect_left(queue, other[1], lo=stop, hi=tie_end, key=_seq)
            stop = max(stop, lo + 1)  # the head sorts first, by choice of `best`
        yield queue[lo:stop]
        pos[best] = stop
        if stop >= hi:
            live.remove(best)
        else:
            heads[best] = head_key(best)


def _bonus_prefix(
    queue: Sequence[QueuedJob], lo: int, hi: int, bonus: int, now: float, interval: float
) -> int:
    """First index in [lo, hi) of one band whose aging bonus is below ``bonus``.

    Bonuses do not increase along a band. The threshold on ``submitted_at`` is found by a
    C-level bisection, then corrected against the exact ``aging_bonus`` (float rounding can
    put it off by a job or so).
    """
    if bonus <= 0:
        return hi
    i = bisect_right(queue, now - bonus * interval, lo=lo, hi=hi, key=_submitted_at)
    while i < hi and aging_bonus(queue[i].submitted_at, now, interval) >= bonus:
        i += 1
    while i > lo and aging_bonus(queue[i - 1].submitted_at, now, interval) < bonus:
        i -= 1
    return i


def ordered(queue: Sequence[QueuedJob], now: float, aging_interval_s: float) -> Iterator[QueuedJob]:
    """The queue in effective order, one job at a time (convenience over ``ordered_runs``)."""
    for run in ordered_runs(queue, now, aging_interval_s):
        yield from run
