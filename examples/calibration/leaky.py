"""A simulated model that leaks: every request keeps SIM_LEAK_MIB (default 128) for good.

Otherwise like ``steady.py``.  Expected: context 256, weights W; with n repeats the last
request peaks at 256 + W + n*L + A, so activation = n*L + A; finding ``leak-across-repeats``
with a slope of L MiB per run.
"""

import time

from _simenv import ACTIVATION, LOAD_S, PREDICT_S, WEIGHTS, hold, mib

import worker_sdk
from worker_sdk import sim

LEAK = mib("SIM_LEAK_MIB", 128)


@worker_sdk.initialize
def load() -> None:
    time.sleep(LOAD_S)
    sim.allocate(WEIGHTS)


@worker_sdk.predict
def generate(payload: bytes, ctx: worker_sdk.RequestContext) -> bytes:
    sim.allocate(ACTIVATION + LEAK)  # the leak is never freed
    try:
        hold(ctx, PREDICT_S)
    finally:
        sim.free(ACTIVATION)
    return b"ok"


@worker_sdk.unload
def unload() -> None:
    sim.reset()
