"""Test worker (worker_sdk): a script that fails while being imported."""

from __future__ import annotations

import vramtui_test_no_such_module  # noqa: F401

import worker_sdk


@worker_sdk.predict
def predict(payload: bytes) -> bytes:
    return payload
