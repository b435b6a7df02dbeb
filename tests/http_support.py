"""Helpers for the HTTP front door's tests: a real engine with its HTTP server, real clients.

``serve_http(backends, config=…)`` starts an embedded engine (simulated GPU, real worker
processes) with an :class:`HttpServer` on a free loopback port, and yields a :class:`Front`
with its base URL.  ``Front.request`` speaks HTTP with the standard library's http.client —
a client nobody here wrote — and ``Front.sse`` reads a server-sent event stream line by line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine_support import ROOT, sim_backend
from serve_support import echo_backend, make_env, new_root
from waiting import wait_until

from supervisor.engine import EngineConfig
from supervisor.facade import Supervisor
from supervisor.http.config import HttpConfig, Listen
from supervisor.http.server import HttpServer
from supervisor.paths import Paths

OPENAI = ROOT / "examples" / "openai"


def openai_backends(step_s: str = "0.005") -> list[dict[str, Any]]:
    def one(name: str, script: str, api: Any, aliases: list[str], **env: str) -> dict[str, Any]:
        return {"name": name, "script": str(OPENAI / script), "api": api, "aliases": aliases,
                "simulated": True,
                "vram": {"weights": "256MiB", "activation": "64MiB", "context": "256MiB"},
                "safety": "64MiB", "timeouts": {"stop_grace": "3s", "start": "20s"},
                "env": {"SIM_WEIGHTS_MIB": "256", "SIM_ACTIVATION_MIB": "64",
                        "SIM_LOAD_S": "0", "SIM_STEP_S": step_s, **env}}

    return [one("chat-sim", "chat.py", ["chat", "completions"], ["gpt-4o-mini"]),
            one("embed-sim", "embeddings.py", "embeddings", ["text-embedding-3-small"]),
            one("image-sim", "images.py", "images", ["dall-e-3"]),
            one("tts-sim", "speech.py", "speech", ["tts-1"]),
            one("stt-sim", "transcriptions.py", "transcriptions", ["whisper-1"]),
            one("slow-chat", "chat.py", "chat", [], SIM_STEP_S="0.2")]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def error(self) -> dict[str, Any]:
        data = self.json()
        assert set(data) == {"error"}, data
        assert {"message", "type", "code"} <= set(data["error"]), data
        return data["error"]


@dataclass
class SseEvent:
    event: str | None
    id: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SseReader:
    """An open SSE response, read one event at a time."""

    conn: http.client.HTTPConnection
    resp: http.client.HTTPResponse
    comments: list[str] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {k.lower(): v for k, v in self.resp.getheaders()}

    def next(self) -> SseEvent | None:
        """The next event (None at the end of the stream); comments are collected."""
        event, ident, data = None, None, []
        while True:
            line = self.resp.readline()
            if not line:
                return None
            text = line.decode().rstrip("\n")
            if text == "":
                if data or event:
                    return SseEvent(event, ident, "\n".join(data))
                continue
            if text.startswith(":"):
                self.comments.append(text)
                continue
            key, _, value = text.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                event = value
            elif key == "id":
                ident = value
            elif key == "data":
                data.append(value)

    def until(self, name: str, limit: int = 10_000) -> list[SseEvent]:
        """Events up to and including the first named ``name``."""
        seen = []
        for _ in range(limit):
            ev = self.next()
            if ev is None:
                raise AssertionError(f"the stream ended before a {name!r} event: {seen}")
            seen.append(ev)
            if ev.event == name:
                return seen
        raise AssertionError(f"no {name!r} event in {limit}")

    def wait_comment(self, timeout: float) -> str:
        """The next comment line (a heartbeat), skipping events; raises after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.resp.readline()
            if not line:
                raise AssertionError("the stream ended")
            if line.startswith(b":"):
                return line.decode()
        raise AssertionError(f"no comment within {timeout} s")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.sock.shutdown(socket.SHUT_RDWR)  # type: ignore[union-attr]
        self.conn.close()


@dataclass
class Front:
    sup: Supervisor
    server: HttpServer
    root: Path
    env: dict[str, str] = field(default_factory=dict)  # for the CLI (with control=True)

    @property
    def base(self) -> str:
        return self.server.address

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    @property
    def engine(self) -> Any:
        return self.sup.engine

    def conn(self, timeout: float = 30) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None, *,
                headers: dict[str, str] | None = None, raw: bytes | None = None,
                timeout: float = 30) -> Reply:
        conn = self.conn(timeout)
        try:
            data = raw if raw is not None else (
                json.dumps(body).encode() if body is not None else None)
            hdrs = {"Content-Type": "application/json"} if data is not None else {}
            hdrs.update(headers or {})
            conn.request(method, path, body=data, headers=hdrs)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kw: Any) -> Reply:
        return self.request("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> Reply:
        return self.request("POST", path, body, **kw)

    def sse(self, method: str, path: str, body: Any = None,
            headers: dict[str, str] | None = None) -> SseReader:
        conn = self.conn()
        data = json.dumps(body).encode() if body is not None else None
        hdrs = {"Accept": "text/event-stream"}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        return SseReader(conn, conn.getresponse())

    def job_state(self, job_id: str) -> str:
        return self.get(f"/v1/jobs/{job_id}").json()["state"]

    def wait_state(self, job_id: str, *states: str, timeout: float = 20) -> str:
        return wait_until(lambda: (s := self.job_state(job_id)) in states and s, timeout,
                        f"job {job_id} to be {states}")


def expecting(port: int, path: str, length: int, headers: dict[str, str] | None = None, *,
              method: str = "POST", expect: str = "100-continue") -> socket.socket:
    """A raw request's head with ``Expect: 100-continue`` and no body yet: what comes back
    first is the server's go (``100 Continue``) or its refusal."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json",
            "Content-Length": str(length), "Expect": expect, **(headers or {})}
    sock.sendall(f"{method} {path} HTTP/1.1\r\n".encode()
                 + "".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n")
    return sock


@contextlib.contextmanager
def serve_http(backends: list[dict[str, Any]] | None = None, *, gpus: str = "sim:8GiB",
               engine_config: EngineConfig | None = None, ui: bool = False,
               control: bool = False, subapps: dict[str, Any] | None = None,
               **config: Any) -> Iterator[Front]:
    """An embedded engine with its HTTP front door on a free loopback port (``control``: and
    its control socket, for the CLI and the client; ``subapps``: more aiohttp applications,
    by prefix, behind the door's middlewares)."""
    root = new_root()
    env = make_env(root, backends)
    sup = Supervisor.from_config(gpus=gpus, backends=[env["VRAMTUI_TEST_BACKENDS"]],
                                 environ=env, paths=Paths.from_env(env),
                                 config=engine_config or EngineConfig(reserve_mib=0, tick_s=0.1))
    listen = config.pop("listen", Listen("127.0.0.1", 0))
    cfg = dataclasses.replace(HttpConfig(listen=listen), **config)
    subapps = {**(config_subapps(sup) if ui else {}), **(subapps or {})}
    if ui or control:  # the dashboard's sessions attach over the control socket
        from supervisor.control.server import ControlServer

        sup.add_service(ControlServer(sup.engine, sup.paths.control_socket, mode="test"))
    server = HttpServer(sup.engine, cfg, version="test", subapps=subapps)
    sup.add_service(server)
    sup.start_in_thread()
    try:
        wait_until(lambda: server.ready is not None and server.ready.is_set(), 20,
                 "the HTTP server to listen")
        yield Front(sup, server, root, env)
    finally:
        sup.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def config_subapps(sup: Supervisor) -> dict[str, Any]:
    from vramtui.web import UI_PREFIX, make_ui_app, ui_command

    return {UI_PREFIX: make_ui_app(ui_command(sup.paths.control_socket), sessions=2)}


def default_http_backends() -> list[dict[str, Any]]:
    return [echo_backend(),
            sim_backend("slow", 512, 128, steps=40, step_s=0.05),
            sim_backend("huge", 64 * 1024, 1024),
            sim_backend("flaky", 256, 64, steps=4, step_s=0.01)]

