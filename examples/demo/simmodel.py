"""A simulated generative model for the simulated GPU: loads, generates, reports progress.

It holds simulated VRAM through ``worker_sdk.sim`` exactly as a real model holds CUDA memory:
``weights`` MiB from initialize until exit, plus ``activation`` MiB while a request runs.
Sizes and timings come from the environment (set per backend in the descriptor):

  SIM_WEIGHTS_MIB, SIM_ACTIVATION_MIB   memory held (MiB)
  SIM_LOAD_S                            seconds to "load the weights"
  SIM_STEP_S, SIM_STEPS                 a request runs SIM_STEPS steps of SIM_STEP_S seconds
  SIM_SLEEP_KEEP_MIB                    with it, the model can sleep (``@worker_sdk.sleep`` and
                                        ``@worker_sdk.wake``): asleep it keeps this much of its
                                        weights on the GPU (its CUDA context stays too)
  SIM_WAKE_S                            seconds a wake takes (default 0.1)

A request is JSON (``{"steps": 10, "step_s": 0.2, "fail": false}``, every key optional) or
anything else (the defaults).  Each step reports progress and stops at once when cancelled.
The reply is JSON with what was simulated.  On a real GPU ``worker_sdk.sim`` does nothing.
"""

import json
import os
import time

import worker_sdk
from worker_sdk import sim

WEIGHTS = int(os.environ.get("SIM_WEIGHTS_MIB", "1024"))
ACTIVATION = int(os.environ.get("SIM_ACTIVATION_MIB", "512"))
LOAD_S = float(os.environ.get("SIM_LOAD_S", "0.5"))
STEP_S = float(os.environ.get("SIM_STEP_S", "0.1"))
STEPS = int(os.environ.get("SIM_STEPS", "10"))
SLEEP_KEEP = os.environ.get("SIM_SLEEP_KEEP_MIB", "").strip()
WAKE_S = float(os.environ.get("SIM_WAKE_S", "0.1"))


@worker_sdk.initialize
def load() -> None:
    time.sleep(LOAD_S)  # the time a real model takes to read its weights
    sim.allocate(WEIGHTS)


@worker_sdk.predict
def generate(payload: bytes, ctx: worker_sdk.RequestContext) -> worker_sdk.Response:
    try:
        request = json.loads(payload) if payload else {}
    except ValueError:
        request = {}
    if not isinstance(request, dict):
        request = {}
    steps = int(request.get("steps", STEPS))
    step_s = float(request.get("step_s", STEP_S))
    started = time.monotonic()
    sim.allocate(ACTIVATION)
    try:
        for i in range(steps):
            ctx.progress(i / steps, f"step {i + 1}/{steps}")
            if ctx.wait_cancelled(step_s):
                raise worker_sdk.Cancelled(f"cancelled at step {i + 1}")
            if request.get("fail") and i == steps // 2:
                raise RuntimeError("simulated failure half-way")
        ctx.progress(1.0, "done")
    finally:
        sim.free(ACTIVATION)
    body = {
        "backend": os.environ.get("VRAMTUI_BACKEND", "?"),
        "pid": os.getpid(),
        "steps": steps,
        "seconds": round(time.monotonic() - started, 3),
        "metadata": ctx.metadata,
    }
    return worker_sdk.Response(json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})


@worker_sdk.unload
def unload() -> None:
    sim.reset()


if SLEEP_KEEP:
    KEEP = min(int(SLEEP_KEEP), WEIGHTS)

    @worker_sdk.sleep
    def fall_asleep() -> dict[str, int]:
        """Give the weights back but KEEP MiB (a real model: ``model.to("cpu")``)."""
        sim.free(WEIGHTS - KEEP)
        return {"kept_mib": KEEP}

    @worker_sdk.wake
    def wake_up() -> None:
        time.sleep(WAKE_S)  # the time a real model takes to move its weights back
        sim.allocate(WEIGHTS - KEEP)
