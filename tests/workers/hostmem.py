"""Test worker holding real host memory, touched page by page (for the host device).

  HOSTMEM_WEIGHTS_MIB     allocated at initialize, held until exit
  HOSTMEM_ACTIVATION_MIB  allocated per request, freed when it ends
  HOSTMEM_LOAD_S          seconds initialize waits once the weights are touched (default 0)
  HOSTMEM_STEP_S          seconds a request holds its activation (default 0.3)
  HOSTMEM_ORPHAN_MIB      with it, initialize starts a child in its own session that holds
                          this much and outlives the worker (until HOSTMEM_ORPHAN_S, 30 s):
                          without the worker's mark, so a crash does not take it with it

Unloading frees the weights.  A request's JSON may set ``step_s``, or ``exit`` (the worker
exits at once, as a crash: its child is left behind).  The reply is the worker's pid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import worker_sdk
from supervisor.workers.lifeline import WORKER_MARK

MIB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")
WEIGHTS = int(os.environ.get("HOSTMEM_WEIGHTS_MIB", "0"))
ACTIVATION = int(os.environ.get("HOSTMEM_ACTIVATION_MIB", "0"))
LOAD_S = float(os.environ.get("HOSTMEM_LOAD_S", "0"))
STEP_S = float(os.environ.get("HOSTMEM_STEP_S", "0.3"))
ORPHAN = int(os.environ.get("HOSTMEM_ORPHAN_MIB", "0"))
ORPHAN_S = float(os.environ.get("HOSTMEM_ORPHAN_S", "30"))
HOLD = ("import sys, time\n"
        "b = bytearray(int(sys.argv[1]) * 1048576)\n"
        "for i in range(0, len(b), 4096): b[i] = 1\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n")

held: list[bytearray] = []


def touched(mib: int) -> bytearray:
    """``mib`` MiB that are really resident: every page written."""
    block = bytearray(mib * MIB)
    for i in range(0, len(block), PAGE):
        block[i] = 1
    return block


@worker_sdk.initialize
def load() -> None:
    held.append(touched(WEIGHTS))
    if ORPHAN:
        env = {k: v for k, v in os.environ.items() if k != WORKER_MARK}
        child = subprocess.Popen([sys.executable, "-c", HOLD, str(ORPHAN), str(ORPHAN_S)],
                                 stdout=subprocess.PIPE, start_new_session=True, env=env)
        assert child.stdout is not None
        child.stdout.readline()  # it holds its memory now
    time.sleep(LOAD_S)


@worker_sdk.unload
def unload() -> None:
    held.clear()  # the weights go back to the kernel at once (a large block is its own mapping)


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext) -> bytes:
    try:
        request = json.loads(payload) if payload else {}
    except ValueError:
        request = {}
    if isinstance(request, dict) and request.get("exit"):
        os._exit(3)
    step_s = float(request.get("step_s", STEP_S)) if isinstance(request, dict) else STEP_S
    block = touched(ACTIVATION)
    ctx.wait_cancelled(step_s)
    del block
    return str(os.getpid()).encode()
