"""Test worker (worker_sdk): registers two ``@predict`` functions."""

from __future__ import annotations

import worker_sdk


@worker_sdk.predict
def first(payload: bytes) -> bytes:
    return payload


@worker_sdk.predict
def second(payload: bytes) -> bytes:
    return payload
