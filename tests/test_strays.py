"""``lifeline.strays``: what a signal to a worker's process group misses, read from /proc:
what left the group but not the tree, and what carries the mark though it left the tree;
never what is still in the group, nor a process older than the worker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_state import gone
from waiting import wait_until

from supervisor.workers.lifeline import RUN_MARK, Lifeline, kill_leftovers, start_ticks, strays

SLEEP = f"{sys.executable} -c 'import time; time.sleep(60)'"


def _ticks_now() -> int:
    """Now, as /proc counts a process's start: clock ticks since boot."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def _named(tag: str) -> set[int]:
    """Live processes whose command line holds ``tag``."""
    found = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if argv[0] == sys.executable.encode() and tag.encode() in argv:
                found.add(int(entry))
    return found


def _descendants(root: int) -> set[int]:
    """``root``'s tree now, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, ValueError, IndexError):
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


@pytest.mark.process
def test_strays_are_what_left_the_group_and_what_carries_the_mark() -> None:
    tag = f"vt-strays-{os.getpid()}"
    older = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              f"{tag}-older"], env={**os.environ, "MARK": tag},
                             start_new_session=True)  # marked, but older than the worker
    born = start_ticks(older.pid) or 0
    wait_until(lambda: _ticks_now() > born + 1, 5, "a clock tick after it")  # (10 ms steps)
    script = (f"{SLEEP} {tag}-in-group & setsid {SLEEP} {tag}-left & "
              f"setsid -f {SLEEP} {tag}-daemon & setsid -f env -i {SLEEP} {tag}-cleared & wait")
    root = subprocess.Popen(["bash", "-c", script], env={**os.environ, "MARK": tag},
                            start_new_session=True)
    try:
        want = {name: wait_until(lambda n=name: _named(f"{tag}-{n}"), 10, name)
                for name in ("in-group", "left", "daemon", "cleared")}
        # `setsid -f` leaves the tree once its own fork has exited: until then the cleared
        # one is still a descendant (and found by tree), which failed one loaded run in CI
        wait_until(lambda: not (want["daemon"] | want["cleared"]) & _descendants(root.pid),
                   10, "the setsid -f ones to leave the tree")
        since = start_ticks(root.pid)
        assert since is not None
        found = set(strays({root.pid}, f"MARK={tag}".encode(), since))
        assert want["left"] <= found and want["daemon"] <= found  # by tree, by mark
        assert not found & (want["in-group"] | want["cleared"] | {root.pid, older.pid})
        assert set(strays({root.pid}, None, since)) >= want["left"]  # the tree alone
        assert not strays(set(), f"MARK={tag}".encode(), since)  # no root: nothing
    finally:
        for pid in {p for n in ("in-group", "left", "daemon", "cleared", "older")
                    for p in _named(f"{tag}-{n}")} | {root.pid}:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        root.wait(5)
        older.wait(5)


@pytest.mark.process
def test_the_watcher_kills_a_marked_worker_it_was_never_told_of_and_its_tree(
        tmp_path: Path) -> None:
    """The engine killed between a worker's fork and the line that tells the watcher of it:
    the worker carries the engine's mark from its exec, so the watcher finds it, and through
    it what it started in a session of its own with its environment cleared (no mark)."""
    tag = f"vt-untold-{os.getpid()}"
    lifeline = Lifeline(tmp_path / "records")
    lifeline.start()
    script = f"setsid env -i {SLEEP} {tag}-cleared & exec {SLEEP} {tag}-worker"
    worker = subprocess.Popen(["bash", "-c", script], start_new_session=True,
                              env={**os.environ, RUN_MARK: lifeline.run})
    try:
        found = {name: wait_until(lambda n=name: _named(f"{tag}-{n}"), 10, name)
                 for name in ("worker", "cleared")}
        lifeline.close()  # as the engine's death closes the pipe: nothing was ever added
        for name, pids in found.items():
            wait_until(lambda p=pids: all(gone(pid) for pid in p), 5, f"the {name} to die")
    finally:
        lifeline.close()
        for pid in {p for n in ("worker", "cleared") for p in _named(f"{tag}-{n}")}:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        worker.wait(5)


@pytest.mark.process
def test_a_record_whose_pid_was_given_out_again_kills_nothing(tmp_path: Path) -> None:
    """A worker recorded by an engine that died long ago; its pid now leads another session
    of ours (a reboot-less reuse): the next engine leaves that session alone, and drops the
    record."""
    tag = f"vt-reused-{os.getpid()}"
    victim = subprocess.Popen(["bash", "-c", f"{SLEEP} {tag} & wait"], start_new_session=True)
    try:
        wait_until(lambda: _named(tag), 10, "the session's child")
        start = start_ticks(victim.pid)
        assert start is not None
        records = tmp_path / "records"
        records.mkdir()
        record = records / f"{victim.pid}.json"
        record.write_text(json.dumps({"pid": victim.pid, "start_time": start - 100,
                                      "backend": "old", "engine_pid": 1, "run": "1.gone"}))
        assert kill_leftovers(records, timeout=1.0) == []
        assert victim.poll() is None and _named(tag)  # untouched (not even stopped)
        assert Path(f"/proc/{victim.pid}/stat").read_text().split(")")[1].split()[0] != "T"
        assert not record.exists()
    finally:
        for pid in _named(tag) | {victim.pid}:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        victim.wait(5)
