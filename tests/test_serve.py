"""``vramtui --serve`` as a real process: start, refuse a second, stop cleanly, restart, security.

Each test runs its own engine in its own /tmp root; every process is killed at teardown.
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from serve_support import (
    PYTHON,
    RawConn,
    Served,
    cli,
    make_env,
    new_root,
    reap,
    request,
    start_serve,
)
from waiting import wait_until

from supervisor.control import messages as m
from supervisor.control.errors import EngineNotRunning, RequestTooLarge
from supervisor.errors import QueueFull
from supervisor.jobs import JobState
from supervisor.paths import Paths
from worker_sdk.protocol import DataType, MessageType, encode_bytes

# What textual-serve gives a browser's session: a TUI that needs no terminal (the TUI's
# errors before it runs are tested with it; without it, the terminal it lacks comes first)
WEB_DRIVER = "textual.drivers.web_driver:WebDriver"

StartServe = Callable[..., Served]


@pytest.fixture
def serve() -> Iterator[StartServe]:
    started: list[Served] = []

    def start(*extra: str, backends: list[dict[str, object]] | None = None,
              root: Path | None = None) -> Served:
        root = root or new_root()
        served = start_serve(make_env(root, backends), root, *extra)
        started.append(served)
        return served

    yield start
    for served in reversed(started):  # a restarted engine shares its root with the first
        reap(served)


@pytest.mark.process
def test_serve_says_where_it_listens_and_a_second_one_refuses_at_once(
        serve: StartServe, tmp_path: Path) -> None:
    log_file = tmp_path / "serve.log"
    s = serve("--log-file", str(log_file))
    banner = wait_until(lambda: s.stdout().strip(), 10, "the banner")
    assert str(s.socket) in banner and "SIMULATED" in banner
    assert f"pid {s.proc.pid}" in banner
    assert stat.S_IMODE(os.stat(s.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(s.socket.parent).st_mode) == 0o700
    t0 = time.monotonic()
    second = cli(s.env, "--serve", "--gpus", "sim:8GiB")
    assert time.monotonic() - t0 < 15
    assert second.returncode == 5
    assert f"pid {s.proc.pid}" in second.stderr and str(s.socket) in second.stderr
    assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
    assert s.proc.poll() is None  # the first one is untouched
    assert "control socket" in s.stderr()  # logs go to stderr, with timestamps…
    assert "engine started" in log_file.read_text()  # …and to --log-file


@pytest.mark.process
def test_a_second_engine_on_the_same_state_directory_refuses_with_exit_5(
        serve: StartServe) -> None:
    # Another runtime directory (so no lock in common) but the same state directory: the
    # journal is the first engine's. It exited 1 saying the journal was "in use by another
    # process", where the exit codes say 5 for another engine that already runs.
    s = serve()
    env = dict(s.env, VRAMTUI_RUNTIME_DIR=str(s.root / "run-2"))
    second = cli(env, "--serve", "--gpus", "sim:8GiB", "--backends",
                 env["VRAMTUI_TEST_BACKENDS"])
    assert second.returncode == 5, second.stderr
    assert "another vramtui engine already runs on the state directory" in second.stderr
    assert str(s.paths.journal_path) in second.stderr
    assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1, \
        second.stderr
    assert s.proc.poll() is None  # the first one is untouched
    assert cli(s.env, "status").returncode == 0


@pytest.mark.process
def test_sigterm_lets_the_running_job_finish_stops_workers_and_exits_0(
        serve: StartServe) -> None:
    s = serve()
    c = s.client()
    running = c.submit("slow", b'{"steps": 40, "step_s": 0.05}')
    wait_until(lambda: c.job(running).state is JobState.RUNNING, 30, "job running")
    workers = s.note_workers(c)
    assert workers
    waiter = subprocess.Popen(  # a CLI already waiting for the result hears it
        [PYTHON, "-m", "vramtui", "result", running, "--wait", "--json"],
        env=s.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: c.stats()["connections"] >= 2, 30, "the waiting CLI")
        s.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: c.snapshot().stopping, 10, "the engine to be stopping")
        refused = cli(s.env, "submit", "echo", "--data", "{}")
        assert refused.returncode == 3 and "stopping" in refused.stderr
        assert s.wait_exit(60) == 0
        out, err = waiter.communicate(timeout=30)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 0, err
    assert json.loads(out)["state"] == "succeeded"  # it ran to the end within the grace
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or _zombie(pid)
    assert not s.socket.exists()
    assert "SIGTERM" in s.stderr() and "engine stopped" in s.stderr()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


@pytest.mark.process
def test_a_subscriber_that_never_reads_does_not_slow_the_served_engine(
        serve: StartServe) -> None:
    s = serve()
    stuck = RawConn(s.socket, rcvbuf=4096)
    assert stuck.hello().type == MessageType.ACKNOWLEDGEMENT
    stuck.send(request(2, "subscribe"))  # every event; then it never reads
    c = s.client()
    t0 = time.monotonic()
    for _ in range(100):
        assert c.submit_wait("echo", b'{"stream": 20}', stream=True).state is JobState.SUCCEEDED
    took = time.monotonic() - t0
    stats = c.stats()
    assert stats["dropped_events"] > 0, stats
    assert max(x["write_buffer"] for x in stats["clients"]) <= stats["subscriber_buffer"] + 65536
    assert took < 60
    done = cli(s.env, "submit", "echo", "--data", '{"still": "fast"}', "--wait")
    assert done.returncode == 0 and json.loads(done.stdout) == {"echo": {"still": "fast"}}
    stuck.close()


@pytest.mark.process
def test_kill_9_with_20_queued_jobs_then_restart_runs_every_job_with_its_id(
        serve: StartServe) -> None:
    s = serve()
    c = s.client()
    ids = [c.submit("slow", json.dumps({"steps": 2, "step_s": 0.05, "i": i}).encode())
           for i in range(20)]
    s.note_workers(c)
    wait_until(lambda: s.note_workers(c), 30, "a worker")
    c.close()
    s.proc.kill()
    s.proc.wait(10)
    again = serve(root=s.root)
    c = again.client()
    views = [c.wait(i, 90) for i in ids]
    again.note_workers(c)
    assert [v.id for v in views] == ids
    assert all(v.state is JobState.SUCCEEDED for v in views), [v.state for v in views]


@pytest.mark.process
def test_the_tui_embedded_engine_serves_cli_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    from vramtui.connect import open_engine

    root = new_root()
    env = make_env(root)
    for key in ("VRAMTUI_RUNTIME_DIR", "VRAMTUI_STATE_DIR", "VRAMTUI_CONFIG_DIR"):
        monkeypatch.setenv(key, env[key])
    args = argparse.Namespace(gpus="sim:8GiB", backends=[env["VRAMTUI_TEST_BACKENDS"]],
                              attach=None)
    with pytest.raises(EngineNotRunning, match="vramtui --serve"):
        open_engine(args, allow_embedded=False)
    api, mode = open_engine(args, allow_embedded=True)
    try:
        assert mode == "embedded"
        status = cli(env, "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["pid"] == os.getpid()
        done = cli(env, "submit", "echo", "--data", '{"from": "cli"}', "--wait")
        assert done.returncode == 0 and json.loads(done.stdout) == {"echo": {"from": "cli"}}
        second, second_mode = open_engine(args, allow_embedded=True)  # attaches, no new engine
        assert second_mode.startswith("attached") and "embedded in another TUI" in second_mode
        assert second.snapshot().pid == os.getpid()
        second.stop()
    finally:
        api.stop(30)


# -- who may connect -------------------------------------------------------------------------

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as nobody")

PROBE = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
s.connect(sys.argv[1])
try:
    s.sendall(bytes.fromhex(sys.argv[2]))
except OSError:
    pass
data = b""
while len(data) < 4096:
    try:
        part = s.recv(4096)
    except OSError:
        break
    if not part:
        break
    data += part
    if len(data) >= 12 and len(data) >= 12 + int.from_bytes(data[:8], "big"):
        break
sys.stdout.write(data.hex())
"""


def _as_nobody(path: Path) -> bytes:
    """What a process of user nobody (its own group only) reads from the socket."""
    nobody = _nobody()
    hello = encode_bytes(MessageType.REGISTRATION, DataType.DEFAULT, 1, m.hello("nobody"))
    done = subprocess.run(["/usr/bin/python3", "-c", PROBE, str(path), hello.hex()],
                          user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[],
                          capture_output=True, text=True, timeout=30, cwd="/")
    assert done.returncode == 0, done.stderr
    return bytes.fromhex(done.stdout)


def _nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
        raise


@pytest.mark.process
@ROOT_ONLY
def test_a_peer_of_another_uid_is_refused_and_logged(serve: StartServe) -> None:
    nobody = _nobody()
    s = serve()
    # The 0700 directory alone keeps nobody out; open the way to test SO_PEERCRED itself.
    os.chmod(s.root, 0o711)
    os.chmod(s.socket.parent, 0o711)
    os.chmod(s.socket, 0o666)
    reply = _as_nobody(s.socket)
    assert b"AccessDenied" in reply and f"uid {nobody.pw_uid}".encode() in reply
    wait_until(lambda: f"from uid {nobody.pw_uid} pid" in s.stderr(), 10, "the refusal logged")
    assert s.client().ping() < 5  # the owner still gets in


@pytest.mark.process
@ROOT_ONLY
def test_allow_group_opens_the_socket_to_that_group(serve: StartServe) -> None:
    nobody = _nobody()
    group = grp.getgrgid(nobody.pw_gid).gr_name
    root = new_root()
    os.chmod(root, 0o711)
    s = serve("--allow-group", group, root=root)
    st = os.stat(s.socket)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == nobody.pw_gid
    dst = os.stat(s.socket.parent)
    assert stat.S_IMODE(dst.st_mode) == 0o710 and dst.st_gid == nobody.pw_gid
    reply = _as_nobody(s.socket)
    assert b"vramtui-engine" in reply and b"AccessDenied" not in reply


@pytest.mark.process
def test_serve_refuses_bad_options_in_one_line() -> None:
    env = make_env(new_root())
    for args, text in ((["--gpus", "bogus"], "bad --gpus value"),
                       (["--log-file", "/nonexistent/dir/x.log"], "cannot open --log-file"),
                       (["--allow-group", "no-such-group-here"], "no group named")):
        done = cli(env, "--serve", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert text in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.process
def test_serve_refuses_attach_in_one_line_and_serves_nothing() -> None:
    """--attach names a running engine; --serve served on the default socket regardless."""
    root = new_root()
    env = make_env(root)
    done = cli(env, "--serve", "--attach", str(root / "x.sock"), timeout=20)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"vramtui --serve: --attach names a running engine's socket, and --serve serves its "
        f"own ({root / 'run' / 'control.sock'}): leave --attach out (set VRAMTUI_RUNTIME_DIR "
        "to serve in another directory)"]
    assert not (root / "x.sock").exists() and not (root / "run" / "control.sock").exists()


@pytest.mark.process
def test_serve_takes_attach_naming_its_own_socket(serve: StartServe) -> None:
    """--attach that names the socket --serve serves says nothing more: it serves there."""
    root = new_root()
    s = serve("--attach", str(root / "run" / "control.sock"), root=root)
    banner = wait_until(lambda: s.stdout().strip(), 10, "the banner")
    assert str(s.socket) in banner and s.socket == root / "run" / "control.sock"


@pytest.mark.process
def test_serve_says_the_tuis_options_do_nothing(serve: StartServe) -> None:
    s = serve("--theme", "nord", "--no-confirm")
    wait_until(lambda: s.stdout().strip(), 10, "the banner")
    assert ("vramtui: warning: --theme, --no-confirm ignored: such options are the TUI's, and "
            "--serve runs none") in s.stderr().splitlines()


@pytest.mark.process
def test_serve_and_the_tui_give_the_same_exit_code_for_a_bad_runtime_dir() -> None:
    root = new_root()
    env = make_env(root)
    blocker = root / "not-a-dir"
    blocker.write_text("")
    env["VRAMTUI_RUNTIME_DIR"] = str(blocker / "run")
    served = cli(env, "--serve")
    tui = cli({**env, "TEXTUAL_DRIVER": WEB_DRIVER}, "--gpus", "sim:8GiB")
    assert served.returncode == tui.returncode == 2, (served.stderr, tui.stderr)
    for done in (served, tui):
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert "terminal" not in done.stderr and "not-a-dir" in done.stderr, done.stderr


@pytest.mark.process
@pytest.mark.parametrize("stdin_tty", [False, True])
def test_the_tui_without_a_terminal_says_so_in_one_line_and_exits_2(stdin_tty: bool) -> None:
    # CI, a pipeline, `vramtui < /dev/null > out.txt`: no full screen waiting forever for keys
    import pty

    root = new_root()
    env = {k: v for k, v in make_env(root).items() if k != "TEXTUAL_DRIVER"}
    keys, tty = pty.openpty() if stdin_tty else (None, None)
    proc = subprocess.Popen([PYTHON, "-m", "vramtui"], env=env, start_new_session=True,
                            stdin=tty if tty is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError("the TUI ran with no terminal and did not exit") from None
    finally:
        for fd in (keys, tty):
            if fd is not None:
                os.close(fd)
    assert proc.returncode == 2 and out == b"", (proc.returncode, out, err)
    [line] = err.decode().splitlines()
    assert line.startswith("vramtui: error: the TUI needs a terminal"), line
    for command in ("`vramtui --serve`", "`vramtui status`", "`vramtui web`"):
        assert command in line, line
    assert not Paths.from_env(env).control_socket.exists()  # no engine was started


@pytest.mark.process
def test_a_client_outlives_an_engine_restart(serve: StartServe) -> None:
    s = serve()
    c = s.client()
    assert c.submit_wait("echo", b"before").state is JobState.SUCCEEDED
    s.proc.send_signal(signal.SIGTERM)
    assert s.wait_exit(60) == 0
    with pytest.raises(EngineNotRunning):
        c.submit("echo", b"while down")
    serve(root=s.root)
    assert c.submit_wait("echo", b"after").data == b"after"  # a fresh connection, no error


@pytest.mark.process
def test_the_limits_come_from_the_environment_and_a_bad_one_is_one_line() -> None:
    root = new_root()
    env = make_env(root)
    env.update(VRAMTUI_MAX_QUEUE="2", VRAMTUI_MAX_REQUEST="1MiB")
    served = start_serve(env, root)
    try:
        c = served.client()
        assert c.info["max_request"] == 1024 * 1024
        with pytest.raises(RequestTooLarge):
            c.submit("echo", b"x" * (2 * 1024 * 1024))
        first = c.submit("slow", b'{"steps": 200, "step_s": 0.02}')
        wait_until(lambda: c.job(first).state is not JobState.QUEUED, 30, "the first admitted")
        jobs = [first] + [c.submit("slow", b"") for _ in range(2)]
        with pytest.raises(QueueFull):  # one runs, two wait: the third waiter is refused
            c.submit("slow", b"")
        for j in jobs:
            c.cancel(j)
        c.close()
    finally:
        reap(served)
    bad = make_env(new_root())
    bad["VRAMTUI_MAX_QUEUE"] = "lots"
    for args in (["--serve"], ["--gpus", "sim:8GiB"]):
        done = cli(bad if "--serve" in args else {**bad, "TEXTUAL_DRIVER": WEB_DRIVER}, *args)
        assert done.returncode == 2 and "VRAMTUI_MAX_QUEUE" in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.process
def test_sighup_reloads_the_descriptors_without_a_restart() -> None:
    import yaml

    root = new_root()
    env = make_env(root)
    served = start_serve(env, root)
    try:
        desc = Path(env["VRAMTUI_TEST_BACKENDS"])
        doc = yaml.safe_load(desc.read_text())
        doc["backends"].append(dict(doc["backends"][0], name="echo2"))
        desc.write_text(yaml.safe_dump(doc))
        c = served.client()
        pid = c.snapshot().pid
        served.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: c.snapshot().backend("echo2") is not None, 20, "echo2 loaded")
        assert c.snapshot().pid == pid  # the same engine, not a restart
        assert c.submit_wait("echo2", b"hup").data == b"hup"
        assert any("descriptors reloaded: 1 added (echo2)" in line.text
                   for line in c.snapshot().log)
        c.close()
    finally:
        reap(served)
