"""Test worker: logs every execution's start and end (job id, pid, time) to the marker file
``executions`` and holds simulated memory like the demo model: ``SIM_WEIGHTS_MIB`` from
initialize, ``SIM_ACTIVATION_MIB`` more while a request runs (``LIE_*`` variants: what it
really takes when it lies). A request is ``{"seconds": s}``; cancellation stops it."""

from __future__ import annotations

import json
import os
import time

from _helpers import mark

import worker_sdk
from worker_sdk import sim

WEIGHTS = int(os.environ.get("SIM_WEIGHTS_MIB", "512"))
ACTIVATION = int(os.environ.get("SIM_ACTIVATION_MIB", "256"))


@worker_sdk.initialize
def load() -> None:
    time.sleep(float(os.environ.get("SIM_LOAD_S", "0")))
    sim.allocate(WEIGHTS)


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext) -> bytes:
    request = json.loads(payload or b"{}")
    mark("executions", f"start {ctx.id} {os.getpid()} {time.time():.6f}")
    sim.allocate(ACTIVATION)
    try:
        if ctx.wait_cancelled(float(request.get("seconds", 0.5))):
            raise worker_sdk.Cancelled("cancelled")
    finally:
        sim.free(ACTIVATION)
    mark("executions", f"end {ctx.id} {os.getpid()} {time.time():.6f}")
    return b"done"
