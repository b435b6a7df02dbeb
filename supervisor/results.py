"""Immutable answers of the API methods besides jobs and snapshots (log tails and the like).

Plain frozen dataclasses, so the control socket's codec carries them as it carries snapshots
(fields by name, rebuilt from their type hints on the client side).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogChunk:
    """Part of a worker's log: the last lines, or what followed an offset."""

    path: str
    data: bytes
    offset: int  # pass it back to read what comes next
    missing: bool = False  # there is no log yet
