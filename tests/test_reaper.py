"""The reaper, a model server's first process (``supervisor/workers/reaper.py``), run as the
engine runs it: it ends as its command did (code or signal), says a command it cannot start,
passes the group's SIGTERM to the command rather than dying of it, and adopts a daemon the
command's tree orphaned with a cleared environment and a session of its own (``setsid -f
env -i``): the daemon stays its child, found from its pid, and dies once the command is
gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.workers import process
from supervisor.workers.process import REAPER
from supervisor.workers.reaper import PARENT_GONE as REAPER_PARENT_GONE

pytestmark = pytest.mark.process


def _reaped(*argv: str) -> subprocess.Popen[bytes]:
    command, env = process.reaper_start(argv, os.environ)
    assert command[-1] == str(REAPER)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _parent(pid: int) -> int | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    return None if fields[0] in (b"Z", b"X") else int(fields[1])


def _wait_for(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_it_ends_as_its_command_did() -> None:
    assert _reaped("sh", "-c", "exit 7").wait(10) == 7
    assert _reaped("sh", "-c", "exit 0").wait(10) == 0
    assert _reaped("sh", "-c", "kill -KILL $$").wait(10) == -signal.SIGKILL
    assert _reaped("sh", "-c", "kill -TERM $$").wait(10) == -signal.SIGTERM


def test_a_command_it_cannot_start_is_said_in_one_line() -> None:
    proc = _reaped("no-such-program-vt")
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 127
    assert err.decode().strip() == "cannot start 'no-such-program-vt': No such file or directory"


def test_the_groups_sigterm_ends_the_command_and_then_it() -> None:
    proc = _reaped("sh", "-c", "trap 'exit 5' TERM; while :; do sleep 0.05; done")
    child = _child_of(proc)
    _wait_for(lambda: _catches(child, signal.SIGTERM), 10, "the command's trap")
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == 5  # (the command's own end, not the reaper killed by the signal)


def test_a_daemon_that_cleared_its_environment_is_adopted_and_dies_with_the_command(
        tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    stop = tmp_path / "stop"
    daemon = (f"{sys.executable} -c 'import os, time; "
              f"open(\"{pidfile}\", \"w\").write(str(os.getpid())); time.sleep(600)'")
    command = f"setsid -f env -i {daemon}; while [ ! -e {stop} ]; do sleep 0.02; done"
    proc = _reaped("sh", "-c", command)
    daemon_pid = 0
    try:
        daemon_pid = _wait_for(lambda: pidfile.exists() and pidfile.read_text() and
                               int(pidfile.read_text()), 10, "the daemon to start")
        # Its launcher is gone: orphaned, it is the reaper's child, not init's.
        _wait_for(lambda: _parent(daemon_pid) == proc.pid, 10, "the daemon to be adopted")
        assert os.getsid(daemon_pid) != os.getsid(proc.pid)
        assert Path(f"/proc/{daemon_pid}/environ").read_bytes() == b""  # (nothing names us)
        stop.touch()
        assert proc.wait(10) == 0
        _wait_for(lambda: _parent(daemon_pid) is None, 10, "the daemon to be gone")
    finally:
        if daemon_pid:
            with contextlib.suppress(OSError):
                os.kill(daemon_pid, signal.SIGKILL)
        proc.kill()
        proc.wait(10)


def test_a_reaped_spawn_of_a_program_that_cannot_run_fails_at_once(tmp_path: Path) -> None:
    not_executable = tmp_path / "server.sh"
    not_executable.write_text("#!/bin/sh\n")

    async def start(argv: list[str]) -> None:
        await process.spawn(argv, env={"PATH": os.environ["PATH"]}, cwd=None,
                            log_path=tmp_path / "log", reaped=True)

    with pytest.raises(FileNotFoundError):
        asyncio.run(start(["no-such-program-vt"]))
    with pytest.raises(FileNotFoundError):
        asyncio.run(start([str(tmp_path / "missing")]))
    with pytest.raises(PermissionError):
        asyncio.run(start([str(not_executable)]))


def test_the_commands_loader_variables_reach_it_but_not_the_reapers_python(
        tmp_path: Path) -> None:
    # LD_LIBRARY_PATH outranks the engine Python's RUNPATH: in the reaper it could load
    # another build's libpython (a conda env's lib); the command gets it as it was given.
    # (Every variable reaches the reaper renamed, given back to the command.)
    seen = tmp_path / "seen"
    env = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(tmp_path / "libs"),
           "OTHER": "kept"}

    async def run() -> tuple[bytes, int]:
        proc = await process.spawn(
            ["sh", "-c", f'echo "$LD_LIBRARY_PATH $OTHER" > {seen}; sleep 600'], env=env,
            cwd=None, log_path=tmp_path / "log", reaped=True)
        try:
            deadline = time.monotonic() + 10
            while not seen.exists() or not seen.read_text().strip():
                assert time.monotonic() < deadline, "the command did not run"
                await asyncio.sleep(0.01)
            return Path(f"/proc/{proc.pid}/environ").read_bytes(), proc.pid
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    reapers_env, _pid = asyncio.run(run())
    assert seen.read_text().split() == [str(tmp_path / "libs"), "kept"]
    assert not any(item.startswith(b"LD_") for item in reapers_env.split(b"\0"))


def _catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` handles ``sig`` now (a shell's trap is set)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return bool(int(status.split("SigCgt:")[1].split()[0], 16) & (1 << (sig - 1)))


def _child_of(proc: subprocess.Popen[bytes]) -> int:
    """The command's pid, as the reaper's name says, once it runs."""
    def named() -> int | None:
        name = Path(f"/proc/{proc.pid}/comm").read_text().split()
        return int(name[1]) if name[0] == "reaper" else None
    return int(_wait_for(named, 10, "the reaper to start its command"))


def test_the_command_gets_its_environment_and_signals_exactly_and_its_words_stay_hidden(
        tmp_path: Path) -> None:
    # Its environment as given (no locale the reaper's Python coerced: LC_CTYPE=C.UTF-8 on
    # a machine with no locale), every signal at its default (Python ignores SIGPIPE and
    # SIGXFSZ, and an exec from the engine reset them), and its words out of the reaper's
    # command line (a pkill -f of the server must not match the reaper).
    out = tmp_path / "out"
    env = {"PATH": os.environ["PATH"], "ONLY": "this"}
    command, start = process.reaper_start(
        ["sh", "-c", f"env > {out}.env; grep SigIgn /proc/$$/status > {out}; sleep 600",
         "vt-secret-word"], env)
    proc = subprocess.Popen(command, env=start, start_new_session=True)
    try:
        child = _child_of(proc)
        _wait_for(lambda: out.exists() and out.read_text(), 10, "the command's report")
        assert out.read_text().split() == ["SigIgn:", "0000000000000000"]
        seen = dict(line.split("=", 1) for line in Path(f"{out}.env").read_text().split())
        assert {k: v for k, v in seen.items() if k not in ("PWD", "SHLVL", "_")} == env
        assert b"vt-secret-word" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert b"vt-secret-word" in Path(f"/proc/{child}/cmdline").read_bytes()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_signal_it_does_not_know_reaches_the_command_and_not_it(tmp_path: Path) -> None:
    # The group's SIGUSR1 (a server that dumps its state on it): the reaper lives on.
    got = tmp_path / "got"
    proc = _reaped("sh", "-c", f"trap 'echo usr1 >> {got}' USR1; "
                   "while :; do sleep 0.05; done")
    try:
        child = _child_of(proc)
        _wait_for(lambda: _catches(child, signal.SIGUSR1), 10, "the command's trap")
        os.killpg(proc.pid, signal.SIGUSR1)
        _wait_for(lambda: got.exists() and got.read_text(), 10, "the command to hear it")
        assert proc.poll() is None  # (it did not die of it)
        assert got.read_text() == "usr1\n"  # (told once: it did not pass on the group's)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_command_that_left_the_group_still_hears_its_sigterm() -> None:
    # A command that calls setsid: the group's SIGTERM misses it, the reaper passes it on.
    proc = _reaped("setsid", "sh", "-c", "trap 'exit 6' TERM; while :; do sleep 0.05; done")
    try:
        child = _child_of(proc)
        _wait_for(lambda: os.getpgid(child) != proc.pid and _catches(child, signal.SIGTERM),
                  10, "the command to leave and set its trap")
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 6
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_a_bare_name_is_found_in_a_relative_path_entry_from_the_cwd(tmp_path: Path) -> None:
    tool = tmp_path / "bin" / "tool"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    env = {"PATH": "bin:/usr/bin:/bin"}
    process.runnable("tool", env, str(tmp_path))  # (found: no error)
    with pytest.raises(FileNotFoundError):
        process.runnable("tool", env, "/")


def test_when_its_parent_dies_the_command_and_what_it_adopted_die_too(tmp_path: Path) -> None:
    """The engine and its lifeline killed together (``kill -9``): nothing watched the server
    any more, and the reaper, its command and a daemon it had adopted lived on with their
    port until another engine started there. The reaper now hears its parent's death from
    the kernel and kills them all. Its parent here: a process that starts it as the engine
    does, then is SIGKILLed."""
    pids = tmp_path / "pids"
    daemon = (f"{sys.executable} -c 'import os, time; "
              f"open(\"{pids}.daemon\", \"w\").write(str(os.getpid())); time.sleep(600)'")
    command = f"setsid -f env -i {daemon}; echo $$ > {pids}.command; sleep 600"
    starter = (
        "import os, subprocess, sys, time\n"
        "from supervisor.workers import process\n"
        f"argv, env = process.reaper_start(['sh', '-c', {command!r}], os.environ)\n"
        "proc = subprocess.Popen(argv, env=env, start_new_session=True)\n"
        f"open({str(pids)!r} + '.reaper', 'w').write(str(proc.pid))\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", starter], cwd=Path(process.__file__)
                              .resolve().parents[2], start_new_session=True)
    found: dict[str, int] = {}
    try:
        for what in ("reaper", "command", "daemon"):
            path = Path(f"{pids}.{what}")
            found[what] = _wait_for(lambda p=path: p.exists() and p.read_text().strip()
                                    and int(p.read_text()), 20, f"the {what} to start")
        _wait_for(lambda: _parent(found["daemon"]) == found["reaper"], 10,
                  "the daemon to be adopted")
        parent.kill()
        parent.wait(10)
        for what, pid in found.items():
            _wait_for(lambda p=pid: _parent(p) is None, 10, f"the {what} to be gone")
    finally:
        parent.kill()
        parent.wait(10)
        for pid in found.values():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_its_parents_signal_from_anyone_else_is_passed_on_not_obeyed() -> None:
    """The parent-death signal sent by someone while its parent lives: an ordinary signal,
    handed to a command that left the group, and the reaper stays."""
    proc = _reaped("sh", "-c", "sleep 600")
    try:
        child = _child_of(proc)
        os.kill(proc.pid, REAPER_PARENT_GONE)
        os.kill(child, signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM  # (as its command ended: not killed by it)
    finally:
        proc.kill()
        proc.wait(10)
