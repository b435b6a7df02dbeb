"""A job across an engine restart, as a user sees it: real ``vramtui --serve`` processes,
real workers, the real journal (SQLite); the job is read through the CLI before and after
(its history entries are ``[t, state, note]``).

The engine has one owner of time (:class:`supervisor.clock.WallClock`): what a view shows and
what the journal keeps are the same instants, so a job read back from the journal after a
restart shows the times it showed before, to the last digit.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_support import ROOT, sim_backend
from serve_support import Served, cli, echo_backend, make_env, new_root, reap, start_serve
from waiting import wait_until

from vramtui.http_serve import front_door_url

pytestmark = pytest.mark.process
SERVER = ROOT / "tests" / "model_server.py"


@pytest.fixture
def root() -> Iterator[Path]:
    yield new_root()


@pytest.fixture
def engines() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for served in reversed(started):
        reap(served)


def _job(env: dict[str, str], job_id: str) -> dict[str, Any]:
    done = cli(env, "result", job_id, "--json")
    assert done.returncode in (0, 6), done.stderr
    return json.loads(done.stdout)


def _times(job: dict[str, Any]) -> tuple[Any, ...]:
    return (job["submitted_at"], job["started_at"], job["finished_at"],
            tuple((h[0], h[1]) for h in job["history"]))


def test_a_finished_job_shows_the_same_times_after_a_restart(
        root: Path, engines: list[Served]) -> None:
    env = make_env(root)
    env["TZ"] = "Asia/Kolkata"  # epoch seconds whatever the zone
    before = time.time()
    first = start_serve(env, root)
    engines.append(first)
    done = cli(env, "submit", "echo", "--data", '{"a": 1}', "--wait")
    assert done.returncode == 0, done.stderr
    job_id = next(j["id"] for j in json.loads(cli(env, "jobs", "--json").stdout)["recent"])
    seen = _job(env, job_id)
    assert seen["state"] == "succeeded"
    assert before <= seen["submitted_at"] <= seen["started_at"] <= seen["finished_at"] \
        <= time.time()
    first.proc.kill()  # kill -9: the journal is all that is left
    first.proc.wait(10)

    env["TZ"] = "America/St_Johns"
    engines.append(start_serve(env, root))
    again = _job(env, job_id)
    assert again["state"] == "succeeded"
    assert _times(again) == _times(seen)


def test_an_interrupted_job_keeps_its_first_times_after_a_restart(
        root: Path, engines: list[Served]) -> None:
    env = make_env(root)
    first = start_serve(env, root)
    engines.append(first)
    job_id = cli(env, "submit", "slow", "--data", '{"steps": 400, "step_s": 0.05}').stdout.strip()
    running = wait_until(lambda: (j := _job(env, job_id))["state"] == "running" and j, 30,
                         "the job to run")
    first.note_workers(c := first.client())
    c.close()
    first.proc.kill()
    first.proc.wait(10)

    engines.append(start_serve(env, root))
    again = _job(env, job_id)
    # what the journal kept of its first run is what was shown of it
    assert again["submitted_at"] == running["submitted_at"]
    assert again["started_at"] == running["started_at"]
    shown = [(h[0], h[1]) for h in running["history"]]
    assert [(h[0], h[1]) for h in again["history"][:len(shown)]] == shown
    interrupted = again["history"][len(shown)]
    assert interrupted[1] == "interrupted"
    assert shown[-1][0] < interrupted[0] <= time.time()
    cli(env, "cancel", job_id)


def _http_url(served: Served) -> str:
    return wait_until(lambda: front_door_url(served.stdout()), 30, "the HTTP line")


def test_jobs_that_finished_before_a_restart_are_still_listed_at_every_door(
        root: Path, engines: list[Served]) -> None:
    env = make_env(root)
    first = start_serve(env, root)
    engines.append(first)
    ids = [cli(env, "submit", "echo", "--data", json.dumps({"n": i})).stdout.strip()
           for i in range(3)]
    for job_id in ids:
        assert cli(env, "result", job_id, "--wait").returncode == 0
    seen = {j["id"]: j for j in json.loads(cli(env, "jobs", "--json").stdout)["recent"]}
    assert set(ids) <= set(seen)
    first.proc.kill()
    first.proc.wait(10)

    again = start_serve(env, root, "--http", "127.0.0.1:0")
    engines.append(again)
    listed = json.loads(cli(env, "jobs", "--json").stdout)["recent"]
    assert [j["id"] for j in listed] == ids[::-1]  # newest first, as before
    for j in listed:
        assert _times(j) == _times(seen[j["id"]])
        assert j["state"] == "succeeded"
    only = json.loads(cli(env, "jobs", "--state", "succeeded", "--json").stdout)["recent"]
    assert [j["id"] for j in only] == ids[::-1]
    status = json.loads(cli(env, "status", "--json", "--history").stdout)
    assert [j["id"] for j in status["recent"]] == ids[::-1]
    with urllib.request.urlopen(f"{_http_url(again)}/v1/jobs?state=succeeded") as answer:
        http = json.load(answer)["data"]
    assert [j["id"] for j in http] == ids[::-1]
    assert [j["finished_at"] for j in http] == [seen[i]["finished_at"] for i in ids[::-1]]


def test_a_new_priority_for_a_job_the_journal_does_not_keep_is_no_journal_error(
        root: Path, engines: list[Served]) -> None:
    # A model server's request is not journaled (its client goes with the engine): giving it
    # a new priority while it waits must not try to journal that, nor say the journal failed.
    server = {"name": "srv", "command": [sys.executable, str(SERVER), "--port", "${PORT}",
                                         "--mib", "4096"],
              "http": {"health": "/health"}, "api": ["chat"], "simulated": True,
              "vram": {"weights": "4096MiB", "activation": "0MiB"},
              "timeouts": {"start": "20s", "stop_grace": "3s"}}
    hog = sim_backend("hog", 6 * 1024, 256, steps=2000, step_s=0.05)
    env = make_env(root, [server, hog])
    served = start_serve(env, root, "--http", "127.0.0.1:0")
    engines.append(served)
    submitted = cli(env, "submit", "hog")
    assert submitted.returncode == 0, submitted.stderr
    hogging = submitted.stdout.strip()
    wait_until(lambda: _job(env, hogging)["state"] == "running", 30, "the hog to run")
    url = _http_url(served)
    body = json.dumps({"model": "srv", "messages": [{"role": "user", "content": "hi"}]})
    chat = threading.Thread(target=lambda: _post(f"{url}/v1/chat/completions", body),
                            daemon=True)
    chat.start()
    queued = wait_until(lambda: json.loads(cli(env, "queue", "--json").stdout), 30,
                        "the chat request to wait")
    done = cli(env, "priority", queued[0]["id"], "5")
    assert done.returncode == 0, done.stderr
    assert "journal" not in served.stderr(), served.stderr()
    status = json.loads(cli(env, "status", "--json", "--history").stdout)
    assert not [line for line in status["log"] if "journal" in json.dumps(line)]
    cli(env, "cancel", hogging, queued[0]["id"])


def _post(url: str, body: str) -> None:
    with contextlib.suppress(OSError):
        urllib.request.urlopen(urllib.request.Request(url, body.encode(), method="POST"),
                               timeout=60).read()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url) as answer:
            return answer.status, json.load(answer)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.load(exc)


def test_a_backend_a_reload_removed_lists_its_jobs_and_an_unknown_one_is_refused_alike(
        root: Path, engines: list[Served]) -> None:
    # `vramtui jobs --backend nope` said "no jobs like that" (exit 0) where GET /v1/jobs
    # answered 404; and HTTP refused a backend a reload removed, whose jobs are still held.
    env = make_env(root, [echo_backend(), echo_backend("gone")])
    served = start_serve(env, root, "--http", "127.0.0.1:0")
    engines.append(served)
    url = _http_url(served)
    job_id = cli(env, "submit", "gone").stdout.strip()
    assert cli(env, "result", job_id, "--wait").returncode == 0
    (root / "backends.yaml").write_text(yaml.safe_dump({"backends": [echo_backend()]}))
    done = cli(env, "evict", "gone")  # a backend with a worker stays until it has none
    assert done.returncode == 0, done.stderr

    def removed() -> bool:
        assert cli(env, "reload").returncode == 0
        return "gone" not in {b["name"] for b in json.loads(cli(env, "backends", "--json")
                                                            .stdout)}

    wait_until(removed, 30, "the reload to remove gone (once its worker has stopped)")

    def listed_at_both() -> None:
        by_cli = cli(env, "jobs", "--backend", "gone", "--json")
        assert by_cli.returncode == 0, by_cli.stderr
        assert [j["id"] for j in json.loads(by_cli.stdout)["recent"]] == [job_id]
        status, http = _get(f"{url}/v1/jobs?backend=gone")
        assert status == 200, http
        assert [j["id"] for j in http["data"]] == [job_id]

    listed_at_both()
    served.proc.kill()  # and after a restart, the job back from the journal
    served.proc.wait(10)
    served = start_serve(env, root, "--http", "127.0.0.1:0")
    engines.append(served)
    url = _http_url(served)
    listed_at_both()

    status, http = _get(f"{url}/v1/jobs?backend=nope")
    assert status == 404 and http["error"]["code"] == "unknown_backend", http
    by_cli = cli(env, "jobs", "--backend", "nope")
    assert by_cli.returncode == 4, (by_cli.stdout, by_cli.stderr)
    assert http["error"]["message"] in by_cli.stderr, by_cli.stderr


def test_a_finished_job_keeps_its_gpu_and_peak_after_a_restart(
        root: Path, engines: list[Served]) -> None:
    # The journal kept no gpu nor peak: after a restart both came back null.
    env = make_env(root)
    first = start_serve(env, root)
    engines.append(first)
    job_id = cli(env, "submit", "slow", "--data", '{"steps": 4, "step_s": 0.05}').stdout.strip()
    assert cli(env, "result", job_id, "--wait").returncode == 0
    seen = _job(env, job_id)
    assert seen["gpu"] is not None and seen["peak_mib"], seen
    first.proc.kill()
    first.proc.wait(10)

    engines.append(start_serve(env, root))
    again = _job(env, job_id)
    assert (again["gpu"], again["peak_mib"]) == (seen["gpu"], seen["peak_mib"])
    listed = json.loads(cli(env, "jobs", "--json").stdout)["recent"]
    assert [(j["gpu"], j["peak_mib"]) for j in listed if j["id"] == job_id] == \
        [(seen["gpu"], seen["peak_mib"])]
