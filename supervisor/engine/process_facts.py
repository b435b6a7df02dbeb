"""What the engine says of a process it may not own: its name and its user.

Read through psutil once per process and kept, keyed by pid and start time (a reused pid is
read again); the cache is bounded.  "?" when the system does not tell (the process is gone,
or belongs to someone the engine may not look at).  A process names itself (``prctl``, its
``argv[0]``), so any user's process may put an escape sequence in its name: what is kept is
:func:`~supervisor.textsafe.visible`, safe for every face to print.
"""

from __future__ import annotations

from ..textsafe import visible

MAX_KEPT = 4096
_KEPT: dict[tuple[int, str], tuple[float, str]] = {}  # (pid, fact) -> (start time, value)


def _fact(pid: int, fact: str) -> str:
    import psutil

    try:
        proc = psutil.Process(pid)
        created = proc.create_time()
        known = _KEPT.get((pid, fact))
        if known is not None and known[0] == created:
            return known[1]
        value = visible(proc.name() if fact == "name" else proc.username())
    except (psutil.Error, KeyError, OSError):
        return "?"
    if len(_KEPT) >= MAX_KEPT:
        _KEPT.clear()
    _KEPT[(pid, fact)] = (created, value)
    return value


def process_name(pid: int) -> str:
    """The name of process ``pid`` ("?" when it cannot be read)."""
    return _fact(pid, "name")


def process_user(pid: int) -> str:
    """The user that process ``pid`` runs as ("?" when it cannot be read)."""
    return _fact(pid, "user")
