"""Simulated VRAM: how a worker declares the GPU memory it would hold on a simulated GPU.

The engine runs simulated workers with two environment variables:

- ``VRAMTUI_SIM_DIR``: the ledger directory the simulated GPU reads;
- ``VRAMTUI_SIM_GPU``: the simulated GPU index this worker is on (default 0).

Each declaring process keeps one file ``<dir>/<pid>.json`` holding
``{"pid", "gpu", "mib", "start_time", "allocated"}``, rewritten atomically (a temporary file in
the same directory, then ``os.replace``). ``start_time`` is field 22 of ``/proc/<pid>/stat`` (clock
ticks after boot), or null where there is no /proc; the engine uses it to tell a live worker
from a reused pid; ``allocated`` says whether the process ever called ``allocate`` (a process
that only attached holds just its simulated CUDA context, and calibration refuses to measure
it). The engine ignores and deletes the file of a dead process, so memory is
released however the worker ends, SIGKILL included.

When ``VRAMTUI_SIM_DIR`` is unset (a real GPU) every function is a no-op and ``used()`` is 0,
so a worker may call these unconditionally. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading

ENV_DIR = "VRAMTUI_SIM_DIR"
ENV_GPU = "VRAMTUI_SIM_GPU"

_lock = threading.Lock()
_state: dict[str, int | bool] = {"pid": 0, "mib": 0, "attached": False, "allocated": False}


def enabled() -> bool:
    """True when this process runs on a simulated GPU."""
    return bool(os.environ.get(ENV_DIR))


def attach() -> None:
    """Declare this process on the simulated GPU with 0 MiB (the device adds its CUDA-context
    overhead for it), as a real process does when it first touches CUDA."""
    with _lock:
        if _own_state() is None:
            return
        _state["attached"] = True
        _write()


def allocate(mib: int) -> int:
    """Declare ``mib`` more MiB held (attaching if needed); returns the new total."""
    mib = _check(mib)
    with _lock:
        if _own_state() is None:
            return 0
        _state["mib"] = int(_state["mib"]) + mib
        _state["attached"] = True
        _state["allocated"] = True
        _write()
        return int(_state["mib"])


def free(mib: int) -> int:
    """Declare ``mib`` MiB released (never below 0); returns the new total."""
    mib = _check(mib)
    with _lock:
        if _own_state() is None:
            return 0
        _state["mib"] = max(0, int(_state["mib"]) - mib)
        if _state["attached"]:
            _write()
        return int(_state["mib"])


def used() -> int:
    """MiB this process has declared (without the context overhead); 0 on a real GPU."""
    with _lock:
        if _own_state() is None:
            return 0
        return int(_state["mib"])


def reset() -> None:
    """Declare every MiB released. The process stays attached if it was (its CUDA context
    lives until it exits, as on a real GPU); see ``detach()`` to leave the GPU entirely."""
    with _lock:
        if _own_state() is None:
            return
        _state["mib"] = 0
        if _state["attached"]:
            _write()


def detach() -> None:
    """Leave the simulated GPU: remove this process's ledger file (context released too)."""
    with _lock:
        directory = _own_state()
        if directory is None:
            return
        _state["mib"] = 0
        _state["attached"] = False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, f"{os.getpid()}.json"))


def process_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks after boot), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        # the command name (field 2) is in parentheses and may hold spaces or ')'
        fields = data[data.rindex(b")") + 2 :].split()
        return int(fields[19])  # fields[0] is field 3
    except (ValueError, IndexError):
        return None


# -- internals -----------------------------------------------------------------------------


def _check(mib: int) -> int:
    if isinstance(mib, bool) or not isinstance(mib, int) or mib < 0:
        raise ValueError(f"MiB must be a non-negative integer, got {mib!r}")
    return mib


def _own_state() -> str | None:
    """The ledger directory, or None when not simulated. Resets the state inherited by a
    forked child, which is a different process on the GPU."""
    directory = os.environ.get(ENV_DIR)
    if not directory:
        return None
    if _state["pid"] != os.getpid():
        _state.update(pid=os.getpid(), mib=0, attached=False, allocated=False)
    return directory


def _gpu_index() -> int:
    raw = os.environ.get(ENV_GPU, "0").strip() or "0"
    try:
        index = int(raw)
    except ValueError:
        index = -1
    if index < 0:
        raise ValueError(f"{ENV_GPU} must be a GPU index (0, 1, ...), got {raw!r}")
    return index


def _write() -> None:
    directory = os.environ[ENV_DIR]
    pid = os.getpid()
    record = {
        "pid": pid,
        "gpu": _gpu_index(),
        "mib": int(_state["mib"]),
        "start_time": process_start_time(pid),
        "allocated": bool(_state["allocated"]),
    }
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{pid}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, os.path.join(directory, f"{pid}.json"))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
