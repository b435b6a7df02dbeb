"""Ollama's routes that run a model: ``/api/chat``, ``/api/generate``, ``/api/embed`` and the
legacy ``/api/embeddings``.

Each request is translated to OpenAI's shape (:mod:`.ollama_shapes`) and submitted through
the very path the OpenAI routes use (``OPENAI``'s ``submit``, :mod:`.openai_routes`): the
same model names and aliases, the same job (admitted, queued, visible, cancelled when the
client goes), whatever the backend is — a worker or a model server.  Its answer comes back
in Ollama's shape: one JSON object (``"stream": false``), or Ollama's NDJSON stream, one
object per line, ended by ``"done": true`` — never an SSE comment, which no NDJSON reader
takes.  A request without messages (or with an empty prompt) loads the model, as Ollama's
does, answered once it is loaded; with ``"keep_alive": 0`` it unloads it (once idle).
Every error is Ollama's ``{"error": "…"}`` with the status the OpenAI routes would give;
a model's refusal (a status not 2xx) with its status and its own words, streamed or not (a
refused stream is never opened: its error is answered whole); an answer that is not
OpenAI's shape, a 502.  A stream that goes wrong once it began (the model's error event, a
chunk of the wrong shape) ends with one error line, as Ollama's does, and its job is
cancelled: nobody reads the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..doors import watch
from ..errors import VramtuiError, brief
from ..events import EngineEvent
from ..jobs import JobState, JobView
from ..jsonline import dumps_line
from ..workers.states import WorkerState
from . import ollama_shapes as shapes
from .bodies import read_json
from .errors import OLLAMA_SHAPED, HttpError, bad_request, from_engine
from .jobflow import answered_failure, cancel_quietly, outcome_error, stream_job, wait_done
from .openai_routes import OPENAI
from .sse import Item, Stream

if TYPE_CHECKING:
    from .server import HttpServer

NDJSON = "application/x-ndjson"
LOADED = frozenset({WorkerState.READY, WorkerState.BUSY})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def add_routes(app: web.Application, server: HttpServer) -> None:
    r = _OllamaJobs(server, app)
    app.add_routes([web.post("/api/chat", r.chat), web.post("/api/generate", r.generate),
                            web.post("/api/embed", r.embed),
                            web.post("/api/embeddings", r.embeddings)])


def ollama_error(status: int, message: str) -> web.Response:
    return HttpError(status, message, "ollama_error").ollama_response()


def ollama_errors(handler: Handler) -> Handler:
    """Errors in Ollama's shape (``{"error": "…"}``), which its clients read, not OpenAI's:
    the route is marked ``OLLAMA_SHAPED``, so the door answers its ``HttpError``s so
    (``HttpError.response_for``), and its own request errors are answered here."""
    @functools.wraps(handler)
    async def wrapped(self: Any, request: web.Request) -> web.StreamResponse:
        try:
            return await handler(self, request)
        except shapes.ShapeError as exc:
            return ollama_error(400, str(exc))
        except web.HTTPRequestEntityTooLarge as exc:
            return ollama_error(413, f"request body too large: {exc.text}")
        except shapes.BadAnswer as exc:  # (the model's, not the client's)
            return ollama_error(502, str(exc))
    setattr(wrapped, OLLAMA_SHAPED, True)  # (the door's own errors take its shape too)
    return wrapped  # type: ignore[return-value]


def _line(obj: Any) -> bytes:
    return dumps_line(obj).encode() + b"\n"


def _result(view: JobView) -> Any:
    """A finished job's answer, parsed; the job's failure, or the model's error (an answer
    whose status is not 2xx, or that is an error object), as an :class:`HttpError` whose
    message is the model's own, one bounded line."""
    if view.state is not JobState.SUCCEEDED and not answered_failure(view):
        raise outcome_error(view)
    data = view.data if view.data is not None else b"".join(view.chunks)
    status = view.status_code or 200
    if not 200 <= status <= 299:
        raise HttpError(status if 400 <= status <= 599 else 502,
                        shapes.answer_error(data, status), "job_failed_error", "model_error")
    try:
        parsed = json.loads(data) if data else {}
    except (ValueError, RecursionError):
        raise HttpError(502, f"job {view.id}: the model's answer is not JSON",
                        "job_failed_error", "bad_answer") from None
    if (said := shapes.server_error(parsed)) is not None:
        raise HttpError(502, f"the model answered an error: {said}", "job_failed_error",
                        "model_error")
    return parsed


class _OllamaJobs:
    def __init__(self, server: HttpServer, app: web.Application) -> None:
        self.server = server
        self.engine = server.engine
        self.app = app

    async def _body(self, request: web.Request) -> dict[str, Any]:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object")
        return body

    # -- chat and generate ------------------------------------------------------------------
    @ollama_errors
    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    @ollama_errors
    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "generate")

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        body = await self._body(request)
        model = shapes.model_of(body)
        door = self.app[OPENAI]
        backend = door.backend_for(model)
        api = self.engine.backends[backend].spec.api
        # /api/generate with "raw": the prompt as it is, when the model takes completions
        raw = kind == "generate" and body.get("raw") is True and "completions" in api
        openai = "completions" if raw else "chat" if "chat" in api else "completions" if (
            kind == "generate" and "completions" in api) else None
        if openai is None:
            raise bad_request(f"model {brief(model)} speaks {', '.join(api)}, not chat "
                              f"(/api/{kind} needs a chat model)", "wrong_api")
        unload = shapes.keep_alive_s(body) == 0  # (checked before anything runs)
        empty = not body.get("messages") if kind == "chat" else not body.get("prompt")
        if empty:
            return await self._load_or_unload(backend, kind, model, unload=unload)
        translated = shapes.chat_request(body, model) if kind == "chat" else \
            shapes.generate_request(body, model, openai)
        started = time.monotonic_ns()
        job_id, stream = door.submit(openai, translated, json.dumps(translated).encode())
        reply = shapes.Reply(kind, model, openai)
        try:
            if not stream:
                view = await wait_done(self.server, job_id)
                parsed = _result(view)
                return web.json_response(reply.whole(parsed, time.monotonic_ns() - started))
            server = bool(self.engine.backends[backend].spec.server)
            return await self._stream(request, job_id, reply, started, server)
        finally:
            if unload:
                self._unload_after(backend)

    def _unload_after(self, backend: str) -> None:
        """``keep_alive: 0`` on a request: its model unloads once its answer is done (and
        any other under way), as Ollama's does."""
        with contextlib.suppress(VramtuiError):  # (gone meanwhile: a reload removed it)
            self.engine.evict_when_idle(backend)

    async def _load_or_unload(self, backend: str, kind: str, model: str, *,
                              unload: bool) -> web.Response:
        await self._nothing_asked(backend, unload=unload)
        return web.json_response(shapes.load_reply(kind, model,
                                                   "unload" if unload else "load"))

    async def _nothing_asked(self, backend: str, *, unload: bool) -> None:
        """A request that asks the model nothing: it loads the model, as Ollama's does (it
        unloads it with ``keep_alive: 0``: a busy one once its requests are answered)."""
        try:
            if unload:
                self.engine.evict_when_idle(backend)
            else:
                await self._load(backend)
        except VramtuiError as exc:
            raise from_engine(exc) from None

    async def _load(self, backend: str) -> None:
        """Load ``backend`` and answer once it is loaded, as Ollama's load does (it said
        "load" at once, while the model still loaded, or failed to): its start's error, or
        why it was not loaded (no room, nothing evicted for a load), as Ollama's error. A
        worker still stopping is waited for, and the load asked again once it has gone."""
        rt = self.engine.backends[backend]
        failures = rt.health.init_failures
        changed = asyncio.Event()
        given_up: list[str] = []

        def seen(event: EngineEvent) -> None:
            if event.backend == backend:
                if event.kind == "log" and event.message.startswith("gave up preloading"):
                    given_up.append(event.message)
                changed.set()

        sub = self.engine.events.subscribe(kinds=frozenset({"worker", "log"}), callback=seen)
        asked = False
        try:
            while True:
                w = rt.worker
                if w is not None and w.state in LOADED:
                    return
                if rt.health.init_failures > failures or rt.health.failed:
                    raise HttpError(500, f"{backend} did not load: {rt.health.last_error}",
                                    "load_failed")
                waits = w is None or w.state == WorkerState.ASLEEP  # (for a load, or a wake)
                if waits and rt.preload_until is None:
                    if asked:  # the engine gave it up: why is what it logged
                        why = given_up[-1] if given_up else "no room for it now"
                        raise HttpError(503, f"{backend} was not loaded: {why} (a load "
                                        "evicts nothing)", "not_loaded")
                    self.engine.preload(backend)  # (refused: too large for every GPU here)
                    asked = True
                    continue
                changed.clear()
                # (a give-up comes with no worker event: looked at again each second)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)
        finally:
            sub.close()

    async def _stream(self, request: web.Request, job_id: str, reply: shapes.Reply,
                      started: int, server: bool) -> web.StreamResponse:
        srv = self.server
        enc = _NdjsonEncoder(srv, job_id, reply, started, server)
        stream = Stream(srv.hub, request, wants=enc.wants, encode=enc.encode,
                        on_lag=enc.resync, heartbeat_s=srv.config.heartbeat_s,
                        buffer_limit=srv.config.subscriber_buffer, heartbeat=None,
                        job_id=job_id)

        async def whole(view: JobView) -> web.StreamResponse:
            # Ended before a chunk: its whole answer (or its error) in one line.
            parsed = _result(view)
            body = reply.whole(parsed, time.monotonic_ns() - started)
            return web.Response(body=_line(body), content_type=NDJSON)

        async def opened() -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": NDJSON,
                                                   "Cache-Control": "no-cache",
                                                   "X-Vramtui-Job": job_id})
            await response.prepare(request)
            return response

        return await stream_job(srv, job_id, stream, whole=whole, opened=opened, hurry=True)

    # -- embeddings -------------------------------------------------------------------------
    @ollama_errors
    async def embed(self, request: web.Request) -> web.StreamResponse:
        return await self._embed(request, legacy=False)

    @ollama_errors
    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._embed(request, legacy=True)

    async def _embed(self, request: web.Request, *, legacy: bool) -> web.StreamResponse:
        body = await self._body(request)
        model = shapes.model_of(body)
        translated = shapes.embed_request(body, model, legacy=legacy)
        unload = shapes.keep_alive_s(body) == 0
        started = time.monotonic_ns()
        door = self.app[OPENAI]
        backend = door.backend_for(model, "embeddings")
        if translated is None:  # nothing to embed
            await self._nothing_asked(backend, unload=unload)
            return web.json_response({"embedding": []} if legacy else {
                "model": model, "embeddings": [], "total_duration": time.monotonic_ns() -
                started, "load_duration": 0})
        job_id, _ = door.submit("embeddings", translated, json.dumps(translated).encode())
        try:
            view = await wait_done(self.server, job_id)
        finally:
            if unload:
                self._unload_after(backend)
        parsed = _result(view)
        return web.json_response(shapes.embed_reply(
            parsed, model, time.monotonic_ns() - started, legacy=legacy,
            dimensions=None if legacy else shapes.embed_dimensions(body)))


class _NdjsonEncoder:
    """One job's chunks as Ollama's NDJSON lines, then the ``done`` line; or, once the model
    said an error or answered what is not OpenAI's shape, a last ``{"error": "…"}`` line (as
    Ollama ends a stream that fails), and the job is cancelled: nobody reads the rest, so its
    server stops generating and its slot is free at once."""

    def __init__(self, server: HttpServer, job_id: str, reply: shapes.Reply,
                 started: int, from_server: bool) -> None:
        self.server = server
        self.job_id = job_id
        self.reply = reply
        self.started = started
        self.reader = shapes.ChunkReader(server=from_server)
        self.sent = 0

    def wants(self, item: Item) -> bool:
        ev = item.event
        if ev.kind == "chunk":
            return ev.job_id == self.job_id
        return ev.kind == "job" and ev.job is not None and ev.job.id == self.job_id \
            and ev.job.finished

    def _chunk(self, data: bytes) -> tuple[bytes, bool]:
        """The lines of one chunk, and whether the stream ends with them (an error)."""
        self.sent += 1
        out = bytearray()
        for obj in self.reader.feed(data):
            said = shapes.server_error(obj)
            if said is not None:
                return bytes(out) + self._failed(f"the model answered an error: {said}"), True
            try:
                lines = self.reply.chunk(obj)
            except shapes.BadAnswer as exc:
                return bytes(out) + self._failed(str(exc)), True
            out += b"".join(_line(line) for line in lines)
        return bytes(out), False

    def _failed(self, message: str) -> bytes:
        cancel_quietly(self.server, self.job_id, f"cancelled: its stream ended: {message}")
        return _line(shapes.error_body(message))

    def _end(self, view: JobView) -> bytes:
        if view.state is JobState.SUCCEEDED:
            took = time.monotonic_ns() - self.started
            return b"".join(_line(line) for line in self.reply.done(took))
        return _line(shapes.error_body(outcome_error(view).message))

    def encode(self, item: Item) -> tuple[bytes, bool] | None:
        ev = item.event
        if ev.kind == "chunk":
            return self._chunk(ev.data or b"")
        assert ev.job is not None
        return self._end(ev.job), True

    def resync(self, lagged: int, seq: int) -> tuple[bytes, bool]:
        """Fell behind: the chunks it missed, read back from the job, then the end if due."""
        view = watch.live_view(self.server.engine, self.job_id)
        if view is None:
            return _line(shapes.error_body("the job is gone")), True
        out = bytearray()
        for chunk in view.chunks[self.sent:]:
            data, end = self._chunk(chunk)
            out += data
            if end:
                return bytes(out), True
        if view.finished:
            out += self._end(view)
            return bytes(out), True
        return bytes(out), False
