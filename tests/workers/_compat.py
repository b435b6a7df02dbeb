"""The predict logic both compat workers share (``compat_ours.py`` and ``compat_verda.py``)."""

from __future__ import annotations

import json
from typing import Any


def answer(payload: bytes, response_type: Any) -> Any:
    """Echo bytes; ``{"op": "response"|"error"|"stream"|"bad_return"}`` for the other kinds."""
    if not payload.startswith(b"{"):
        return payload
    cmd = json.loads(payload)
    op = cmd.get("op")
    if op == "response":
        return response_type(
            cmd["data"].encode(), headers=cmd.get("headers"), status_code=cmd.get("status", 200)
        )
    if op == "error":
        raise ValueError(cmd["message"])
    if op == "stream":
        return (f"part {i}".encode() for i in range(int(cmd["n"])))
    if op == "bad_return":
        return 3.5
    return payload
