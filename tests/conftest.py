"""Shared fixtures for the worker tests: a ``wire_server`` factory, ``spawn_worker`` and gates.

Workers are real processes talking over real Unix sockets to a :class:`WireServer`.  Socket
directories live under /tmp (AF_UNIX paths must stay under 108 bytes); every process a test
spawns is killed at teardown if it is still running.  A worker's stdout and stderr go to a log
file next to its sockets so a chatty worker can never block on a full pipe.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from spawning import spawns

from worker_sdk.protocol import EXTENSIONS
from worker_sdk.testing import WireServer

pytest_plugins = ["process_marker"]

# A suite started in the background by a shell without job control (``nohup .ci/run &``)
# inherits SIGINT ignored, and so would every process it starts: the CLI's Ctrl-C tests would
# send SIGINT to processes that cannot hear it. Handled here, it is the default again in them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).resolve().parent / "workers"


class WorkerProcess(subprocess.Popen[bytes]):
    """A worker process whose output is captured in ``log_path``; ``marker_dir`` is its scratch."""

    log_path: Path
    marker_dir: Path

    def output(self) -> str:
        """Everything the worker wrote to stdout and stderr so far."""
        return self.log_path.read_text(errors="replace")

    def marker(self, name: str) -> str:
        """The contents of marker file ``name`` the worker wrote ('' if absent)."""
        path = self.marker_dir / name
        return path.read_text() if path.exists() else ""


class Gate:
    """A FIFO a worker blocks on until the test releases it, with no polling on either side.

    The test keeps the FIFO open read-write, so a release written before the worker reaches the
    gate is kept in the pipe, and the worker's ``open`` never blocks.  Closing the gate (at
    teardown) gives a still-waiting worker EOF, so nothing hangs.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._fd: int | None = os.open(path, os.O_RDWR)

    def release(self, n: int = 1) -> None:
        assert self._fd is not None
        os.write(self._fd, b"x" * n)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def worker_env(marker_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERDA_IO_", "VRAMTUI_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["WORKER_MARKER_DIR"] = str(marker_dir)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra:
        env.update(extra)
    return env


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory under /tmp for sockets, FIFOs and marker files."""
    path = Path(tempfile.mkdtemp(prefix="vt-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


ServerFactory = Callable[..., WireServer]


@pytest.fixture
def wire_server() -> Iterator[ServerFactory]:
    """``wire_server(features=…, send_ack=True)``: a started server in its own dir (by default
    every extension but ``data-progress``: the tests wait for progress on the control
    socket while a request runs)."""
    servers: list[WireServer] = []
    dirs: list[str] = []

    def make(features: frozenset[str] = EXTENSIONS - {"data-progress"},
             send_ack: bool = True) -> WireServer:
        directory = tempfile.mkdtemp(prefix="vt-", dir="/tmp")
        dirs.append(directory)
        server = WireServer(directory, features=features, send_ack=send_ack).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()
    for directory in dirs:
        shutil.rmtree(directory, ignore_errors=True)


SpawnWorker = Callable[..., WorkerProcess]


@pytest.fixture
@spawns
def spawn_worker() -> Iterator[SpawnWorker]:
    """``spawn_worker(script, server, name, *extra_args, module=..., env=...)`` -> the process.

    ``script`` is a path, or a file name under tests/workers.  ``module`` is ``worker_sdk``
    (default) or ``verda_io`` for the unmodified peer.  ``server`` may be None to pass no
    socket flags at all (config-precedence tests).
    """
    procs: list[WorkerProcess] = []
    dirs: list[str] = []

    def spawn(
        script: str | os.PathLike[str] | None,
        server: WireServer | None,
        name: str | None,
        *extra_args: str,
        module: str = "worker_sdk",
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        marker_dir = Path(tempfile.mkdtemp(prefix="vtm-", dir="/tmp"))
        dirs.append(str(marker_dir))
        args = [sys.executable, "-m", module]
        if script is not None:
            path = Path(script)
            args.append(str(path if path.is_absolute() else WORKERS / path))
        if server is not None:
            args += ["--control-socket", server.control_path, "--data-socket", server.data_path]
        if name is not None:
            args += ["--name", name]
        args += list(extra_args)
        log_path = marker_dir / "worker.log"
        with open(log_path, "wb") as log:
            proc = WorkerProcess(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=worker_env(marker_dir, env),
                cwd=str(marker_dir),
            )
        proc.log_path = log_path
        proc.marker_dir = marker_dir
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    for directory in dirs:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def gate(sock_dir: Path) -> Iterator[Callable[[str], Gate]]:
    """``gate(name)``: a fresh :class:`Gate` FIFO in the test's socket directory."""
    gates: list[Gate] = []

    def make(name: str = "gate") -> Gate:
        g = Gate(sock_dir / name)
        gates.append(g)
        return g

    yield make
    for g in gates:
        g.close()
