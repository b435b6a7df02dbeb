"""The front door from the command line: --serve --http, curl -N, completion, install-service.

Plus the pure parts around it: the engine's counters and the kernel socket table reader.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from serve_support import PYTHON, Served, cli, echo_backend, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

from supervisor.counters import Counters, Histogram
from supervisor.http.peer import loopback_uid
from supervisor.jobs import Job, JobState
from vramtui.http_serve import front_door_url

pytestmark = pytest.mark.timeout(120)


def _http_url(served: Served) -> str:
    return wait_until(lambda: front_door_url(served.stdout()), 30, "the HTTP line")


@pytest.fixture(scope="module")
@spawns
def served() -> Iterator[Served]:
    root = new_root()
    env = make_env(root, [echo_backend()])
    s = start_serve(env, root, "--http", "127.0.0.1:0")
    try:
        yield s
    finally:
        reap(s)


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_curl_streams_a_job_as_server_sent_events(served: Served) -> None:
    url = _http_url(served)
    done = subprocess.run(
        ["curl", "-sS", "-N", "-H", "Accept: text/event-stream", "-H",
         "Content-Type: application/json", "-d",
         json.dumps({"backend": "echo", "input": {"stream": 3}}), f"{url}/v1/jobs"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    events = [b for b in done.stdout.split("\n\n") if "event:" in b]
    names = [next(line[7:] for line in e.splitlines() if line.startswith("event: "))
             for e in events]
    assert names[0] == "state" and names[-1] == "state" and names.count("chunk") == 3
    assert '"state":"succeeded"' in events[-1]
    got = subprocess.run(["curl", "-sS", f"{url}/v1/backends/echo"], capture_output=True,
                         text=True, timeout=30)
    assert json.loads(got.stdout)["name"] == "echo"


def test_a_port_in_use_fails_the_start_with_one_line(served: Served) -> None:
    port = int(_http_url(served).rsplit(":", 1)[1])
    root = new_root()
    env = make_env(root, [echo_backend()])
    try:
        done = subprocess.run([PYTHON, "-m", "vramtui", "--serve", "--gpus", "sim:1GiB",
                               "--backends", env["VRAMTUI_TEST_BACKENDS"],
                               "--http", f"127.0.0.1:{port}"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0
        assert f"cannot listen on http://127.0.0.1:{port}" in done.stderr
        assert "Traceback" not in done.stderr
        bad = cli(env, "--serve", "--http", "0.0.0.0:8080")
        assert bad.returncode == 2 and "set a token" in bad.stderr
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_completion_scripts_come_from_the_parser(served: Served) -> None:
    for shell in ("bash", "zsh", "fish"):
        done = cli(served.env, "completion", shell)
        assert done.returncode == 0, done.stderr
        for word in ("submit", "install-service", "--http", "completion --list-backends"):
            assert word in done.stdout, (shell, word)
    names = cli(served.env, "completion", "--list-backends")
    assert names.stdout.split() == ["echo"]
    assert cli(served.env, "completion").returncode == 2


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_backend_names(served: Served, tmp_path: Path) -> None:
    script = cli(served.env, "completion", "bash").stdout
    (tmp_path / "c.sh").write_text(script)
    probe = (f"source {tmp_path / 'c.sh'}; COMP_WORDS=(vramtui evict ''); COMP_CWORD=2; "
             "COMP_LINE='vramtui evict '; COMP_POINT=${#COMP_LINE}; _shtab_vramtui; "
             "printf '%s\\n' \"${COMPREPLY[@]}\"")
    env = dict(served.env, PATH=f"{Path(PYTHON).parent}:{os.environ['PATH']}")
    wrapper = tmp_path / "vramtui"
    wrapper.write_text(f"#!/bin/sh\nexec {PYTHON} -m vramtui \"$@\"\n")
    wrapper.chmod(0o755)
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    done = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True,
                          timeout=60)
    assert "echo" in done.stdout.split(), done.stderr


@pytest.mark.process
def test_install_service_writes_a_user_unit(tmp_path: Path) -> None:
    root = new_root()
    env = make_env(root, [echo_backend()])
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    try:
        done = cli(env, "install-service", "--http", "127.0.0.1:8080", "--gpus", "sim:8GiB")
        assert done.returncode == 0, done.stderr
        unit = (tmp_path / "systemd" / "user" / "vramtui.service").read_text()
        assert "KillMode=mixed" in unit and "Restart=on-failure" in unit
        assert "TimeoutStopSec=" in unit and "WantedBy=default.target" in unit
        assert "--serve --gpus sim:8GiB --http 127.0.0.1:8080" in unit
        assert "loginctl enable-linger" in done.stdout
        again = cli(env, "install-service", "--http", "127.0.0.1:9090")
        assert again.returncode == 5 and "--force" in again.stderr
        printed = cli(env, "install-service", "--print")
        assert printed.stdout.startswith("# Written by `vramtui install-service`")
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- the pure parts -----------------------------------------------------------------------

def test_counters_count_what_happened() -> None:
    c = Counters()
    handle = SimpleNamespace(backend="b", name="b#1", started_at=10.0, ready_at=12.5)
    c.loaded("b", 2.5)
    c.loaded("b", 1.0)
    assert c.loads["b"] == 2 and c.load_seconds["b"].n == 2
    c.worker_exited(handle, expected=False, never_ready=False)
    c.worker_exited(handle, expected=False, never_ready=True)
    c.worker_exited(handle, expected=True, never_ready=False)
    assert c.crashes["b"] == 1 and c.load_failures["b"] == 1
    c.evicted("b", "room")
    c.evicted("b", "made up")
    assert c.evictions[("b", "room")] == 1 and c.evictions[("b", "asked")] == 1
    c.refused_because("queue full: 3 jobs waiting")
    c.refused_because("b needs 9 MiB at peak")
    c.refused("nonsense")
    assert dict(c.refusals) == {"queue_full": 1, "too_large": 1, "other": 1}
    job = Job(backend="b", payload=b"", submitted_at=1.0)
    job.started_at, job.finished_at, job.state = 3.0, 7.0, JobState.SUCCEEDED
    c.job_finished(job)
    never = Job(backend="b", payload=b"", submitted_at=1.0)
    never.state = JobState.CANCELLED
    c.job_finished(never)
    cal = Job(backend="b", payload=b"", kind="calibration")
    cal.state = JobState.FAILED
    c.job_finished(cal)
    assert dict(c.jobs) == {("b", "succeeded"): 1, ("b", "cancelled"): 1}
    assert c.queue_wait["b"].total == 2.0 and c.duration["b"].total == 4.0


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram((1.0, 5.0))
    for v in (0.5, 1.0, 3.0, 9.0):
        h.observe(v)
    assert h.cumulative() == [("1.0", 2), ("5.0", 3), ("+Inf", 4)]
    assert h.n == 4 and h.total == 13.5


def test_loopback_uid_reads_the_kernels_socket_table(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
        "   0: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1234 "
        "0 1 1\n"
        # closed by the client: a TIME_WAIT row (06) reads uid 0 and inode 0; no one's
        "   1: 0100007F:9C42 0100007F:1F90 06 00000000:00000000 03:00000000 00000000     0 "
        "0 0 3\n"
        # established but orphaned (no inode): no one's either
        "   2: 0100007F:9C43 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0 "
        "0 0 1\n")
    assert loopback_uid(("127.0.0.1", 40000), ("127.0.0.1", 8080), (str(table),)) == 1234
    assert loopback_uid(("127.0.0.1", 40001), ("127.0.0.1", 8080), (str(table),)) is None
    assert loopback_uid(("127.0.0.1", 40002), ("127.0.0.1", 8080), (str(table),)) is None
    assert loopback_uid(("127.0.0.1", 40003), ("127.0.0.1", 8080), (str(table),)) is None
    with socket.socket() as server:  # and the real table, for a real connection
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            peer, _ = server.accept()
            with peer:
                assert loopback_uid(client.getsockname(), server.getsockname()) == os.geteuid()


@pytest.mark.process
def test_sigterm_ends_open_streams_and_the_engine_exits_0() -> None:
    import http.client
    import signal

    root = new_root()
    env = make_env(root, [echo_backend()])
    s = start_serve(env, root, "--http", "127.0.0.1:0")
    try:
        port = int(_http_url(s).rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/v1/events", headers={"Accept": "text/event-stream"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline() == b"retry: 3000\n"
        s.proc.send_signal(signal.SIGTERM)
        while resp.readline():  # the stream ends (it does not hold the stop)
            pass
        assert s.wait_exit(30) == 0
        conn.close()
    finally:
        reap(s)
