"""Attacks by another user on the same machine, with real users (root only; skipped otherwise).

Two users are made for the module with ``useradd``: a victim, who runs the real ``vramtui``
CLI and ``vramtui --serve`` with no XDG_RUNTIME_DIR (so the /tmp default applies), and
mallory, who gets to /tmp first.  Mallory's fake engine records every byte it receives: that
count, not anything vramtui says, is the truth checked.  The users need an interpreter they
may run: the test's own, or the system's with the test's site-packages (same Python minor).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from engine_support import ROOT
from spawning import spawns
from waiting import wait_until

from supervisor.client import Client
from supervisor.control.errors import UntrustedEngine

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="needs root and useradd to make the other users")

FAKE_ENGINE = textwrap.dedent('''
    import os, socket, sys
    from worker_sdk.protocol import DataType, MessageType, encode_bytes
    directory, record, drop_to = sys.argv[1], sys.argv[2], int(sys.argv[3])
    os.makedirs(directory, exist_ok=True)
    os.chmod(directory, 0o755)
    path = os.path.join(directory, "control.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o777)
    if drop_to:  # bound as root in a root directory, then served as someone else
        os.setgroups([])
        os.setgid(drop_to)
        os.setuid(drop_to)
    sock.listen(16)
    ack = encode_bytes(MessageType.ACKNOWLEDGEMENT, DataType.DEFAULT, 1, {
        "identifier": "vramtui-engine", "protocol": "1", "pid": os.getpid(), "mode": "serve",
        "version": "fake", "socket": path, "max_request": 1 << 20})
    open(record, "wb").close()
    print("ready", flush=True)
    while True:
        conn, _ = sock.accept()
        conn.settimeout(3)
        try:
            conn.sendall(ack)  # "I am the engine", before it even says hello
            while data := conn.recv(65536):
                with open(record, "ab") as f:
                    f.write(data)
        except OSError:
            pass
        conn.close()
''')


@dataclass
class User:
    name: str
    uid: int
    gid: int
    home: Path


@dataclass
class Machine:
    victim: User
    mallory: User
    python: str
    pythonpath: str

    def env(self, user: User, **extra: str) -> dict[str, str]:
        env = {"HOME": str(user.home), "PATH": "/usr/bin:/bin", "PYTHONPATH": self.pythonpath,
               "LANG": "C.UTF-8", "COLUMNS": "200", "PYTHONDONTWRITEBYTECODE": "1"}
        env.update(extra)
        return env

    def run(self, user: User, *args: str, timeout: float = 60,
            **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.python, *args], env=self.env(user, **extra), user=user.uid,
                              group=user.gid, extra_groups=[], cwd=user.home,
                              capture_output=True, text=True, timeout=timeout)

    def start(self, user: User, *args: str, out: Path, **extra: str) -> subprocess.Popen[bytes]:
        with open(out, "wb") as sink:
            return subprocess.Popen([self.python, *args], env=self.env(user, **extra),
                                    user=user.uid, group=user.gid, extra_groups=[],
                                    cwd=user.home, stdout=sink, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)


def _make_user(role: str) -> User:
    name = f"vt{role}{os.getpid() % 100000}"
    done = subprocess.run(["useradd", "-M", "-U", "-s", "/usr/sbin/nologin", name],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"useradd {name} failed: {done.stderr.strip()}")
    pw = pwd.getpwnam(name)
    home = Path(tempfile.mkdtemp(prefix=f"vt-{role}-", dir="/tmp"))
    os.chown(home, pw.pw_uid, pw.pw_gid)
    os.chmod(home, 0o755)
    return User(name, pw.pw_uid, pw.pw_gid, home)


def _remove_user(user: User) -> None:
    subprocess.run(["pkill", "-KILL", "-u", str(user.uid)], capture_output=True)
    subprocess.run(["userdel", user.name], capture_output=True)
    shutil.rmtree(user.home, ignore_errors=True)
    for leftover in Path("/tmp").glob(f"vramtui-{user.uid}*"):
        shutil.rmtree(leftover, ignore_errors=True)


@pytest.fixture(scope="module")
@spawns
def machine() -> Iterator[Machine]:
    victim = _make_user("v")
    try:
        mallory = _make_user("m")
    except BaseException:
        _remove_user(victim)
        raise
    try:
        paths = [str(ROOT), *site.getsitepackages()]
        pythonpath = os.pathsep.join(paths)
        for python in (sys.executable, "/usr/bin/python3"):
            probe = Machine(victim, mallory, python, pythonpath)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if probe.run(victim, "-c", "import supervisor, msgpack, yaml, rich, psutil",
                             timeout=60).returncode == 0:
                    yield probe
                    return
        pytest.skip("no Python interpreter the test users may run with vramtui's packages")
    finally:
        _remove_user(mallory)
        _remove_user(victim)


def fake_engine(m: Machine, directory: Path, *, as_root_then: int = 0) -> tuple[
        subprocess.Popen[bytes], Path]:
    record = m.mallory.home / f"received-{time.monotonic_ns()}"
    out = m.mallory.home / f"fake-{time.monotonic_ns()}.out"
    args = ["-c", FAKE_ENGINE, str(directory), str(record), str(as_root_then)]
    if as_root_then:
        with open(out, "wb") as sink:
            proc = subprocess.Popen([sys.executable, *args], env={
                "PYTHONPATH": m.pythonpath, "PATH": "/usr/bin:/bin"}, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True)
    else:
        proc = m.start(m.mallory, *args, out=out)
    wait_until(lambda: proc.poll() is not None or "ready" in out.read_text(errors="replace"),
             30, "the fake engine to listen")
    assert proc.poll() is None, out.read_text(errors="replace")
    return proc, record


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def descriptor(m: Machine) -> Path:
    desc = m.victim.home / "backends.yaml"
    desc.write_text(yaml.safe_dump({"backends": [{
        "name": "echo", "script": str(ROOT / "examples" / "echo" / "main.py"),
        "python": m.python, "vram": {"weights": "0MiB", "activation": "16MiB"},
        "timeouts": {"stop_grace": "3s"}}]}))
    os.chown(desc, m.victim.uid, m.victim.gid)
    return desc


def test_a_squatter_gets_nothing_and_the_real_engine_still_starts(machine: Machine) -> None:
    m = machine
    default = Path(f"/tmp/vramtui-{m.victim.uid}")
    fake, received = fake_engine(m, default)
    serve: subprocess.Popen[bytes] | None = None
    try:
        sent = m.run(m.victim, "-m", "vramtui", "submit", "echo", "--data",
                    '{"secret": "payload"}')
        assert sent.returncode == 5, sent.stdout + sent.stderr
        lines = sent.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in sent.stderr
        assert f"belongs to uid {m.mallory.uid} ({m.mallory.name})" in lines[0]
        assert "impersonating" in lines[0]
        assert received.read_bytes() == b""  # not one byte reached mallory
        status = m.run(m.victim, "-m", "vramtui", "status")
        assert status.returncode != 0 and received.read_bytes() == b""

        out = m.victim.home / "serve.out"
        serve = m.start(m.victim, "-m", "vramtui", "--serve", "--gpus", "sim:8GiB",
                        "--backends", str(descriptor(m)), out=out)
        wait_until(lambda: serve.poll() is not None or "serving" in out.read_text(), 60,
                 "the real engine to start")
        assert serve.poll() is None, out.read_text()
        text = out.read_text()
        assert f"/tmp/vramtui-{m.victim.uid}." in text  # its own private directory
        assert "belongs to uid" in text  # and it said why, once
        t0 = time.monotonic()
        status = m.run(m.victim, "-m", "vramtui", "status")
        took = time.monotonic() - t0
        assert status.returncode == 0, status.stdout + status.stderr
        job = m.run(m.victim, "-m", "vramtui", "submit", "echo", "--data", '{"a": 1}',
                     "--wait")
        assert job.returncode == 0 and '"echo"' in job.stdout, job.stdout + job.stderr
        assert received.read_bytes() == b""
        print(f"vramtui status through the fallback directory: {took:.2f} s (with start-up)")
    finally:
        if serve is not None:
            stop(serve, signal.SIGTERM)
        stop(fake)


def test_a_socket_served_by_another_user_is_refused_after_connect_before_sending(
        machine: Machine, tmp_path: Path) -> None:
    m = machine
    directory = Path(tempfile.mkdtemp(prefix="vt-peer-", dir="/tmp"))  # root's, 0755
    fake, received = fake_engine(m, directory, as_root_then=m.mallory.uid)
    try:
        sock = directory / "control.sock"
        st = os.lstat(sock)
        assert st.st_uid == 0  # the file looks like root's: only the kernel knows better
        with pytest.raises(UntrustedEngine, match=f"served by pid {fake.pid} of uid "
                           f"{m.mallory.uid}"):
            Client(sock)
        # The raw truth: the fake saw a connection and got nothing on it.
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(sock))
        probe.close()
        time.sleep(0.2)
        assert received.read_bytes() == b""
    finally:
        stop(fake)
        shutil.rmtree(directory, ignore_errors=True)


def test_a_link_planted_at_the_runtime_path_is_not_followed(machine: Machine) -> None:
    m = machine
    precious = m.victim.home / "precious"
    precious.mkdir()
    os.chown(precious, m.victim.uid, m.victim.gid)
    os.chmod(precious, 0o755)
    default = Path(f"/tmp/vramtui-{m.victim.uid}")
    for leftover in Path("/tmp").glob(f"vramtui-{m.victim.uid}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    (m.victim.home / ".local/state/vramtui/runtime-dir").unlink(missing_ok=True)  # none yet
    planted = m.run(m.mallory, "-c", f"import os; os.symlink({str(precious)!r}, "
                    f"{str(default)!r})")
    assert planted.returncode == 0, planted.stderr
    try:
        done = m.run(m.victim, "-c", "from supervisor.paths import Paths; "
                     "print(Paths.from_env().ensure().runtime_dir)")
        assert done.returncode == 0, done.stderr
        moved = Path(done.stdout.strip().splitlines()[-1])
        assert moved != default and moved.name.startswith(f"vramtui-{m.victim.uid}.")
        assert os.stat(precious).st_mode & 0o777 == 0o755 and list(precious.iterdir()) == []
        assert os.path.islink(default)  # left as it was, never followed
        client = m.run(m.victim, "-m", "vramtui", "status")  # finds the moved directory
        assert "no vramtui engine is running" in client.stderr, client.stderr
    finally:
        with contextlib.suppress(OSError):
            default.unlink()
