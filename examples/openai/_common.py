"""Shared by the OpenAI-shaped example workers: simulated memory, the request, ids.

Each worker holds ``SIM_WEIGHTS_MIB`` of simulated VRAM from initialize on, and
``SIM_ACTIVATION_MIB`` more while a request runs, through ``worker_sdk.sim`` (a no-op on a
real GPU), so admission, queueing and eviction treat it like a real model.  Outputs are
canned: these show the shapes of the wire, not a model.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterator

import worker_sdk
from worker_sdk import sim

WEIGHTS = int(os.environ.get("SIM_WEIGHTS_MIB", "512"))
ACTIVATION = int(os.environ.get("SIM_ACTIVATION_MIB", "128"))
LOAD_S = float(os.environ.get("SIM_LOAD_S", "0.05"))
STEP_S = float(os.environ.get("SIM_STEP_S", "0.01"))


def load() -> None:
    time.sleep(LOAD_S)  # the time a real model takes to read its weights
    sim.allocate(WEIGHTS)


def request(payload: bytes) -> dict:
    """The client's JSON body (the front door hands it over exactly as sent)."""
    body = json.loads(payload)
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    return body


@contextlib.contextmanager
def activation() -> Iterator[None]:
    """Hold the activation memory while a request runs."""
    sim.allocate(ACTIVATION)
    try:
        yield
    finally:
        sim.free(ACTIVATION)


def step(ctx: worker_sdk.RequestContext) -> None:
    """One step of 'work'; stops at once when the job is cancelled."""
    if ctx.wait_cancelled(STEP_S):
        raise worker_sdk.Cancelled("cancelled")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def json_reply(body: dict, status: int = 200) -> worker_sdk.Response:
    return worker_sdk.Response(json.dumps(body).encode(), status_code=status,
                               headers={"Content-Type": "application/json"})
