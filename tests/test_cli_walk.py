"""What a newcomer meets on the command line, through a real ``vramtui --serve`` (two
simulated GPUs, a broken descriptor in ``backends.d``): each answer says what is true and
exits with the code the README lists."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
from collections.abc import Iterator

import pytest
from serve_support import Served, cli, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
@spawns
def served() -> Iterator[Served]:
    root = new_root()
    env = make_env(root)
    broken = root / "cfg" / "backends.d"
    broken.mkdir(parents=True)
    (broken / "broken.yaml").write_text("name: mine\nvram: 2GiB\n")  # nothing to run
    s = start_serve(env, root, "--gpus", "sim:8GiB,sim:8GiB")
    yield s
    reap(s)


def run(s: Served, *args: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    if cwd is None:
        done = cli(s.env, *args)
    else:
        here = os.getcwd()
        os.chdir(cwd)
        try:
            done = cli(s.env, *args)
        finally:
            os.chdir(here)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_doctor_lists_a_descriptor_error_once_and_sources_are_absolute(served: Served) -> None:
    # From another directory than the engine's: the paths it prints differ from ours.
    done = run(served, "doctor", "--json", cwd=str(served.root / "cfg"))
    checks = json.loads(done.stdout)["checks"]
    about = [c for c in checks if "broken.yaml" in c["detail"]]
    assert len(about) == 1, about
    backends = json.loads(run(served, "backends", "--json").stdout)
    for b in backends:
        assert os.path.isabs(b["source"]), b["source"]


def test_cancel_twice_evict_cold_and_an_unknown_gpu_say_so(served: Served) -> None:
    job = run(served, "submit", "echo", "--data", "{}").stdout.strip()
    wait_until(lambda: json.loads(run(served, "result", job, "--json").stdout)["state"]
               == "succeeded", 30, "the echo job to end")
    done = run(served, "cancel", job)
    assert done.returncode == 7 and "had already succeeded: nothing to cancel" in done.stdout
    queued = run(served, "submit", "huge", "--data", "{}")
    assert queued.returncode == 5  # too large for every GPU: refused, never queued
    slow = run(served, "submit", "slow", "--data", '{"steps": 400, "step_s": 0.02}')
    slow_id = slow.stdout.strip()
    assert run(served, "cancel", slow_id).returncode == 0
    again = run(served, "cancel", slow_id)
    assert again.returncode == 7, again
    assert f"job {slow_id} had already cancelled" in again.stdout
    evict = run(served, "evict", "huge")
    assert evict.returncode == 7 and evict.stdout.strip() == "huge is not loaded: nothing to evict"
    drain = run(served, "drain", "7")
    assert drain.returncode == 4
    assert drain.stderr.strip() == ("vramtui: error: unknown GPU 7: there is no GPU7 "
                                    "(present: GPU0, GPU1)")


def test_events_json_names_the_job_and_stream_json_is_one_line_a_chunk(served: Served) -> None:
    events = subprocess.Popen([*cli_argv(), "events", "--json", "--kind", "job"],
                              env=served.env, stdout=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    assert events.stdout is not None
    reader = threading.Thread(target=lambda: [lines.put(x) for x in events.stdout], daemon=True)
    reader.start()
    try:
        def a_job_event() -> dict | None:  # (submitting until the subscription is there)
            if lines.empty():
                run(served, "submit", "echo", "--data", "{}")
                return None
            return json.loads(lines.get())
        first = wait_until(a_job_event, 30, "a job event")
        assert first["kind"] == "job" and first["job_id"] == first["job"]["id"]
    finally:
        events.terminate()
        events.wait(10)
    done = run(served, "submit", "echo", "--data", '{"stream": 3}', "--stream", "--json")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line.get("chunk") for line in lines[:3]] == [0, 1, 2]
    assert lines[0]["data"] == "chunk 0\n" and lines[-1]["state"] == "succeeded"
    assert len(lines) == 4


def test_echo_is_simulated_in_backends_json_on_a_simulated_gpu(served: Served) -> None:
    backends = json.loads(run(served, "backends", "--json").stdout)
    assert next(b for b in backends if b["name"] == "echo")["simulated"] is True


def test_job_ids_complete_for_the_job_commands(served: Served) -> None:
    job = run(served, "submit", "echo", "--data", "{}", "--wait", "--json")
    job_id = json.loads(job.stdout)["id"]
    listed = run(served, "completion", "--list-jobs").stdout.split()
    assert job_id in listed
    script = run(served, "completion", "bash").stdout
    jobs_fn = next(line.split("()")[0] for line in script.splitlines()
                   if line.endswith("() {") and "--list-jobs" in
                   script.split(line, 1)[1].split("}", 1)[0])
    for command in ("cancel", "result", "retry", "priority"):
        assert f"_shtab_vramtui_{command}_pos_0_COMPGEN={jobs_fn}" in script, command


def cli_argv() -> list[str]:
    from serve_support import PYTHON

    return [PYTHON, "-m", "vramtui"]
