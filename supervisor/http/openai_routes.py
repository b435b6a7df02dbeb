"""OpenAI-compatible routes for the backends that declare which API they speak (``api:``).

``model`` names a backend, or one of its ``aliases``.  Each request is an ordinary job —
admitted by peak, queued, visible in the TUI and the CLI — and is cancelled when its client
disconnects.  The contract with the worker:

- its payload is the request's JSON body exactly as the client sent it (``stream``
  included); for ``/v1/audio/transcriptions`` (multipart) it is a JSON object of the form's
  fields, the file as ``{"filename", "content_type", "b64"}``;
- a non-streaming reply is the response itself (e.g. a ``chat.completion`` JSON, or the audio
  bytes of ``/v1/audio/speech`` with their Content-Type), passed on with its status;
- a streaming reply yields one JSON object per chunk (e.g. a ``chat.completion.chunk``),
  framed here as ``data: …`` and ended with ``data: [DONE]``.

Headers are sent when the first chunk arrives, so a job that fails before it streams anything
still answers with a proper error status.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from aiohttp import web

from ..doors import watch
from ..errors import VramtuiError, brief
from ..jsonline import dumps_line
from ..servers.request import API_PATHS, job_metadata, looks_like_object
from . import forward, openai_fields
from .auth import changes_engine
from .bodies import FormPart, read_body, read_form, read_json
from .errors import HttpError, bad_request, from_engine, not_found
from .jobflow import outcome_error, result_response, stream_job, wait_done
from .routes import json_response
from .server import streaming
from .sse import Item, Stream, open_response

if TYPE_CHECKING:
    from ..backends.schema import BackendSpec
    from ..engine import Engine
    from ..jobs import JobView
    from .server import HttpServer

log = logging.getLogger("supervisor.http")
_BREAKS = re.compile(r"\r\n|\r|\n")  # what ends a line of an event stream

ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/images/generations": "images",
    "/v1/audio/speech": "speech",
    "/v1/audio/transcriptions": "transcriptions",
    "/v1/responses": "responses",
    "/v1/rerank": "rerank",
}
STREAMABLE = frozenset({"chat", "completions"})  # by a worker (a server streams as it does)
DONE = b"data: [DONE]\n\n"


def add_routes(app: web.Application, server: HttpServer) -> None:
    r = _OpenAI(server)
    app[OPENAI] = r  # the other doors' shapes (Ollama's) submit through it
    app.add_routes([
        web.get("/v1/models", r.models), web.get("/v1/models/{model:.+}", r.model),
        *(web.post(path, r.handler(kind)) for path, kind in ENDPOINTS.items()),
        web.route("*", "/upstream/{model}/{path:.*}", r.upstream),
        web.route("*", "/upstream/{model}", r.upstream)])


LATEST = ":latest"


def has_tag(model: str) -> bool:
    """Whether an Ollama model name carries a tag (``qwen:7b``, ``org/qwen:7b``; not
    ``host:11434/qwen``, whose colon is in an earlier part)."""
    return ":" in model.rsplit("/", 1)[-1]


def ollama_name(model: str) -> str:
    """A model name as Ollama lists it: with its tag, ``:latest`` when it has none."""
    return model if has_tag(model) else model + LATEST


class ModelTable:
    """Model names (backend names first, then aliases) -> backend, for ``api:`` backends, of
    the descriptors ``specs`` (kept: :meth:`of` builds a table anew once they change)."""

    def __init__(self, specs: tuple[BackendSpec, ...]) -> None:
        self.specs = specs
        self.names: dict[str, str] = {}
        specs_by_name = {spec.name: spec for spec in specs}
        # backends a request may name but no list shows
        self.unlisted = {name for name, spec in specs_by_name.items() if spec.unlisted}
        # backends listed by another of their names (``listed_as``) than their own
        self.listed_as = {name: spec.listed_as for name, spec in specs_by_name.items()
                          if spec.listed_as not in (None, name)}
        for name, spec in specs_by_name.items():
            if spec.api:
                self.names[name] = name
        for name, spec in specs_by_name.items():
            if not spec.api:
                continue
            for alias in spec.aliases:
                owner = self.names.get(alias)
                if owner is not None and owner != name:
                    log.warning("model alias %r of %s is already %s's name or alias; %s keeps "
                                "it", alias, name, owner, owner)
                    continue
                self.names[alias] = name
        for model, name in self.names.items():
            tagged = ollama_name(model)
            if self.names.get(tagged, name) != name:
                log.warning("model %r is %s's, and %r, the name Ollama's clients ask for it by "
                            "(its tag added), is %s's: they reach %s", model, name, tagged,
                            self.names[tagged], self.names[tagged])

    @classmethod
    def of(cls, engine: Engine, table: ModelTable | None) -> ModelTable:
        """The table of the engine's descriptors now: ``table`` while they are the same
        objects (a reload adds, removes or replaces them), else a new one."""
        specs = tuple(rt.spec for rt in engine.backends.values())
        if table is not None and len(table.specs) == len(specs) and all(
                a is b for a, b in zip(table.specs, specs, strict=True)):
            return table
        return cls(specs)

    def resolve(self, model: str) -> str | None:
        """The backend ``model`` names: a name or an alias, exactly; else, as Ollama reads a
        name (one without a tag is its ``:latest``), ``x:latest`` names ``x`` and ``x``
        names ``x:latest`` (Open WebUI and the ``ollama`` CLI add the tag)."""
        found = self.names.get(model)
        if found is None:
            if model.endswith(LATEST):
                found = self.names.get(model[:-len(LATEST)])
            elif not has_tag(model):
                found = self.names.get(model + LATEST)
        return found

    def ollama_listed(self, model: str) -> str:
        """``model`` as Ollama's lists name it: with its tag (``x:latest``), unless that
        tagged name is another backend's name or alias, which a client asking by it would
        reach (then bare: the name that reaches this one)."""
        tagged = ollama_name(model)
        other = self.names.get(tagged)
        return model if other is not None and other != self.names.get(model, model) \
            else tagged

    def listed(self) -> list[tuple[str, str]]:
        """(model, backend) for every name the model lists show (``/v1/models``,
        ``/api/tags``): backends with an ``api:`` and their aliases, but the unlisted (and a
        backend's own name when it is ``listed_as`` another)."""
        return [(model, name) for model, name in sorted(self.names.items())
                if name not in self.unlisted
                and not (model == name and name in self.listed_as)]

    def shown(self, backend: str) -> str:
        """The name the lists show ``backend`` by: its ``listed_as``, else its own."""
        return self.listed_as.get(backend, backend)


FORM_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def asks_stream(body: dict[str, Any]) -> bool:
    """Whether an OpenAI request asks for a stream: ``"stream"`` is true, false or absent;
    anything else is refused (a client that sent ``"maybe"`` would otherwise get a worker's
    stream as one unframed body, or a server's answer read as the wrong kind)."""
    value = body.get("stream")
    if value is None or isinstance(value, bool):
        return bool(value)
    raise bad_request(f"stream: true or false, not {json.dumps(value)[:40]}", param="stream")


class _OpenAI:
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.engine = server.engine
        self._table: ModelTable | None = None

    @property
    def table(self) -> ModelTable:
        """The model names of the descriptors now (a reload changes them)."""
        self._table = ModelTable.of(self.engine, self._table)
        return self._table

    # -- models -------------------------------------------------------------------------------
    def _model_json(self, model: str, name: str, states: dict[str, str]) -> dict[str, Any]:
        spec = self.engine.backends[name].spec
        return {"id": model, "object": "model", "created": int(self.engine.wall_started),
                "owned_by": "vramtui", "backend": name, "api": list(spec.api),
                "aliases": list(spec.aliases), "state": states.get(name, "cold"),
                "description": spec.description}

    async def models(self, request: web.Request) -> web.Response:
        """Every name a request may give: backends and their aliases (UIs offer only these)."""
        states = {b.name: b.state for b in self.engine.snapshot().backends}
        return json_response({"object": "list", "data": [
            self._model_json(model, name, states) for model, name in self.table.listed()]})

    async def model(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        name = self.table.resolve(model)
        if name is None:
            raise self._unknown(model)
        states = {b.name: b.state for b in self.engine.snapshot().backends}
        return json_response(self._model_json(model, name, states))

    def _unknown(self, model: str) -> HttpError:
        hint = ""
        if model in self.engine.backends:
            hint = (f"; backend {brief(model)} exists but declares no api (add e.g. 'api: "
                    "chat' to its descriptor)")
        known = ", ".join(sorted(self.table.names)) or "none declare an api"
        return not_found(f"the model {brief(model)} does not exist{hint} (models: {known})",
                         "model_not_found")

    # -- the endpoints ----------------------------------------------------------------------
    def handler(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            return await self._handle(request, kind)

        handle.__name__ = f"openai_{kind}"
        return handle

    async def _handle(self, request: web.Request, kind: str) -> web.StreamResponse:
        served = await self._served(request, kind)
        if served is not None:
            return served
        if kind == "transcriptions":
            body, payload = await self._form_body(request)
        else:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise bad_request("the body must be a JSON object")
            payload = await read_body(request)
        job_id, stream = self.submit(kind, body, payload)
        if not stream:
            return result_response(self.server, await wait_done(self.server, job_id))
        return await self._stream(request, job_id)

    def backend_for(self, model: object, kind: str | None = None) -> str:
        """The backend a request's ``model`` names (that speaks ``kind``), or the error."""
        if not isinstance(model, str) or not model:
            raise bad_request("model: the name of a model (GET /v1/models lists them)",
                              param="model")
        backend = self.table.resolve(model)
        if backend is None:
            raise self._unknown(model)
        spec = self.engine.backends[backend].spec
        if kind is not None and kind not in spec.api:
            raise wrong_api(model, spec.api, kind)
        return backend

    def submit(self, kind: str, body: dict[str, Any], payload: bytes) -> tuple[str, bool]:
        """The job of one request of OpenAI's ``kind`` (``body``: its JSON, ``payload``: its
        bytes): its id, and whether it streams.  Every door that speaks another API's shape
        (Ollama's) comes through here, so its requests run as these do.  A worker's request
        has its fields checked first (:mod:`.openai_fields`): a bad one is a 400 naming it."""
        model = body.get("model")
        backend = self.backend_for(model, kind)
        server = self.engine.backends[backend].spec.server
        stream = asks_stream(body)
        if not server:
            if stream and kind not in STREAMABLE:
                raise bad_request(f"stream is not supported for {kind} by {brief(backend)} (a "
                                  "worker backend answers it whole): send stream false, or "
                                  "leave it out", param="stream")
            if (wrong := openai_fields.problem(kind, body)) is not None:
                raise bad_request(f"{wrong[0]}: {wrong[1]}", param=wrong[0])
        stream = stream and kind in STREAMABLE
        metadata: dict[str, Any] = {"api": kind, "model": model}
        if server:  # the route of the server it goes to
            metadata.update(job_metadata("POST", API_PATHS[kind],
                                         {"content-type": "application/json"}))
        try:
            # A server's job is not journaled, as forward's are: its client goes with the engine.
            job = self.engine.submit(backend, payload, stream=stream, metadata=metadata,
                                     durable=not server)
        except VramtuiError as exc:
            raise from_engine(exc, submitting=True) from None
        return job.id, stream

    async def _served(self, request: web.Request, kind: str) -> web.StreamResponse | None:
        """A request for a model server, forwarded as it came (None: not for a server). Its
        body is parsed here, once (:mod:`.bodies`): a worker's route reads that parse."""
        payload = await read_body(request)
        body: Any = None
        if request.content_type.startswith("multipart/"):
            body = form_fields(await read_form(request))  # (its model; whether it streams)
        elif looks_like_object(payload):
            body = await read_json(request)
        model = body.get("model") if isinstance(body, dict) else None
        backend = self.table.resolve(model) if isinstance(model, str) else None
        spec = self.engine.backends[backend].spec if backend is not None else None
        if spec is None or not spec.server:
            return None
        if kind not in spec.api:
            raise wrong_api(model, spec.api, kind)
        assert isinstance(body, dict)
        return await forward.forward(self.server, request, backend, payload,
                                     stream=asks_stream(body),
                                     path=request.path_qs,
                                     metadata={"api": kind, "model": model})

    @streaming  # websockets and event streams stay open: counted among the streams
    @changes_engine  # any method starts the server: no GET from another site, token needed
    async def upstream(self, request: web.Request) -> web.StreamResponse:
        """``/upstream/{model}/{path}``: anything, to the model's own server. A model ID may
        have slashes (llama-swap's ``org/model:7b``): the longest run of leading segments
        that names a model is it, as llama-swap reads it (``FindModelInPath``), so with
        models ``org`` and ``org/model`` both, ``/upstream/org/model/health`` is the
        second's."""
        model = request.match_info["model"]
        path = request.match_info.get("path")
        rest = [] if path is None else path.split("/")
        found: tuple[str, str, int] | None = None
        for used in range(1, len(rest) + 2):
            backend = self._server_named(model)
            if backend is not None:
                found = backend, model, used
            if used > len(rest):
                break
            model = f"{model}/{rest[used - 1]}"
        if found is None:
            raise forward.unknown_server(request.match_info["model"])
        backend, named, used = found
        if used > len(rest):  # /upstream/model, no slash after it: as llama-swap does, to
            # /upstream/model/, so the relative links of the server's pages resolve there
            raw_query = request.rel_url.raw_query_string  # (as it came: still encoded)
            where = f"/upstream/{quote(named, safe='/')}/" + (f"?{raw_query}"
                                                              if raw_query else "")
            raise (web.HTTPMovedPermanently(where) if request.method in ("GET", "HEAD")
                   else web.HTTPPermanentRedirect(where))
        return await forward.upstream(self.server, request, backend,
                                      "/".join(rest[used - 1:]), segments=used)

    def _server_named(self, model: str) -> str | None:
        """The model server backend ``model`` names (a name or an alias), if any."""
        backend = self.table.resolve(model) or (model if model in self.engine.backends
                                                else None)
        return backend if backend is not None and self.engine.backends[backend].spec.server \
            else None

    async def _form_body(self, request: web.Request) -> tuple[dict[str, Any], bytes]:
        ctype = request.headers.get("Content-Type", "")
        if not ctype.startswith("multipart/form-data"):
            raise bad_request("send the audio as multipart/form-data (file, model, …)")
        parts = await read_form(request)
        body = form_fields(parts)
        for name, filename, content_type, data in parts:
            if filename is not None:
                body[name] = {"filename": filename, "content_type": content_type,
                              "b64": base64.b64encode(data).decode("ascii")}
        if "file" not in body:
            raise bad_request("file: the audio to transcribe", param="file")
        return body, json.dumps(body, separators=(",", ":")).encode()

    async def _stream(self, request: web.Request, job_id: str) -> web.StreamResponse:
        srv = self.server
        enc = _ChunkEncoder(srv, job_id)
        stream = Stream(srv.hub, request, wants=enc.wants, encode=enc.encode,
                        on_lag=enc.resync, heartbeat_s=srv.config.heartbeat_s,
                        buffer_limit=srv.config.subscriber_buffer, job_id=job_id)

        async def whole(view: JobView) -> web.StreamResponse:
            return result_response(srv, view) if view.state.value == "succeeded" \
                else outcome_error(view).response()

        return await stream_job(srv, job_id, stream, whole=whole, opened=lambda: open_response(
            request, headers={"X-Vramtui-Job": job_id}))


OPENAI = web.AppKey("openai_routes", _OpenAI)


class _ChunkEncoder:
    """One job's chunks as ``data: {json}`` lines, then ``data: [DONE]`` (or an error)."""

    def __init__(self, server: HttpServer, job_id: str) -> None:
        self.server = server
        self.job_id = job_id
        self.sent = 0

    def wants(self, item: Item) -> bool:
        ev = item.event
        if ev.kind == "chunk":
            return ev.job_id == self.job_id
        return ev.kind == "job" and ev.job is not None and ev.job.id == self.job_id \
            and ev.job.finished

    def encode(self, item: Item) -> tuple[bytes, bool] | None:
        ev = item.event
        if ev.kind == "chunk":
            self.sent += 1
            return data_lines(ev.data or b""), False
        assert ev.job is not None
        return self._end(ev.job.state.value, ev.job), True

    def _end(self, state: str, view: Any) -> bytes:
        if state == "succeeded":
            return DONE
        err = outcome_error(view)
        return data_lines(json.dumps(err.body()).encode())

    def resync(self, lagged: int, seq: int) -> tuple[bytes, bool]:
        """Fell behind: the chunks it missed, read back from the job, then the end if due."""
        view = watch.live_view(self.server.engine, self.job_id)
        if view is None:
            return data_lines(json.dumps({"error": {"message": "the job is gone",
                                                    "type": "job_failed_error"}}).encode()), True
        out = bytearray()
        for chunk in view.chunks[self.sent:]:
            out += data_lines(chunk)
        self.sent = max(self.sent, len(view.chunks))
        if view.finished:
            out += self._end(view.state.value, view)
            return bytes(out), True
        return bytes(out), False


def form_fields(parts: list[FormPart]) -> dict[str, Any]:
    """A form's text fields as a request's JSON, ``stream`` read as the flag it is (a form's
    fields are text: ``true``, ``1``, ``false``, ``0``)."""
    body: dict[str, Any] = {name: data.decode("utf-8", "replace")
                            for name, filename, _ctype, data in parts if filename is None}
    flag = body.get("stream")
    if isinstance(flag, str):
        body["stream"] = FORM_BOOLEANS.get(flag.strip().lower(), flag)
    return body


def wrong_api(model: str, api: tuple[str, ...], kind: str) -> HttpError:
    """The error for a request of ``kind`` to a model that speaks only ``api``."""
    return bad_request(f"model {brief(model)} speaks {', '.join(api)}, not {kind}", "wrong_api",
                       param="model")


def data_lines(chunk: bytes) -> bytes:
    """A chunk as one SSE message: compact JSON on one line when it is JSON, else each of its
    lines as a ``data:`` line (the client joins them back with newlines)."""
    text = chunk.decode("utf-8", errors="replace").strip()
    with contextlib.suppress(ValueError, RecursionError):  # a worker's JSON nested too deep
        text = dumps_line(json.loads(text))
    return b"".join(b"data: " + line.encode() + b"\n" for line in _BREAKS.split(text)) + b"\n"

