"""The engine's time, and the one place its times become wall-clock epoch seconds.

The engine keeps time on a monotonic clock (immune to clock changes; injected, so tests can
drive it): every time it holds is such a reading, of :func:`monotonic` and nothing else.
That is Linux's ``CLOCK_BOOTTIME`` where the system has it: ``CLOCK_MONOTONIC`` (Python's
``time.monotonic``) stops while the machine is suspended, so after a night's suspend every
time converted below would lag the wall clock by the night (a job submitted now "8 h ago"),
and a deadline would not count the suspend.  Every reading in the engine's process comes from
this one clock: one of ``time.monotonic`` beside it would be off by every suspend since
boot (``tests/test_one_clock.py`` looks for one).  What leaves the engine (views, the
journal) carries wall-clock seconds since the epoch, converted here by :class:`WallClock`,
whose offset is fixed per clock (so every view and the journal agree to the microsecond).
The doors never convert again: a view's times are already epoch seconds.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

Clock = Callable[[], float]



def _boot_clock() -> Clock:
    """``CLOCK_BOOTTIME`` (monotonic, and counting a suspend) where it reads, else
    ``time.monotonic``."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    if boottime is None:
        return time.monotonic
    try:
        time.clock_gettime(boottime)
    except OSError:
        return time.monotonic
    return functools.partial(time.clock_gettime, boottime)


#: The engine's one monotonic clock (see the module doc).
monotonic: Clock = _boot_clock()

_MONO_TO_WALL = time.time() - monotonic()


def wall_offset(clock: Clock = monotonic) -> float:
    """What to add to a reading of ``clock`` to get wall-clock seconds."""
    return _MONO_TO_WALL if clock is monotonic else time.time() - clock()


class WallClock:
    """Engine times to wall-clock epoch seconds and back, for one clock."""

    __slots__ = ("clock", "offset")

    def __init__(self, clock: Clock = monotonic) -> None:
        self.clock = clock
        self.offset = wall_offset(clock)

    def wall(self, t: float) -> float:
        return t + self.offset

    def now(self) -> float:
        """The clock's present instant as wall-clock epoch seconds."""
        return self.clock() + self.offset

    def maybe_wall(self, t: float | None) -> float | None:
        return None if t is None else t + self.offset

    def engine_time(self, wall: float) -> float:
        """A wall-clock time (from the journal) as a time of the engine's clock."""
        return wall - self.offset


MONOTONIC = WallClock()
