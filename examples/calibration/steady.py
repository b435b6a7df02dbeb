"""A well-behaved simulated model: calibration should measure it exactly and find nothing.

Holds SIM_WEIGHTS_MIB from initialize to unload and SIM_ACTIVATION_MIB more while a request
runs (see ``_simenv``).  Expected: context 256, weights W, activation A, peak 256 + W + A.
"""

import time

from _simenv import ACTIVATION, LOAD_S, PREDICT_S, WEIGHTS, hold

import worker_sdk
from worker_sdk import sim


@worker_sdk.initialize
def load() -> None:
    time.sleep(LOAD_S)  # reading the weights
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
    sim.reset()
