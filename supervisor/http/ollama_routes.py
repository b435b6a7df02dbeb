"""The Ollama routes about models: ``/api/ps``, ``/api/version``, ``/api/tags``, ``/api/show``,
and ``/api/pull`` (with ``push``, ``create``, ``copy``, ``delete``) answered honestly: vramtui
runs the models its descriptors name and downloads none, so each says so, in Ollama's error
shape, naming what to do instead.  The routes that run a model are :mod:`.ollama_jobs`.

``GET /`` (and ``HEAD /``) answers "Ollama is running", as Ollama does: its CLI and its
clients ask it first.  Models are listed by Ollama's names, with a tag (``chat:latest`` for
a backend ``chat``), and either spelling reaches a model (:meth:`.ModelTable.resolve`).

``/api/ps`` lists the backends whose worker is up, as Ollama lists loaded models: ``size``
is what admission holds for it (its reserved bytes, else its peak), ``size_vram`` what its
processes really hold on the GPU (the last sample; on a simulated GPU, where a real server's
process holds nothing, ``size`` when nothing was seen: its declared figures count there, and
the entry says ``"simulated": true``), and ``expires_at`` when keep-alive will
unload it if nothing comes (far in the future for a pinned or busy backend).  ``/api/tags``
lists what ``/v1/models`` lists (the backends with an ``api:`` and their aliases, but the
``unlisted``): the names a chat or an embedding may be asked of; ``/api/version`` answers
vramtui's version;
``/api/show`` one model (a backend's name or alias): what it speaks as Ollama's
``capabilities``, its memory figures in ``model_info``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..errors import brief
from . import ollama_jobs
from .bodies import read_json
from .ollama_jobs import ollama_error, ollama_errors
from .openai_routes import OPENAI
from .routes import json_response

if TYPE_CHECKING:
    from ..snapshot import BackendView
    from .server import HttpServer

MIB = 1024 * 1024
NEVER = dt.datetime(2318, 1, 1, tzinfo=dt.UTC)  # Ollama's own "never expires"
LOADED = frozenset({"starting", "initializing", "ready", "busy"})
# Ollama's routes that manage a model store, which vramtui has not: (method, path).
NOT_HERE = (("POST", "/api/pull"), ("POST", "/api/push"), ("POST", "/api/create"),
            ("POST", "/api/copy"), ("DELETE", "/api/delete"))
CAPABILITIES = {"chat": "completion", "completions": "completion", "embeddings": "embedding"}


def add_routes(app: web.Application, server: HttpServer) -> None:
    r = _Ollama(server, app)
    app.add_routes([web.get("/", r.running), web.get("/api/ps", r.ps),
                    web.get("/api/version", r.version),
                    web.get("/api/tags", r.tags), web.post("/api/show", r.show),
                    *(web.route(method, path, r.not_here) for method, path in NOT_HERE)])
    ollama_jobs.add_routes(app, server)


def _digest(name: str) -> str:
    return hashlib.sha256(f"vramtui:{name}".encode()).hexdigest()


class _Ollama:
    def __init__(self, server: HttpServer, app: web.Application) -> None:
        self.server = server
        self.engine = server.engine
        self.app = app

    def _details(self, name: str) -> dict[str, Any]:
        spec = self.engine.backends[name].spec
        family = spec.api[0] if spec.api else "vramtui"
        return {"parent_model": "", "format": "vramtui", "family": family,
                "families": list(spec.api) or [family], "parameter_size": "",
                "quantization_level": ""}

    def _entry(self, b: BackendView, now: dt.datetime, simulated: bool) -> dict[str, Any]:
        if b.keep_alive_left_s is not None:
            expires = now + dt.timedelta(seconds=b.keep_alive_left_s)
        else:
            expires = NEVER
        size = b.reserved_mib or (b.peak_mib or 0)
        vram = b.observed_mib or (size if simulated else 0)  # (`ollama ps`: its % on GPU)
        table = self.app[OPENAI].table
        listed = table.ollama_listed(table.shown(b.name))
        entry = {"name": listed, "model": listed, "size": size * MIB,
                 "digest": _digest(b.name), "details": self._details(b.name),
                 "expires_at": expires.isoformat(), "size_vram": vram * MIB,
                 "state": b.state, "gpu": b.gpu}
        if simulated:
            entry["simulated"] = True
        return entry

    @ollama_errors
    async def ps(self, request: web.Request) -> web.Response:
        snap = self.engine.snapshot()
        now = dt.datetime.now(dt.UTC)
        simulated = {g.index for g in snap.gpus if g.simulated}
        return json_response({"models": [self._entry(b, now, b.gpu in simulated)
                                         for b in snap.backends if b.state in LOADED]})

    @ollama_errors
    async def tags(self, request: web.Request) -> web.Response:
        peaks = {b.name: b.peak_mib for b in self.engine.snapshot().backends}
        modified = dt.datetime.fromtimestamp(self.engine.wall_started, dt.UTC).isoformat()
        table = self.app[OPENAI].table
        listed = {table.ollama_listed(model): name for model, name in table.listed()}
        return json_response({"models": [
            {"name": model, "model": model, "modified_at": modified,
             "size": (peaks.get(name) or 0) * MIB, "digest": _digest(name),
             "details": self._details(name)}
            for model, name in sorted(listed.items())]})

    async def running(self, request: web.Request) -> web.Response:
        """``GET /`` and ``HEAD /``: Ollama's own answer, which its CLI and clients take as
        the sign that a server is there before they ask it anything."""
        return web.Response(text="Ollama is running")

    @ollama_errors
    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": self.server.version})

    @ollama_errors
    async def show(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        model = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
        if not isinstance(model, str) or not model:
            return ollama_error(400, "model: the name of a model (GET /api/tags lists them)")
        name = self.app[OPENAI].table.resolve(model)
        if name is None:
            name = model if model in self.engine.backends else None
        if name is None:
            return ollama_error(404, f"model {brief(model)} not found (vramtui serves the models "
                                "its descriptors name: GET /api/tags lists them)")
        spec = self.engine.backends[name].spec
        capabilities = sorted({CAPABILITIES[a] for a in spec.api if a in CAPABILITIES})
        info: dict[str, Any] = {"general.architecture": "vramtui", "vramtui.backend": name,
                                "vramtui.api": list(spec.api),
                                "vramtui.aliases": list(spec.aliases),
                                "vramtui.server": spec.server}
        if spec.peak is not None:
            info["vramtui.peak_bytes"] = spec.peak * MIB
            info["vramtui.simulated"] = spec.simulated
        modified = dt.datetime.fromtimestamp(self.engine.wall_started, dt.UTC).isoformat()
        return json_response({
            "modelfile": f"# {name}: a vramtui backend ({spec.source or 'descriptor'})\n"
                         f"FROM {name}\n",
            "parameters": "", "template": "", "license": "",
            "details": self._details(name), "model_info": info,
            "capabilities": capabilities, "modified_at": modified})

    @ollama_errors
    async def not_here(self, request: web.Request) -> web.Response:
        what = request.path.rsplit("/", 1)[-1]
        known = ", ".join(sorted(self.app[OPENAI].table.names)) or "none yet"
        return ollama_error(501, f"{what} is not supported: vramtui downloads and "
                            "stores no models; it runs the models its backend descriptors "
                            "name (add one to backends.d, or `vramtui import-llama-swap`). "
                            f"Models here: {known}")
