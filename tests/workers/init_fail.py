"""Test worker (worker_sdk): an ``@initialize`` that raises; ``@unload`` must not run."""

from __future__ import annotations

from _helpers import mark

import worker_sdk


@worker_sdk.initialize
def load_model() -> None:
    raise RuntimeError("model weights missing at /nonexistent/weights.bin")


@worker_sdk.unload
def teardown() -> None:
    mark("unload", "unload")


@worker_sdk.predict
def predict(payload: bytes) -> bytes:
    return payload
