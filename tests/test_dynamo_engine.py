"""``vramtui --serve --dynamo NS``: the engine's backends as NVIDIA Dynamo endpoints, for real.

The engine is a real ``vramtui --serve --dynamo`` process on a simulated 8 GiB GPU with the
simulated models (``tests/engine_support.sim_backend``) and the echo example; the Dynamo client
is :class:`worker_sdk.dynamo.client.Client`, a real Dynamo runtime on a thread of the test
process; discovery is a file directory under /tmp and requests travel on Dynamo's TCP request
plane: no etcd, no NATS.  The engine is also watched through its control socket (and the CLI),
as any face would.  Every wait polls a condition with a deadline; every process is reaped.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_support import ROOT, sim_backend
from serve_support import Served, cli, echo_backend, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

from supervisor.client import Client as ControlClient
from supervisor.errors import UnknownJob
from supervisor.jobs import JobState, JobView
from worker_sdk.dynamo.errors import RequestError
from worker_sdk.dynamo.shapes import raw_bytes

NS = "t"
SLOW = {"steps": 2000, "step_s": 0.05}  # 100 s: ends only when cancelled


def backends() -> list[dict[str, Any]]:
    return [
        echo_backend(),
        sim_backend("slow", 1024, 256, steps=2, step_s=0.02),
        # Two models that do not fit the 8 GiB GPU together: one waits for the other.
        sim_backend("big-a", 5000, 512, steps=2, step_s=0.02),
        sim_backend("big-b", 5000, 512, steps=2, step_s=0.02),
        sim_backend("huge", 64 * 1024, 1024),
    ]


# -- no Dynamo needed -------------------------------------------------------------------------
@pytest.mark.process
def test_missing_dynamo_or_a_bad_namespace_is_one_line_and_exit_2() -> None:
    root = new_root()
    try:
        env = make_env(root, backends())
        code = ("import runpy, sys; sys.modules['dynamo'] = None; "
                "sys.argv = ['vramtui', '--serve', '--gpus', 'sim:8GiB', '--dynamo', 'ns']; "
                "runpy.run_module('vramtui', run_name='__main__', alter_sys=True)")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 2, done.stderr
        assert done.stderr == ("vramtui --serve: --dynamo needs NVIDIA Dynamo: "
                               "pip install 'vramtui[dynamo]'\n")
        bad = cli(env, "--serve", "--gpus", "sim:8GiB", "--dynamo", "a.b")
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "not a Dynamo namespace" in bad.stderr
        assert not Path(env["VRAMTUI_RUNTIME_DIR"], "control.sock").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.process
def test_a_bad_queue_limit_is_one_line_and_exit_2() -> None:
    root = new_root()
    try:
        env = make_env(root, backends())
        for extra, flags, error in (
                ({}, ["--max-queue", "0"],
                 "vramtui: error: argument --max-queue: must be at least 1, got 0"),
                ({"VRAMTUI_MAX_QUEUE": "lots"}, [],
                 "vramtui --serve: VRAMTUI_MAX_QUEUE='lots' is not a number of jobs")):
            done = cli(env | extra, "--serve", "--gpus", "sim:8GiB", *flags)
            assert done.returncode == 2, done.stderr
            assert done.stderr.strip().splitlines()[-1] == error, done.stderr  # after usage
            assert "Traceback" not in done.stderr
        settings = Path(env["VRAMTUI_CONFIG_DIR"], "config.yaml")
        settings.parent.mkdir(parents=True, exist_ok=True)
        for text, error in (("engine: {max_queue: 0}\n", "engine: max_queue must be at least 1"),
                            ("engine: {max_queeu: 3}\n", "engine: unknown key 'max_queeu'"),
                            ("engin: {max_queue: 3}\n", "unknown section 'engin' (known: "
                                                          "engine, http)")):
            settings.write_text(text)
            done = cli(env, "--serve", "--gpus", "sim:8GiB")
            assert done.returncode == 2 and error in done.stderr, done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not Path(env["VRAMTUI_RUNTIME_DIR"], "control.sock").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_queue_limit_comes_from_the_flag_then_the_environment_then_config_yaml(
        tmp_path: Path) -> None:
    import argparse

    from supervisor.paths import Paths
    from vramtui.serve import engine_config

    paths = Paths(config_dir=tmp_path, state_dir=tmp_path, runtime_dir=tmp_path)
    (tmp_path / "config.yaml").write_text("http: {listen: 127.0.0.1:1}\nengine:\n  max_queue: 7\n")
    args = argparse.Namespace(max_queue=None)
    assert engine_config(args, paths, {}).max_queue_depth == 7
    assert engine_config(args, paths, {"VRAMTUI_MAX_QUEUE": "9"}).max_queue_depth == 9
    args.max_queue = 3
    assert engine_config(args, paths, {"VRAMTUI_MAX_QUEUE": "9"}).max_queue_depth == 3
    (tmp_path / "config.yaml").unlink()
    assert engine_config(argparse.Namespace(), paths, {}).max_queue_depth == 512


# -- real Dynamo ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
@spawns
def discovery() -> Iterator[Path]:
    """The file-discovery directory the engines and clients of this module share."""
    pytest.importorskip("dynamo.runtime", reason="needs ai-dynamo-runtime (the dynamo extra)")
    path = Path(tempfile.mkdtemp(prefix="vtde-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def dynamo_env(root: Path, discovery: Path) -> dict[str, str]:
    env = {k: v for k, v in make_env(root, backends()).items() if not k.startswith("DYN_")}
    env.update(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(discovery),
               DYN_REQUEST_PLANE="tcp", DYN_EVENT_PLANE="zmq")
    return env


@pytest.fixture(scope="module")
def client_for(discovery: Path) -> Iterator[Callable[[str], Any]]:
    """``client_for(endpoint)``: a ready Dynamo client (one per endpoint, closed at the end)."""
    from worker_sdk.dynamo.client import Client

    clients: dict[str, Client] = {}

    def get(endpoint: str) -> Client:
        if endpoint not in clients:
            clients[endpoint] = Client(endpoint, discovery_dir=str(discovery))
        client = clients[endpoint]
        wait_until(lambda: _has_instance(client), 60, f"{endpoint} to be served")
        return client

    yield get
    for client in clients.values():
        client.close()


def _has_instance(client: Any) -> bool:
    try:
        client.wait_for_instances(timeout=0.25)
    except TimeoutError:
        return False
    return True


@pytest.fixture(scope="module")
@spawns
def engine(discovery: Path) -> Iterator[Served]:
    """One ``vramtui --serve --dynamo t`` for the module's tests."""
    root = new_root()
    served = start_serve(dynamo_env(root, discovery), root, "--dynamo", NS)
    yield served
    reap(served)


@pytest.fixture(scope="module")
def control(engine: Served) -> Iterator[ControlClient]:
    client = engine.client()
    yield client
    engine.note_workers(client)
    client.close()


def dynamo_job(control: ControlClient, request_id: str) -> JobView | None:
    """The engine's job for the Dynamo request ``request_id`` (queued, running or recent)."""
    snap = control.snapshot()
    for view in (*snap.running, *snap.queued, *snap.recent):
        mark = view.metadata.get("dynamo")
        if isinstance(mark, dict) and mark.get("request_id") == request_id:
            return view
    return None


def in_state(control: ControlClient, request_id: str, *states: JobState) -> JobView | None:
    view = dynamo_job(control, request_id)
    return view if view is not None and view.state in states else None


def status(client_for: Callable[[str], Any], backend: str) -> dict[str, Any]:
    [answer] = client_for(f"{NS}.{backend}.status").call(None)
    return answer


def entries(discovery: Path, namespace: str) -> list[str]:
    """The discovery files (instances) of ``namespace``."""
    return sorted(str(p.relative_to(discovery)) for p in discovery.rglob("*")
                  if p.is_file() and urllib.parse.unquote(p.name).startswith(namespace + "/"))


def test_a_dynamo_that_cannot_start_stops_the_engine_with_exit_1(discovery: Path) -> None:
    root = new_root()
    try:
        env = dynamo_env(root, discovery) | {"DYN_DISCOVERY_BACKEND": "nonsense"}
        done = cli(env, "--serve", "--gpus", "sim:8GiB", "--backends",
                   env["VRAMTUI_TEST_BACKENDS"], "--dynamo", NS)
        assert done.returncode == 1, done.stderr
        assert done.stderr.splitlines()[-1] == (
            "vramtui --serve: Dynamo could not start: Unknown key-value store type 'nonsense'")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_replies_and_streams_take_the_raw_shapes_and_show_as_jobs(
        engine: Served, control: ControlClient, client_for: Callable[[str], Any]) -> None:
    client = client_for(f"{NS}.echo.generate")
    binary = b"\x00\xff" + bytes(range(256))
    [reply] = client.call(binary, request_id="bin-1", metadata={"who": "test"})
    assert raw_bytes(reply) == binary
    assert reply["encoding"] == "base64" and reply["status_code"] == 200
    assert reply["headers"] == {}

    [reply] = client.call({"hello": "dynamo"})
    assert reply["headers"] == {"Content-Type": "application/json"}
    assert json.loads(raw_bytes(reply)) == {"echo": {"hello": "dynamo"}}

    chunks = client.call({"stream": 3})
    assert [raw_bytes(c) for c in chunks] == [b"chunk 0\n", b"chunk 1\n", b"chunk 2\n"]
    assert all(set(c) == {"data", "encoding"} for c in chunks)

    with pytest.raises(Exception, match='"code":400'):
        client.call({"b64": "not base64!"})

    view = dynamo_job(control, "bin-1")  # a job like any other, with where it came from
    assert view is not None and view.state is JobState.SUCCEEDED and view.backend == "echo"
    assert view.metadata["who"] == "test"
    assert view.metadata["dynamo"]["endpoint"] == f"{NS}.echo.generate"
    listed = cli(engine.env, "jobs", "--json")
    assert listed.returncode == 0, listed.stderr
    assert view.id in listed.stdout


def test_a_dynamo_request_waits_in_the_queue_behind_a_local_job_then_runs(
        engine: Served, control: ControlClient, client_for: Callable[[str], Any]) -> None:
    client = client_for(f"{NS}.big-b.generate")
    client_for(f"{NS}.big-a.status")
    client_for(f"{NS}.big-b.status")
    local = control.submit("big-a", json.dumps({"steps": 40, "step_s": 0.05}).encode())
    wait_until(lambda: control.job(local).state is JobState.RUNNING, 30, "the local job to run")

    stream = client.stream({"steps": 2, "step_s": 0.02}, request_id="behind", timeout=60)

    def waiting() -> JobView | None:  # queued, with why: big-a holds the memory it needs
        view = in_state(control, "behind", JobState.QUEUED)
        return view if view is not None and view.waiting else None

    queued = wait_until(waiting, 10, "the Dynamo job waiting in the queue")
    assert status(client_for, "big-b") | {"instance_id": 0} == {
        "backend": "big-b", "hot": False, "state": "cold", "queued": 1, "running": 0,
        "gpu": None, "stopping": False, "instance_id": 0}
    assert status(client_for, "big-a")["hot"] is True
    shown = cli(engine.env, "queue", "--json")  # the CLI shows it like any queued job
    assert shown.returncode == 0 and queued.id in shown.stdout, shown.stderr

    [reply] = list(stream)
    body = json.loads(raw_bytes(reply))
    assert reply["status_code"] == 200 and body["backend"] == "big-b"
    assert body["metadata"]["dynamo"]["request_id"] == "behind"
    first, then = control.job(local), control.job(queued.id)
    assert first.state is JobState.SUCCEEDED and then.state is JobState.SUCCEEDED
    assert first.finished_at is not None and then.started_at is not None
    assert then.started_at >= first.finished_at  # it ran once the local job had ended
    hot = status(client_for, "big-b")
    assert hot["hot"] is True and hot["state"] == "ready" and hot["gpu"] == 0
    assert status(client_for, "big-a")["hot"] is False  # evicted to make room
    engine.note_workers(control)


def test_dynamo_stop_cancels_the_job_running_or_queued(
        engine: Served, control: ControlClient, client_for: Callable[[str], Any]) -> None:
    client = client_for(f"{NS}.slow.generate")
    stream = client.stream(SLOW, request_id="stop-running")
    running = wait_until(lambda: in_state(control, "stop-running", JobState.RUNNING), 30,
                       "the Dynamo job to run")
    stream.cancel()
    assert list(stream) == []
    wait_until(lambda: control.job(running.id).state is JobState.CANCELLED, 15,
             "the running job to be cancelled")

    local = control.submit("slow", json.dumps(SLOW).encode())
    wait_until(lambda: control.job(local).state is JobState.RUNNING, 30, "the local job to run")
    stream = client.stream({"steps": 1}, request_id="stop-queued")
    queued = wait_until(lambda: in_state(control, "stop-queued", JobState.QUEUED), 10,
                      "the Dynamo job in the queue")
    stream.cancel()
    assert list(stream) == []
    wait_until(lambda: control.job(queued.id).state is JobState.CANCELLED, 15,
             "the queued job to be cancelled")
    assert control.job(local).state is JobState.RUNNING  # the local job is untouched
    control.cancel(local)
    engine.note_workers(control)


def test_failures_refusals_and_local_cancels_reach_the_dynamo_client(
        engine: Served, control: ControlClient, client_for: Callable[[str], Any]) -> None:
    slow = client_for(f"{NS}.slow.generate")
    with pytest.raises(Exception, match=r'simulated failure half-way.*"code":500'):
        slow.call({"steps": 4, "fail": True}, request_id="fails")
    assert in_state(control, "fails", JobState.FAILED)
    with pytest.raises(RequestError, match=r'huge.*"code":507') as refused:
        client_for(f"{NS}.huge.generate").call(b"")
    info = refused.value.info  # machine-readable: another box may have a larger GPU
    assert (info.error_class, info.code, info.reason) == ("Unavailable", 507, "cannot_run_here")
    assert info.try_another_instance and info.retry_after_s is None  # never here again
    assert info.instance_id == status(client_for, "huge")["instance_id"] != 0

    stream = slow.stream(SLOW, request_id="cancelled-here")
    running = wait_until(lambda: in_state(control, "cancelled-here", JobState.RUNNING), 30,
                       "the Dynamo job to run")
    done = cli(engine.env, "cancel", running.id)  # cancelled here, through the CLI
    assert done.returncode == 0, done.stderr
    with pytest.raises(Exception, match="cancelled"):
        list(stream)
    engine.note_workers(control)


def test_a_full_queue_is_a_machine_readable_503_and_the_caller_retries_on_another_box(
        discovery: Path, client_for: Callable[[str], Any]) -> None:
    namespace = "rq"
    roots = [new_root(), new_root()]
    busy_env = dynamo_env(roots[0], discovery)  # its queue limit from config.yaml
    Path(busy_env["VRAMTUI_CONFIG_DIR"]).mkdir(parents=True, exist_ok=True)
    Path(busy_env["VRAMTUI_CONFIG_DIR"], "config.yaml").write_text("engine:\n  max_queue: 1\n")
    busy = start_serve(busy_env, roots[0], "--dynamo", namespace)
    free = start_serve(dynamo_env(roots[1], discovery), roots[1], "--dynamo", namespace)
    controls = [busy.client(), free.client()]
    try:
        a, b = controls
        client = client_for(f"{namespace}.slow.generate")
        wait_until(lambda: len(client.instance_ids()) == 2, 30, "both engines as instances")
        running = a.submit("slow", json.dumps(SLOW).encode())
        wait_until(lambda: a.job(running).state is JobState.RUNNING, 30, "the busy box's job")
        waiting = a.submit("slow", json.dumps(SLOW).encode())  # the queue (limit 1) is full
        full = cli(busy.env, "submit", "slow", "--data", "{}")  # the CLI is refused too
        assert full.returncode == 5 and "queue full" in full.stderr, full.stderr
        probe = client_for(f"{namespace}.slow.status")
        by_queue = {probe.call(None, instance_id=i)[0]["queued"]: i
                    for i in client.instance_ids()}
        a_id, b_id = by_queue[1], by_queue[0]
        assert probe.call(None, instance_id=b_id)[0]["instance_id"] == b_id != a_id

        with pytest.raises(RequestError) as refused:
            client.call({"steps": 1}, instance_id=a_id, request_id="refused")
        assert str(refused.value).startswith('Unavailable: {"message":"queue full')
        info = refused.value.info
        assert (info.error_class, info.code, info.reason) == ("Unavailable", 503, "queue_full")
        assert info.try_another_instance and info.retry_after_s == 1.0
        assert info.instance_id == a_id and info.extra == {"backend": "slow"}
        assert dynamo_job(a, "refused") is None  # refused before it became a job

        [reply] = client.call({"steps": 1}, instance_id=a_id, retries=1, request_id="retried")
        assert json.loads(raw_bytes(reply))["metadata"]["dynamo"]["request_id"] == "retried"
        assert in_state(b, "retried", JobState.SUCCEEDED) and dynamo_job(a, "retried") is None

        # Dynamo's own router now leaves the refusing box out: plain calls land on the other.
        for n in range(3):
            client.call({"steps": 1}, request_id=f"routed-{n}")
            assert in_state(b, f"routed-{n}", JobState.SUCCEEDED), n
        for control, served in ((a, busy), (b, free)):
            served.note_workers(control)
        a.cancel(waiting)
        a.cancel(running)
    finally:
        for control in controls:
            control.close()
        reap(busy)
        reap(free)


def test_sigterm_answers_waiting_requests_leaves_no_discovery_entry_and_no_orphan(
        discovery: Path, client_for: Callable[[str], Any]) -> None:
    namespace = "term"
    root = new_root()
    env = dynamo_env(root, discovery)
    served = start_serve(env, root, "--dynamo", namespace)
    again: Served | None = None
    try:
        control = served.client()
        client = client_for(f"{namespace}.slow.generate")
        assert any("slow" in e for e in entries(discovery, namespace))
        local = control.submit("slow", json.dumps({"steps": 30, "step_s": 0.05}).encode())
        wait_until(lambda: control.job(local).state is JobState.RUNNING, 30, "the local job")
        stream = client.stream({"steps": 1}, request_id="at-sigterm", timeout=30)
        waiting = wait_until(lambda: in_state(control, "at-sigterm", JobState.QUEUED), 10,
                           "the Dynamo job in the queue")
        served.note_workers(control)
        control.close()
        served.proc.send_signal(signal.SIGTERM)
        with pytest.raises(Exception, match=r'engine stopped.*"code":503'):
            list(stream)  # answered at once; the local job still has its grace
        assert served.wait_exit(60) == 0, served.stderr()
        assert entries(discovery, namespace) == []  # no stale discovery entry
        wait_until(lambda: client.instance_ids() == [], 15, "the client to see no instance")
        err = served.stderr()  # Dynamo 1.6.1 prints the traceback of what a handler raises:
        assert err.count("Traceback") == err.count('EngineUnavailable: {"message":"job '), err

        # A Dynamo request is not journaled (its caller went with the engine): the next
        # engine does not run it, while the local job it interrupted... had finished.
        again = start_serve(env, root, "--dynamo", namespace)
        control = again.client()
        with pytest.raises(UnknownJob):
            control.job(waiting.id)
        assert control.job(local).state is JobState.SUCCEEDED
        control.close()
    finally:
        if again is not None:
            reap(again)
        reap(served)


@pytest.mark.process
def test_nothing_else_imports_dynamo() -> None:
    code = ("import sys, vramtui.serve, supervisor.doors.dynamo, supervisor.facade; "
            "print(sorted(m for m in sys.modules if m == 'dynamo' or m.startswith('dynamo.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
