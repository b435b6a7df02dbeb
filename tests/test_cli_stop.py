"""``vramtui stop`` and a second SIGTERM, against a real ``vramtui --serve``: the stop says
which running jobs it waits for, the command exits once the engine is gone, and a second
signal stops at once, the running job journaled to run again (marked interrupted)."""

from __future__ import annotations

import json
import signal

import pytest
from engine_support import sim_backend
from serve_support import cli, echo_backend, make_env, new_root, reap, start_serve
from waiting import wait_until

pytestmark = pytest.mark.process


def test_stop_waits_for_the_running_job_says_so_and_exits_when_the_engine_is_gone() -> None:
    root = new_root()
    # 3 s of work: still running when a CLI started on a loaded box asks for the stop
    slow = sim_backend("slow", 512, 256, steps=60, step_s=0.05,
                       timeouts={"stop_grace": "10s", "start": "20s"})
    env = make_env(root, [echo_backend(), slow])
    served = start_serve(env, root)
    try:
        job = cli(env, "submit", "slow", "--data", "{}").stdout.strip()
        wait_until(lambda: json.loads(cli(env, "result", job, "--json").stdout)["state"]
                   == "running", 30, "the job to run")
        done = cli(env, "stop")
        assert done.returncode == 0, done.stderr
        first, last = done.stdout.strip().splitlines()
        assert first.startswith(f"stopping the engine (pid {served.proc.pid}): waiting for 1 "
                                f"running job(s) to finish ({job})")
        assert last == "the engine stopped"
        assert served.proc.wait(5) == 0
        assert f"stopping: waiting up to 10.0 s for 1 running job(s) to finish: {job} (slow)" \
            in served.stderr()
        assert cli(env, "stop").returncode == 3  # no engine any more
    finally:
        reap(served)


def test_a_second_sigterm_stops_at_once_and_the_job_runs_again_after_a_restart() -> None:
    root = new_root()
    long = sim_backend("slow", 512, 256, steps=400, step_s=0.05,
                       timeouts={"stop_grace": "60s", "start": "20s"})
    env = make_env(root, [echo_backend(), long])
    served = start_serve(env, root)
    try:
        job = cli(env, "submit", "slow", "--data", "{}").stdout.strip()
        wait_until(lambda: json.loads(cli(env, "result", job, "--json").stdout)["state"]
                   == "running", 30, "the job to run")
        served.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping: waiting up to 60.0 s" in served.stderr(), 10,
                   "the stop to say what it waits for")
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(15) == 0  # not the 60 s of its stop grace
        assert "stopping now (running jobs are interrupted)" in served.stderr()
    except BaseException:
        reap(served)  # (it also removes the root, which the restart below reuses)
        raise
    again = start_serve(env, root)
    try:
        view = json.loads(cli(env, "result", job, "--json").stdout)
        assert view["state"] in ("queued", "starting", "running")
        assert "interrupted" in json.dumps(view["history"]), view
        assert cli(env, "stop", "--now").returncode == 0
        assert again.proc.wait(15) == 0
    finally:
        reap(again)


def test_a_second_sigterm_cuts_short_a_stop_already_waiting_for_a_worker_to_exit() -> None:
    # Its job is done: the stop goes straight to the server, which ignores SIGTERM and would
    # get its whole stop grace (60 s) before the SIGKILL. The second signal stops at once.
    from test_model_servers import chat, server_backend

    root = new_root()
    deaf = server_backend("deaf", mode="deaf", timeouts={"stop_grace": "60s", "start": "20s"})
    env = make_env(root, [deaf])
    served = start_serve(env, root)
    try:
        job = cli(env, "submit", "deaf", "--data", json.dumps(chat("deaf"))).stdout.strip()
        wait_until(lambda: json.loads(cli(env, "result", job, "--json").stdout)["state"]
                   == "succeeded", 30, "the job to succeed")
        served.note_workers(served.client())
        served.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping: no job is running" in served.stderr(), 10,
                   "the stop to begin")
        served.proc.send_signal(signal.SIGTERM)
        assert served.proc.wait(15) == 0  # not the 60 s of its stop grace
        assert "stopping now (running jobs are interrupted)" in served.stderr()
    finally:
        reap(served)
