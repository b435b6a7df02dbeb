"""Test worker (worker_sdk): every kind of reply, selected by a JSON command in the payload.

A payload that is not a JSON object is echoed.  Commands: ``{"op": ...}`` with ops
``response``, ``stream``, ``error``, ``context``, ``progress``, ``coop`` (cooperative cancel),
``block`` (waits on a FIFO gate), ``stream_gate`` (a stream that waits on a gate between
chunks), ``init_count``, ``bad_return``, ``env``.  ``@initialize`` and ``@unload`` write marker
files so tests can count them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from _helpers import mark, wait_gate

import worker_sdk

INIT_CALLS = 0


@worker_sdk.initialize
def setup() -> None:
    global INIT_CALLS
    INIT_CALLS += 1
    mark("init", "init")


@worker_sdk.unload
def teardown() -> None:
    mark("unload", "unload")


@worker_sdk.hardware_health
def health() -> dict[str, Any]:
    return {"status": "ok", "device": "test"}


def _stream(n: int) -> Iterator[bytes | str]:
    ctx = worker_sdk.current()
    for i in range(n):
        ctx.progress((i + 1) / n, f"chunk {i + 1} of {n}")
        yield f"chunk {i}\n".encode() if i % 2 == 0 else f"chunk {i}\n"  # str chunks too


def _stream_gate(gate: str) -> Iterator[bytes]:
    try:
        yield b"first"
        wait_gate(gate)
        yield b"second"
        yield b"third"
    finally:
        mark("stream_closed", "closed")


@worker_sdk.predict
def predict(payload: bytes) -> Any:
    try:
        cmd = json.loads(payload)
    except ValueError:
        return payload
    if not isinstance(cmd, dict):
        return payload
    op = cmd.get("op")
    ctx = worker_sdk.current()
    if op == "response":
        data = cmd.get("data", "").encode()
        return worker_sdk.Response(data, cmd.get("headers"), cmd.get("status", 200))
    if op == "stream":
        return _stream(int(cmd["n"]))
    if op == "error":
        raise ValueError(cmd.get("message", "boom"))
    if op == "context":
        return json.dumps(
            {"id": ctx.id, "wire_id": ctx.wire_id, "metadata": ctx.metadata,
             "deadline": ctx.deadline}
        ).encode()
    if op == "progress":
        for step, text in enumerate(cmd["steps"]):
            ctx.progress(cmd["fractions"][step], text)
        return b"done"
    if op == "coop":
        ctx.progress(0.0, "started")
        # A cooperative predict: polls for cancellation between units of work (bounded).
        for _ in range(400):
            ctx.check_cancelled()
            ctx.wait_cancelled(0.025)
        return b"never cancelled"
    if op == "block":
        ctx.progress(None, "blocked")
        wait_gate(cmd["gate"])
        return b"released"
    if op == "stream_gate":
        return _stream_gate(cmd["gate"])
    if op == "init_count":
        return str(INIT_CALLS).encode()
    if op == "bad_return":
        return 42
    if op == "env":
        return os.environ.get(cmd["key"], "<unset>").encode()
    return payload
