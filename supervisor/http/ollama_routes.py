"""The few Ollama routes that dashboards and Open WebUI poll: ``/api/ps``, ``/api/version``,
``/api/tags``.

``/api/ps`` lists the backends whose worker is up, as Ollama lists loaded models: ``size``
is what admission holds for it (its reserved bytes, else its peak), ``size_vram`` what its
processes really hold on the GPU (the last sample), and ``expires_at`` when keep-alive will
unload it if nothing comes (far in the future for a pinned or busy backend).  ``/api/tags``
lists every backend; ``/api/version`` answers vramtui's version.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .routes import json_response

if TYPE_CHECKING:
    from ..snapshot import BackendView
    from .server import HttpServer

MIB = 1024 * 1024
NEVER = dt.datetime(2318, 1, 1, tzinfo=dt.UTC)  # Ollama's own "never expires"
LOADED = frozenset({"starting", "initializing", "ready", "busy"})


def add_routes(app: web.Application, server: HttpServer) -> None:
    r = _Ollama(server)
    app.add_routes([web.get("/api/ps", r.ps), web.get("/api/version", r.version),
                    web.get("/api/tags", r.tags)])


def _digest(name: str) -> str:
    return hashlib.sha256(f"vramtui:{name}".encode()).hexdigest()


class _Ollama:
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.engine = server.engine

    def _details(self, name: str) -> dict[str, Any]:
        spec = self.engine.backends[name].spec
        family = spec.api[0] if spec.api else "vramtui"
        return {"parent_model": "", "format": "vramtui", "family": family,
                "families": list(spec.api) or [family], "parameter_size": "",
                "quantization_level": ""}

    def _entry(self, b: BackendView, now: dt.datetime) -> dict[str, Any]:
        if b.keep_alive_left_s is not None:
            expires = now + dt.timedelta(seconds=b.keep_alive_left_s)
        else:
            expires = NEVER
        size = b.reserved_mib or (b.peak_mib or 0)
        return {"name": b.name, "model": b.name, "size": size * MIB,
                "digest": _digest(b.name), "details": self._details(b.name),
                "expires_at": expires.isoformat(), "size_vram": (b.observed_mib or 0) * MIB,
                "state": b.state, "gpu": b.gpu}

    async def ps(self, request: web.Request) -> web.Response:
        snap = self.engine.snapshot()
        now = dt.datetime.now(dt.UTC)
        return json_response({"models": [self._entry(b, now) for b in snap.backends
                                         if b.state in LOADED]})

    async def tags(self, request: web.Request) -> web.Response:
        snap = self.engine.snapshot()
        modified = dt.datetime.fromtimestamp(self.engine.wall_started, dt.UTC).isoformat()
        return json_response({"models": [
            {"name": b.name, "model": b.name, "modified_at": modified,
             "size": (b.peak_mib or 0) * MIB, "digest": _digest(b.name),
             "details": self._details(b.name)} for b in snap.backends
            if not self.engine.backends[b.name].spec.unlisted]})

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": self.server.version})
