"""Test worker (worker_sdk): an ``async def`` predict and an async generator stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from _helpers import mark

import worker_sdk


async def _chunks(n: int) -> AsyncIterator[bytes]:
    for i in range(n):
        await asyncio.sleep(0)
        yield f"async {i}".encode()


async def _endless() -> AsyncIterator[bytes]:
    try:
        yield b"first"
        await asyncio.Event().wait()  # never set: only a cancel ends this
        yield b"unreachable"
    finally:
        mark("agen_closed", "closed")


@worker_sdk.predict
async def predict(payload: bytes) -> Any:
    cmd = json.loads(payload) if payload.startswith(b"{") else {"op": "echo"}
    op = cmd["op"]
    ctx = worker_sdk.current()
    if op == "echo":
        await asyncio.sleep(0)
        return b"async:" + payload + b":" + ctx.id.encode()
    if op == "stream":
        return _chunks(int(cmd["n"]))
    if op == "endless":
        return _endless()
    if op == "block":
        ctx.progress(None, "started")
        try:
            await asyncio.Event().wait()  # never set: only a cancel ends this
        except asyncio.CancelledError:
            mark("async_cancelled", "cancelled")
            raise
    if op == "error":
        raise KeyError("async failure")
    return payload
