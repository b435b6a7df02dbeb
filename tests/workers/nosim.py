"""Test worker that never uses worker_sdk.sim: on the simulated GPU it holds only its context."""

from __future__ import annotations

import worker_sdk


@worker_sdk.predict
def predict(payload: bytes) -> bytes:
    return b"ok"
