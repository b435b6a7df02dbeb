"""What the kernel says about memory: the host's, a cgroup's, and each process's (its PSS).

Pure readers of ``/proc`` and ``/sys/fs/cgroup`` (the root is a parameter, so a test can
point them at a directory of its own), in MiB (2**20 bytes) unless said otherwise:

- :func:`meminfo`: ``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo``;
- :func:`cgroup_memory`: the limit and the usage of the cgroup this process runs in
  (v2 ``memory.max`` / ``memory.current``, else v1 ``memory.limit_in_bytes`` /
  ``memory.usage_in_bytes``), None when there is no limit;
- :func:`process_memory`: one process's proportional set size from ``smaps_rollup`` (a page
  shared by n processes counts 1/n in each, so a sum of PSS over any processes counts every
  page at most once), falling back to its resident set from ``statm`` — an over-estimate,
  said so — when ``smaps_rollup`` cannot be read (another user's process);
- :func:`resident_pages`: one process's RSS in pages from ``statm`` (it says whether the PSS
  may have moved, for a fraction of a ``smaps_rollup`` read's cost);
- :func:`parents`: pid -> (parent pid, start time) of every process (one pass over ``/proc``);
- :func:`anon_mib` / :func:`tree_anon_mib`: the anonymous memory a process (and its
  descendants) took, from the kernel's counters;
- :func:`has_env`: whether a process's environment holds an item (a mark it inherited);
- :func:`last_pid`: the last pid given out (a new process started when it moves);
- :func:`start_ticks`: one process's state letter and start time (tells a reused pid apart).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

KIB_PER_MIB = 1024
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True)
class HostMemory:
    """``/proc/meminfo`` in MiB."""

    total_mib: int
    available_mib: int


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    """The cgroup's limit (None: unlimited) and what it uses now, MiB."""

    limit_mib: int | None
    current_mib: int


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """One process's memory; ``measured`` False: its PSS could not be read, this is its RSS."""

    pid: int
    mib: float
    measured: bool


def _read(path: str, size: int = 65536) -> bytes:
    """A small /proc file in one read, without a Python file object (these are read many
    times a second: the cheapest way there is). OSError as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size)
    finally:
        os.close(fd)


def meminfo(proc: str = "/proc") -> HostMemory:
    """MemTotal and MemAvailable (OSError when ``/proc/meminfo`` cannot be read)."""
    fields: dict[str, int] = {}
    for line in _read(f"{proc}/meminfo").splitlines():
        key, _, rest = line.partition(b":")
        if key in (b"MemTotal", b"MemAvailable"):
            fields[key.decode()] = int(rest.split()[0])
    total = fields["MemTotal"] // KIB_PER_MIB
    return HostMemory(total, fields.get("MemAvailable", fields["MemTotal"]) // KIB_PER_MIB)


def _read_int(path: str) -> int | None:
    """A cgroup file holding one number (None: ``max``, absent, or unreadable)."""
    try:
        with open(path, "rb") as f:
            text = f.read().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    return int(text)


UNLIMITED_V1 = 1 << 60  # v1 writes "no limit" as a huge page-rounded number


def cgroup_dirs(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> list[str]:
    """The memory cgroup directories of this process, v2 first, then v1."""
    try:
        with open(f"{proc}/self/cgroup", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out: list[str] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        path = path.strip("/")
        if controllers == "":
            for base in (cgroup_root, f"{cgroup_root}/unified"):
                candidate = f"{base}/{path}".rstrip("/")
                if os.path.exists(f"{candidate}/memory.max"):
                    out.insert(0, candidate)
                    break
        elif "memory" in controllers.split(","):
            candidate = f"{cgroup_root}/memory/{path}".rstrip("/")
            if os.path.exists(f"{candidate}/memory.limit_in_bytes"):
                out.append(candidate)
    return out


def cgroup_memory(dirs: list[str]) -> CgroupMemory | None:
    """The tightest limit among ``dirs`` (see :func:`cgroup_dirs`) and its usage; None when
    none of them limits memory."""
    best: CgroupMemory | None = None
    for d in dirs:
        limit = _read_int(f"{d}/memory.max")
        current = _read_int(f"{d}/memory.current")
        if current is None:
            limit = _read_int(f"{d}/memory.limit_in_bytes")
            current = _read_int(f"{d}/memory.usage_in_bytes")
        if limit is None or current is None or limit >= UNLIMITED_V1:
            continue
        found = CgroupMemory(limit // 2**20, current // 2**20)
        if best is None or (found.limit_mib or 0) - found.current_mib \
                < (best.limit_mib or 0) - best.current_mib:
            best = found
    return best


def process_memory(pid: int, proc: str = "/proc") -> ProcessMemory | None:
    """``pid``'s PSS, else its RSS (``measured`` False); None when the process is gone."""
    try:
        data = _read(f"{proc}/{pid}/smaps_rollup")
        at = data.index(b"\nPss:")
        kib = int(data[at + 5: data.index(b"kB", at)])
        return ProcessMemory(pid, kib / KIB_PER_MIB, True)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        pass  # another user's process, or a kernel without smaps_rollup: its RSS
    try:
        resident = int(_read(f"{proc}/{pid}/statm").split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return ProcessMemory(pid, resident * PAGE_BYTES / 2**20, False)


def resident_pages(pid: int, proc: str = "/proc") -> int | None:
    """``pid``'s resident set in pages (``statm``: cheap, no page-table walk); None if gone."""
    try:
        return int(_read(f"{proc}/{pid}/statm").split()[1])
    except (OSError, ValueError, IndexError):
        return None


def start_ticks(pid: int, proc: str = "/proc") -> tuple[str, int, int] | None:
    """(state letter, parent pid, start time in ticks after boot), None if gone."""
    try:
        data = _read(f"{proc}/{pid}/stat")
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def has_env(pid: int, item: bytes, proc: str = "/proc", *, uid: int | None = None) -> bool:
    """Whether ``pid``'s environment holds ``item`` (``NAME=value``); False if unreadable.

    With ``uid``, only a process of that user counts: anyone may put any mark in their own
    environment, and root reads every user's."""
    try:
        if uid is not None and os.stat(f"{proc}/{pid}").st_uid != uid:
            return False
        with open(f"{proc}/{pid}/environ", "rb") as f:
            return item in f.read().split(b"\0")
    except OSError:
        return False


def last_pid(proc: str = "/proc") -> int | None:
    """The pid most recently given out on the host (``/proc/loadavg``): it moves when any
    process starts (None: unknown)."""
    try:
        return int(_read(f"{proc}/loadavg").split()[4])
    except (OSError, ValueError, IndexError):
        return None


def parents(proc: str = "/proc") -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time) for every live process (zombies left out)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir(proc)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        stat = start_ticks(int(name), proc)
        if stat is not None and stat[0] not in ("Z", "X", "x"):
            out[int(name)] = (stat[1], stat[2])
    return out


def children(pid: int, proc: str = "/proc") -> list[int] | None:
    """The children of ``pid`` (of all its threads), from the kernel's ``task/*/children``
    lists: no pass over every process. None when they cannot be read."""
    try:
        tasks = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return None
    found: list[int] = []
    for tid in tasks:
        try:
            found.extend(int(c) for c in _read(f"{proc}/{pid}/task/{tid}/children").split())
        except (OSError, ValueError):
            return None
    return found


def anon_mib(pid: int, proc: str = "/proc") -> float | None:
    """The anonymous and shared-memory pages ``pid`` holds (``RssAnon`` + ``RssShmem`` of
    its ``status``), MiB: memory it took, not file pages it maps (shared libraries, mapped
    weights, whose share moves when another process maps or unmaps them); read from
    counters the kernel keeps, with no walk over its pages. None when it cannot be read."""
    try:
        text = _read(f"{proc}/{pid}/status").decode("ascii", "replace")
    except OSError:
        return None
    kib = 0
    for line in text.splitlines():
        if line.startswith(("RssAnon:", "RssShmem:")):
            try:
                kib += int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return kib / KIB_PER_MIB


def tree_anon_mib(pid: int, proc: str = "/proc") -> float | None:
    """:func:`anon_mib` of ``pid`` and every process descended from it, MiB; None when
    ``pid`` is gone. Found through the kernel's children lists (a few small reads), else
    one pass over every process."""
    if not os.path.exists(f"{proc}/{pid}"):
        return None
    by_parent: dict[int, list[int]] | None = None  # (the slow way, built once if needed)

    def kids(one: int) -> list[int]:
        nonlocal by_parent
        found = children(one, proc)
        if found is not None or not os.path.exists(f"{proc}/{one}"):
            return found or []
        if by_parent is None:
            by_parent = {}
            for child, (parent, _start) in parents(proc).items():
                by_parent.setdefault(parent, []).append(child)
        return by_parent.get(one, [])

    seen: set[int] = set()
    stack = [pid]
    while stack:
        one = stack.pop()
        if one not in seen:
            seen.add(one)
            stack.extend(kids(one))
    return sum(anon_mib(one, proc) or 0.0 for one in seen)
