"""Test worker (worker_sdk): the two-parameter ``predict(payload, ctx)`` form."""

from __future__ import annotations

import json

import worker_sdk


@worker_sdk.predict
def predict(payload: bytes, ctx: worker_sdk.RequestContext) -> bytes:
    assert ctx is worker_sdk.current()
    return json.dumps({"payload": payload.decode(), "id": ctx.id, "meta": ctx.metadata}).encode()
