"""The simulated GPU: devices of any size whose memory is what simulated workers declare.

This is the simulated *hardware*: checkers outside the engine read the same ledger to know
what the device really holds, independently of the engine's own accounts.

The ledger is a directory (``$VRAMTUI_RUNTIME_DIR/simgpu`` for an engine: ``Paths.sim_dir``;
workers find it in ``VRAMTUI_SIM_DIR`` and their GPU index in ``VRAMTUI_SIM_GPU``), holding one
JSON file per process that declared memory through ``worker_sdk.sim``: ``<pid>.json`` =
``{"pid": int, "gpu": int, "mib": int, "start_time": int | null, "allocated": bool}``, written
atomically (a temporary file, then rename). ``mib`` excludes the CUDA context; ``start_time``
is field 22 of ``/proc/<pid>/stat``; ``allocated`` is false for a process that only attached
(its context alone). Reading the ledger:

- a file whose process is dead, a zombie, or whose pid now belongs to another process (the
  start time differs) is ignored and deleted, so memory is released whenever a worker ends,
  SIGKILL included;
- a file that cannot be parsed (foreign tools, partial writes) is ignored and left alone;
- a process uses ``mib + context_mib`` on its GPU (the per-process CUDA-context overhead);
  the device's used memory is the sum over its live processes.

Spec grammar: ``sim:<size>[,sim:<size>...]``, size ``24GiB``, ``8192MiB`` or ``8192`` (MiB).
"""

from __future__ import annotations

import json
import logging
import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import psutil

from supervisor.gpu.errors import BadGpuSpec
from supervisor.gpu.model import GpuReading, ProcessReading
from supervisor.paths import pid_record
from supervisor.units import MAX_SIZE_MIB, mib_exact

log = logging.getLogger(__name__)

DEFAULT_CONTEXT_MIB = 256
SPEC_FORM = "sim:<size>[,sim:<size>...] with <size> like 24GiB, 8192MiB or 8192 (MiB)"
_SIZE = re.compile(r"^sim:\s*(\d+(?:\.\d+)?)\s*(mib|gib|m|g)?$", re.IGNORECASE)
_HAS_PROC = os.path.isdir("/proc/self")


def parse_sim_spec(spec: str) -> list[int]:
    """``"sim:24GiB,sim:8GiB"`` -> ``[24576, 8192]`` (MiB). Raises ``BadGpuSpec``."""
    sizes: list[int] = []
    for part in str(spec).split(","):
        match = _SIZE.match(part.strip())
        if not match:
            raise BadGpuSpec(f"bad simulated GPU spec {spec!r}: expected {SPEC_FORM}")
        number, unit = Fraction(match.group(1)), (match.group(2) or "mib").lower()
        mib = number * 1024 if unit.startswith("g") else number
        if mib < 1 or mib.denominator != 1 or mib > MAX_SIZE_MIB:
            raise BadGpuSpec(
                f"bad simulated GPU size {part.strip()!r}: must be a whole number of MiB, >= 1 "
                f"and at most {MAX_SIZE_MIB} (1 PiB)"
            )
        sizes.append(int(mib))
    return sizes


def _start_ticks(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in ticks after boot) from /proc/<pid>/stat, None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, start_time: Any) -> bool:
    """The process that wrote the record is still running (not a zombie, pid not reused)."""
    if _HAS_PROC:
        stat = _start_ticks(pid)
        if stat is None or stat[0] in ("Z", "X", "x"):
            return False
        return start_time is None or stat[1] == start_time
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _parse(path: Path) -> tuple[int, int, int, Any, int, bool] | None:
    """(pid, gpu, mib, start_time, inode, allocated) or None when the file is not a valid
    ledger record."""
    try:
        with path.open("rb") as f:
            inode = os.fstat(f.fileno()).st_ino
            record = json.loads(f.read())
        pid, gpu, mib = record["pid"], record["gpu"], record["mib"]
        start_time = record.get("start_time")
        allocated = record.get("allocated")
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if any(isinstance(v, bool) or not isinstance(v, int) for v in (pid, gpu, mib)):
        return None
    if pid <= 0 or gpu < 0 or mib < 0 or path.name != pid_record(path.parent, pid).name:
        return None
    if start_time is not None and (isinstance(start_time, bool) or not isinstance(start_time, int)):
        return None
    if not isinstance(allocated, bool):
        allocated = mib > 0  # a record written before the flag existed
    return pid, gpu, mib, start_time, inode, allocated


class SimulatedProbe:
    """A simulated GPU set read from the ledger directory ``ledger_dir``.

    ``used_mib`` is reported as the workers declared it, even above ``total_mib``: an
    over-committed simulated GPU shows used > total (and free 0) rather than hiding it, so
    that the engine's tests can assert admission never lets it happen.
    """

    source = "simulated"
    simulated = True
    driver_version: str | None = None

    def __init__(
        self, spec: str, ledger_dir: Path, context_mib: int = DEFAULT_CONTEXT_MIB
    ) -> None:
        if context_mib < 0:
            raise ValueError(f"context_mib must be >= 0, got {context_mib}")
        self.spec = spec
        self.sizes_mib = parse_sim_spec(spec)
        self.ledger_dir = Path(ledger_dir)
        self.context_mib = context_mib
        self.ledger_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._closed = False

    @property
    def env(self) -> dict[str, str]:
        """What to add to a simulated worker's environment (set VRAMTUI_SIM_GPU per worker)."""
        return {"VRAMTUI_SIM_DIR": str(self.ledger_dir)}

    def devices(self) -> list[GpuReading]:
        used = [0] * len(self.sizes_mib)
        for p in self.processes():
            used[p.gpu_index] += p.used_mib or 0
        return [
            GpuReading(
                index=i,
                name=f"Simulated GPU ({mib_exact(total)})",
                total_mib=total,
                used_mib=used[i],
                free_mib=max(0, total - used[i]),
                util_pct=None,
                temp_c=None,
                power_w=None,
            )
            for i, total in enumerate(self.sizes_mib)
        ]

    def processes(self) -> list[ProcessReading]:
        if self._closed:
            return []
        out: list[ProcessReading] = []
        try:
            paths = sorted(self.ledger_dir.glob("*.json"))
        except OSError as exc:
            log.warning("cannot read simulated GPU ledger %s: %s", self.ledger_dir, exc)
            return []
        for path in paths:
            record = _parse(path)
            if record is None:
                continue
            pid, gpu, mib, start_time, inode, allocated = record
            if not _alive(pid, start_time):
                self._remove_stale(path, inode)
                continue
            if gpu >= len(self.sizes_mib):
                continue  # declared on a GPU this spec doesn't have
            out.append(ProcessReading(pid, gpu, mib + self.context_mib, allocated))
        return out

    def close(self) -> None:
        self._closed = True

    def _remove_stale(self, path: Path, inode: int) -> None:
        """Delete the file we read, not one a new process (same pid) put in its place since."""
        try:
            if path.stat().st_ino == inode:
                path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.debug("cannot delete stale ledger file %s: %s", path, exc)
