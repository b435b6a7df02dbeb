"""Compat worker on worker_sdk: the same functions as compat_verda.py."""

from __future__ import annotations

from typing import Any

from _compat import answer

import worker_sdk


@worker_sdk.predict
def predict(payload: bytes) -> Any:
    return answer(payload, worker_sdk.Response)
