"""AITune users' code, as the ``aitune.dynamo.worker`` page documents it, run on worker_sdk.dynamo.

The scripts in tests/workers/aitune_*.py are written against AITune's API with only the import
changed; each runs as a real process on the real Dynamo runtime (file discovery in a directory
under /tmp, the TCP request plane: no etcd, no NATS), all started at once and shared by this
module.  Answers are read by two clients: :class:`worker_sdk.dynamo.client.Client` (a Dynamo
runtime in this process) and Dynamo's own OpenAI frontend (ai-dynamo-runtime), and their
content is checked: how many embeddings, of what width, which vector for which input.  The
start-up validation (``ValueError``, ``ImportError``) needs no runtime and runs in this process.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import types
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from spawning import spawns
from waiting import wait_until

from worker_sdk.dynamo import DynamoMissing, DynamoWorker, DynamoWorkerConfig, dynamo_worker

ROOT = Path(__file__).resolve().parents[1]
WORKERS = Path(__file__).resolve().parent / "workers"
SCRIPTS = ("aitune_embedder.py", "aitune_positional.py", "aitune_painter.py",
           "aitune_subclass.py")


# -- no runtime -------------------------------------------------------------------------------
def test_the_config_takes_aitunes_fields_order_and_defaults() -> None:
    config = DynamoWorkerConfig("embedding", "org/m")
    assert (config.type, config.model_path, config.mapping) == ("embedding", "org/m", None)
    assert (config.namespace, config.component, config.endpoint) == ("aitune", "backend",
                                                                     "generate")
    assert config.enable_nats is False and config.model_name is None
    assert config.served_model_name == "org/m"
    mapping = dict
    full = DynamoWorkerConfig("image", "org/i", mapping, "ns", "comp", "ep", True, "shown")
    assert full.path == "ns.comp.ep" and full.mapping is mapping and full.enable_nats
    assert full.served_model_name == "shown"
    with pytest.raises(TypeError):  # ours are keyword-only: a 9th positional is an error
        DynamoWorkerConfig("image", "org/i", None, "ns", "comp", "ep", False, None, 2)
    with pytest.raises(TypeError):  # type and model_path are required, as in AITune
        DynamoWorkerConfig(type="embedding")  # type: ignore[call-arg]


def test_a_torch_module_without_mapping_is_refused_before_dynamo_is_even_imported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # torch is not a dependency here: a stand-in module named torch provides nn.Module, which
    # is all the check looks at (sys.modules["torch"].nn.Module, never an import of torch).
    torch = types.ModuleType("torch")
    torch.nn = types.SimpleNamespace(Module=type("Module", (), {"__call__": lambda s: None}))
    monkeypatch.setitem(sys.modules, "torch", torch)
    # No Dynamo (the check comes first), even if an earlier test imported it in this process;
    # and should the block fail, an unknown discovery backend fails fast instead of serving.
    names = {n for n in sys.modules if n == "dynamo" or n.startswith("dynamo.")}
    for name in names | {"dynamo", "dynamo.llm", "dynamo.llm.exceptions", "dynamo.runtime"}:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setenv("DYN_DISCOVERY_BACKEND", "no-such-backend")
    model = torch.nn.Module()
    config = DynamoWorkerConfig("embedding", "org/m")
    with pytest.raises(ValueError, match="mapping function is required"):
        dynamo_worker(model, config)
    with_mapping = DynamoWorkerConfig("embedding", "org/m", mapping=lambda r: {"x": r.input})
    with pytest.raises(ImportError, match="ai-dynamo-runtime"):  # AITune's ImportError
        dynamo_worker(model, with_mapping)
    with pytest.raises(DynamoMissing):  # a plain function needs no mapping, only Dynamo
        dynamo_worker(lambda request: [0.0], config)
    with pytest.raises(ValueError, match="type must be one of"):
        DynamoWorkerConfig("audio", "org/m")


def test_the_base_class_is_aitunes() -> None:
    assert (DynamoWorker.namespace, DynamoWorker.component, DynamoWorker.endpoint_name) == (
        "aitune", "backend", "generate")
    with pytest.raises(NotImplementedError):
        DynamoWorker().setup()


def test_typed_requests_read_as_objects_and_as_their_json() -> None:
    pytest.importorskip("pydantic")
    from worker_sdk.dynamo.requests import EmbeddingRequest, parse_request
    from worker_sdk.dynamo.shapes import ShapeError

    request = parse_request("embedding", {"input": ["a", "b"], "model": "m", "extra": 1})
    assert isinstance(request, EmbeddingRequest)
    assert request.input == ["a", "b"] and request["input"] == ["a", "b"]
    assert request.get("dimensions", 8) == 8 and "dimensions" not in request
    assert request.model_extra == {"extra": 1} and request.texts == ["a", "b"]
    assert parse_request("embedding", {"input": "one"}).texts == ["one"]
    image = parse_request("image", {"prompt": "a cat", "size": "4x4"})
    assert (image.prompt, image.size, image.n) == ("a cat", "4x4", None)
    with pytest.raises(ShapeError, match="'input'"):
        parse_request("embedding", {"prompt": "not an embedding request"})
    with pytest.raises(ShapeError, match="'input'"):
        parse_request("embedding", {"input": []})
    with pytest.raises(ShapeError, match="JSON object"):
        parse_request("video", b"bytes")


# -- the real runtime ---------------------------------------------------------------------------
class Fleet:
    """The AITune scripts and Dynamo's frontend, as processes sharing one discovery directory."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="vta-", dir="/tmp"))
        self.discovery = self.dir / "discovery"
        self.notes = self.dir / "notes.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "VRAMTUI_"))}
        env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
                   DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(self.discovery),
                   DYN_REQUEST_PLANE="tcp", DYN_EVENT_PLANE="zmq", DYN_LOG="warn",
                   AITUNE_TEST_NOTES=str(self.notes))
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = _free_port()
        for script in SCRIPTS:
            self._spawn(script, [str(WORKERS / script)])
        self._spawn("frontend", [str(WORKERS / "dynamo_frontend.py"), str(self.port),
                                 str(self.discovery)])

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.dir / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen([sys.executable, *args], stdout=log,
                                                stderr=subprocess.STDOUT, env=self.env,
                                                cwd=self.dir)

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def alive(self, name: str) -> None:
        proc = self.procs[name]
        if proc.poll() is not None:
            pytest.fail(f"{name} exited with {proc.returncode}:\n{self.log(name)}")

    def notes_seen(self) -> list[dict[str, Any]]:
        if not self.notes.exists():
            return []
        return [json.loads(line) for line in self.notes.read_text().splitlines()]

    def entries(self, endpoint: str) -> list[str]:
        prefix = "/".join(endpoint.split(".")) + "/"
        return sorted(str(p.relative_to(self.discovery)) for p in self.discovery.rglob("*")
                      if p.is_file() and urllib.parse.unquote(p.name).startswith(prefix))

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _free_port() -> int:
    import random
    import socket

    for port in random.Random().sample(range(20_000, 32_768), 200):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail("no free port below 32768")


@pytest.fixture(scope="module")
@spawns
def fleet() -> Iterator[Fleet]:
    pytest.importorskip("dynamo.runtime", reason="needs ai-dynamo-runtime (the dynamo extra)")
    pytest.importorskip("numpy", reason="the AITune scripts return numpy arrays")
    started = Fleet()
    yield started
    started.close()


@pytest.fixture(scope="module")
def client_for(fleet: Fleet) -> Iterator[Callable[[str, str], Any]]:
    """``client_for(endpoint, script)``: a client of ``endpoint`` once ``script`` serves it."""
    from worker_sdk.dynamo.client import Client

    clients: dict[str, Client] = {}

    def get(endpoint: str, script: str) -> Client:
        if endpoint not in clients:
            clients[endpoint] = Client(endpoint, discovery_dir=str(fleet.discovery))
        client = clients[endpoint]

        def ready() -> bool:
            fleet.alive(script)
            try:
                client.wait_for_instances(timeout=0.25)
            except TimeoutError:
                return False
            return True

        wait_until(ready, 60, f"{script} to serve {endpoint}")
        return client

    yield get
    for client in clients.values():
        client.close()


def _vector(text: str, dims: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255.0 for b in digest[:dims]]


@pytest.mark.process
def test_a_mapping_reads_request_input_and_its_dict_becomes_the_kwargs(
        client_for: Callable[[str, str], Any]) -> None:
    client = client_for("aitune.embedder.generate", "aitune_embedder.py")
    for texts in (["alpha", "beta"], ["one"], ["a", "b", "c", "d", "e"]):
        [reply] = client.call({"model": "toy-embedder", "input": texts, "dimensions": 6})
        assert reply["object"] == "list" and reply["model"] == "toy-embedder"
        rows = reply["data"]
        assert len(rows) == len(texts)  # one embedding per input, never one per byte
        assert [row["index"] for row in rows] == list(range(len(texts)))
        for row, text in zip(rows, texts, strict=True):
            assert row["object"] == "embedding" and len(row["embedding"]) == 6
            assert row["embedding"] == pytest.approx(_vector(text, 6), abs=1e-6)

    [reply] = client.call({"input": "a single string"})  # the mapping's default width
    assert len(reply["data"]) == 1 and len(reply["data"][0]["embedding"]) == 16

    with pytest.raises(Exception, match=r"mapping must return a dict, got list.*\"code\":500"):
        client.call({"input": "x", "user": "broken-mapping"})
    with pytest.raises(Exception, match=r"'input'.*\"code\":400"):
        client.call({"prompt": "no input"})


def test_mapping_none_hands_the_request_object_itself_to_the_function(
        client_for: Callable[[str, str], Any]) -> None:
    client = client_for("aitune.backend.generate", "aitune_positional.py")  # the defaults
    [reply] = client.call({"input": ["ab", "abcd", ""], "dimensions": 3})
    assert [row["embedding"] for row in reply["data"]] == [[2.0] * 3, [4.0] * 3, [0.0] * 3]
    assert reply["model"] == "org/positional"  # model_name defaults to model_path
    [reply] = client.call({"input": "xyz"})
    assert [row["embedding"] for row in reply["data"]] == [[3.0] * 4]


def test_an_image_mapping_reads_prompt_and_size(client_for: Callable[[str, str], Any]) -> None:
    client = client_for("aitune.painter.generate", "aitune_painter.py")
    [reply] = client.call({"prompt": "a red fox", "size": "3x2"})
    assert isinstance(reply["created"], int)
    png = base64.b64decode(reply["data"][0]["b64_json"])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (3, 2)


def test_a_dynamoworker_subclass_runs_setup_then_on_ready_then_serves(
        fleet: Fleet, client_for: Callable[[str, str], Any]) -> None:
    client = client_for("aitune.lengths.embed", "aitune_subclass.py")
    items = client.call({"input": ["abcd", "ab"]})
    assert [item["data"][0]["embedding"] for item in items] == [[2.0] * 3, [1.0] * 3]
    events = [n["event"] for n in fleet.notes_seen()]
    assert events[:2] == ["setup", "on_ready"] and events[2:] == ["request"], events
    ready = fleet.notes_seen()[1]
    assert ready["endpoint"] == "Endpoint" and ready["runtime"] == "DistributedRuntime"
    [card] = [e for e in fleet.entries("aitune.lengths.embed") if e.startswith("v1/mdc/")]
    assert json.loads((fleet.discovery / card).read_text())["card_json"]["display_name"] == (
        "lengths")


def test_dynamos_own_frontend_serves_the_aitune_workers_by_name(
        fleet: Fleet, client_for: Callable[[str, str], Any]) -> None:
    for endpoint, script in (("aitune.embedder.generate", "aitune_embedder.py"),
                             ("aitune.painter.generate", "aitune_painter.py")):
        client_for(endpoint, script)
    base = f"http://127.0.0.1:{fleet.port}/v1"

    def models() -> set[str]:
        fleet.alive("frontend")
        try:
            with urllib.request.urlopen(base + "/models", timeout=5) as answer:
                return {m["id"] for m in json.load(answer)["data"]}
        except OSError:
            return set()

    def post(path: str, body: dict[str, Any]) -> Any:
        request = urllib.request.Request(base + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.load(answer)

    wait_until(lambda: {"toy-embedder", "org/toy-painter"} <= models(), 60, "the frontend's models")
    texts = ["the", "frontend", "sends"]
    embedded = post("/embeddings", {"model": "toy-embedder", "input": texts})
    assert len(embedded["data"]) == 3
    for row, text in zip(sorted(embedded["data"], key=lambda r: r["index"]), texts, strict=True):
        assert row["embedding"] == pytest.approx(_vector(text, 16), abs=1e-6)
    image = post("/images/generations", {"model": "org/toy-painter", "prompt": "cat",
                                         "size": "2x2"})
    assert base64.b64decode(image["data"][0]["b64_json"]).startswith(b"\x89PNG")


def test_sigterm_stops_an_aitune_worker_and_removes_its_discovery_entries(
        fleet: Fleet, client_for: Callable[[str, str], Any]) -> None:
    client = client_for("aitune.backend.generate", "aitune_positional.py")
    assert any(e.startswith("v1/instances/") for e in fleet.entries("aitune.backend.generate"))
    proc = fleet.procs["aitune_positional.py"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, fleet.log("aitune_positional.py")
    assert fleet.entries("aitune.backend.generate") == []
    wait_until(lambda: client.instance_ids() == [], 15, "the client to see no instance")
