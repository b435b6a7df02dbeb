"""The native routes of the HTTP front door, against a real engine and real worker processes.

One engine for the module (simulated 8 GiB GPU; echo, a slow simulated model, one too large
for the GPU); every request goes through http.client over a real TCP socket.  Each error code
is provoked for real: a full queue, a job too big for every GPU, a failing worker, a timeout.
"""

from __future__ import annotations

import base64
import http.client
import json
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from http_support import Front, default_http_backends, serve_http
from spawning import spawns
from waiting import wait_until

from supervisor.apispec import METHODS
from supervisor.engine import EngineConfig
from supervisor.http import route_table

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    with serve_http(default_http_backends(), heartbeat_s=0.3, max_body=64 * 1024,
                    engine_config=EngineConfig(reserve_mib=0, tick_s=0.1,
                                               max_queue_depth=6)) as f:
        yield f


def drain(front: Front) -> None:
    """Cancel whatever is left running or queued (tests share the engine)."""
    for job in front.get("/v1/jobs?state=active").json()["data"]:
        front.post(f"/v1/jobs/{job['id']}/cancel")
    wait_until(lambda: not front.get("/v1/jobs?state=active").json()["data"], 20, "no active job")


# -- jobs ---------------------------------------------------------------------------------

def test_sync_submit_answers_with_the_workers_body_headers_and_status(front: Front) -> None:
    r = front.post("/v1/jobs", {"backend": "echo", "input": {"a": 1}})
    assert r.status == 200
    assert r.headers["content-type"].startswith("application/json")
    assert json.loads(r.body) == {"echo": {"a": 1}}
    job_id = r.headers["x-vramtui-job"]
    assert front.job_state(job_id) == "succeeded"
    raw = front.post("/v1/jobs", {"backend": "echo", "input_b64":
                                  base64.b64encode(b"\x00\xffraw").decode()})
    assert raw.status == 200 and raw.body == b"\x00\xffraw"
    assert raw.headers["content-type"] == "application/octet-stream"


def test_respond_async_gives_202_location_and_the_result_later(front: Front) -> None:
    r = front.post("/v1/jobs", {"backend": "echo", "input": "hello", "priority": 3,
                                "metadata": {"who": "test"}},
                   headers={"Prefer": "respond-async"})
    assert r.status == 202
    location = r.headers["location"]
    job = r.json()
    assert location == f"/v1/jobs/{job['id']}" and job["priority"] == 3
    assert r.headers["preference-applied"] == "respond-async"
    wait_until(lambda: front.get(location).json()["state"] == "succeeded", 20, "the job")
    detail = front.get(location).json()
    assert detail["metadata"] == {"who": "test"}
    assert [h["state"] for h in detail["history"]][0] == "queued"
    result = front.get(location + "/result")
    assert result.status == 200 and result.body == b'"hello"'  # input: handed over as JSON


def test_queue_position_and_why_a_job_waits(front: Front) -> None:
    first = front.post("/v1/jobs", {"backend": "slow"}, headers={"Prefer": "respond-async"})
    second = front.post("/v1/jobs", {"backend": "slow"}, headers={"Prefer": "respond-async"})
    third = front.post("/v1/jobs", {"backend": "slow"}, headers={"Prefer": "respond-async"})
    ids = [first.json()["id"], second.json()["id"], third.json()["id"]]
    front.wait_state(ids[0], "running")
    waiting = front.get(f"/v1/jobs/{ids[2]}").json()
    assert waiting["state"] == "queued" and waiting["position"] == 2
    assert waiting["waiting"]  # the scheduler's reason, in words
    listed = front.get("/v1/jobs?state=queued&backend=slow&limit=10").json()["data"]
    assert [j["id"] for j in listed] == [ids[1], ids[2]]  # the queue in the order it runs
    assert [j["position"] for j in listed] == [1, 2]
    one = front.get("/v1/jobs?backend=slow&limit=1").json()["data"]
    assert len(one) == 1
    cancelled = front.post(f"/v1/jobs/{ids[2]}/cancel")
    assert cancelled.status == 200 and cancelled.json()["state"] == "cancelled"
    drain(front)


def test_sse_on_submit_streams_named_events_with_monotonic_ids(front: Front) -> None:
    reader = front.sse("POST", "/v1/jobs", {"backend": "echo", "input": {"stream": 3}})
    try:
        assert reader.resp.status == 200
        h = reader.headers
        assert h["content-type"].startswith("text/event-stream")
        assert h["cache-control"] == "no-cache" and h["x-accel-buffering"] == "no"
        events = reader.until("state")  # the job as it is now
        seen = events + [e for e in iter(reader.next, None)]
    finally:
        reader.close()
    names = [e.event for e in seen]
    assert names[0] == "state" and seen[-1].event == "state"
    assert seen[-1].json()["state"] == "succeeded"
    chunks = [e.json() for e in seen if e.event == "chunk"]
    assert [c["text"] for c in chunks] == ["chunk 0\n", "chunk 1\n", "chunk 2\n"]
    assert [c["index"] for c in chunks] == [0, 1, 2]
    # In the order the worker sent them: each step's progress, then its chunk.
    assert [n for n in names if n in ("progress", "chunk")] == ["progress", "chunk"] * 3
    ids = [int(e.id) for e in seen if e.id is not None]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_job_events_resume_after_last_event_id(front: Front) -> None:
    r = front.post("/v1/jobs", {"backend": "slow", "input": {"steps": 6, "step_s": 0.05}},
                   headers={"Prefer": "respond-async"})
    job_id = r.json()["id"]
    reader = front.sse("GET", f"/v1/jobs/{job_id}/events")
    first = reader.next()
    assert first is not None and first.event == "state"
    got = [first]
    while not any(e.event == "progress" for e in got):
        ev = reader.next()
        assert ev is not None
        got.append(ev)
    last_id = got[-1].id
    reader.close()  # an observer: closing it does not cancel the job
    front.wait_state(job_id, "succeeded")
    again = front.sse("GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": last_id})
    rest = [e for e in iter(again.next, None)]
    again.close()
    assert rest and rest[-1].event == "state" and rest[-1].json()["state"] == "succeeded"
    assert all(int(e.id) > int(last_id) for e in rest if e.id)
    assert rest[0].event != "state" or rest[0].json()["state"] != "queued"  # replayed, not anew


def test_events_stream_snapshot_then_live_with_heartbeats_and_resume(front: Front) -> None:
    reader = front.sse("GET", "/v1/events?kinds=job,worker")
    first = reader.next()
    assert first is not None and first.event == "snapshot"
    assert {"gpus", "backends", "queued", "running"} <= set(first.json())
    r = front.post("/v1/jobs", {"backend": "echo", "input": 1})
    job_id = r.headers["x-vramtui-job"]
    seen = []
    while True:
        ev = reader.next()
        assert ev is not None
        seen.append(ev)
        if ev.event == "job" and ev.json()["job"]["id"] == job_id and \
                ev.json()["job"]["state"] == "succeeded":
            break
    assert all(e.event in ("job", "worker") for e in seen)
    assert "data" not in seen[-1].json()["job"]  # events carry no results
    mark = seen[-1].id
    assert reader.wait_comment(5).startswith(": heartbeat"), "no heartbeat on a quiet stream"
    reader.close()
    front.post("/v1/jobs", {"backend": "echo", "input": 2})
    again = front.sse("GET", "/v1/events?kinds=job", headers={"Last-Event-ID": mark})
    ev = again.next()
    again.close()
    assert ev is not None and ev.event == "job" and int(ev.id) > int(mark)
    gap = front.sse("GET", "/v1/events", headers={"Last-Event-ID": "0"})
    ev = gap.next()
    gap.close()
    # event 1 has left the ring only if the ring is full; otherwise it is replayed
    assert ev is not None and (ev.event == "snapshot" or int(ev.id) == 1)


def test_a_subscriber_that_does_not_read_gets_a_fresh_snapshot_not_a_slow_engine(
        front: Front) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", front.port))
    sock.sendall(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Accept: text/event-stream\r\n\r\n")
    try:
        big = {"stream": 1000}
        for _ in range(8):  # each is answered while the stalled stream holds nothing up
            r = front.post("/v1/jobs", {"backend": "echo", "input": big})
            assert r.status == 200
        wait_until(lambda: front.server.hub.dropped > 0, 10, "the stalled stream to lag")
        sock.settimeout(5)
        data = b""
        deadline = time.monotonic() + 10
        while b'"lagged":' not in data and time.monotonic() < deadline:
            data += sock.recv(1 << 20)
        head, _, rest = data.partition(b'"lagged":')
        assert rest, "no fresh snapshot after falling behind"
        assert head.rsplit(b"event: ", 1)[-1].startswith(b"snapshot")
    finally:
        sock.close()


def test_disconnecting_a_sync_client_cancels_its_job(front: Front) -> None:
    conn = front.conn()
    conn.request("POST", "/v1/jobs", body=json.dumps({"backend": "slow", "input":
                                                      {"steps": 200, "step_s": 0.05}}),
                 headers={"Content-Type": "application/json"})
    job = wait_until(lambda: front.get("/v1/jobs?state=running&backend=slow").json()["data"], 20,
               "the job to run")[0]
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    front.wait_state(job["id"], "cancelled")
    assert "went away" in front.get(f"/v1/jobs/{job['id']}").json()["error"]


def test_disconnecting_an_sse_submitter_cancels_its_job_but_not_an_observer(
        front: Front) -> None:
    reader = front.sse("POST", "/v1/jobs", {"backend": "slow", "input":
                                            {"steps": 200, "step_s": 0.05}})
    job_id = reader.headers["x-vramtui-job"]
    front.wait_state(job_id, "running")
    watcher = front.sse("GET", f"/v1/jobs/{job_id}/events")
    assert watcher.next() is not None
    watcher.close()
    time.sleep(0)  # the observer's close must not cancel: check the job still runs
    assert front.job_state(job_id) == "running"
    reader.close()
    front.wait_state(job_id, "cancelled")


# -- backends, GPUs, logs -----------------------------------------------------------------

def test_backends_gpus_load_unload_respawn_and_zero(front: Front) -> None:
    listing = front.get("/v1/backends").json()["data"]
    assert {b["name"] for b in listing} == {"echo", "slow", "huge", "flaky"}
    slow = front.get("/v1/backends/slow").json()
    declared = front.sup.snapshot().backend("slow").declared_peak_mib
    assert declared is not None and declared >= 640  # weights + activation (+ context)
    assert slow["peaks"]["declared_mib"] == declared and "keep_alive_left_s" in slow
    assert front.post("/v1/backends/slow/load").status == 202
    wait_until(lambda: front.get("/v1/backends/slow").json()["state"] == "ready", 20, "slow ready")
    # (measured at the sampler's next pass: a ready worker may not have been sampled yet)
    wait_until(lambda: front.get("/v1/backends/slow").json()["memory"]["observed_mib"]
               is not None, 10, "slow's memory to be observed")
    gpus = front.get("/v1/gpus").json()
    assert gpus["simulated"] is True and gpus["data"][0]["total_mib"] == 8192
    assert gpus["data"][0]["uuid"] == "SIM-0"
    assert front.post("/v1/backends/slow/respawn").status == 202
    wait_until(lambda: front.get("/v1/backends/slow").json()["state"] == "ready", 20, "respawned")
    assert front.post("/v1/backends/slow/unload").status == 202
    wait_until(lambda: front.get("/v1/backends/slow").json()["state"] == "cold", 20, "slow cold")
    front.post("/v1/backends/echo/load")
    wait_until(lambda: front.get("/v1/backends/echo").json()["state"] == "ready", 20, "echo ready")
    r = front.post("/v1/backends/unload")
    assert r.status == 202 and "echo" in r.json()["unloaded"]


def test_logs_and_follow(front: Front) -> None:
    front.post("/v1/jobs", {"backend": "echo", "input": 1})
    r = front.get("/v1/backends/echo/logs?lines=5")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
    conn = front.conn(timeout=10)
    conn.request("GET", "/v1/backends/echo/logs?follow=1&lines=0")
    resp = conn.getresponse()
    assert resp.status == 200
    path = front.engine.paths.worker_log_path("echo")
    with open(path, "a") as f:
        f.write("a line written by the test\n")
    line = b""
    deadline = time.monotonic() + 10
    while b"written by the test" not in line and time.monotonic() < deadline:
        line += resp.read1(4096) if hasattr(resp, "read1") else resp.read(1)
    conn.close()
    assert b"written by the test" in line


def test_health_ready_version_and_the_route_list(front: Front) -> None:
    assert front.get("/healthz").json() == {"status": "ok"}
    assert front.get("/readyz").json() == {"status": "ready"}
    v = front.get("/v1/version").json()
    assert v["version"] == "test" and v["simulated"] is True
    routes = {(r["method"], r["path"]) for r in front.get("/v1").json()["data"]}
    assert ("POST", "/v1/jobs") in routes and ("GET", "/metrics") in routes


# -- every error code ---------------------------------------------------------------------

def test_404s(front: Front) -> None:
    assert front.get("/v1/nothing").error["type"] == "not_found_error"
    assert front.post("/v1/jobs", {"backend": "nope"}).error["code"] == "unknown_backend"
    assert front.get("/v1/jobs/j-0000000000").error["code"] == "unknown_job"
    assert front.get("/v1/jobs/j-0000000000/result").status == 404
    assert front.get("/v1/jobs/j-0000000000/events").status == 404
    assert front.post("/v1/jobs/j-0000000000/cancel").status == 404
    assert front.get("/v1/backends/nope").status == 404
    assert front.post("/v1/backends/nope/load").status == 404
    assert front.get("/v1/backends/nope/logs").status == 404
    assert front.get("/v1/jobs?backend=nope").status == 404
    # an error echoes what it was sent: never sniffed as anything but JSON, in either shape
    for reply in (front.get("/v1/backends/%3Cscript%3E"), front.get("/api/nothing"),
                  front.get("/v1/nothing")):
        assert reply.status == 404, reply
        nosniff = {k.lower(): v for k, v in reply.headers.items()}.get("x-content-type-options")
        assert nosniff == "nosniff", reply.headers


@pytest.mark.parametrize("body, param", [
    ({"backend": "echo", "bogus": 1}, "bogus"),
    ({"input": 1}, "backend"),
    ({"backend": "echo", "input": 1, "input_b64": "AA=="}, "input"),
    ({"backend": "echo", "input_b64": "not base64!"}, "input_b64"),
    ({"backend": "echo", "priority": "high"}, "priority"),
    ({"backend": "echo", "timeout": -1}, "timeout"),
    ({"backend": "echo", "metadata": [1]}, "metadata"),
    ([1, 2], None),
])
def test_400_bad_input_says_which_field(front: Front, body: object, param: str | None) -> None:
    r = front.post("/v1/jobs", body)
    assert r.status == 400
    assert r.error["type"] == "invalid_request_error"
    assert r.json()["error"].get("param") == param


def test_400_and_405_and_413(front: Front) -> None:
    assert front.post("/v1/jobs", raw=b"{not json").status == 400
    assert front.post("/v1/jobs", raw=b"").status == 400
    assert front.get("/v1/jobs?state=bogus").error["param"] == "state"
    assert front.get("/v1/jobs?limit=-3").status == 400
    r = front.request("DELETE", "/v1/jobs")
    assert r.status == 405 and "allow" in r.headers and r.error
    big = front.post("/v1/jobs", {"backend": "echo", "input": "x" * (100 * 1024)})
    assert big.status == 413 and "limit" in big.error["message"]
    # the oversized body did not become a job
    assert all(j["backend"] != "echo" or j["state"] != "queued"
               for j in front.get("/v1/jobs?state=active").json()["data"])


def test_507_too_large_for_every_gpu(front: Front) -> None:
    r = front.post("/v1/jobs", {"backend": "huge"})
    assert r.status == 507 and r.error["code"] == "too_large"
    assert "GPU" in r.error["message"]


def test_503_queue_full_with_retry_after(front: Front) -> None:
    ids = []
    for _ in range(7):  # one runs, six wait: the queue is full
        r = front.post("/v1/jobs", {"backend": "slow"}, headers={"Prefer": "respond-async"})
        assert r.status == 202, r.body
        ids.append(r.json()["id"])
    wait_until(lambda: len(front.get("/v1/jobs?state=queued").json()["data"]) == 6, 20, "full")
    r = front.post("/v1/jobs", {"backend": "echo"})
    assert r.status == 503 and r.error["code"] == "queue_full"
    assert int(r.headers["retry-after"]) > 0
    drain(front)


def test_409_502_504_job_outcomes(front: Front) -> None:
    failed = front.post("/v1/jobs", {"backend": "flaky", "input": {"fail": True}})
    assert failed.status == 502 and failed.error["code"] == "job_failed"
    timed = front.post("/v1/jobs", {"backend": "slow", "input": {"steps": 100, "step_s": 0.05},
                                    "timeout": 0.5})
    assert timed.status == 504 and timed.error["code"] == "job_timed_out"
    r = front.post("/v1/jobs", {"backend": "slow"}, headers={"Prefer": "respond-async"})
    job_id = r.json()["id"]
    early = front.get(f"/v1/jobs/{job_id}/result")
    assert early.status == 409 and early.error["code"] == "job_not_finished"
    assert "retry-after" in early.headers
    front.wait_state(job_id, "running")
    busy = front.post("/v1/backends/slow/unload")
    assert busy.status == 409 and "busy" in busy.error["message"]
    front.post(f"/v1/jobs/{job_id}/cancel")
    front.wait_state(job_id, "cancelled")
    gone = front.get(f"/v1/jobs/{job_id}/result")
    assert gone.status == 409 and gone.error["code"] == "job_cancelled"


# -- the API's other methods, each on its route (supervisor/http/route_table.py) -----------

ASYNC = {"Prefer": "respond-async"}


def test_the_route_list_is_the_table_and_names_the_api_method_of_each(front: Front) -> None:
    listed = front.get("/v1").json()["data"]
    assert [(r["method"], r["path"]) for r in listed] == \
        [(r.method, r.path) for r in route_table.ROUTES]
    carried = {r["api"] for r in listed if r["api"] is not None}
    assert carried | set(route_table.NOT_ON_HTTP) == set(METHODS)
    assert {"method": "POST", "path": "/v1/jobs/{id}/retry", "api": "retry"}.items() <= \
        next(r for r in listed if r["path"] == "/v1/jobs/{id}/retry").items()


def test_priority_the_request_and_cancel_many(front: Front) -> None:
    slow = {"backend": "slow", "input": {"steps": 400, "step_s": 0.02}}
    first = front.post("/v1/jobs", slow, headers=ASYNC).json()["id"]
    front.wait_state(first, "running")
    a = front.post("/v1/jobs", {"backend": "slow"}, headers=ASYNC).json()["id"]
    b = front.post("/v1/jobs", {"backend": "slow"}, headers=ASYNC).json()["id"]
    moved = front.post(f"/v1/jobs/{b}/priority", {"priority": 50})
    assert moved.status == 200
    assert moved.json()["priority"] == 50 and moved.json()["position"] == 1
    assert front.get(f"/v1/jobs/{a}").json()["position"] == 2
    assert front.post(f"/v1/jobs/{b}/priority", {"priority": "high"}).status == 400
    assert front.post(f"/v1/jobs/{b}/priority", {}).error["param"] == "priority"
    running = front.post(f"/v1/jobs/{first}/priority", {"priority": 1})
    assert running.status == 409 and "only a queued job" in running.error["message"]

    sent = b'{"steps":400,"step_s":0.02}'  # the input, as the worker got it
    req = front.get(f"/v1/jobs/{first}/request?limit=9")
    assert req.status == 200
    assert req.json() == {"job_id": first, "size": len(sent), "data": sent[:9].decode(),
                          "kept": True}
    assert front.get(f"/v1/jobs/{first}/request?limit=-1").error["param"] == "limit"
    assert front.get("/v1/jobs/j-0000000000/request").error["code"] == "unknown_job"

    r = front.post("/v1/jobs/cancel", {"jobs": [a, b, first, "j-0000000000"]})
    assert r.status == 200
    got = {c["job_id"]: c for c in r.json()["data"]}
    assert got[a]["state"] == got[b]["state"] == "cancelled"
    assert got[first]["state"] in ("running", "cancelled")  # it gets its grace
    assert got["j-0000000000"]["state"] is None and "j-0000000000" in \
        got["j-0000000000"]["error"]
    assert front.post("/v1/jobs/cancel", {"jobs": "all"}).error["param"] == "jobs"
    assert front.post("/v1/jobs/cancel", {"jobs": [1]}).status == 400
    front.wait_state(first, "cancelled")


def test_retry_runs_the_request_again_as_a_new_job(front: Front) -> None:
    first = front.post("/v1/jobs", {"backend": "echo", "input": {"again": 1}})
    job_id = first.headers["x-vramtui-job"]
    r = front.post(f"/v1/jobs/{job_id}/retry")
    assert r.status == 202
    new = r.json()
    assert new["id"] != job_id and new["retry_of"] == job_id and new["object"] == "job"
    assert r.headers["location"] == f"/v1/jobs/{new['id']}"
    done = front.get(f"/v1/jobs/{new['id']}/wait?timeout=30")
    assert done.status == 200 and done.json()["state"] == "succeeded"
    assert front.get(f"/v1/jobs/{new['id']}/result").body == first.body
    queued = front.post("/v1/jobs", {"backend": "slow"}, headers=ASYNC).json()["id"]
    early = front.post(f"/v1/jobs/{queued}/retry")
    assert early.status == 409 and "only a finished job" in early.error["message"]
    assert front.post("/v1/jobs/j-0000000000/retry").status == 404
    drain(front)


def test_kill_drain_reload_and_the_descriptor(front: Front) -> None:
    assert front.post("/v1/backends/flaky/load").status == 202
    wait_until(lambda: front.get("/v1/backends/flaky").json()["state"] == "ready", 20, "flaky up")
    pid = front.get("/v1/backends/flaky").json()["pid"]
    killed = front.post("/v1/backends/flaky/kill")
    assert killed.status == 202 and killed.json()["action"] == "kill"
    wait_until(lambda: front.get("/v1/backends/flaky").json()["pid"] != pid, 20, "flaky killed")
    cold = front.post("/v1/backends/huge/kill")
    assert cold.status == 409 and "no worker process" in cold.error["message"]
    assert front.post("/v1/backends/nope/kill").status == 404

    assert front.post("/v1/gpus/0/drain").json() == {"gpu": 0, "draining": [0]}
    assert front.get("/v1/snapshot?light=1").json()["gpus"][0]["draining"] is True
    assert front.post("/v1/gpus/0/drain", {"on": False}).json() == {"gpu": 0, "draining": []}
    assert front.post("/v1/gpus/7/drain").status == 404  # no such GPU here
    assert front.post("/v1/gpus/x/drain").error["param"] == "gpu"
    assert front.post("/v1/gpus/0/drain", {"on": "yes"}).status == 400

    reloaded = front.post("/v1/backends/reload")
    assert reloaded.status == 200
    body = reloaded.json()
    assert body["unchanged"] is True and body["errors"] == [] and len(body["files"]) == 1

    d = front.get("/v1/backends/echo/descriptor").json()
    assert d["backend"] == "echo" and "name: echo" in d["layers"][0]["text"]
    assert "command:" in d["effective"]
    assert front.get("/v1/backends/nope/descriptor").error["code"] == "unknown_backend"


def test_calibration_reports_and_a_calibration_run(front: Front) -> None:
    from fixed_source import calibration_record

    from supervisor.calibration.report import write_report

    assert front.get("/v1/backends/echo/calibration").error["code"] == "no_report"
    path = write_report(front.sup.paths.calibration_dir / "slow-20260101-115500.json",
                        calibration_record(), None)
    got = front.get("/v1/backends/slow/calibration")
    assert got.status == 200 and got.body == path.read_bytes()
    assert got.headers["content-type"].startswith("application/json")
    assert got.headers["x-vramtui-report"] == path.name
    assert got.headers["x-vramtui-reports"] == "1"
    assert front.get("/v1/backends/slow/calibration?name=../../etc/passwd").status == 404

    assert front.post("/v1/backends/echo/calibrate", {"repeats": 0}).status == 400
    bad = front.post("/v1/backends/echo/calibrate", {"bogus": 1})
    assert bad.error["param"] == "bogus"
    r = front.post("/v1/backends/echo/calibrate", {"repeats": 1, "input": {"a": 1}})
    assert r.status == 202
    job = r.json()
    assert job["kind"] == "calibration" and r.headers["location"] == f"/v1/jobs/{job['id']}"
    front.post(f"/v1/jobs/{job['id']}/cancel")
    front.wait_state(job["id"], "cancelled", "failed", "succeeded", timeout=60)


def test_the_snapshot_and_the_servers_own_counters(front: Front) -> None:
    full = front.get("/v1/snapshot").json()
    assert {b["name"] for b in full["backends"]} == {"echo", "slow", "huge", "flaky"}
    assert all(j["data"] is None and j["chunks"] == [] for j in full["recent"])
    assert abs(full["taken_at"] - time.time()) < 60
    light = front.get("/v1/snapshot?light=1").json()
    assert light["recent"] == [] and light["gpus"][0]["history"] == []
    stats = front.get("/v1/stats").json()
    assert stats["requests"] >= 2 and "connections" in stats and stats["in_flight"] >= 1


def test_a_huge_path_parameter_is_never_echoed_whole_and_always_answered_in_json(
        front: Front) -> None:
    # A 5000-character id came back whole in the 404's message; past aiohttp's 8 KiB line
    # limit the answer was aiohttp's plain text, quoting the request line.
    for path, code in ((f"/v1/jobs/j-{'x' * 5000}", "unknown_job"),
                       (f"/v1/jobs/j-{'x' * 5000}/result", "unknown_job"),
                       (f"/v1/backends/{'b' * 5000}", "unknown_backend")):
        r = front.get(path)
        assert r.status == 404 and r.error["code"] == code, r.body[:200]
        assert len(r.error["message"]) < 200 and "x" * 100 not in r.error["message"]
        assert len(r.body) < 500
    r = front.get(f"/v1/jobs/j-{'y' * 9000}")
    assert r.status == 400, r.body[:200]
    assert r.headers["content-type"].startswith("application/json")
    assert r.error["type"] == "invalid_request_error" and r.error["code"] == "line_too_long"
    assert "y" * 100 not in r.body.decode() and len(r.body) < 500
    r = front.get("/v1/jobs", headers={"X-Big": "z" * 9000})
    assert r.status == 400 and r.error["code"] == "line_too_long"
    assert "z" * 100 not in r.body.decode()
    assert front.get("/healthz").status == 200  # and the door goes on


async def _fails_after_its_head(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    await response.write(b'{"done":false}\n')
    raise RuntimeError("a fault after the answer began")


@pytest.mark.process
def test_a_route_that_fails_after_its_answer_began_is_cut_not_given_a_second_head(
        caplog: pytest.LogCaptureFixture) -> None:
    """The door's error middleware wrote its 500 response, head and all, inside the body of
    the answer already begun: a client read it as the body's next chunk (``illegal chunk
    header``), and the connection stayed open. Now the connection is cut, without the body's
    end: the client reads a broken answer, never a whole one."""
    broken = web.Application()
    broken.router.add_get("/stream", _fails_after_its_head)
    with serve_http([], subapps={"/broken": broken}) as front, \
            caplog.at_level(logging.ERROR, logger="supervisor.http"), \
            socket.create_connection(("127.0.0.1", front.port), timeout=10) as sock:
        sock.sendall(b"GET /broken/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):  # (a timeout here: the connection left open)
            data += chunk
        assert data.startswith(b"HTTP/1.1 200 ") and data.count(b"HTTP/1.1") == 1, data
        assert b'{"done":false}' in data and not data.endswith(b"0\r\n\r\n"), data
        assert "failed after its answer began: RuntimeError" in caplog.text
        with pytest.raises(http.client.IncompleteRead):
            conn = front.conn()
            conn.request("GET", "/broken/stream")
            conn.getresponse().read()
