"""Compat worker on the unmodified verda-io 0.4.4 SDK: the same functions as compat_ours.py."""

from __future__ import annotations

from typing import Any

import verda_io
from _compat import answer


@verda_io.predict
def predict(payload: bytes) -> Any:
    return answer(payload, verda_io.Response)
