"""The peak to declare for a backend whose jobs use more than it declares: one owner, so the
TUI and ``vramtui backends`` always suggest the same figure, written the same way."""

from __future__ import annotations

import math

from supervisor.snapshot import BackendView
from supervisor.units import mib_rounded_up, mib_text

# The TUI's screens import the style under this name.
size_to_declare = mib_rounded_up

SUGGESTED_MARGIN = 1.05  # a suggested peak: the observed p95 plus 5 % ...
SUGGESTED_STEP_MIB = 64  # ... rounded up to this


def suggested_peak_mib(backend: BackendView) -> int | None:
    """For a backend whose observed p95 peak exceeds its declared peak, the peak to declare
    instead (observed p95 + 5 %, rounded up to 64 MiB); None when the declaration holds."""
    if not backend.over_declared or backend.observed_p95_mib is None:
        return None
    wanted = math.ceil(backend.observed_p95_mib * SUGGESTED_MARGIN)
    return -(-wanted // SUGGESTED_STEP_MIB) * SUGGESTED_STEP_MIB


def over_declared_line(backend: BackendView) -> str | None:
    """"observed p95 9.8 GiB > declared 9.0 GiB: set vram.peak to 10.3 GiB or run ..."."""
    suggested = suggested_peak_mib(backend)
    if suggested is None:
        return None
    return (f"{backend.name}: observed p95 {mib_text(backend.observed_p95_mib)} > declared "
            f"{mib_text(backend.declared_peak_mib)}: set vram.peak to {mib_rounded_up(suggested)} "
            f"or run `vramtui calibrate {backend.name}`")
