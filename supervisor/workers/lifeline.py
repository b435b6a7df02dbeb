"""No orphans: worker process groups die with the engine, and a restarted engine kills leftovers.

Two mechanisms, because either alone has a hole:

- The *lifeline*: a tiny watcher process (this file run as a script; standard library only)
  that the engine starts before any worker and tells of every worker process group it
  creates. Its stdin is a pipe whose only writer is the engine, so when the engine dies —
  ``kill -9`` included — the pipe closes and the watcher SIGKILLs every group it was told of,
  within milliseconds. Unlike ``PR_SET_PDEATHSIG`` this reaches the workers' own children too
  (a worker runs in its own session, and its children share its process group). The watcher
  lives in a session of its own and ignores SIGINT, SIGTERM and SIGHUP: only the pipe ends it.
  Then it kills what a signal to a group misses: every process of our uid, started since the
  engine, that carries this engine's mark in its environment (:data:`RUN_MARK`, set for each
  worker, which passes it on to its children): one a worker or model server started in a
  session of its own (``setsid``); and what is in the tree of a group or of a marked process
  (one that cleared its environment, ``env -i``).  The mark is there from a worker's exec, so
  a worker the engine had not told it of yet (killed between the fork and that line) dies too.
- The *records*: one file per worker group in the runtime directory (``<pid>.json``: pid,
  start time, backend, engine pid, run mark). A restarted engine kills every group whose record
  survived (the watcher itself may have been killed) before it requeues the jobs the old one
  was running, so a job never executes twice at once. It touches only processes of its own
  uid that started no earlier than the recorded worker: in the recorded session and group, in
  the tree of one of those, or carrying the recording run's mark; a reused pid is never
  signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

# No package imports up here: this file also runs as a bare script (the watcher, ``-S``).

#: In every worker's environment: which run of an engine started it (its pid and a random
#: part: two engines of one process, as tests have, are told apart).
RUN_MARK = "VRAMTUI_ENGINE_RUN"
#: In every worker's environment: which start of which worker (its run mark and a random
#: part), so that its stop finds what it started, a process that left its tree included.
WORKER_MARK = "VRAMTUI_WORKER_RUN"


def start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks after boot), or None."""
    stat = _stat(pid)
    return stat[3] if stat is not None else None


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, process group, session, start ticks) of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2 :].split()
        return fields[0].decode(), int(fields[2]), int(fields[3]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


class Lifeline:
    """The engine's end: the watcher process and the records of live worker groups."""

    def __init__(self, records_dir: Path) -> None:
        self.records_dir = records_dir
        self.run = f"{os.getpid()}.{os.urandom(6).hex()}"  # RUN_MARK's value for its workers
        self._proc: subprocess.Popen[bytes] | None = None
        self._broken = False

    def start(self) -> None:
        self.records_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._proc = subprocess.Popen(
            [sys.executable, "-S", os.path.abspath(__file__), f"{RUN_MARK}={self.run}"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, close_fds=True,
        )

    def revive(self) -> int | None:
        """A watcher that is gone (killed by someone, by the kernel out of memory) or can no
        longer be told is started again and told every worker group still recorded: the
        workers must not lose their way to die with the engine. Returns the pid it had (None:
        it watches)."""
        proc = self._proc
        if proc is None or self.watching:
            return None
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        if proc.poll() is None:  # alive but deaf: it kills nothing any more
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)
        self._broken = False
        self.start()
        for path in sorted(self.records_dir.glob("*.json")):
            if path.stem.isdigit():
                self._tell(f"+{int(path.stem)}\n")
        return proc.pid

    @property
    def pid(self) -> int | None:
        """The watcher's pid while it runs (a process of the engine itself)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def watching(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and not self._broken

    def add(self, pid: int, backend: str) -> None:
        """A worker group led by ``pid`` was created: record it, and tell the watcher."""
        from ..paths import pid_record

        record = {"pid": pid, "start_time": start_ticks(pid), "backend": backend,
                  "engine_pid": os.getpid(), "run": self.run}
        path = pid_record(self.records_dir, pid)
        tmp = path.with_suffix(".tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(json.dumps(record))
            os.replace(tmp, path)
        self._tell(f"+{pid}\n")

    def remove(self, pid: int) -> None:
        """The group led by ``pid`` is gone."""
        from ..paths import pid_record

        with contextlib.suppress(OSError):
            pid_record(self.records_dir, pid).unlink()
        self._tell(f"-{pid}\n")

    def _tell(self, line: str) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or self._broken:
            return
        try:
            proc.stdin.write(line.encode())
            proc.stdin.flush()
        except OSError:
            self._broken = True  # the records still let the next engine clean up

    def close(self) -> None:
        """Stop watching: the watcher kills what is left of the groups it knows, and exits."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5.0)


def kill_leftovers(records_dir: Path, *, timeout: float = 5.0) -> list[str]:
    """Kill the worker groups an earlier engine recorded and left behind; say what was done.

    Returns one line per group that still had processes. Records are deleted once their group
    is gone. Only processes of our own uid, started no earlier than the recorded worker, are
    signalled: those in the recorded session and group, and what escaped it (in the tree of
    one of them, or carrying the run mark of the engine that recorded it).
    """
    try:
        paths = sorted(records_dir.glob("*.json"))
    except OSError:
        return []
    groups: dict[int, tuple[int | None, str, Path]] = {}
    runs: dict[int, str] = {}  # pgid -> the RUN_MARK value of the engine that recorded it
    for path in paths:
        try:
            record = json.loads(path.read_text())
            pid = int(record["pid"])
            start = record.get("start_time")
            groups[pid] = (int(start) if start is not None else None,
                           str(record.get("backend", "?")), path)
            if isinstance(record.get("run"), str):
                runs[pid] = record["run"]
        except (OSError, ValueError, KeyError, TypeError):
            with contextlib.suppress(OSError):
                path.unlink()
    for pgid, (start, _backend, path) in list(groups.items()):
        # A live leader that is not the recorded one (its start differs): the pid was given
        # out again, so nothing of that group is the old worker's (while any member of the
        # old group lived, the kernel could not have reused its id).
        leader = _stat(pgid)
        if leader is not None and start is not None and leader[3] != start:
            del groups[pgid]
            runs.pop(pgid, None)
            with contextlib.suppress(OSError):
                path.unlink()
    if not groups:
        return []
    notes: list[str] = []
    members = _members(groups)
    escaped = _escaped(groups, runs, members)
    for pgid, pids in members.items():
        _start, backend, _path = groups[pgid]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        notes.append(f"killed {len(pids)} leftover process(es) of {backend} (group {pgid}) "
                     "from an engine that did not stop cleanly")
    for pid in escaped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if escaped:
        notes.append(f"killed {len(escaped)} leftover process(es) that had left their worker's "
                     "group (setsid), from an engine that did not stop cleanly")
    deadline = time.monotonic() + timeout  # (a local deadline: the watcher has no package)
    while members and time.monotonic() < deadline:
        members = {g: [p for p in pids if _alive(p)] for g, pids in members.items()}
        members = {g: pids for g, pids in members.items() if pids}
        if members:
            time.sleep(0.02)
    for pgid, pids in members.items():
        notes.append(f"processes {pids} of group {pgid} did not die within {timeout:g} s")
    for pgid, (_start, _backend, path) in groups.items():
        if pgid not in members:
            with contextlib.suppress(OSError):
                path.unlink()
    return notes


def _escaped(groups: dict[int, tuple[int | None, str, Path]], runs: dict[int, str],
             members: dict[int, list[int]]) -> list[int]:
    """What of the recorded workers left their groups: in the trees of the groups' live
    members (stopped first, so that none forks or exits meanwhile), or carrying the mark of
    the run that recorded them, and started no earlier than the recorded worker."""
    found: set[int] = set()
    for pgid, pids in members.items():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGSTOP)
        since = groups[pgid][0]
        if since is not None:
            found.update(strays((), None, since, parents=pids))
    earliest: dict[str, int] = {}  # a run's mark -> its earliest recorded worker's start
    for pgid, run in runs.items():
        since = groups[pgid][0]
        if since is not None:
            earliest[run] = min(since, earliest.get(run, since))
    for run, since in earliest.items():
        found.update(marked(f"{RUN_MARK}={run}".encode(), since))
    stopped = {pid for pids in members.values() for pid in pids}
    return sorted(found - stopped)


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X", "x")


def _members(groups: dict[int, tuple[int | None, str, Path]]) -> dict[int, list[int]]:
    """pgid -> our live processes in that recorded worker session and group."""
    uid = os.getuid()
    found: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        pid = int(entry)
        stat = _stat(pid)
        if stat is None or stat[0] in ("Z", "X", "x"):
            continue
        state, pgrp, session, started = stat
        group = groups.get(pgrp)
        if group is None or session != pgrp:
            continue
        leader_start = group[0]
        if leader_start is not None and started < leader_start:
            continue  # older than the recorded worker: not one of its processes
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        found.setdefault(pgrp, []).append(pid)
    return found


def marked(mark: bytes, since: int | None) -> list[int]:
    """Our live processes started no earlier than ``since`` (clock ticks after boot) whose
    environment holds ``mark`` (``NAME=value``), but this one."""
    uid, me, found = os.getuid(), os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        stat = _stat(int(entry))
        if stat is None or stat[0] in ("Z", "X", "x") or (since is not None and stat[3] < since):
            continue
        if _ours_with(int(entry), uid, mark):
            found.append(int(entry))
    return found


def strays(roots: Collection[int], mark: bytes | None, since: int,
           parents: Collection[int] = ()) -> list[int]:
    """One pass over /proc: our live processes started no earlier than ``since`` (the
    ``roots``' start) that are out of the roots' process groups but in their trees (by
    parent) or carry ``mark`` (``NAME=value``) in their environment: what a signal to their
    groups misses.  ``parents``: more processes whose trees count, leading a group or not
    (what is in their trees is found, not the parents themselves)."""
    uid, table = os.getuid(), {}  # pid -> (parent, group)
    try:
        entries = os.listdir("/proc") if roots or parents else []
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2 :].split()
            if fields[0] in (b"Z", b"X", b"x") or int(fields[19]) < since:
                continue
            table[int(entry)] = (int(fields[1]), int(fields[2]))
        except (OSError, ValueError, IndexError):
            continue
    # A root no longer leading its group is gone (its pid maybe another's now): no tree.
    roots = {r for r in roots if r in table and table[r][1] == r}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _group) in table.items():
        children.setdefault(ppid, []).append(pid)
    tree: set[int] = set()
    stack = [*roots, *(p for p in parents if p in table)]
    while stack:
        for pid in children.get(stack.pop(), ()):
            if pid not in tree:
                tree.add(pid)
                stack.append(pid)
    found = []
    for pid, (_ppid, group) in table.items():
        if pid in roots or group in roots or pid in parents:
            continue
        if pid in tree or (mark is not None and _ours_with(pid, uid, mark)):
            found.append(pid)
    return found


def _ours_with(pid: int, uid: int, mark: bytes) -> bool:
    """``pid`` is of ``uid`` and its environment holds ``mark`` (``NAME=value``)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            return False
        with open(f"/proc/{pid}/environ", "rb") as f:
            return mark in f.read().split(b"\0")
    except OSError:
        return False


def _watch() -> None:
    """The watcher: remember the groups named on stdin; when stdin ends, SIGKILL them and
    what of their trees left them, then the processes that carry the engine's mark
    (``argv[1]``)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    mark = sys.argv[1].encode() if len(sys.argv) > 1 else None
    since = start_ticks(os.getppid())  # the engine's start: nothing older is one of ours
    groups: set[int] = set()
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        text = line.strip()
        if len(text) < 2 or not text[1:].isdigit():
            continue
        pid = int(text[1:])
        if text[:1] == b"+":
            groups.add(pid)
        elif text[:1] == b"-":
            groups.discard(pid)
    # What left a group but not its tree (setsid without a fork): found before the group
    # goes, as its parents die with it; the mark finds it too unless its environment was
    # cleared (env -i). The groups are stopped first: reading /proc takes a while when it is
    # large, and they must not go on running their jobs meanwhile.  So is every process that
    # carries the mark, and their trees count too: a worker the engine started but had not
    # told of yet (it was killed between the fork and the line on stdin) carries the mark
    # from its first instruction, and its group and tree are found through it.
    since_ticks = since if since is not None else 0
    for pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGSTOP)
    carriers = marked(mark, since) if mark else []  # (a pass over /proc: the groups wait)
    for pid in carriers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)
    left = strays(groups, None, since_ticks, parents=carriers)
    for pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    # (the mark read again: what a carrier forked before it was stopped)
    for pid in {*carriers, *left, *(marked(mark, since) if mark else [])}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    _watch()
