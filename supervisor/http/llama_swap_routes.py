"""llama-swap's own routes, answered as llama-swap answers them, for the scripts and dashboards
that call them.

- ``GET /health``: ``200 OK`` (text), to anyone, as ``/healthz``;
- ``GET /running``: ``{"running": [{model, state, cmd, proxy, ttl, name, description}]}``,
  the backends whose process is up, by name, llama-swap's states (``starting``, ``ready``,
  ``stopping``);
- ``GET /unload`` (``OK``) and ``POST /api/models/unload`` (``{"msg": "ok"}``): unload every
  loaded backend; ``POST /api/models/unload/{model}`` one (a name or an alias), ``OK``. An
  idle one goes at once; a busy one finishes the jobs it runs first (nothing is killed
  mid-answer) and then goes, and the answer comes once it went, as llama-swap's comes once
  its in-flight requests ended; ``GET /unload``
  changes the engine, so the guard treats it as a ``POST`` (:func:`.auth.changes_engine`);
- ``GET /logs`` (and ``/log``): the engine's recent event log as text;
  ``GET /logs/stream/{model}``: a redirect to that backend's followed log.

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
from .errors import from_engine

if TYPE_CHECKING:
    from .server import HttpServer

# Our worker states as llama-swap names a process's.
STATES = {"starting": "starting", "initializing": "starting", "ready": "ready",
          "busy": "ready", "asleep": "ready", "stopping": "stopping"}
TEXT = "text/plain"


def add_routes(app: web.Application, server: HttpServer) -> None:
    r = _LlamaSwap(server)
    app.add_routes([web.get("/health", r.health), web.get("/running", r.running),
                    web.get("/unload", r.unload, allow_head=False),
                    web.post("/api/models/unload", r.unload_all),
                    web.post("/api/models/unload/{model:.+}", r.unload_one),
                    web.get("/logs", r.logs), web.get("/log", r.logs),
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
            # a running server's own URL (its port filled in), else the descriptor's
            proxy = getattr(rt.worker, "url", None) or (spec.http.url if spec.http else "")
            listed.append({"model": b.name, "state": state, "cmd": shlex.join(spec.command),
                           "proxy": proxy,
                           "ttl": ttl, "name": b.name, "description": spec.description})
        return web.json_response({"running": listed})

    async def _unload_all(self) -> None:
        await asyncio.gather(*(self._unload(name) for name in list(self.engine.backends)))

    async def _unload(self, name: str) -> None:
        """Evict ``name`` once the jobs it runs now have ended (at once when it runs none;
        it may have taken new ones meanwhile: their ends are waited for too), and wait until
        its process is gone."""
        while True:
            rt = self.engine.backends.get(name)
            if rt is None or rt.worker is None or rt.worker.state == WorkerState.STOPPING:
                return
            if not rt.admitted:
                worker = rt.worker
                try:
                    self.engine.evict(name)
                except VramtuiError as exc:
                    raise from_engine(exc) from None
                # gone (its stop is bounded by its grace, then SIGKILL)
                await worker.wait_exited(rt.spec.timeouts.stop_grace_s + 5.0)
                return
            ends = [end for job_id in list(rt.admitted)
                    if (end := watch.JobEnd.of(self.engine, job_id)) is not None]
            if not ends:  # ended, not yet let go of: the engine's next turn does
                await asyncio.sleep(0.05)
            for end in ends:
                with contextlib.suppress(VramtuiError):
                    await end.wait()

    @changes_engine  # a GET, as llama-swap has it, guarded as a POST
    async def unload(self, request: web.Request) -> web.Response:
        await self._unload_all()
        return web.Response(text="OK", content_type=TEXT)

    async def unload_all(self, request: web.Request) -> web.Response:
        await self._unload_all()
        return web.json_response({"msg": "ok"})

    async def unload_one(self, request: web.Request) -> web.Response:
        name = self._backend(request.match_info["model"])
        if name is None:
            return web.Response(status=404, text="model not found", content_type=TEXT)
        await self._unload(name)
        return web.Response(text="OK", content_type=TEXT)

    async def logs(self, request: web.Request) -> web.Response:
        lines = []
        for line in self.engine.snapshot().log:
            when = dt.datetime.fromtimestamp(line.t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            who = f" {line.backend}:" if line.backend else ""
            lines.append(f"{when} [{line.level}]{who} {line.text}\n")
        return web.Response(text="".join(lines), content_type=TEXT)

    async def log_stream(self, request: web.Request) -> web.Response:
        name = self._backend(request.match_info["model"])
        if name is None:
            return web.Response(status=400, text="invalid logger. Use a model's name",
                                content_type=TEXT)
        raise web.HTTPTemporaryRedirect(f"/v1/backends/{name}/logs?follow=1")
