"""Reading a worker's log file for ``vramtui logs``: the last lines, or what came after an offset.

Runs in a thread (never on the engine loop).  Reads at most ``MAX_READ`` bytes per call; a file
that shrank since the last offset (truncated or replaced) is read again from its start.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MAX_READ = 1024 * 1024
MAX_LINES = 100_000  # lines from the end one call may ask for (the API's and the CLI's check)


def read_log(path: Path, lines: int = 50, offset: int | None = None) -> dict[str, Any]:
    """``{path, data, offset}``: ``offset`` is where the next call should continue from."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # never through a link
    except FileNotFoundError:
        return {"path": str(path), "data": b"", "offset": 0, "missing": True}
    try:
        size = os.fstat(fd).st_size
        if offset is not None:
            start = offset if offset <= size else 0
            data = os.pread(fd, min(MAX_READ, size - start), start)
            return {"path": str(path), "data": data, "offset": start + len(data)}
        start = max(0, size - MAX_READ)
        data = os.pread(fd, size - start, start)
        if lines >= 0:
            parts = data.split(b"\n")
            keep = parts[-(lines + 1):] if data.endswith(b"\n") else parts[-lines:]
            data = b"\n".join(keep) if lines else b""
        return {"path": str(path), "data": data, "offset": size}
    finally:
        os.close(fd)
