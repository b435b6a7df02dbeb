"""Every CLI screen that shows a memory figure says when it is SIMULATED, and only then.

``status`` and ``gpus`` name the devices; ``jobs``, ``queue`` (its notes), ``backends`` and
``events`` show figures without them, so they carry a line of their own (and their JSON a
``simulated`` field).  One
engine on the simulated GPU, one on the host's memory (real figures, not simulated).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from typing import IO

import pytest
from serve_support import PYTHON, Served, cli, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

NOTE = "memory figures are SIMULATED"


@pytest.fixture(scope="module")
@spawns
def sim() -> Iterator[Served]:
    root = new_root()
    s = start_serve(make_env(root), root)  # --gpus sim:8GiB
    yield s
    reap(s)


@pytest.fixture(scope="module")
@spawns
def host() -> Iterator[Served]:
    root = new_root()
    s = start_serve(make_env(root), root, "--gpus", "host:2GiB")
    yield s
    reap(s)


def run(s: Served, *args: str) -> subprocess.CompletedProcess[str]:
    done = cli(s.env, *args)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done


def one_job(s: Served) -> None:
    run(s, "submit", "echo", "--data", "{}", "--wait")


def read_line(stream: IO[str], what: str) -> str:
    """The next line of a follow's output (a blocked read fails the test at its deadline)."""
    import threading

    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    wait_until(lambda: got, 30, what)
    return got[0]


def follow(s: Served, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PYTHON, "-m", "vramtui", *args], env=s.env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(20) == 0


def first_line(s: Served, *args: str) -> str:
    """The first line a following command (``events``) prints; it is then stopped."""
    proc = follow(s, *args)
    try:
        assert proc.stdout is not None
        return read_line(proc.stdout, f"the first line of {' '.join(args)}")
    finally:
        stop(proc)


def test_jobs_and_backends_say_their_figures_are_simulated(sim: Served) -> None:
    one_job(sim)
    for command in ("jobs", "backends"):
        first = run(sim, command).stdout.splitlines()[0]
        assert first.startswith(NOTE), (command, first)
    assert json.loads(run(sim, "jobs", "--json").stdout)["simulated"] is True
    assert all(b["simulated"] for b in json.loads(run(sim, "backends", "--json").stdout))


def test_jobs_watch_says_it_on_every_refresh(sim: Served) -> None:
    one_job(sim)
    proc = follow(sim, "jobs", "--watch", "-n", "0.2", "--json")
    try:
        assert proc.stdout is not None
        for _ in range(2):  # one compact document per refresh, each saying it
            assert json.loads(read_line(proc.stdout, "a refresh"))["simulated"] is True
    finally:
        stop(proc)
    proc = follow(sim, "jobs", "--watch", "-n", "0.2")
    try:
        assert proc.stdout is not None
        lines = [read_line(proc.stdout, "a refresh's line") for _ in range(8)]
        assert sum(line.startswith(NOTE) for line in lines) >= 2, lines
    finally:
        stop(proc)


def test_queue_says_it_above_waiting_notes_with_figures(sim: Served) -> None:
    run(sim, "yield", "0")  # nothing of ours runs there: the job waits
    try:
        job = run(sim, "submit", "slow", "--data", "{}").stdout.strip()
        try:
            out = run(sim, "queue").stdout
            assert out.startswith(NOTE) and job in out, out
            shown = json.loads(run(sim, "queue", "--json").stdout)
            assert [(j["id"], j["simulated"]) for j in shown] == [(job, True)]
        finally:
            run(sim, "cancel", job)
    finally:
        run(sim, "resume", "0")


def test_events_say_it_first_and_in_each_document(sim: Served) -> None:
    assert first_line(sim, "events").startswith(NOTE)
    assert json.loads(first_line(sim, "events", "--json", "--kind", "sample"))["simulated"] is True


def test_real_figures_carry_no_label(host: Served) -> None:
    one_job(host)
    for command in ("jobs", "backends"):
        out = run(host, command).stdout
        assert "SIMULATED" not in out and "echo" in out, (command, out)
    assert json.loads(run(host, "jobs", "--json").stdout)["simulated"] is False
    sample = first_line(host, "events", "--json", "--kind", "sample")
    assert json.loads(sample)["simulated"] is False
    line = first_line(host, "events", "--kind", "sample")
    assert "SIMULATED" not in line and " sample" in line, line
