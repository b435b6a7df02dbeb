"""What a calibration run produces: raw samples of the worker's memory and its phase marks.

A run (the engine's, or ``harness.run_with_wire_server``) spawns a fresh worker alone on a GPU,
samples the memory of every process of the worker's process tree at 20 Hz and marks the START
of each phase; a phase lasts until the next mark.  The phases, in order:

- ``start``: the process was spawned (no CUDA context yet);
- ``initialize``: the worker's own status event ``initializing`` arrived (it loads);
- ``settle-load``: the worker said ``ready``; the run waits ``settle_s``;
- ``predict-<i>`` / ``settle-<i>`` for i in 1..repeats: the request was sent / its reply
  arrived (then the run waits ``settle_s``);
- for a worker that can sleep (``@worker_sdk.sleep`` and ``@wake``): ``sleep`` (asked),
  ``asleep`` (it answered; the run waits ``settle_s``: what it keeps asleep), ``wake`` (asked)
  and ``woken`` (it answered: the wake's time; the run waits ``settle_s``);
- ``shutdown``: SHUTDOWN was sent (the worker's ``@unload`` runs, then it exits);
- ``exited``: the process is gone; sampling goes on about ``settle_s`` to see memory return;
- ``end``: sampling stopped.

A run that fails stops marking where it failed (and still ends with ``end``).  Times are
seconds since the run started; memory is MiB.  Nothing here computes anything: see
``analysis``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

START = "start"
INITIALIZE = "initialize"
SETTLE_LOAD = "settle-load"
SHUTDOWN = "shutdown"
EXITED = "exited"
END = "end"
SLEEP = "sleep"
ASLEEP = "asleep"
WAKE = "wake"
WOKEN = "woken"
LOAD_PHASES = (START, INITIALIZE, SETTLE_LOAD)

OUTCOMES = frozenset({"completed", "cancelled", "crashed", "failed"})
_RUN_PHASE = re.compile(r"^(predict|settle)-([1-9][0-9]*)$")


class CalibrationError(Exception):
    """A calibration record or report that cannot be used (malformed, unreadable)."""


def predict_phase(i: int) -> str:
    """The phase of run ``i``'s request (1-based): ``predict-<i>``."""
    return f"predict-{i}"


def settle_phase(i: int) -> str:
    """The phase after run ``i``'s reply (1-based): ``settle-<i>``."""
    return f"settle-{i}"


def run_of(phase: str) -> tuple[str, int] | None:
    """``"predict-2"`` -> ``("predict", 2)``; None for a phase that is not part of a run."""
    match = _RUN_PHASE.match(phase)
    return (match.group(1), int(match.group(2))) if match else None


@dataclass(frozen=True)
class CalSample:
    """One reading: ``procs`` maps pid -> MiB for the worker's processes the GPU source showed
    (empty: none of them visible); ``device_used_mib`` is the whole GPU's used memory.  It
    was read over ``read_s`` seconds from ``t``: it shows some instant of that span."""

    t: float
    procs: dict[int, int] = field(default_factory=dict)
    device_used_mib: int | None = None
    read_s: float = 0.0

    @property
    def visible(self) -> bool:
        """Some process of the worker was seen on the GPU."""
        return bool(self.procs)

    @property
    def total(self) -> int | None:
        """The worker's memory (its processes summed), None when none was visible."""
        return sum(self.procs.values()) if self.procs else None


@dataclass(frozen=True)
class PhaseMark:
    """The start of ``phase`` at ``t`` seconds; it lasts until the next mark."""

    t: float
    phase: str


@dataclass(frozen=True)
class CalibrationRecord:
    """Everything one run observed; the input of ``analysis.analyze``.

    ``per_process`` is False when the GPU source cannot attribute memory to processes (then
    nothing can be measured). ``allocated`` is False when the source could tell that the
    worker never allocated memory of its own (a simulated worker that does not use
    ``worker_sdk.sim``): then nothing was measured either; None when the source cannot tell.
    ``outcome`` is ``completed``, ``cancelled``, ``crashed`` (the worker died) or ``failed``
    (an error reply, a timeout, an init failure); ``error`` says why.
    """

    backend: str
    gpu: int
    source: str
    per_process: bool
    sample_hz: float
    repeats: int
    request: bytes
    started_wall: float
    samples: tuple[CalSample, ...]
    marks: tuple[PhaseMark, ...]
    device_total_mib: int
    outcome: str
    error: str | None = None
    allocated: bool | None = None

    def __post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome {self.outcome!r} is not one of {sorted(OUTCOMES)}")
        if not self.sample_hz > 0:
            raise ValueError(f"sample_hz must be > 0, got {self.sample_hz!r}")
        if self.repeats < 0:
            raise ValueError(f"repeats must be >= 0, got {self.repeats!r}")
        # Lists are accepted and kept as tuples, so that equal records compare equal.
        object.__setattr__(self, "samples", tuple(self.samples))
        object.__setattr__(self, "marks", tuple(self.marks))
        object.__setattr__(self, "request", bytes(self.request))

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases marked, in order."""
        return tuple(mark.phase for mark in self.marks)
