"""worker_sdk.dynamo: decorated workers served as NVIDIA Dynamo endpoints, for real.

Workers are real ``python -m worker_sdk.dynamo`` processes (``spawn_worker`` from conftest);
the client is :class:`worker_sdk.dynamo.client.Client`, a real Dynamo runtime on a background
thread of the test process.  Discovery is a file directory under /tmp and requests travel on
Dynamo's TCP request plane: no etcd, no NATS.  Every wait polls a condition with a deadline.
The shaping tests at the top need no Dynamo; the rest skip when ``ai-dynamo-runtime`` is not
installed (``.ci/run`` installs it with the ``dynamo`` extra).
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spawning import spawns
from waiting import wait_until

from worker_sdk import Response
from worker_sdk.dynamo import MISSING_MESSAGE, DynamoWorkerConfig
from worker_sdk.dynamo.shapes import (
    ReplyError,
    ReplyStatus,
    ShapeError,
    Shaper,
    raw_bytes,
    request_payload,
)

ROOT = Path(__file__).resolve().parents[1]
ECHO = ROOT / "examples" / "echo" / "main.py"
TOY = ROOT / "examples" / "dynamo" / "main.py"
WORKERS = Path(__file__).resolve().parent / "workers"


# -- shaping, no Dynamo -----------------------------------------------------------------------
def test_raw_requests_become_predict_bytes() -> None:
    assert request_payload("raw", b"\x00\xff") == b"\x00\xff"
    assert request_payload("raw", "héllo") == "héllo".encode()
    assert request_payload("raw", {"b64": base64.b64encode(b"\x01\x02").decode()}) == b"\x01\x02"
    assert request_payload("raw", {"stream": 3}) == b'{"stream":3}'
    assert request_payload("raw", None) == b""
    with pytest.raises(ShapeError):
        request_payload("raw", {"b64": "not base64!"})
    with pytest.raises(ShapeError):
        request_payload("embedding", {"prompt": "no input"})
    with pytest.raises(ShapeError):
        request_payload("image", b"not an object")
    # a typed request reaches a decorated predict as the JSON it came as, unknown fields kept
    assert request_payload("image", {"prompt": "a cat", "x": 1}) == b'{"prompt":"a cat","x":1}'
    with pytest.raises(ShapeError, match="'n'"):
        request_payload("image", {"prompt": "a cat", "n": 99})


def test_replies_take_each_type_shape() -> None:
    raw = Shaper("raw", model="m")
    assert raw.reply(b"\xff\x00") == {
        "data": "/wA=", "encoding": "base64", "headers": {}, "status_code": 200
    }
    reply = raw.reply(Response(b"nope", {"X": "1"}, status_code=503))
    assert reply == {"data": "nope", "encoding": "utf-8", "headers": {"X": "1"}, "status_code": 503}
    assert raw_bytes(raw.chunk(b"\xff")) == b"\xff"
    with pytest.raises(ReplyError):
        raw.reply("a str is not bytes")

    embedding = Shaper("embedding", model="m", request={"input": ["a", "b"], "model": "asked"})
    first = embedding.chunk(b"[[1, 0], [0, 1]]")
    second = embedding.chunk([0.5, 0.5])  # the Python API may return plain lists
    assert first["model"] == "asked" and first["object"] == "list"
    assert [d["index"] for d in first["data"] + second["data"]] == [0, 1, 2]
    with pytest.raises(ReplyError):
        embedding.reply(b"not json")
    with pytest.raises(ReplyStatus):
        embedding.reply(Response(b"too long", status_code=413))

    image = Shaper("image", model="m", clock=lambda: 1000.0)
    assert image.reply(b"PNG") == {"created": 1000, "data": [{"b64_json": "UE5H"}]}
    passthrough = Response(b'{"data": []}', {"Content-Type": "application/json"})
    assert image.reply(passthrough) == {"data": []}

    video = Shaper("video", model="m", request={"output_format": "webm"}, request_id="r1")
    assert video.progress(0.5, "half") is None  # progress items are opt-in
    video.stream_progress = True
    assert video.progress(0.5, "half")["status"] == "in_progress"
    done = video.reply(b"VID")
    assert done["id"] == "video-r1" and done["status"] == "completed" and done["progress"] == 100
    assert done["data"] == [{"b64_json": "VklE", "output_format": "webm"}]


def test_config_validates() -> None:
    with pytest.raises(ValueError, match="NAMESPACE.COMPONENT.ENDPOINT"):
        DynamoWorkerConfig("raw", None, endpoint="two.parts")
    with pytest.raises(ValueError, match="type"):
        DynamoWorkerConfig(type="audio", model_path="m")
    with pytest.raises(ValueError, match="names namespace 'ns'"):
        DynamoWorkerConfig("raw", None, namespace="other", endpoint="ns.comp.ep")
    with pytest.raises(ValueError, match="component"):
        DynamoWorkerConfig("raw", None, component="a.b")
    config = DynamoWorkerConfig(endpoint="dyn://ns.comp.ep", type="image", model_path="org/m")
    assert (config.namespace, config.component, config.endpoint) == ("ns", "comp", "ep")
    assert config.path == "ns.comp.ep"
    assert config.registers and config.served_model_name == "org/m"
    assert not DynamoWorkerConfig("raw", None).registers


@pytest.mark.process
def test_missing_dynamo_is_one_line_and_exit_2() -> None:
    code = (
        "import runpy, sys; sys.modules['dynamo'] = None; "
        "runpy.run_module('worker_sdk.dynamo', run_name='__main__', alter_sys=True)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(ECHO), "--endpoint", "a.b.c"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == MISSING_MESSAGE + "\n"


@pytest.mark.process
def test_a_runtime_that_cannot_start_is_one_line_and_exit_4() -> None:
    pytest.importorskip("dynamo.runtime", reason="needs ai-dynamo-runtime (the dynamo extra)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    env.update(DYN_DISCOVERY_BACKEND="no-such-backend", DYN_LOG="error",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "worker_sdk.dynamo", str(ECHO), "--endpoint", "a.b.c"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )
    assert proc.returncode == 4, proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if "worker_sdk.dynamo" in x]
    assert line.endswith("cannot start the Dynamo runtime (discovery no-such-backend): "
                         "Unknown key-value store type 'no-such-backend'"), proc.stderr


@pytest.mark.process
def test_nothing_imports_dynamo_until_it_is_used() -> None:
    code = (
        "import sys, worker_sdk, worker_sdk.dynamo, worker_sdk.dynamo.shapes, "
        "worker_sdk.dynamo.client, worker_sdk.dynamo.server, worker_sdk.dynamo.worker, "
        "worker_sdk.dynamo.errors, worker_sdk.dynamo.config, worker_sdk.dynamo.loader; "
        "print(sorted(m for m in sys.modules if m == 'dynamo' or m.startswith('dynamo.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- real Dynamo ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
@spawns
def discovery() -> Iterator[Path]:
    """The file-discovery directory every worker and client of this module shares."""
    pytest.importorskip("dynamo.runtime", reason="needs ai-dynamo-runtime (the dynamo extra)")
    path = Path(tempfile.mkdtemp(prefix="vtd-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def client_for(discovery: Path) -> Iterator[Callable[[str], Any]]:
    """``client_for(endpoint)``: a Dynamo client (one per endpoint, closed at the end)."""
    from worker_sdk.dynamo.client import Client

    clients: dict[str, Client] = {}

    def get(endpoint: str) -> Client:
        if endpoint not in clients:
            clients[endpoint] = Client(endpoint, discovery_dir=str(discovery))
        return clients[endpoint]

    yield get
    for client in clients.values():
        client.close()


def entries(discovery: Path, endpoint: str) -> list[str]:
    """The discovery files (instances, model cards) of ``endpoint``'s workers."""
    prefix = "/".join(endpoint.split(".")) + "/"
    return sorted(
        str(p.relative_to(discovery))
        for p in discovery.rglob("*")
        if p.is_file() and urllib.parse.unquote(p.name).startswith(prefix)
    )


@pytest.fixture
def serve(
    spawn_worker: Callable[..., Any], discovery: Path, client_for: Callable[[str], Any]
) -> Callable[..., tuple[Any, Any]]:
    """``serve(script, endpoint, *flags, env=None)`` -> (worker process, its ready client)."""

    def start(
        script: Path | str, endpoint: str, *flags: str, env: dict[str, str] | None = None
    ) -> tuple[Any, Any]:
        proc = spawn_worker(
            script, None, None, "--endpoint", endpoint, "--discovery-dir", str(discovery),
            *flags, module="worker_sdk.dynamo", env=env,
        )
        client = client_for(endpoint)

        def ready() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"worker exited with {proc.returncode}:\n{proc.output()}")
            try:
                client.wait_for_instances(timeout=0.25)
            except TimeoutError:
                return False
            return True

        wait_until(ready, 60, f"{endpoint} to be served")
        return proc, client

    return start


def _free_port() -> int:
    """A free TCP port below 32768: Dynamo 1.6.1 parses DYN_SYSTEM_PORT as an i16."""
    for port in random.Random().sample(range(20_000, 32_768), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    pytest.fail("no free port below 32768")


@pytest.mark.process
def test_raw_bytes_json_and_stream_from_the_echo_example(serve: Callable[..., Any]) -> None:
    port = _free_port()
    _proc, client = serve(ECHO, "t.echo.generate", env={"DYN_SYSTEM_PORT": str(port)})

    binary = b"\x00\xff" + bytes(range(256))
    [reply] = client.call(binary)
    assert raw_bytes(reply) == binary
    assert reply["encoding"] == "base64" and reply["status_code"] == 200

    [reply] = client.call({"hello": "dynamo"})
    assert reply["headers"] == {"Content-Type": "application/json"}
    assert json.loads(raw_bytes(reply)) == {"echo": {"hello": "dynamo"}}

    chunks = client.call({"stream": 3})
    assert b"".join(raw_bytes(c) for c in chunks) == b"chunk 0\nchunk 1\nchunk 2\n"
    assert all(set(c) == {"data", "encoding"} for c in chunks)

    url = f"http://127.0.0.1:{port}/engine/hardware_health"
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert json.load(answer) == {"status": "ok", "device": "cpu"}


def test_embedding_shape_and_registration(serve: Callable[..., Any], discovery: Path) -> None:
    endpoint = "t.embedder.generate"
    _proc, client = serve(TOY, endpoint, "--type", "embedding", "--model-name", "toy-embedder")

    [reply] = client.call({"model": "toy-embedder", "input": ["a", "b"], "dimensions": 4})
    assert reply["object"] == "list" and reply["model"] == "toy-embedder"
    assert [d["index"] for d in reply["data"]] == [0, 1]
    for item in reply["data"]:
        assert item["object"] == "embedding" and len(item["embedding"]) == 4
        assert math.isclose(sum(x * x for x in item["embedding"]), 1.0, rel_tol=1e-4)
    assert reply["usage"] == {"prompt_tokens": 0, "total_tokens": 0}

    with pytest.raises(Exception, match='"code":400'):
        client.call({"prompt": "not an embedding request"})

    [card] = [p for p in entries(discovery, endpoint) if p.startswith("v1/mdc/")]
    card_json = json.loads((discovery / card).read_text())["card_json"]
    assert card_json["display_name"] == "toy-embedder"
    assert card_json["model_type"] == "Embedding" and card_json["model_input"] == "Text"


@pytest.mark.process
@pytest.mark.parametrize("kind", ["image", "video"])
def test_image_and_video_come_back_as_b64_json(serve: Callable[..., Any], kind: str) -> None:
    _proc, client = serve(TOY, f"t.{kind}.generate", "--type", kind, "--progress")
    if kind == "image":
        items = client.call({"prompt": "a cat", "size": "4x4", "n": 2})
        assert len(items) == 2  # streamed: one image per item, the frontend merges ``data``
        for item in items:
            png = base64.b64decode(item["data"][0]["b64_json"])
            assert png.startswith(b"\x89PNG\r\n\x1a\n")
    else:
        *updates, done = client.call({"prompt": "a cat", "seconds": 1})  # with --progress
        assert [u["progress"] for u in updates] == [25, 50, 75, 100]
        assert all(u["status"] == "in_progress" and u["data"] == [] for u in updates)
        assert done["status"] == "completed" and done["object"] == "video"
        assert base64.b64decode(done["data"][0]["b64_json"]).endswith(b"a cat")
        assert done["data"][0]["output_format"] == "mp4" and "inference_time_s" in done


@pytest.mark.process
def test_dynamo_stop_cancels_the_request_context(serve: Callable[..., Any]) -> None:
    proc, client = serve(TOY, "t.ticks.generate")
    stream = client.stream({"ticks": 10_000, "interval": 0.05}, request_id="tick-req")
    assert [raw_bytes(next(stream)) for _ in range(2)] == [b"tick 0\n", b"tick 1\n"]
    stream.cancel()
    list(stream)  # ends, without the 10,000 ticks
    wait_until(lambda: "request tick-req cancelled after" in proc.output(), 30,
               "the worker's cancel")
    [reply] = client.call(b"next")  # the predict thread is free again
    assert raw_bytes(reply) == b"next"


@pytest.mark.process
def test_async_predict_sees_request_id_and_cancel(serve: Callable[..., Any]) -> None:
    proc, client = serve("async_worker.py", "t.async.generate", "--progress")
    [reply] = client.call(b"hello", request_id="req-42", metadata={"who": "test"})
    assert raw_bytes(reply) == b"async:hello:req-42"
    chunks = client.call(b'{"op": "stream", "n": 3}')
    assert [raw_bytes(c) for c in chunks] == [b"async 0", b"async 1", b"async 2"]

    stream = client.stream(b'{"op": "block"}')
    assert next(stream) == {"progress": None, "message": "started"}
    stream.cancel()
    assert list(stream) == []
    wait_until(lambda: proc.marker("async_cancelled"), 30, "the async predict's CancelledError")

    with pytest.raises(Exception, match="KeyError"):
        client.call(b'{"op": "error"}')


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_leaves_no_discovery_entry(
    serve: Callable[..., Any], discovery: Path, sig: signal.Signals
) -> None:
    endpoint = f"t.sig{int(sig)}.generate"
    proc, client = serve(TOY, endpoint, "--type", "embedding")
    found = entries(discovery, endpoint)
    assert any(p.startswith("v1/instances/") for p in found), found
    assert any(p.startswith("v1/mdc/") for p in found), found

    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 0, proc.output()
    assert entries(discovery, endpoint) == []
    assert "toy worker unloaded" in proc.output()
    wait_until(lambda: client.instance_ids() == [], 30, "the client to see no instance")


@pytest.mark.process
def test_sigterm_drains_then_cancels(serve: Callable[..., Any]) -> None:
    proc, client = serve(TOY, "t.drain.generate", "--drain-timeout", "30")
    stream = client.stream({"ticks": 8, "interval": 0.05})
    next(stream)
    proc.send_signal(signal.SIGTERM)
    assert len(list(stream)) == 7  # the request in flight finishes
    assert proc.wait(timeout=30) == 0, proc.output()

    proc, client = serve(TOY, "t.cut.generate", "--drain-timeout", "0.3")
    stream = client.stream({"ticks": 10_000, "interval": 0.05})
    next(stream)
    proc.send_signal(signal.SIGTERM)
    with pytest.raises(Exception, match="Cancelled"):
        list(stream)
    assert proc.wait(timeout=30) == 0, proc.output()
    # The drain timeout cut it (the worker's own "cancelled after" line is printed only when
    # the cancel finds it waiting between ticks, not when it lands while a tick is handed on).
    assert "(shutdown)" in proc.output() and "cancelling request" in proc.output()


def test_initialize_failure_exits_3_unregistered(
    spawn_worker: Callable[..., Any], discovery: Path
) -> None:
    proc = spawn_worker(
        "init_fail.py", None, None, "--endpoint", "t.initfail.generate",
        "--discovery-dir", str(discovery), module="worker_sdk.dynamo",
    )
    assert proc.wait(timeout=60) == 3, proc.output()
    assert "initialize failed: RuntimeError: model weights missing" in proc.output()
    assert proc.marker("unload") == ""
    assert entries(discovery, "t.initfail.generate") == []


def test_python_api_serves_a_plain_function(
    discovery: Path, client_for: Callable[[str], Any], tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["WORKER_MARKER_DIR"] = str(tmp_path)
    env["DYN_LOG"] = "warn"
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(WORKERS / "dynamo_api.py"), "t.api.generate", str(discovery)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )
    try:
        client = client_for("t.api.generate")

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                client.wait_for_instances(timeout=0.25)
            except TimeoutError:
                return False
            return True

        wait_until(ready, 60, "the API worker")
        [reply] = client.call({"text": "hi"}, request_id="r7")
        assert raw_bytes(reply) == b"HI!r7"
        assert (tmp_path / "init").read_text() == "init\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
        assert (tmp_path / "unload").read_text() == "unload\n"
        assert entries(discovery, "t.api.generate") == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_dynamos_openai_frontend_serves_each_type(
    serve: Callable[..., Any], discovery: Path, tmp_path: Path
) -> None:
    """Dynamo's own HTTP frontend (ai-dynamo-runtime) finds the registered workers by name."""
    for kind in ("embedding", "image", "video"):
        serve(TOY, f"fe.{kind}.generate", "--type", kind, "--model-name", f"toy-{kind}")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["DYN_LOG"] = "warn"
    log = tmp_path / "frontend.log"
    with open(log, "wb") as out:
        frontend = subprocess.Popen(
            [sys.executable, str(WORKERS / "dynamo_frontend.py"), str(port), str(discovery)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )
    base = f"http://127.0.0.1:{port}/v1"

    def post(path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(
            base + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    def models() -> set[str]:
        assert frontend.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(base + "/models", timeout=5) as answer:
                return {m["id"] for m in json.load(answer)["data"]}
        except OSError:
            return set()

    try:
        wait_until(lambda: {"toy-embedding", "toy-image", "toy-video"} <= models(), 30,
                   "the models")
        embedded = post("/embeddings", {"model": "toy-embedding", "input": ["a", "b"]})
        assert [d["index"] for d in embedded["data"]] == [0, 1]
        assert len(embedded["data"][0]["embedding"]) == 8
        images = post("/images/generations", {"model": "toy-image", "prompt": "cat", "n": 2})
        assert len(images["data"]) == 2
        assert base64.b64decode(images["data"][1]["b64_json"]).startswith(b"\x89PNG")
        video = post("/videos", {"model": "toy-video", "prompt": "cat", "seconds": 1})
        assert video["status"] == "completed" and video["progress"] == 100
        assert base64.b64decode(video["data"][0]["b64_json"]).endswith(b"cat")
    finally:
        frontend.send_signal(signal.SIGTERM)
        try:
            frontend.wait(timeout=20)
        except subprocess.TimeoutExpired:
            frontend.kill()
            frontend.wait(timeout=10)
