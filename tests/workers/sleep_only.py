"""Test worker (worker_sdk): a ``@sleep`` without a ``@wake`` (refused at start)."""

from __future__ import annotations

import worker_sdk


@worker_sdk.predict
def echo(payload: bytes) -> bytes:
    return payload


@worker_sdk.sleep
def sleep() -> None:
    pass
