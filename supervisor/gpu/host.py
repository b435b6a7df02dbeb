"""The host device: the machine's own memory as one device, measured by the kernel.

``--gpus host[:SIZE]`` (:func:`parse_host_spec`). What vramtui's workers may hold there is
the smaller of ``SIZE`` and what the kernel can give — ``MemAvailable``, and the cgroup's
``limit - usage`` when the engine runs in a limited one, re-read at every sample — less the
``reserve`` left for the desktop and the engine itself. As a :class:`~supervisor.gpu.model.
GpuReading`, with ``ours`` what the engine's process trees hold:

- ``total`` = ``min(SIZE, MemTotal - reserve, cgroup limit - reserve)``;
- ``free`` = ``min(total - ours, MemAvailable - reserve, cgroup limit - usage - reserve)``;
- ``used`` = ``total - free``: without a SIZE, exactly what the host (or its cgroup) uses;
  with one, the part of it that the rest of the host takes from it; the ledger calls
  ``used - ours`` foreign, as on a GPU.

Each process's memory is its PSS (``supervisor.gpu.procmem``): the processes listed are every
descendant of ``root`` (the engine), and every process that outlived its parent (an orphan,
re-parented to init) and was one, until it is gone: known as one when seen before, else by
the mark its worker's environment passed on (``VRAMTUI_ENGINE_PID=<root>``, set by the
worker factory; :data:`ENGINE_MARK`), in a process of the engine's own user (anyone can set
the mark, and a root engine reads every environment); summing PSS over processes counts a shared
page once. Descendants are discovered by one pass over ``/proc`` when a process started on
the host since the last pass (the last pid given out moved), at most every 0.1 s, and every
``discover_s`` whatever (the pause grows when a pass is expensive: at most
goes to them, ~0.1 %); between passes, only the known processes are read. Reading a PSS walks the
process's page tables (~0.1 ms for a small Python process), so each sample reads the cheap
resident-set count (``statm``) first and reads the PSS again only when it moved, or every
``PSS_REFRESH_S`` (2 s): an unchanged resident set means no page came or went (the sharing
among processes may still move: the periodic read catches that). A process whose PSS
cannot be read (another user's) is counted at its RSS, an over-estimate, and logged once:
never a silent zero. The engine tells it of each worker it starts (:meth:`HostProbe.track`),
so a worker is read from its first instant.

:meth:`HostProbe.host_used_mib` is the host's own used total (for yielding to other programs).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable

from supervisor.clock import monotonic
from supervisor.gpu.errors import BadGpuSpec, GpuUnavailable
from supervisor.gpu.model import GpuReading, ProcessReading
from supervisor.gpu.procmem import (
    CgroupMemory,
    HostMemory,
    ProcessMemory,
    cgroup_dirs,
    cgroup_memory,
    has_env,
    last_pid,
    meminfo,
    parents,
    process_memory,
    resident_pages,
    start_ticks,
)
from supervisor.units import mib_exact, parse_size

log = logging.getLogger(__name__)

HOST_NAME = "host memory"
DEFAULT_RESERVE_MIB = 1024
HOST_FORM = "host or host:<size> (like host:48GiB or host:3500MiB)"
DISCOVERY_SHARE = 0.001  # of one core: what finding new descendants may cost at most
MIN_DISCOVER_S, MAX_DISCOVER_S = 0.1, 2.0
PSS_REFRESH_S = 2.0  # a process's PSS is read again at least this often
ENGINE_MARK = "VRAMTUI_ENGINE_PID"  # in every worker's environment: the engine's pid
_SPEC = re.compile(r"^host(?::(.*))?$", re.IGNORECASE)


def is_host_spec(part: str) -> bool:
    return _SPEC.match(part.strip()) is not None


def parse_host_spec(spec: str) -> int | None:
    """``host`` -> None (all the kernel gives), ``host:48GiB`` -> 49152. BadGpuSpec else."""
    match = _SPEC.match(spec.strip())
    if match is None:
        raise BadGpuSpec(f"bad host device {spec!r}: expected {HOST_FORM}")
    size = match.group(1)
    if size is None:
        return None
    try:
        mib = parse_size(size.strip())
    except ValueError as exc:
        raise BadGpuSpec(f"bad host memory size in {spec!r}: {exc}; expected {HOST_FORM}"
                         ) from None
    if mib < 1:
        raise BadGpuSpec(f"bad host memory size in {spec!r}: it must be at least 1 MiB; "
                         f"write plain 'host' for all the memory the kernel gives")
    return mib


class HostProbe:
    """The host's memory as device 0 (see the module doc). Thread-safe."""

    source = "host"
    simulated = False
    driver_version: str | None = None

    def __init__(self, spec: str = "host", *, reserve_mib: int = DEFAULT_RESERVE_MIB,
                 root: int | None = None, proc: str = "/proc",
                 cgroup_root: str = "/sys/fs/cgroup", discover_s: float = 1.0,
                 clock: Callable[[], float] = monotonic) -> None:
        if reserve_mib < 0:
            raise BadGpuSpec(f"the host reserve must be 0 or more, got {reserve_mib} MiB")
        self.spec = spec
        self.size_mib = parse_host_spec(spec)
        self.reserve_mib = reserve_mib
        self.root = os.getpid() if root is None else root
        self._proc = proc
        self._cgroups = cgroup_dirs(proc, cgroup_root)
        self._discover_s = discover_s
        self._clock = clock
        self._lock = threading.Lock()
        self._tracked: dict[int, int] = {}  # pid -> start time: the root's trees, orphans kept
        self._own: dict[int, int] = {}  # pid -> start time: the engine's own processes
        self._next_discovery = 0.0  # a pass, whatever happened
        self._next_allowed = 0.0  # the earliest pass (its cost paid)
        self._last_pid: int | None = None
        self._ours_mib = 0.0
        self._ours_at: float | None = None
        self._estimated: set[int] = set()  # pids counted at their RSS (PSS unreadable)
        self._checked: dict[int, int] = {}  # pid -> start: looked at for the mark, not ours
        self._pss: dict[int, tuple[int, float, ProcessMemory]] = {}  # pid -> (rss, at, read)
        root_stat = start_ticks(self.root, proc)
        self._root_start = root_stat[2] if root_stat is not None else 0
        self._mark = f"{ENGINE_MARK}={self.root}".encode()
        self._uid = os.geteuid()  # the engine's workers' user: only its processes carry the mark
        self._orphans: set[int] = set()  # tracked processes no longer under the root
        self._closed = False
        try:
            host = meminfo(proc)
        except (OSError, KeyError, ValueError, IndexError) as exc:
            raise GpuUnavailable(f"host memory: cannot read {proc}/meminfo ({exc}); the host "
                                 "device needs Linux's /proc") from None
        limit = self._cgroup()
        machine = host.total_mib if limit is None or limit.limit_mib is None \
            else min(host.total_mib, limit.limit_mib)
        if self.size_mib is not None and self.size_mib > machine:
            where = "this machine's memory" if machine == host.total_mib \
                else "this cgroup's memory limit"
            raise BadGpuSpec(f"{spec!r} asks for more than {where} ({mib_exact(machine)}): "
                             f"give at most host:{machine}MiB, or plain 'host'")
        if machine - reserve_mib < 1:
            raise BadGpuSpec(f"the host reserve ({reserve_mib} MiB) leaves nothing of "
                             f"{mib_exact(machine)}: lower it")

    # -- the kernel's figures ----------------------------------------------------------------
    def _cgroup(self) -> CgroupMemory | None:
        return cgroup_memory(self._cgroups) if self._cgroups else None

    def _figures(self) -> tuple[HostMemory, CgroupMemory | None]:
        return meminfo(self._proc), self._cgroup()

    def host_used_mib(self) -> int:
        """What the whole host (or its cgroup, when it is tighter) uses now, ours included."""
        host, group = self._figures()
        used = host.total_mib - host.available_mib
        if group is not None and group.limit_mib is not None \
                and group.limit_mib - group.current_mib < host.available_mib:
            used = group.current_mib
        return used

    def devices(self) -> list[GpuReading]:
        host, group = self._figures()
        total = host.total_mib - self.reserve_mib
        available = host.available_mib - self.reserve_mib
        if group is not None and group.limit_mib is not None:
            total = min(total, group.limit_mib - self.reserve_mib)
            available = min(available, group.limit_mib - group.current_mib - self.reserve_mib)
        if self.size_mib is not None:
            total = min(total, self.size_mib)
        total = max(1, total)
        with self._lock:
            stale = self._ours_at is None or self._clock() - self._ours_at > 1.0
        if stale:
            self.processes()
        ours = round(self._ours_mib)
        free = max(0, min(total - ours, available))
        used = max(ours, total - free)
        return [GpuReading(index=0, name=HOST_NAME, total_mib=total, used_mib=used,
                           free_mib=free, util_pct=None, temp_c=None, power_w=None,
                           source="host")]

    # -- the processes -----------------------------------------------------------------------
    def processes(self) -> list[ProcessReading]:
        with self._lock:
            if self._closed:
                return []
            now = self._clock()
            newest = last_pid(self._proc)
            if now >= self._next_discovery or (
                    now >= self._next_allowed and (newest is None or newest != self._last_pid)):
                self._last_pid = newest
                spent = self._discover()
                pause = min(MAX_DISCOVER_S, max(MIN_DISCOVER_S, spent / DISCOVERY_SHARE))
                self._next_allowed = now + pause
                self._next_discovery = now + max(self._discover_s, pause)
            out: list[ProcessReading] = []
            total = 0.0
            for pid in list(self._tracked):
                mem = self._memory(pid, now)
                if mem is None:
                    self._forget(pid)
                    continue
                if not mem.measured and pid not in self._estimated:
                    self._estimated.add(pid)
                    log.warning("host memory: /proc/%d/smaps_rollup cannot be read (another "
                                "user's process?): counting its resident set, %.0f MiB, an "
                                "over-estimate", pid, mem.mib)
                total += mem.mib
                out.append(ProcessReading(pid, 0, round(mem.mib), None))
            self._ours_mib = total
            self._ours_at = now
            return out

    def _memory(self, pid: int, now: float) -> ProcessMemory | None:
        """``pid``'s PSS: read again when its resident set moved or PSS_REFRESH_S passed (a pid
        reused meanwhile is told apart at the next pass over /proc); None once it is gone
        (a zombie holds no page)."""
        rss = resident_pages(pid, self._proc)
        if not rss:
            return None
        known = self._pss.get(pid)
        if known is not None and known[0] == rss and now - known[1] < PSS_REFRESH_S:
            return known[2]
        mem = process_memory(pid, self._proc)
        if mem is not None:
            self._pss[pid] = (rss, now, mem)
        return mem

    def track(self, pid: int) -> None:
        """``pid`` (a worker just started) is ours: read from the next sample on, not from the
        next pass over /proc."""
        stat = start_ticks(pid, self._proc)
        if stat is not None:
            with self._lock:
                self._tracked.setdefault(pid, stat[2])

    def own(self, pid: int) -> None:
        """``pid`` is part of the engine (its lifeline, a ``yield_when`` command): never
        listed, nor what it starts, as the root itself is not; the host reserve is there for
        the engine."""
        stat = start_ticks(pid, self._proc)
        if stat is not None:
            with self._lock:
                self._own[pid] = stat[2]
                self._forget(pid)

    @property
    def orphans(self) -> frozenset[int]:
        """Processes of ours that outlived their parent (counted until they exit)."""
        with self._lock:
            return frozenset(self._orphans)

    @property
    def estimated(self) -> frozenset[int]:
        """Processes counted at their RSS because their PSS could not be read."""
        with self._lock:
            return frozenset(self._estimated)

    def _forget(self, pid: int) -> None:
        self._tracked.pop(pid, None)
        self._pss.pop(pid, None)
        self._estimated.discard(pid)
        self._orphans.discard(pid)

    def _discover(self) -> float:
        """One pass over /proc: the root's descendants, and those of the tracked processes
        (orphans included). Returns the CPU seconds it took."""
        began = time.thread_time()
        table = parents(self._proc)
        children: dict[int, list[int]] = {}
        for pid, (ppid, _start) in table.items():
            children.setdefault(ppid, []).append(pid)
        under_root: set[int] = set()
        stack = [self.root]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in under_root:
                    under_root.add(child)
                    stack.append(child)
        self._own = {p: s for p, s in self._own.items() if table.get(p, (0, -1))[1] == s}
        own_trees: set[int] = set()  # the engine's own processes and whatever they started
        stack = list(self._own)
        while stack:
            pid = stack.pop()
            if pid not in own_trees:
                own_trees.add(pid)
                stack.extend(children.get(pid, ()))
        under_root -= own_trees
        for pid in list(self._tracked):
            if pid not in table or table[pid][1] != self._tracked[pid] or pid in own_trees:
                self._forget(pid)
        self._checked = {p: s for p, s in self._checked.items() if table.get(p, (0, -1))[1] == s}
        for pid, (_ppid, started) in table.items():
            if pid in under_root or pid in self._tracked or pid in self._checked \
                    or started < self._root_start:
                continue
            # an orphan of ours, never seen before: our workers run as the engine's user, and
            # another user's process that carries the mark is not one (a root engine reads it)
            if has_env(pid, self._mark, self._proc, uid=self._uid):
                self._tracked[pid] = started
            else:
                self._checked[pid] = started
        found = set(under_root)
        stack = [pid for pid in self._tracked if pid not in under_root]
        while stack:
            pid = stack.pop()
            found.add(pid)
            stack.extend(c for c in children.get(pid, ()) if c not in found)
        for pid in found:
            if pid not in self._tracked and pid in table and pid not in own_trees:
                self._tracked[pid] = table[pid][1]
        self._orphans = set(self._tracked) - under_root
        return time.thread_time() - began

    def close(self) -> None:
        with self._lock:
            self._closed = True
