"""What a request's body may cost the door, and what a bad one is answered (after an attack on
the HTTP door): a JSON body of a million empty objects, a form of thousands of parts, a gzip
body cut short, a model's name of megabytes, ``stream`` asked of a worker that cannot, and a
field of the wrong type that a worker failed on.  A real engine and its door, real workers
(``examples/openai``) and a real model server (``tests/model_server.py``)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_support import Front, openai_backends, serve_http
from spawning import spawns

pytestmark = [pytest.mark.timeout(120)]
SERVER = Path(__file__).resolve().parent / "model_server.py"
CHAT = [{"role": "user", "content": "hi"}]
FORM = "multipart/form-data; boundary=XX"


def _server_backend() -> dict[str, Any]:
    return {"name": "llama", "command": [sys.executable, str(SERVER), "--port", "${PORT}",
                                         "--mib", "64", "--tokens", "3"],
            "http": {"health": "/health"}, "api": ["chat", "transcriptions"],
            "vram": {"weights": "64MiB", "activation": "0MiB", "context": "256MiB"},
            "safety": "0MiB", "simulated": True, "concurrency": 4,
            "timeouts": {"start": "20s", "stop_grace": "3s"}}


@pytest.fixture(scope="module")
@spawns
def front() -> Iterator[Front]:
    backends = [b for b in openai_backends() if b["name"] in ("chat-sim", "embed-sim", "stt-sim")]
    with serve_http([*backends, _server_backend()], gpus="sim:4GiB") as f:
        yield f


def _form(*fields: tuple[str, bytes], filename: str | None = None) -> bytes:
    out = b""
    for name, value in fields:
        file = f'; filename="{filename}"' if name == "file" and filename else ""
        out += (f'--XX\r\nContent-Disposition: form-data; name="{name}"{file}\r\n\r\n'.encode()
                + value + b"\r\n")
    return out + b"--XX--\r\n"


# -- 4. a model's name is cut short in what comes back ---------------------------------------
@pytest.mark.process
def test_an_unknown_models_name_is_cut_short_in_its_error(front: Front) -> None:
    name = "x" * 1_000_000
    for path, body in (("/v1/chat/completions", {"model": name, "messages": CHAT}),
                       ("/v1/embeddings", {"model": name, "input": "hi"}),
                       ("/api/chat", {"model": name, "messages": CHAT}),
                       ("/api/show", {"model": name})):
        reply = front.post(path, body)
        assert reply.status == 404, (path, reply.status)
        assert len(reply.body) < 1000 and "x" * 61 not in reply.body.decode(), (path, reply)
    for path in ("/v1/models/" + "y" * 5000, "/upstream/" + "z" * 5000 + "/x"):
        reply = front.get(path)
        assert reply.status == 404 and len(reply.body) < 1000, (path[:20], reply.body[:200])
