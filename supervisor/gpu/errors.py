"""Errors raised by the GPU probes.

Owned here for now; the engine re-exports them from ``supervisor.errors``.
"""

from __future__ import annotations


class GpuUnavailable(RuntimeError):
    """The requested GPU source cannot be used (NVML missing, no driver, no device...)."""


class BadGpuSpec(ValueError):
    """A ``--gpus`` value or simulated-GPU spec that cannot be parsed."""
