"""Test worker (worker_sdk): ordered ``@initialize`` functions; predict returns the order run."""

from __future__ import annotations

import worker_sdk

ORDER: list[str] = []


@worker_sdk.initialize(2)
def c() -> None:
    ORDER.append("c2")


@worker_sdk.initialize
def a() -> None:
    ORDER.append("a0")


@worker_sdk.initialize(1)
def b() -> None:
    ORDER.append("b1")


@worker_sdk.initialize(0)
def a_second() -> None:
    ORDER.append("a0-second")


@worker_sdk.initialize(-5)
def first() -> None:
    ORDER.append("neg5")


@worker_sdk.predict
def predict(payload: bytes) -> bytes:
    return ",".join(ORDER).encode()
