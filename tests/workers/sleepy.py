"""Test worker (worker_sdk) with ``@sleep`` and ``@wake``, honest or not, on the simulated GPU.

It holds ``SLEEPY_WEIGHTS`` MiB (``worker_sdk.sim``) from initialize on; asleep it keeps
``SLEEPY_KEEP`` MiB.  ``SLEEPY_MODE`` picks how it behaves:

- ``honest`` (default): sleep frees all but SLEEPY_KEEP and says so; wake takes it back after
  ``SLEEPY_WAKE_S`` seconds;
- ``async``: the same, with ``async`` hooks;
- ``keeps``: sleep "succeeds" but gives nothing back (and says nothing);
- ``lies``: sleep says it keeps SLEEPY_KEEP but gives nothing back;
- ``sleep-fails`` / ``wake-fails``: that hook raises;
- ``wake-hangs``: wake never returns.

``SLEEPY_HOST_MIB`` (default 0): its sleep also takes that much host memory (touched), kept
until it wakes, and says nothing of it (``host_mib: 0``).

A request answers ``{"pid": ..., "asleep_calls": n, "wake_calls": n, "level": last level}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import worker_sdk
from worker_sdk import sim

WEIGHTS = int(os.environ.get("SLEEPY_WEIGHTS", "1000"))
KEEP = int(os.environ.get("SLEEPY_KEEP", "100"))
WAKE_S = float(os.environ.get("SLEEPY_WAKE_S", "0"))
MODE = os.environ.get("SLEEPY_MODE", "honest")
HOST_MIB = int(os.environ.get("SLEEPY_HOST_MIB", "0"))
CALLS = {"sleep": 0, "wake": 0, "level": 0}
HOST: list[bytearray] = []  # the host memory its sleep took (the weights moved there)


@worker_sdk.initialize
def load() -> None:
    sim.allocate(WEIGHTS)


@worker_sdk.predict
def predict(payload: bytes) -> bytes:
    return json.dumps({"pid": os.getpid(), "sleep_calls": CALLS["sleep"],
                       "wake_calls": CALLS["wake"], "level": CALLS["level"],
                       "payload": payload.decode(errors="replace")}).encode()


def _sleep(level: int) -> dict[str, int] | None:
    CALLS["sleep"] += 1
    CALLS["level"] = level
    if MODE == "sleep-fails":
        raise RuntimeError("cannot release the weights")
    if MODE == "keeps":
        return None
    if MODE == "lies":
        return {"kept_mib": KEEP}
    sim.free(WEIGHTS - KEEP)
    if HOST_MIB:
        HOST.append(bytearray(b"\1" * (HOST_MIB << 20)))  # (touched: resident)
    return {"kept_mib": KEEP, "host_mib": 0}


def _wake() -> None:
    CALLS["wake"] += 1
    HOST.clear()
    if MODE == "wake-fails":
        raise RuntimeError("the weights are gone")
    if MODE == "wake-hangs":
        while True:
            time.sleep(3600)
    if WAKE_S:
        time.sleep(WAKE_S)
    if MODE not in ("keeps", "lies"):
        sim.allocate(WEIGHTS - KEEP)


if MODE == "async":

    @worker_sdk.sleep
    async def sleep_async(level: int) -> dict[str, int] | None:
        await asyncio.sleep(0)
        return _sleep(level)

    @worker_sdk.wake
    async def wake_async() -> None:
        await asyncio.sleep(WAKE_S)
        CALLS["wake"] += 1
        sim.allocate(WEIGHTS - KEEP)

else:
    worker_sdk.sleep(_sleep)
    worker_sdk.wake(_wake)
