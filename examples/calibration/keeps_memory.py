"""A simulated model whose ``@unload`` frees nothing and takes SIM_UNLOAD_HOLD_S (0.6 s).

Its memory comes back only when the process exits.  Expected: context 256, weights W,
activation A, peak 256 + W + A; finding ``shutdown-keeps-memory``.
"""

import time

from _simenv import ACTIVATION, LOAD_S, PREDICT_S, WEIGHTS, hold, seconds

import worker_sdk
from worker_sdk import sim

UNLOAD_HOLD_S = seconds("SIM_UNLOAD_HOLD_S", 0.6)


@worker_sdk.initialize
def load() -> None:
    time.sleep(LOAD_S)
    sim.allocate(WEIGHTS)


@worker_sdk.predict
def generate(payload: bytes, ctx: worker_sdk.RequestContext) -> bytes:
    sim.allocate(ACTIVATION)
    try:
        hold(ctx, PREDICT_S)
    finally:
        sim.free(ACTIVATION)
    return b"ok"


@worker_sdk.unload
def unload() -> None:
    time.sleep(UNLOAD_HOLD_S)  # "cleaning up", but the weights stay where they are
