"""A llama-swap config.yaml given to ``vramtui --serve --backends`` as it is: its models run as
model servers (``tests/model_server.py``, a llama-server look-alike), reached by the official
``ollama`` and ``openai`` clients and by llama-swap's own routes."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import ollama
import openai
import pytest
from serve_support import Served, make_env, new_root, reap, start_serve
from spawning import spawns
from waiting import wait_until

from vramtui.http_serve import front_door_url

pytestmark = [pytest.mark.timeout(120), pytest.mark.process]
SERVER = Path(__file__).resolve().parent / "model_server.py"
CONFIG = f"""\
healthCheckTimeout: 20
logLevel: info
macros:
  server: "{sys.executable} {SERVER} --port ${{PORT}}"
models:
  "qwen2.5:7b":
    cmd: |
      ${{server}}
      # three tokens a reply, like a tiny model
      --tokens 3 \\
        --mib 512
    aliases: [llama3]
    ttl: 60
  "nomic-embed":
    cmd: ${{server}} --mib 256
    useModelName: nomic
    aliases: ["org/nomic:v1"]
    unlisted: true
  "My Model":
    cmd: ${{server}} --mib 64
    aliases: ["другое имя"]
groups:
  everything:
    swap: true
    members: ["qwen2.5:7b", "nomic-embed"]
hooks:
  on_startup:
    preload: ["nomic-embed"]
"""


@pytest.fixture(scope="module")
@spawns
def served() -> Iterator[Served]:
    root = new_root()
    env = make_env(root, [])
    Path(env["VRAMTUI_TEST_BACKENDS"]).write_text(CONFIG)
    s = start_serve(env, root, "--http", "127.0.0.1:0")
    try:
        yield s
    finally:
        reap(s)


def _url(served: Served) -> str:
    return wait_until(lambda: front_door_url(served.stdout()), 30, "the HTTP line")


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read()


def test_the_file_loads_as_it_is_and_its_notes_are_logged(served: Served) -> None:
    url = _url(served)
    names = {m["id"] for m in json.loads(_get(url + "/v1/models")[1])["data"]}
    # the model and its aliases (llama-swap's id "qwen2.5:7b" is one); nomic-embed is unlisted
    # each model by its ID (its backend's made-up name is not listed) and its aliases
    assert names == {"qwen2.5:7b", "llama3", "My Model", "другое имя"}
    logs = _get(url + "/logs")[1].decode()
    assert "'logLevel' is not used" in logs and "group 'everything'" in logs
    # hooks.on_startup.preload: started with the engine, before any request
    wait_until(lambda: any(r["model"] == "nomic-embed" and r["state"] == "ready"
                           for r in json.loads(_get(url + "/running")[1])["running"]),
               30, "nomic-embed preloaded")


def test_ollama_and_openai_clients_reach_the_servers(served: Served) -> None:
    url = _url(served)
    o = ollama.Client(host=url, timeout=60)
    r = o.chat(model="llama3", messages=[{"role": "user", "content": "hi"}], stream=False)
    assert r.message.content == "tok tok tok" and r.done
    parts = list(o.generate(model="qwen2.5:7b", prompt="hi", stream=True))
    assert "".join(p.response for p in parts) == "t0 t1 t2 " and parts[-1].done  # its stream
    # (as Ollama's /api/embed answers: of length 1)
    assert o.embed(model="nomic-embed", input="x").embeddings == [
        pytest.approx([x / 0.14 ** 0.5 for x in (0.1, 0.2, 0.3)])]
    raw = o.generate(model="qwen2.5:7b", prompt="hi", raw=True, stream=False)
    assert raw.response == "tok tok tok"  # a completion, the prompt as it is
    running = json.loads(_get(url + "/running")[1])["running"]
    qwen = next(r for r in running if r["model"] == "qwen2.5:7b")  # its ID, as llama-swap
    assert qwen["proxy"].startswith("http://127.0.0.1:") and "${" not in qwen["proxy"]
    assert qwen["ttl"] == 60 and "--tokens 3" in qwen["cmd"]
    # the command as it runs: its port the one in its proxy, as llama-swap shows it
    assert "${" not in qwen["cmd"] and qwen["proxy"].rsplit(":", 1)[1] in qwen["cmd"]
    # /upstream/:model with a model ID that has slashes, as llama-swap reads it
    assert _get(url + "/upstream/org/nomic:v1/v1/models?x=1") == \
        _get(url + "/upstream/nomic-embed/v1/models?x=1")
    c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    # a model ID of any printable text reaches its model (it was "model not found")
    for name in ("My Model", "другое имя"):
        said = c.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
        assert said.choices[0].message.content == "tok tok tok tok", name
    chunks = c.chat.completions.create(model="qwen2.5:7b", stream=True,
                                       messages=[{"role": "user", "content": "hi"}])
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == \
        "t0 t1 t2 "
