"""How the engine stops: which running jobs a stop waits for, and what the log says of it.

A stop (SIGTERM, Ctrl-C, ``vramtui stop``) admits nothing new and lets each running job finish
within its backend's stop grace (``timeouts.stop_grace``); the log names those jobs and how
long it waits.  A stop asked *now* (a second SIGTERM or Ctrl-C, ``vramtui stop --now``) waits
for none: the workers are stopped at once and their running jobs end interrupted (a journaled
one runs again, marked interrupted, when the engine starts again); one asked while a stop
already waits out a worker's stop grace cuts that wait short too (``WorkerPool.hurry``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..units import seconds_text

if TYPE_CHECKING:
    from .pool import WorkerPool

SHOWN = 10  # job ids named in the log line; the rest are counted


@dataclass(frozen=True, slots=True)
class Waiting:
    """A running job a stop waits for, and for how long at most."""

    job_id: str
    backend: str
    grace_s: float


def waiting(pool: WorkerPool) -> tuple[Waiting, ...]:
    """The jobs running on the pool's workers, each with its backend's stop grace."""
    return tuple(Waiting(job_id, rt.spec.name, rt.spec.timeouts.stop_grace_s)
                 for rt in pool.live() for job_id in rt.admitted)


def request(pool: WorkerPool, stop: Callable[[], None], now: bool) -> tuple[str, ...]:
    """Ask the stop (``now``: the pool waits for no running job); the jobs it waits for."""
    if now:
        pool.hurry()
    stop()
    return () if now else tuple(w.job_id for w in waiting(pool))


def stop_line(pool: WorkerPool, calibrating: Collection[str] = ()) -> str:
    """The log's line for a stop: what it waits for (or interrupts), and how to hurry it;
    ``calibrating``: the backends whose calibration the stop interrupts (a run of minutes is
    never waited for)."""
    jobs, now = waiting(pool), pool.hurrying
    cut = "".join(f"; the calibration of {name} is interrupted (run `vramtui calibrate {name}` "
                  "again)" for name in sorted(calibrating))
    if not jobs:
        return "stopping: no job is running" + cut
    names = ", ".join(f"{w.job_id} ({w.backend})" for w in jobs[:SHOWN])
    if len(jobs) > SHOWN:
        names += f" and {len(jobs) - SHOWN} more"
    if now:
        return (f"stopping now: {len(jobs)} running job(s) interrupted: {names} (journaled "
                f"ones run again when the engine starts){cut}")
    longest = seconds_text(max(w.grace_s for w in jobs))
    return (f"stopping: waiting up to {longest} for {len(jobs)} running job(s) to finish: "
            f"{names} (a second SIGTERM or Ctrl-C, or `vramtui stop --now`, stops at once)"
            f"{cut}")
