"""Moved to :mod:`supervisor.units` (sizes and durations, parsed and printed, in one place).

Only ``supervisor/calibration/engine_run.py`` still imports ``parse_size`` from here; it is
being rewritten, and this shim goes once it imports from :mod:`supervisor.units`.
"""

from __future__ import annotations

from ..units import parse_size

__all__ = ["parse_size"]
