"""Test worker (worker_sdk): registers no ``@predict`` function."""

from __future__ import annotations

import worker_sdk


@worker_sdk.initialize
def setup() -> None:
    pass
