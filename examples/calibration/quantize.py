"""A simulated model quantised after loading: 2W at initialize, then W before ``ready``.

It loads at full precision (2 * SIM_WEIGHTS_MIB, held SIM_LOAD_S), then frees half.
Expected: context 256, weights W, activation A, peak 256 + 2W (the load peak); finding
``load-peak-above-inference`` (with the defaults 2W > W + A).
"""

import time

from _simenv import ACTIVATION, LOAD_S, PREDICT_S, WEIGHTS, hold

import worker_sdk
from worker_sdk import sim


@worker_sdk.initialize
def load() -> None:
    time.sleep(LOAD_S)
    sim.allocate(2 * WEIGHTS)  # fp16 weights
    time.sleep(LOAD_S)  # quantising
    sim.free(WEIGHTS)  # the fp16 copy goes


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
