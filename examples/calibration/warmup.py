"""A simulated model whose first request needs SIM_WARMUP_MIB (default 768) more, transiently.

Like a first call that autotunes kernels or builds caches.  Expected: context 256, weights W,
activation A + X, peak 256 + W + A + X; finding ``warm-up``.
"""

import time

from _simenv import ACTIVATION, LOAD_S, PREDICT_S, WEIGHTS, hold, mib

import worker_sdk
from worker_sdk import sim

WARMUP = mib("SIM_WARMUP_MIB", 768)
_warm = False


@worker_sdk.initialize
def load() -> None:
    time.sleep(LOAD_S)
    sim.allocate(WEIGHTS)


@worker_sdk.predict
def generate(payload: bytes, ctx: worker_sdk.RequestContext) -> bytes:
    global _warm
    extra = ACTIVATION if _warm else ACTIVATION + WARMUP
    _warm = True
    sim.allocate(extra)
    try:
        hold(ctx, PREDICT_S)
    finally:
        sim.free(extra)
    return b"ok"


@worker_sdk.unload
def unload() -> None:
    sim.reset()
