"""llama-swap's own routes, answered as llama-swap answers them, for the scripts and dashboards
that call them.

- ``GET /health``: ``200 OK`` (text), to anyone, as ``/healthz``;
- ``GET /running``: ``{"running": [{model, state, cmd, proxy, ttl, name, description}]}``,
  the backends whose process is up, by name, llama-swap's states (``starting``, ``ready``,
  ``stopping``);
- ``GET /unload`` (``OK``) and ``POST /api/models/unload`` (``{"msg": "ok"}``): unload every
  loaded backend; ``POST /api/models/unload/{model}`` one (a name or an alias), ``OK`` (an
  unknown one: 404, ``model not found`` as text to a client that accepts text, else as a
  JSON error, as llama-swap answers). An
  idle one goes at once; a busy one finishes the jobs it runs first (nothing is killed
  mid-answer) and then goes, and the answer comes once it went, as llama-swap's comes once
  its in-flight requests ended; ``GET /unload``
  changes the engine, so the guard treats it as a ``POST`` (:func:`.auth.changes_engine`);
- ``GET /logs`` (and ``/log``): the engine's recent event log as text, with the headers of
  any text a worker wrote (:func:`.jobflow.worker_text_headers`: ``nosniff``, a sandbox);
  ``GET /logs/stream`` (and ``/logs/stream/proxy``) the same, followed: each line as it is
  logged; ``GET /logs/stream/{model}``: a redirect to that backend's followed log (with
  ``?no-history``: without its recent lines, as in llama-swap).

``/upstream/{model}/…`` is the model servers' (:mod:`supervisor.servers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import shlex
from typing import TYPE_CHECKING

from aiohttp import web

from ..doors import watch
from ..errors import VramtuiError
from ..workers.states import WorkerState
from .auth import changes_engine
from .errors import from_engine, not_found
from .jobflow import worker_text_headers
from .server import streaming
from .sse import Item, Stream

if TYPE_CHECKING:
    from .server import HttpServer

# Our worker states as llama-swap names a process's.
STATES = {"starting": "starting", "initializing": "starting", "ready": "ready",
          "busy": "ready", "asleep": "ready", "stopping": "stopping"}
TEXT = "text/plain"
UNLOAD_WAIT_S = 300.0  # an unload waits this long at most for a busy model's jobs to end


def add_routes(app: web.Application, server: HttpServer) -> None:
    r = _LlamaSwap(server)
    app.add_routes([web.get("/health", r.health), web.get("/running", r.running),
                            web.get("/unload", r.unload, allow_head=False),
                            web.post("/api/models/unload", r.unload_all),
                            web.post("/api/models/unload/{model:.+}", r.unload_one),
                            web.get("/logs", r.logs), web.get("/log", r.logs),
                            web.get("/logs/stream", r.log_follow),
                            web.get("/logs/stream/proxy", r.log_follow),
                            web.get("/logs/stream/{model:.+}", r.log_stream)])


class _LlamaSwap:
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.engine = server.engine

    def _backend(self, model: str) -> str | None:
        if model in self.engine.backends:
            return model
        for name, rt in self.engine.backends.items():
            if model in rt.spec.aliases:
                return name
        return None

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK", content_type=TEXT)

    async def running(self, request: web.Request) -> web.Response:
        listed = []
        for b in sorted(self.engine.snapshot().backends, key=lambda b: b.name):
            state = STATES.get(b.state)
            if state is None:
                continue
            rt = self.engine.backends[b.name]
            spec = rt.spec
            ttl = 0 if math.isinf(spec.keep_alive_s) else int(spec.keep_alive_s)
            # a running server's own URL and command (its port filled in), else the descriptor's
            proxy = getattr(rt.worker, "url", None) or (spec.http.url if spec.http else "")
            launch = getattr(rt.worker, "launch", None)
            argv = getattr(launch, "argv", None) or spec.command
            # (a model by its llama-swap ID, which its backend lists it as)
            listed.append({"model": spec.listed_as or b.name, "state": state,
                           "cmd": shlex.join(argv), "proxy": proxy, "ttl": ttl,
                           "name": b.name, "description": spec.description})
        return web.json_response({"running": listed})

    async def _unload_all(self) -> list[str]:
        """Unload every backend; those still busy at the deadline (see :meth:`_unload`)."""
        names = list(self.engine.backends)
        gone = await asyncio.gather(*(self._unload(name) for name in names))
        return [name for name, went in zip(names, gone, strict=True) if not went]

    async def _unload(self, name: str) -> bool:
        """Evict ``name`` once the jobs it runs now have ended (at once when it runs none;
        it may have taken new ones meanwhile: their ends are waited for too, for at most
        :data:`UNLOAD_WAIT_S` in all), and wait until its process is gone. False: it still
        ran jobs at the deadline (new ones kept coming) and stays."""
        deadline = asyncio.get_running_loop().time() + UNLOAD_WAIT_S
        while True:
            rt = self.engine.backends.get(name)
            if rt is None or rt.worker is None or rt.worker.state == WorkerState.STOPPING:
                return True
            if not rt.admitted:
                worker = rt.worker
                try:
                    self.engine.evict(name)
                except VramtuiError as exc:
                    raise from_engine(exc) from None
                # gone (its stop is bounded by its grace, then SIGKILL)
                await worker.wait_exited(rt.spec.timeouts.stop_grace_s + 5.0)
                return True
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            ends = [end for job_id in list(rt.admitted)
                    if (end := watch.JobEnd.of(self.engine, job_id)) is not None]
            if not ends:  # ended, not yet let go of: the engine's next turn does
                await asyncio.sleep(0.05)
            with contextlib.suppress(VramtuiError, TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(end.wait() for end in ends)), left)

    @staticmethod
    def _busy(names: list[str]) -> web.Response:
        return web.Response(status=409, content_type=TEXT, text=(
            f"{', '.join(names)} still ran jobs after {UNLOAD_WAIT_S:g} s (new ones kept "
            "coming) and stayed loaded; unload again once the requests stop"))

    @changes_engine  # a GET, as llama-swap has it, guarded as a POST
    async def unload(self, request: web.Request) -> web.Response:
        busy = await self._unload_all()
        return self._busy(busy) if busy else web.Response(text="OK", content_type=TEXT)

    async def unload_all(self, request: web.Request) -> web.Response:
        busy = await self._unload_all()
        return self._busy(busy) if busy else web.json_response({"msg": "ok"})

    async def unload_one(self, request: web.Request) -> web.Response:
        name = self._backend(request.match_info["model"])
        if name is None:  # (as llama-swap: text to who asks for text, else a JSON error)
            if TEXT in request.headers.get("Accept", ""):
                return web.Response(status=404, text="model not found", content_type=TEXT)
            raise not_found("model not found", "model_not_found")
        if not await self._unload(name):
            return self._busy([name])
        return web.Response(text="OK", content_type=TEXT)

    async def logs(self, request: web.Request) -> web.Response:
        lines = [_log_line(line.t, line.level, line.backend, line.text)
                 for line in self.engine.snapshot().log]
        # (the engine's event log quotes what workers and servers said: their errors)
        return web.Response(body="".join(lines).encode(), headers=worker_text_headers())

    @streaming
    async def log_follow(self, request: web.Request) -> web.StreamResponse:
        """``/logs/stream`` and ``/logs/stream/proxy``: the engine's event log (llama-swap's
        proxy log) as text, its recent lines first (not with ``?no-history``), then each line
        as it is logged, until the client goes."""
        srv = self.server
        stream = Stream(srv.hub, request, wants=lambda item: item.event.kind == "log",
                        encode=_encode_log, on_lag=_lagged, heartbeat_s=None,
                        buffer_limit=srv.config.subscriber_buffer, heartbeat=None)
        history = "" if "no-history" in request.query else "".join(
            _log_line(line.t, line.level, line.backend, line.text)
            for line in self.engine.snapshot().log)
        response = web.StreamResponse(headers={**worker_text_headers(),
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        await stream.run(response, history.encode())
        return response

    async def log_stream(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        name = self._backend(model)
        if name is None:
            text = ("vramtui keeps one log per model: /logs/stream/{model} follows one, and "
                    "/logs/stream the engine's" if model == "upstream" else
                    "invalid logger. Use a model's name")
            return web.Response(status=400, text=text, content_type=TEXT)
        lines = "&lines=0" if "no-history" in request.query else ""
        raise web.HTTPTemporaryRedirect(f"/v1/backends/{name}/logs?follow=1{lines}")


def _log_line(t: float, level: str, backend: str | None, text: str) -> str:
    when = dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    who = f" {backend}:" if backend else ""
    return f"{when} [{level}]{who} {text}\n"


def _encode_log(item: Item) -> tuple[bytes, bool]:
    ev = item.event
    return _log_line(ev.t, ev.level, ev.backend, ev.message).encode(), False


def _lagged(dropped: int, seq: int) -> tuple[bytes, bool]:
    return f"[{dropped} log lines dropped: this reader fell behind]\n".encode(), False
