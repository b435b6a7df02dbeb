"""Helpers for the control-socket, serve and CLI tests: real engines, real processes.

- ``make_env``: a fresh config/state/runtime root under /tmp (short socket paths) with a
  backends file, as environment variables for a subprocess (or ``monkeypatch``);
- ``start_serve``: ``vramtui --serve`` as a subprocess, returned once its socket answers;
- ``cli``: one ``vramtui ...`` command as a subprocess;
- ``in_process``: an embedded engine with its control server, for in-process client tests.

Every process started here is killed at teardown if it still runs (``reap``, called by the
tests' fixtures), worker process groups included.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from engine_support import ROOT, scratch_dir, sim_backend
from waiting import wait_until

from supervisor.client import Client
from supervisor.control import messages as m
from supervisor.control.errors import EngineNotRunning
from supervisor.engine import EngineConfig
from supervisor.facade import Supervisor
from supervisor.paths import Paths
from worker_sdk.protocol import DataType, Decoder, Message, MessageType, encode_bytes

PYTHON = sys.executable
ECHO = ROOT / "examples" / "echo" / "main.py"


def echo_backend(name: str = "echo") -> dict[str, Any]:
    return {"name": name, "script": str(ECHO), "vram": {"weights": "0MiB", "activation": "16MiB"},
            "timeouts": {"stop_grace": "3s"}}


def default_backends() -> list[dict[str, Any]]:
    return [echo_backend(),
            sim_backend("slow", 1024, 512, steps=20, step_s=0.05),
            sim_backend("huge", 64 * 1024, 1024)]


def make_env(root: Path, backends: list[dict[str, Any]] | None = None) -> dict[str, str]:
    desc = root / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": backends or default_backends()}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMTUI_")}
    env.update(VRAMTUI_RUNTIME_DIR=str(root / "run"), VRAMTUI_STATE_DIR=str(root / "state"),
               VRAMTUI_CONFIG_DIR=str(root / "cfg"), VRAMTUI_TEST_BACKENDS=str(desc),
               COLUMNS="200")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # CLI processes start faster with cached bytecode
    env.pop("VRAMTUI_DEBUG", None)
    return env


def new_root() -> Path:
    """A fresh directory for an engine's files, removed when this test process exits."""
    return scratch_dir()


def cli(env: dict[str, str], *args: str, input: bytes | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``vramtui ARGS`` as a subprocess; text output."""
    done = subprocess.run([PYTHON, "-m", "vramtui", *args], env=env, input=input,
                          capture_output=True, timeout=timeout)
    return subprocess.CompletedProcess(done.args, done.returncode,
                                       done.stdout.decode(errors="replace"),
                                       done.stderr.decode(errors="replace"))


@dataclass
class Served:
    """A ``vramtui --serve`` subprocess."""

    proc: subprocess.Popen[bytes]
    env: dict[str, str]
    root: Path
    out_path: Path
    err_path: Path
    worker_pids: set[int] = field(default_factory=set)

    @property
    def socket(self) -> Path:
        return Paths.from_env(self.env).control_socket

    @property
    def paths(self) -> Paths:
        return Paths.from_env(self.env)

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def client(self) -> Client:
        return Client(self.socket)

    def note_workers(self, client: Client) -> set[int]:
        """Remember the workers' pids (to kill them at teardown should they outlive us)."""
        pids = {b.pid for b in client.snapshot().backends if b.pid is not None}
        self.worker_pids |= pids
        return pids

    def wait_exit(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout)


def _answers(socket_path: Path) -> Client | None:
    try:
        return Client(socket_path)
    except EngineNotRunning:
        return None


def start_serve(env: dict[str, str], root: Path, *extra: str, timeout: float = 60,
                preexec: Any = None) -> Served:
    """``vramtui --serve`` with ``extra`` flags; ``preexec`` runs in the child first (limits)."""
    out_path, err_path = root / "serve.out", root / "serve.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [PYTHON, "-m", "vramtui", "--serve", "--gpus", "sim:8GiB",
             "--backends", env["VRAMTUI_TEST_BACKENDS"], *extra],
            env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, preexec_fn=preexec)
    served = Served(proc, env, root, out_path, err_path)

    def up() -> Client | None:
        if proc.poll() is not None:
            raise AssertionError(f"vramtui --serve exited with {proc.returncode}: "
                                 f"{served.stderr()[-2000:]}")
        return _answers(served.socket)

    try:
        wait_until(up, timeout, "vramtui --serve to answer").close()
    except BaseException:
        reap(served)
        raise
    return served


def reap(served: Served) -> None:
    """Stop a serve process left running (SIGTERM, then SIGKILL) and any worker it left."""
    if served.proc.poll() is None:
        with contextlib.suppress(Exception):
            c = served.client()
            served.note_workers(c)
            c.close()
        served.proc.send_signal(signal.SIGTERM)
        try:
            served.proc.wait(20)
        except subprocess.TimeoutExpired:
            served.proc.kill()
            served.proc.wait(10)
    for pid in served.worker_pids:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)
    shutil.rmtree(served.root, ignore_errors=True)


@contextlib.contextmanager
def in_process(backends: list[dict[str, Any]] | None = None, *, gpus: str = "sim:8GiB",
               config: EngineConfig | None = None,
               **server_kw: Any) -> Iterator[tuple[Supervisor, Any, Path]]:
    """An embedded engine serving its control socket: (supervisor, server, root)."""
    from supervisor.control.server import ControlServer

    root = new_root()
    env = make_env(root, backends)
    sup = Supervisor.from_config(gpus=gpus, backends=[env["VRAMTUI_TEST_BACKENDS"]],
                                 environ=env, paths=Paths.from_env(env),
                                 config=config or EngineConfig(reserve_mib=0, tick_s=0.1))
    server = ControlServer(sup.engine, sup.paths.control_socket, mode="test", **server_kw)
    sup.add_service(server)
    sup.start_in_thread()
    try:
        yield sup, server, root
    finally:
        sup.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


# -- raw frames ---------------------------------------------------------------------------


def request(msg_id: int, method: str, **args: object) -> bytes:
    return encode_bytes(MessageType.REQUEST, DataType.DEFAULT, msg_id, {"m": method, "a": args})


def hello_frame(protocol: str = m.PROTOCOL) -> bytes:
    payload = m.hello("test")
    payload["metadata"]["protocol"] = protocol
    return encode_bytes(MessageType.REGISTRATION, DataType.DEFAULT, 1, payload)


class RawConn:
    """A bare socket speaking frames, for what the Client would never send."""

    def __init__(self, path: os.PathLike[str] | str, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(30)
        self.sock.connect(os.fspath(path))
        self.dec = Decoder()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> Message:
        while (msg := self.dec.next()) is None:
            data = self.sock.recv(1 << 20)
            if not data:
                raise EOFError("closed")
            self.dec.feed(data)
        return msg

    def hello(self) -> Message:
        with contextlib.suppress(BrokenPipeError):  # refused: the reason is already here
            self.send(hello_frame())
        return self.recv()

    def close(self) -> None:
        self.sock.close()
