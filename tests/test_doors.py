"""The door layer (supervisor/doors): one job seen alike through every door, and one way to
wait for it.

One engine for the module with its HTTP door and its control socket (simulated 8 GiB GPU,
real worker processes).  The same job is read through ``GET /v1/jobs``, ``vramtui jobs
--json`` (a real CLI process) and the control socket (:class:`supervisor.client.Client`), and
must come out with the same fields and values; its times are epoch seconds (the HTTP door once
added the monotonic-to-wall offset twice: the year 2083).  Waiting is checked at each door
for what :mod:`supervisor.doors.watch` promises: the final view, JobTimeout past a deadline
while the job goes on, EngineStopped when the engine stops first.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_support import sim_backend
from http_support import Front, serve_http
from serve_support import cli, echo_backend
from spawning import spawns
from waiting import wait_until

from supervisor.client import Client
from supervisor.doors import codec, watch
from supervisor.errors import EngineStopped, JobTimeout
from supervisor.jobs import JobState

pytestmark = pytest.mark.timeout(120)
SLOW = b'{"steps": 400, "step_s": 0.02}'  # 8 s: long enough to wait on, cancelled after


@pytest.fixture(scope="module")
@spawns
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
    assert [[h["t"], h["state"], h["note"]] for h in detail["history"]] == by_cli["history"]
    for h in detail["history"]:
        _near_now(h["t"])
    # the engine's whole view over HTTP is the CLI's status --json, job for job
    snap = front.get("/v1/snapshot").json()
    assert next(j for j in snap["recent"] if j["id"] == job_id) == by_cli


def test_a_wait_past_its_deadline_raises_and_the_job_goes_on(front: Front,
                                                             client: Client) -> None:
    job_id = client.submit("slow", SLOW)
    try:
        wait_until(lambda: client.job(job_id).state is JobState.RUNNING, 30, "slow running")
        for face in (front.sup, client):
            t0 = time.monotonic()
            with pytest.raises(JobTimeout, match="it goes on"):
                face.wait(job_id, 0.2)
            assert time.monotonic() - t0 < 10
        r = front.get(f"/v1/jobs/{job_id}/wait?timeout=0.2")
        assert r.status == 504 and r.error["code"] == "wait_timeout"
        assert "it goes on" in r.error["message"]
        assert client.job(job_id).state is JobState.RUNNING  # nobody cancelled it
        assert front.get(f"/v1/jobs/{job_id}/wait?timeout=soon").status == 400
    finally:
        client.cancel(job_id)
    ended = front.get(f"/v1/jobs/{job_id}/wait?timeout=30")
    assert ended.status == 200 and ended.json()["state"] == "cancelled"
    assert ended.json()["history"]  # the job's page, as GET /v1/jobs/{id} gives it
    assert front.get("/v1/jobs/j-0000000000/wait").error["code"] == "unknown_job"


def test_an_http_waiter_that_goes_away_does_not_cancel_the_job(front: Front,
                                                               client: Client) -> None:
    job_id = client.submit("slow", SLOW)
    try:
        conn = front.conn(timeout=0.5)
        conn.request("GET", f"/v1/jobs/{job_id}/wait")
        with pytest.raises(TimeoutError):
            conn.getresponse()
        conn.close()  # an observer left; the job is not its to cancel
        wait_until(lambda: client.job(job_id).state is JobState.RUNNING, 30, "slow running")
        time.sleep(0.3)
        assert not client.job(job_id).finished
    finally:
        client.cancel(job_id)


@pytest.mark.process
def test_every_door_hears_engine_stopped_when_the_engine_stops_first() -> None:
    backends = [sim_backend("slow", 512, 128, steps=40, step_s=0.05)]
    with serve_http(backends, control=True) as front:
        c = Client(front.sup.paths.control_socket)
        running = c.submit("slow", SLOW)
        wait_until(lambda: c.job(running).state is JobState.RUNNING, 30, "slow running")
        queued = c.submit("slow", b"{}")  # waits behind it; journaled: it stays queued
        got: dict[str, BaseException | None] = {}

        def waits(name: str, wait: Any) -> None:
            try:
                wait(queued, 60)
                got[name] = None
            except BaseException as exc:  # noqa: BLE001 - what the test looks at
                got[name] = exc

        threads = [threading.Thread(target=waits, args=("facade", front.sup.wait)),
                   threading.Thread(target=waits, args=("control", c.wait))]
        for t in threads:
            t.start()
        waiter = front.conn(timeout=60)
        waiter.request("GET", f"/v1/jobs/{queued}/wait")
        time.sleep(0.5)  # every door waits now
        stopper = threading.Thread(target=front.sup.stop, kwargs={"timeout": 30})
        stopper.start()
        resp = waiter.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 503 and body["error"]["code"] == "engine_stopping"
        assert "stays queued" in body["error"]["message"]
        for t in threads:
            t.join(30)
        stopper.join(60)
        assert isinstance(got["facade"], EngineStopped), got
        assert isinstance(got["control"], EngineStopped), got
        assert "stays queued" in str(got["control"])
        c.close()


def test_only_the_watch_module_knows_how_a_jobs_end_is_signalled() -> None:
    """Outside the engine, only supervisor/doors/watch.py reads the engine's end signals
    (``engine.futures``) or takes its decision early (``step_now``): a door that did would
    break when the engine changes how it says a job has ended."""
    root = Path(__file__).resolve().parents[1]
    engine = ("supervisor/engine/", "supervisor/jobs/")
    pattern = re.compile(r"\.futures\b|\bstep_now\b")
    found = []
    for package in ("supervisor", "vramtui", "worker_sdk"):
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith(engine) or rel == "supervisor/doors/watch.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "concurrent.futures" not in line:
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_following_a_job_gives_its_events_then_its_end_or_a_timeout(front: Front,
                                                                     client: Client) -> None:
    engine = front.sup.engine

    async def follow(backend: str, payload: bytes, timeout: float | None,
                     job_id: str | None = None) -> tuple[str, list[tuple[str, Any]]]:
        feed = watch.Feed(engine, frozenset({"chunk", "job"}))
        feed.start()
        try:
            if job_id is None:
                job_id = engine.submit(backend, payload, stream=True).id
            items: list[tuple[str, Any]] = []
            try:
                async for item in feed.follow(job_id, timeout=timeout):
                    items.append(item)
            except JobTimeout as exc:
                items.append(("timeout", exc))
            return job_id, items
        finally:
            feed.close()

    def run(*args: Any) -> tuple[str, list[tuple[str, Any]]]:
        assert engine.run.loop is not None
        return asyncio.run_coroutine_threadsafe(follow(*args), engine.run.loop).result(60)

    job_id, items = run("echo", b'{"stream": 3}', None)
    assert [v for k, v in items if k == "chunk"] == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n"]
    assert {k for k, _v in items[:-1]} == {"job", "chunk"}  # in the engine's order
    kind, view = items[-1]
    assert kind == "end" and view.state is JobState.SUCCEEDED and view.id == job_id
    # a job that has ended already: its end at once
    again = run("echo", b"", None, job_id)[1]
    assert [k for k, _v in again] == ["end"] and again[0][1].state is JobState.SUCCEEDED
    # past its deadline: JobTimeout, and the job goes on
    slow_id, slow = run("slow", SLOW, 0.3)
    try:
        assert slow[-1][0] == "timeout" and "it goes on" in str(slow[-1][1])
        assert not client.job(slow_id).finished
    finally:
        client.cancel(slow_id)


def test_a_listings_limit_has_one_rule_and_one_error_at_every_door(front: Front) -> None:
    # The CLI refused 0 and capped 1001 silently; HTTP took 0 and refused 1001.  Now both
    # ask the engine's one listing (the API's `jobs`), so both say the same, word for word.
    for limit in ("0", "1001", "-3"):
        http = front.get(f"/v1/jobs?limit={limit}")
        assert http.status == 400 and http.error["param"] == "limit", http.json()
        message = http.error["message"]
        assert "from 1 to 1000" in message, message
        done = cli(front.env, "jobs", "--limit", limit)
        assert done.returncode == 2, (limit, done.stdout, done.stderr)
        assert message in done.stderr, (message, done.stderr)
    assert front.get("/v1/jobs?limit=abc").error["param"] == "limit"
    for limit in ("1", "1000"):
        assert front.get(f"/v1/jobs?limit={limit}").status == 200
        done = cli(front.env, "jobs", "--limit", limit, "--json")
        assert done.returncode == 0, done.stderr


def test_a_listings_states_are_read_by_one_parser_at_every_door(front: Front,
                                                                 client: Client) -> None:
    # The CLI's --state took one state of its own list, no `active`/`finished` nor a comma
    # list, which GET /v1/jobs?state= took: both now give the text to the engine's parser.
    done_id = client.submit("echo", b"{}")
    assert client.wait(done_id, 30).state is JobState.SUCCEEDED
    slow_id = client.submit("slow", SLOW)
    try:
        for asked in ("active", "finished", "queued,running,starting", "succeeded, failed"):
            http = front.get(f"/v1/jobs?state={asked.replace(' ', '')}&limit=1000")
            assert http.status == 200, http.json()
            done = cli(front.env, "jobs", "--state", asked, "--limit", "1000", "--json")
            assert done.returncode == 0, (asked, done.stderr)
            by_cli = json.loads(done.stdout)
            ids = {j["id"] for part in ("running", "queued", "recent") for j in by_cli[part]}
            assert ids == {j["id"] for j in http.json()["data"]}, asked
            assert (slow_id in ids) == (asked in ("active", "queued,running,starting")), asked
            assert (done_id in ids) == (asked in ("finished", "succeeded, failed")), asked
        both = cli(front.env, "jobs", "--state", "queued", "--state", "succeeded", "--json")
        assert both.returncode == 0, both.stderr
        assert done_id in {j["id"] for j in json.loads(both.stdout)["recent"]}
        http = front.get("/v1/jobs?state=bogus")
        assert http.status == 400 and http.error["param"] == "state"
        done = cli(front.env, "jobs", "--state", "bogus")
        assert done.returncode == 2 and http.error["message"] in done.stderr, done.stderr
    finally:
        client.cancel(slow_id)


def test_a_long_queue_never_hides_the_running_job_nor_the_head_of_the_queue(
        front: Front, client: Client) -> None:
    """Listed newest first and cut at the limit, 150 queued jobs pushed the running one and
    the first 50 of the queue out of `vramtui jobs` (its default limit is 100): the listing
    is running jobs, then the queue in the order it runs, then finished ones, at every
    door."""
    ids = [client.submit("slow", SLOW)]
    try:
        wait_until(lambda: client.job(ids[0]).state is JobState.RUNNING, deadline=30,
                   what="the first job running")
        ids += [client.submit("slow", SLOW) for _ in range(150)]
        done = cli(front.env, "jobs", "--json")
        assert done.returncode == 0, done.stderr
        got = json.loads(done.stdout)
        assert [j["id"] for j in got["running"]] == [ids[0]]
        assert [j["id"] for j in got["queued"]] == ids[1:100]
        assert [j["position"] for j in got["queued"]] == list(range(1, 100))
        listed = front.get("/v1/jobs?backend=slow").json()["data"]
        assert [j["id"] for j in listed] == ids[:100]
    finally:
        client.cancel_many(ids)
        wait_until(lambda: all(client.job(i).finished for i in ids), deadline=60,
                   what="every job cancelled")


def test_a_listing_names_a_bounded_number_of_backends(front: Front) -> None:
    """Each backend a listing names is looked up (in the journal too): their number is
    bounded alike at every door."""
    many = "&".join(f"backend=b{i}" for i in range(65))
    answer = front.get(f"/v1/jobs?{many}")
    assert answer.status == 400 and "at most 64" in answer.json()["error"]["message"]
    done = cli(front.env, "jobs", *[a for i in range(65) for a in ("--backend", f"b{i}")])
    assert done.returncode == 2 and "at most 64" in done.stderr
