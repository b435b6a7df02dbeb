"""The door layer (supervisor/doors): one job seen alike through every door.

One engine for the module with its HTTP door and its control socket (simulated 8 GiB GPU,
real worker processes).  The same job is read through ``GET /v1/jobs``, ``vramtui jobs
--json`` (a real CLI process) and the control socket (:class:`supervisor.client.Client`), and
must come out with the same fields and values; its times are epoch seconds (the HTTP door once
added the monotonic-to-wall offset twice: the year 2083).  Waiting is checked at each door
for what :mod:`supervisor.doors.watch` promises: the final view, JobTimeout past a deadline
while the job goes on, EngineStopped when the engine stops first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from engine_support import sim_backend
from http_support import Front, serve_http
from serve_support import cli, echo_backend

from supervisor.client import Client
from supervisor.doors import codec
from supervisor.jobs import JobState

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def front() -> Iterator[Front]:
    backends = [echo_backend(), sim_backend("slow", 512, 128, steps=40, step_s=0.05)]
    with serve_http(backends, control=True) as f:
        yield f


@pytest.fixture
def client(front: Front) -> Iterator[Client]:
    c = Client(front.sup.paths.control_socket)
    yield c
    c.close()


def _near_now(t: float | None) -> None:
    assert t is not None and abs(t - time.time()) < 60, f"{t} is not within a minute of now"


def test_one_job_has_the_same_fields_and_values_at_every_door(front: Front,
                                                              client: Client) -> None:
    metadata: dict[str, Any] = {"who": "doors", "raw": b"\xff\x00", "list": [1, "two"]}
    job_id = client.submit("echo", b'{"a": 1}', metadata=metadata, priority=2)
    assert client.wait(job_id, 30).state is JobState.SUCCEEDED

    listed = front.get("/v1/jobs?limit=1000").json()["data"]
    http = next(j for j in listed if j["id"] == job_id)
    done = cli(front.env, "jobs", "--json")
    assert done.returncode == 0, done.stderr
    by_cli = next(j for j in json.loads(done.stdout)["recent"] if j["id"] == job_id)
    over_socket = codec.job_json(client.job(job_id), data_limit=0)  # as `jobs` asks

    # the CLI shows the control socket's view exactly (it is what it reads)
    assert by_cli == over_socket
    # HTTP: the same fields, less the result (its own URL) and the history (the job's own
    # page), plus the resource's kind and links; every shared field has the same value
    assert set(http) - set(by_cli) == {"object", "links"}
    assert set(by_cli) - set(http) == {"data", "headers", "chunks", "history"}
    assert {k: by_cli[k] for k in http if k in by_cli} == \
        {k: v for k, v in http.items() if k in by_cli}
    assert http["metadata"] == {"who": "doors", "raw": {"base64": "/wA="}, "list": [1, "two"]}
    assert http["priority"] == 2 and http["state"] == "succeeded"

    # times: epoch seconds, never monotonic ones converted twice
    for t in (http["submitted_at"], http["started_at"], http["finished_at"]):
        _near_now(t)
    assert http["submitted_at"] <= http["started_at"] <= http["finished_at"]
    detail = front.get(f"/v1/jobs/{job_id}").json()
    assert detail["history"] == by_cli["history"]
    for t, _state, _note in detail["history"]:
        _near_now(t)
