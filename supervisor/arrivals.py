"""Arrival processes for simulated traces: when the requests of a stream come.

Each process is a pure function of its parameters and a ``random.Random`` (for the random
ones), returning sorted arrival times in seconds; ``jobs`` turns them into the
``tracesim.TraceJob`` of one backend. Every process takes ``until``: the stream stops there
(a stream that stops is any of them with an end).

- ``periodic``: one request every ``every`` seconds (a person at a chat window, a poller),
  optionally jittered;
- ``poisson``: independent requests at a mean ``rate`` per second;
- ``bursts``: ``size`` requests close together (within ``spread`` seconds) every ``every``
  seconds (an agent's tool calls, a page of thumbnails).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from .tracesim import TraceJob

#: At most this many arrivals from one process (a trace is for a simulation, not a flood).
MAX_ARRIVALS = 100_000


def _check(start: float, until: float) -> None:
    if not until >= start:
        raise ValueError(f"until ({until}) must be at or after start ({start})")


def periodic(every: float, until: float, *, start: float = 0.0, jitter: float = 0.0,
             rng: random.Random | None = None) -> list[float]:
    """A request every ``every`` seconds from ``start`` up to ``until`` (each moved by up
    to ``jitter`` seconds either way, never before ``start``)."""
    _check(start, until)
    if not every > 0:
        raise ValueError(f"every must be > 0, got {every}")
    rng = rng or random.Random(0)
    out = []
    k = 0
    while (t := start + k * every) <= until and k < MAX_ARRIVALS:
        if jitter:
            t = max(start, t + rng.uniform(-jitter, jitter))
        out.append(round(t, 6))
        k += 1
    return sorted(out)


def poisson(rate: float, until: float, rng: random.Random, *, start: float = 0.0
            ) -> list[float]:
    """Independent requests at ``rate`` per second from ``start`` up to ``until``."""
    _check(start, until)
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    out: list[float] = []
    t = start
    while len(out) < MAX_ARRIVALS:
        t += rng.expovariate(rate)
        if t > until:
            break
        out.append(round(t, 6))
    return out


def bursts(every: float, size: int, until: float, rng: random.Random, *,
           start: float = 0.0, spread: float = 0.5) -> list[float]:
    """``size`` requests within ``spread`` seconds, every ``every`` seconds, up to
    ``until``."""
    _check(start, until)
    if not every > 0 or size < 1 or spread < 0:
        raise ValueError("bursts need every > 0, size >= 1 and spread >= 0")
    out: list[float] = []
    t = start
    while t <= until and len(out) < MAX_ARRIVALS:
        out.extend(round(t + rng.uniform(0.0, spread), 6) for _ in range(size))
        t += every
    return sorted(x for x in out if x <= until)


def jobs(times: Sequence[float], backend: str, duration_s: float, priority: int = 0, *,
         prefix: str | None = None) -> tuple[TraceJob, ...]:
    """The jobs of ``backend`` arriving at ``times``, each taking ``duration_s``."""
    tag = prefix if prefix is not None else backend
    return tuple(TraceJob(f"{tag}-{i}", t, backend, duration_s, priority)
                 for i, t in enumerate(times))
