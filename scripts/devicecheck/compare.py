"""The device check's tolerances: when a measured figure counts as the truth.

Pure functions, standard library only.  A figure matches when it is within 2 % of the truth
or 64 MiB, whichever is larger (64 MiB is also the calibration analysis's own noise band).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

TOLERANCE_FRACTION = 0.02
TOLERANCE_MIB = 64
MIN_WATCH_HZ = 20.0


def tolerance(truth_mib: int) -> int:
    return max(TOLERANCE_MIB, int(abs(truth_mib) * TOLERANCE_FRACTION))


def within(measured_mib: int | None, truth_mib: int) -> bool:
    return measured_mib is not None and abs(measured_mib - truth_mib) <= tolerance(truth_mib)


def delta_text(measured_mib: int | None, truth_mib: int) -> str:
    if measured_mib is None:
        return "not measured"
    diff = measured_mib - truth_mib
    return f"{measured_mib} MiB ({diff:+d} MiB)"


def expect_text(truth_mib: int, what: str = "") -> str:
    tail = f" {what}" if what else ""
    return f"{truth_mib} MiB{tail} ± {tolerance(truth_mib)}"


def level(readings: Sequence[int]) -> tuple[int, int] | None:
    """(median, spread) of a steady stretch of readings; None when there are none."""
    if not readings:
        return None
    return int(statistics.median(readings)), max(readings) - min(readings)
