"""Timing helpers the benchmarks share: sequential round trips after a warm-up, and a
percentile of the samples.  Imported as ``bench.timing`` (each benchmark puts the project
root on ``sys.path``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_jobs(run_one: Callable[[], Any], n: int) -> tuple[list[float], float]:
    """``n`` calls of ``run_one`` after a warm-up (worker hot, caches filled): the seconds
    each took, and the seconds all took."""
    for _ in range(min(200, n)):
        run_one()
    samples = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        run_one()
        samples.append(time.perf_counter() - t)
    return samples, time.perf_counter() - t0
