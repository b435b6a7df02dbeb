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

pytestmark = pytest.mark.process


def _reaped(*argv: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", "-S", str(REAPER), "--", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, **kwargs)  # type: ignore[call-overload]


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
    _wait_for(lambda: any(_parent(int(p)) == proc.pid for p in filter(str.isdigit,
                                                                    os.listdir("/proc"))),
              10, "the command to start")
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
