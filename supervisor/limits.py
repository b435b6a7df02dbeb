"""The engine's limits that a user may change, read from the environment in one place.

- ``VRAMTUI_MAX_QUEUE``: jobs waiting at most (default 512); a submit past it is refused
  with "queue full" (the CLI's exit 5, HTTP 503 for a remote front).
- ``VRAMTUI_MAX_REQUEST``: the largest request the control socket takes, as a size
  (``64MiB`` by default; ``1GiB``, ``512MiB``; a bare number is MiB); a larger one is
  answered "request too large" and the connection goes on.

A bad value stops the start with one line naming the variable (exit 2), never silently.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import VramtuiError

DEFAULT_MAX_QUEUE = 512
DEFAULT_MAX_REQUEST = 64 * 1024 * 1024


class BadLimit(VramtuiError):
    """A limit in the environment that cannot be used."""


@dataclass(frozen=True)
class Limits:
    max_queue: int = DEFAULT_MAX_QUEUE
    max_request: int = DEFAULT_MAX_REQUEST  # bytes

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Limits:
        queue = environ.get("VRAMTUI_MAX_QUEUE", "").strip()
        request = environ.get("VRAMTUI_MAX_REQUEST", "").strip()
        max_queue = DEFAULT_MAX_QUEUE
        if queue:
            if not queue.isdigit() or not 1 <= int(queue) <= 10_000_000:
                raise BadLimit(f"VRAMTUI_MAX_QUEUE={queue!r}: give a number of jobs between 1 "
                               "and 10000000 (default 512)")
            max_queue = int(queue)
        max_request = DEFAULT_MAX_REQUEST
        if request:
            from .backends.units import parse_size

            try:
                mib = parse_size(request)  # a bare number is MiB, as in descriptors
            except ValueError as exc:
                raise BadLimit(f"VRAMTUI_MAX_REQUEST={request!r}: {exc}") from None
            if not 1 <= mib <= 4096:
                raise BadLimit(f"VRAMTUI_MAX_REQUEST={request!r}: give a size between 1MiB "
                               "and 4GiB (default 64MiB)")
            max_request = mib * 1024 * 1024
        return cls(max_queue, max_request)
