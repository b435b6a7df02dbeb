"""Whether a process is gone, as /proc says: the one reading the process tests share."""

from __future__ import annotations

from pathlib import Path


def gone(pid: int) -> bool:
    """Dead, or a zombie nobody reaped yet. (It may die while its stat is read: an open
    that succeeded can still fail to read, ESRCH, so any OSError means gone.)"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2:][:1] in (b"Z", b"X")
