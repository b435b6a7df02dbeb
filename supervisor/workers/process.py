"""Starting and signalling worker processes, and their log files.

Every worker runs in its own session (so its own process group); signals go to that group, so
a worker's children die with it.  The engine only ever signals process groups it created.

Logs.  A worker's stdout and stderr go to a pipe that the engine copies into the backend's log
file (:class:`LogSink`), never straight to the file: so the file is rotated *while* the worker
runs (over ``LOG_MAX_BYTES`` it becomes ``.1``, ``.1`` becomes ``.2`` …, ``LOG_KEEP`` old files
kept), and a worker that floods its output is slowed to ``LOG_RATE`` bytes a second (its
writes block) instead of filling the disk — one backend's logs never take more than
``(LOG_KEEP + 1) * LOG_MAX_BYTES`` of it.  The files are opened without following links.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from supervisor.clock import monotonic

from ..paths import open_private
from . import reaper

LOG_MAX_BYTES = 5 * 1024 * 1024
LOG_KEEP = 3
LOG_RATE = 8 * 1024 * 1024  # bytes a second a worker may log, over a burst of as much
#: The first process of a ``reaped`` spawn: it adopts what its command's tree orphans.
REAPER = Path(reaper.__file__)

log = logging.getLogger(__name__)


def rotate_log(path: Path, max_bytes: int = LOG_MAX_BYTES, keep: int = LOG_KEEP) -> None:
    """Rotate ``path`` to ``path.1`` … ``path.<keep>`` once it is larger than ``max_bytes``."""
    try:
        if path.stat().st_size <= max_bytes:
            return
    except FileNotFoundError:
        return
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            older.replace(path.with_name(f"{path.name}.{i + 1}"))
    path.replace(path.with_name(f"{path.name}.1"))


def _open_log(path: Path) -> int:
    return open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)


class LogSink(asyncio.Protocol):
    """Copies one worker's output pipe into its log file: rotated by size, slowed by rate."""

    def __init__(self, path: Path, *, max_bytes: int, keep: int, rate: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.rate = rate
        self.fd: int | None = _open_log(path)
        self.size = os.fstat(self.fd).st_size
        self.dropped = 0  # bytes that could not be written (disk full…)
        self.transport: asyncio.ReadTransport | None = None
        self._tokens = float(rate)
        self._stamp = monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (cast: another loop's transports, uvloop's, are not asyncio.ReadTransport's)
        self.transport = cast(asyncio.ReadTransport, transport)

    def data_received(self, data: bytes) -> None:
        self._write(data)
        now = monotonic()
        self._tokens = min(float(self.rate), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= len(data)
        if self._tokens < 0 and self.transport is not None:
            # Over the rate: stop reading until it is paid back; the worker's writes block.
            self.transport.pause_reading()
            asyncio.get_running_loop().call_later(-self._tokens / self.rate, self._resume)

    def _resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _write(self, data: bytes) -> None:
        if self.fd is None:
            self.dropped += len(data)
            return
        if self.size + len(data) > self.max_bytes and self.size:
            self._rotate()
        view = memoryview(data)
        try:
            while view.nbytes and self.fd is not None:
                n = os.write(self.fd, view)
                self.size += n
                view = view[n:]
        except OSError as exc:
            first = not self.dropped
            self.dropped += view.nbytes
            if first:
                log.warning("worker log %s: %s; the worker's output is dropped until it can "
                            "be written", self.path, exc.strerror or exc)

    def _rotate(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            rotate_log(self.path, 0, self.keep)
            self.fd = _open_log(self.path)
            self.size = 0
        except OSError as exc:
            log.warning("worker log %s cannot be rotated (%s); its output is dropped",
                        self.path, exc.strerror or exc)

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.transport = None


def runnable(program: str, env: Mapping[str, str], cwd: str | None) -> None:
    """Raise the ``OSError`` an exec of ``program`` in ``cwd`` would when it is not there or
    not executable (a bare name: searched in the environment's ``PATH``, a relative entry
    from ``cwd``, as :mod:`.reaper` searches it). What only an exec finds (a script with no
    ``#!``) is said by the reaper, in the log."""
    if "/" in program:
        candidates = [os.path.join(cwd or "", program)]
    else:
        candidates = [os.path.join(cwd or "", entry or ".", program)
                      for entry in env.get("PATH", os.defpath).split(os.pathsep)]
    denied = False
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return
        denied = denied or os.path.exists(path)
    if denied:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def reaper_start(argv: Sequence[str], env: Mapping[str, str]) -> tuple[list[str],
                                                                       dict[str, str]]:
    """The command line and environment of :mod:`.reaper` running ``argv`` in ``env``: its
    command and every variable of its environment passed in its own (renamed: they do not
    configure the reaper's Python, nor show in its command line)."""
    start = {reaper.ENV_PREFIX + k: v for k, v in env.items()}
    start[reaper.ARGC] = str(len(argv))
    start[reaper.PARENT] = str(os.getpid())
    start.update((f"{reaper.ARG}{i}", word) for i, word in enumerate(argv))
    return [sys.executable, "-I", "-S", str(REAPER)], start


async def spawn(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, log_path: Path,
    pipes: bool = False, reaped: bool = False,
) -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session, its stdout and stderr copied to ``log_path`` (with
    ``pipes``: stdin and stdout are pipes to the caller, and only stderr is logged). With
    ``reaped``, under :mod:`.reaper` (the process started, whose pid is returned): what the
    command's tree orphans is adopted by it, so it stays in the tree that is walked from the
    pid, whatever it did to leave the session and its environment."""
    for text in (*argv, *env.keys(), *env.values(), cwd or ""):
        if "\0" in text:  # (asyncio's exec refuses it; uvloop's would pass it cut short)
            raise ValueError(f"embedded null byte in the command or its environment: "
                             f"{text.split(chr(0))[0][:40]!r}…")
    if reaped and argv and sys.executable:
        runnable(argv[0], env, cwd)  # (said now, as an exec of it would: not in the log)
        argv, env = reaper_start(argv, env)
    log_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    rotate_log(log_path)
    try:
        sink = LogSink(log_path, max_bytes=LOG_MAX_BYTES, keep=LOG_KEEP, rate=LOG_RATE)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise OSError(exc.errno, f"cannot open its log {log_path}: {why}") from None
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if pipes else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if pipes else write_fd,
            stderr=write_fd if pipes else asyncio.subprocess.STDOUT,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        sink.connection_lost(None)
        raise
    finally:
        os.close(write_fd)
    pipe = os.fdopen(read_fd, "rb", buffering=0)
    try:
        await asyncio.get_running_loop().connect_read_pipe(lambda: sink, pipe)
    except BaseException:
        pipe.close()
        sink.connection_lost(None)
        raise
    return proc


def reaped_pid(reaper_pid: int) -> int | None:
    """The pid of the command :mod:`.reaper` ``reaper_pid`` started, as its name says
    (``reaper <pid>``); None before it has started one (or once it is gone)."""
    try:
        with open(f"/proc/{reaper_pid}/comm") as f:
            name = f.read().split()
    except OSError:
        return None
    return int(name[1]) if len(name) == 2 and name[0] == "reaper" and name[1].isdigit() \
        else None


def signal_group(pid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the process group led by ``pid``; False if it is already gone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return True


def tail(path: Path, max_bytes: int = 4096) -> str:
    """The last ``max_bytes`` of a log file, decoded leniently ('' when missing)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
