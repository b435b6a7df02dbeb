"""Shared by the calibration examples: sizes and times from the environment, and a hold.

  SIM_WEIGHTS_MIB     weights held from initialize (default 1024)
  SIM_ACTIVATION_MIB  extra memory while a request runs (default 512)
  SIM_LOAD_S          seconds initialize takes (default 0.3)
  SIM_PREDICT_S       seconds a request holds its activation (default 0.3)

Each example adds its own variables.  The CUDA context is the simulated GPU's per-process
overhead (256 MiB by default), counted from the moment ``worker_sdk`` attaches at start.
"""

from __future__ import annotations

import os

import worker_sdk


def mib(name: str, default: int) -> int:
    """A size in MiB from the environment variable ``name``."""
    return int(os.environ.get(name, str(default)))


def seconds(name: str, default: float) -> float:
    """A duration in seconds from the environment variable ``name``."""
    return float(os.environ.get(name, str(default)))


WEIGHTS = mib("SIM_WEIGHTS_MIB", 1024)
ACTIVATION = mib("SIM_ACTIVATION_MIB", 512)
LOAD_S = seconds("SIM_LOAD_S", 0.3)
PREDICT_S = seconds("SIM_PREDICT_S", 0.3)


def hold(ctx: worker_sdk.RequestContext, duration: float) -> None:
    """Keep the request running ``duration`` seconds (stopping at once if cancelled)."""
    if ctx.wait_cancelled(duration):
        raise worker_sdk.Cancelled("cancelled")
