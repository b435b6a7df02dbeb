"""Starting and signalling worker processes, and their log files.

Every worker runs in its own session (so its own process group); signals go to that group, so
a worker's children die with it.  The engine only ever signals process groups it created.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_KEEP = 3


def rotate_log(path: Path, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> None:
    """Rotate ``path`` to ``path.1`` … ``path.<keep>`` once it is larger than ``max_bytes``."""
    try:
        if path.stat().st_size <= max_bytes:
            return
    except FileNotFoundError:
        return
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


async def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, log_path: Path
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    rotate_log(log_path)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=fd,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    finally:
        os.close(fd)


def signal_group(pid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the process group led by ``pid``; False if it is already gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return True


def tail(path: Path, max_bytes: int = 4096) -> str:
    """The last ``max_bytes`` of a log file, decoded leniently ('' when missing)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
