"""A worker whose sockets are in a shared place talks only to a server of its own user.

verda-io's default sockets are ``/tmp/verda-io.ctrl.sock`` and ``.data.sock``: another local
user who listens there first would get the worker's registration, send it requests (run on our
model and GPU) and read the answers.  The worker asks the kernel who listens (``SO_PEERCRED``)
before it sends a byte, and refuses another user in one line (exit 4), unless
``VRAMTUI_ENGINE_USER`` names that user.  The other user is a real process of uid 65534
(``tests/other_user.py``); what it received, counted by itself, is the truth checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from other_user import OTHER_UID, needs_other_user, start_as_other_user
from waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "examples" / "echo" / "main.py"

# The other user's server: listens on both sockets, counts what each connection sends.
FAKE_SERVER = r'''
import os, socket, sys, threading
directory = sys.argv[1]
os.umask(0)
def serve(name):
    path = os.path.join(directory, name)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=record, args=(conn, name), daemon=True).start()
def record(conn, name):
    while data := conn.recv(65536):
        with open(os.path.join(directory, name + ".got"), "ab") as f:
            f.write(data)
for name in ("ctrl.sock", "data.sock"):
    threading.Thread(target=serve, args=(name,), daemon=True).start()
while not all(os.path.exists(os.path.join(directory, n)) for n in ("ctrl.sock", "data.sock")):
    pass
print("ready", flush=True)
sys.stdin.read()
'''


@pytest.fixture
def squatted() -> Iterator[Path]:
    """A sticky world-writable directory (as /tmp) where the other user listens first."""
    directory = Path(tempfile.mkdtemp(prefix="vt-vio-", dir="/tmp"))
    os.chmod(directory, 0o1777)
    server = start_as_other_user(FAKE_SERVER, directory)
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n", \
            server.stderr.read() if server.stderr else ""
        yield directory
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.kill()
        server.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def received(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob("*.got"))


def worker(directory: Path, **env: str) -> subprocess.Popen[str]:
    environ = {k: v for k, v in os.environ.items() if k != "VRAMTUI_ENGINE_USER"}
    environ.update(env, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-m", "worker_sdk", str(ECHO), "--control-socket",
         str(directory / "ctrl.sock"), "--data-socket", str(directory / "data.sock"),
         "--name", "victim"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ, cwd=ROOT)


@needs_other_user
@pytest.mark.process
def test_a_server_of_another_user_gets_nothing_and_the_worker_says_why(squatted: Path) -> None:
    proc = worker(squatted)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 4, out
    [line] = out.strip().splitlines()
    assert f"refusing the server at {squatted / 'ctrl.sock'}: it is pid" in line, out
    assert f"of uid {OTHER_UID}" in line and "nothing was sent" in line
    assert received(squatted) == 0


@needs_other_user
@pytest.mark.process
def test_a_user_named_as_trusted_is_served(squatted: Path) -> None:
    proc = worker(squatted, VRAMTUI_ENGINE_USER=str(OTHER_UID))
    try:
        wait_until(lambda: received(squatted) > 0 or proc.poll() is not None, 30,
                   "the worker to register with the server it was told to trust")
        assert received(squatted) > 0, proc.communicate()[0]
    finally:
        proc.kill()
        proc.communicate()


def test_an_unknown_trusted_user_is_one_line() -> None:
    from worker_sdk.connection import UntrustedServer, trusted_uids

    with pytest.raises(UntrustedServer, match="^VRAMTUI_ENGINE_USER=nosuchuserhere: no such "
                                              "user on this machine$"):
        trusted_uids({"VRAMTUI_ENGINE_USER": "nosuchuserhere"})
    assert trusted_uids({}) == {os.geteuid(), 0}
