"""Bench worker on worker_sdk: echo the payload."""

from __future__ import annotations

import worker_sdk


@worker_sdk.predict
def predict(payload: bytes) -> bytes:
    return payload
