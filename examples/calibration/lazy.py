"""A simulated model that loads lazily: nothing at initialize, its weights in the first request.

The weights (SIM_WEIGHTS_MIB) are then kept; each request also holds SIM_ACTIVATION_MIB.
Expected: context 256, weights 0, activation W + A, peak 256 + W + A; finding
``lazy-loading``.
"""

import time

from _simenv import ACTIVATION, LOAD_S, PREDICT_S, WEIGHTS, hold

import worker_sdk
from worker_sdk import sim

_loaded = False


@worker_sdk.initialize
def load() -> None:
    time.sleep(LOAD_S)  # imports and configuration only: no weights yet


@worker_sdk.predict
def generate(payload: bytes, ctx: worker_sdk.RequestContext) -> bytes:
    global _loaded
    if not _loaded:
        sim.allocate(WEIGHTS)
        _loaded = True
    sim.allocate(ACTIVATION)
    try:
        hold(ctx, PREDICT_S)
    finally:
        sim.free(ACTIVATION)
    return b"ok"


@worker_sdk.unload
def unload() -> None:
    sim.reset()
