"""Backend descriptors: the YAML that says how to run each model and how much VRAM it needs.

- ``schema``  — ``BackendSpec`` / ``VramSpec`` / ``Timeouts`` and field validation
- ``yamlio``  — YAML reading that keeps line numbers
- ``raw``     — unvalidated entries, per-key layering and origins
- ``vramd``   — reading vramd's ``version: 2`` files (``vramd_tools``: its interpolations
  and ``tool:``; ``vramd_import``: those files in our spelling, for ``vramtui import-vramd``)
- ``loader``  — layers, ``extends``, ``load_backends`` → ``LoadResult``
- ``overlay`` — ``write_overlay`` for calibration results
- ``errors``  — ``DescriptorError`` (and ``DescriptorWarning``), one line with file:line,
  backend and field

Sizes and durations as written in YAML are read by :mod:`supervisor.units`.
"""

from __future__ import annotations

from .errors import DescriptorError, DescriptorWarning
from .loader import (
    BACKENDS_ENV,
    LoadResult,
    default_layers,
    demo_backends_dir,
    load_backends,
    packaged_defaults_dir,
)
from .overlay import write_overlay
from .schema import (
    DEFAULT_KEEP_ALIVE_S,
    DEFAULT_SAFETY_MIB,
    BackendSpec,
    Timeouts,
    VramSpec,
)

__all__ = [
    "BACKENDS_ENV",
    "DEFAULT_KEEP_ALIVE_S",
    "DEFAULT_SAFETY_MIB",
    "BackendSpec",
    "DescriptorError",
    "DescriptorWarning",
    "LoadResult",
    "Timeouts",
    "VramSpec",
    "default_layers",
    "demo_backends_dir",
    "load_backends",
    "packaged_defaults_dir",
    "write_overlay",
]
