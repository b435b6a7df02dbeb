"""HTTP model servers as backends (issue 24), end to end: a real engine on the simulated GPU,
real server processes (``tests/model_server.py``, which behaves like llama-server), real
clients (http.client, the official ``openai`` client).

What is checked: requests forwarded byte for byte and answered as the server answers (JSON,
SSE chunk by chunk, status and headers); each request an ordinary job; two servers that
cannot co-reside alternate and are never both on the simulated GPU (its own ledger says so);
a client that goes away frees the server's slot; bad servers (never healthy, exiting at once,
a port taken, 500s, endless and broken streams) and a too-large body each get one clear error,
leave no process behind and the queue goes on.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from http_support import Front, serve_http
from waiting import wait_until

from supervisor.engine import EngineConfig

pytestmark = pytest.mark.process

SERVER = Path(__file__).resolve().parent / "model_server.py"
CONTEXT_MIB = 256  # the simulated GPU's CUDA context per process


def server_backend(name: str, mib: int = 512, *, mode: str = "ok", api: Any = None,
                   args: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    """A descriptor for ``tests/model_server.py``: it holds ``mib`` (+ its context)."""
    spec: dict[str, Any] = {
        "name": name,
        "command": [sys.executable, str(SERVER), "--port", "${PORT}", "--mib", str(mib),
                    "--mode", mode, *args],
        "http": {"health": "/health"},
        "api": api or ["chat", "completions", "embeddings"],
        "vram": {"weights": f"{mib}MiB", "activation": "0MiB", "context": f"{CONTEXT_MIB}MiB"},
        "safety": "0MiB",
        "simulated": True,
        "concurrency": 4,
        "timeouts": {"start": "20s", "stop_grace": "3s"},
    }
    spec.update(extra)
    return spec


def chat(model: str, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}],
            "stream": stream, **extra}


def sim_holders(front: Front) -> dict[int, int]:
    """pid -> MiB, as the simulated GPU's own ledger has it (not the engine's view)."""
    out = {}
    for path in Path(front.sup.paths.sim_dir).glob("*.json"):
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        pid = int(entry["pid"])
        if os.path.exists(f"/proc/{pid}"):
            out[pid] = int(entry["mib"])
    return out


def server_pids() -> set[int]:
    """Every live process running tests/model_server.py (an orphan shows here)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if str(SERVER).encode() in cmd:
                found.add(int(entry))
    return found


def test_requests_are_forwarded_byte_for_byte_as_jobs() -> None:
    before = server_pids()
    with serve_http([server_backend("llama", args=("--tokens", "3"))]) as front:
        reply = front.post("/v1/chat/completions", chat("llama"))
        assert reply.status == 200, reply.body
        assert reply.json()["choices"][0]["message"]["content"] == "tok tok tok"
        # The job is an ordinary job, seen by every face.
        jobs = front.get("/v1/jobs?backend=llama").json()
        assert any(j["state"] == "succeeded" for j in jobs["data"]), jobs
        # Streamed: the server's own bytes, chunk by chunk, under its headers.
        sse = front.sse("POST", "/v1/chat/completions", chat("llama", stream=True))
        assert sse.resp.status == 200
        assert sse.headers["x-server"] == "model_server"
        body = sse.resp.read()
        sse.close()
        assert body.count(b"data: ") == 4 and body.endswith(b"data: [DONE]\n\n"), body
        # Any request through /upstream: body, query and status as they were.
        raw = b'{"z": 1,  "a" : [1,2]}\n'
        reply = front.request("POST", "/upstream/llama/echo?x=1&y=2", raw=raw,
                              headers={"X-Custom": "yes"})
        assert (reply.status, reply.body) == (201, raw)
        assert reply.headers["x-query"] == "x=1&y=2" and reply.headers["x-seen-x-custom"] == "yes"
        assert "x-seen-connection" not in reply.headers  # hop-by-hop: never forwarded
        pid = front.engine.backends["llama"].worker.pid
        assert pid in server_pids()
    wait_until(lambda: server_pids() <= before, 10, "the server to be gone")
