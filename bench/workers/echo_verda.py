"""Bench worker on the unmodified verda-io 0.4.4 SDK: echo the payload."""

from __future__ import annotations

import verda_io


@verda_io.predict
def predict(payload: bytes) -> bytes:
    return payload
