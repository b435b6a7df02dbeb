"""Requests for a model server backend (``http:``): forwarded as jobs, answered as it answers.

A request for a server becomes an ordinary job (admitted by peak, queued by priority, seen in
the TUI and the CLI, cancelled when its client goes) whose payload is the client's body, byte
for byte, and whose metadata says the method, path and body headers
(``supervisor/servers/request.py``). Its answer comes back as the server sent it: a job that
is not streamed with its status, headers and body; a streamed one chunk by chunk as the
server wrote them, under the server's status and headers (the door's allow-list and sandbox
apply as to a worker's result: ``jobflow.answer_headers``). A streamed request still waiting
in the queue is sent SSE comment lines with its place (``: queued, position 2``); clients
ignore them (through ``/upstream``, only a client that accepts ``text/event-stream`` gets
them). If the job fails once its answer has begun, an SSE answer ends with an OpenAI-shaped
error event; any other answer has no way to carry one, and is cut: its connection closes
without the end of its body, so the client reads a broken answer, never a whole one.

``/upstream/{model}/{path}`` passes any request to the model's server (loading it first):
a plain request as a job like the others, a websocket (``Upgrade: websocket``) straight to
the server once it is ready, counted as use of it while open (``doors/tunnels.py``: no
``keep_alive`` unload under it); when the server's side ends without a close of its own
(evicted for room, stopped, crashed) the client's is closed with 1012.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import TYPE_CHECKING, Any

from aiohttp import ClientError, ClientSession, TraceConfig, WSMsgType, web

from supervisor.clock import monotonic

from ..doors import tunnels, watch
from ..errors import EngineStopped, VramtuiError, brief
from ..jobs import JobState
from ..servers.request import forwardable, job_metadata, target_url
from ..workers.states import WorkerState
from .bodies import read_body
from .errors import HttpError, from_engine, not_found
from .jobflow import (
    answer_headers,
    answered_failure,
    cancel_quietly,
    finished_view,
    following,
    outcome_error,
    result_response,
    wait_done,
)
from .sse import Encoded, Item, Stream

if TYPE_CHECKING:
    from .server import HttpServer

_BLANK_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")  # an event's end
QUEUE_NOTE_S = 0.5  # a streamed request still waiting after this hears its queue position
WAITING = frozenset({JobState.QUEUED, JobState.STARTING})


def forwarded_headers(request: web.Request) -> dict[str, str]:
    """The client's end-to-end headers the server may see (never our token or cookies)."""
    return forwardable(request.headers.items())


async def forward(server: HttpServer, request: web.Request, backend: str, payload: bytes, *,
                  stream: bool, path: str, metadata: dict[str, Any],
                  headers: dict[str, str] | None = None,
                  notes: bool = True) -> web.StreamResponse:
    """Submit the request as a job of ``backend`` and answer as its server answers
    (``notes``: a streamed answer may open as SSE, with queue notes, while the job waits)."""
    meta = {**job_metadata(request.method, path, headers if headers is not None
                           else request.headers, every_header=headers is not None), **metadata}
    try:
        # Not journaled: its client goes with the engine, so it is never run again after one.
        job = server.engine.submit(backend, payload, stream=stream, metadata=meta,
                                   durable=False)
    except VramtuiError as exc:
        raise from_engine(exc, submitting=True) from None
    if not stream:
        return result_response(server, await wait_done(server, job.id))
    watch.hurry(server.engine)
    return await _relay(server, request, job.id, notes)


async def _relay(srv: HttpServer, request: web.Request, job_id: str,
                 notes: bool = True) -> web.StreamResponse:
    enc = _RawEncoder(srv, job_id, request)
    # The server's body goes out as it wrote it: no heartbeat comment is ever put in (one could
    # land in the middle of an event the server split across two writes).
    stream = Stream(srv.hub, request, wants=enc.wants, encode=enc.encode, on_lag=enc.resync,
                    heartbeat_s=None, buffer_limit=srv.config.subscriber_buffer,
                    job_id=job_id)
    response: web.StreamResponse | None = None
    with following(srv, job_id, stream):  # joined right after submit: no chunk is missed
        loop = asyncio.get_running_loop()
        while not stream.pending and not stream.lagged and not srv.hub.closed \
                and not stream.ended:
            stream.wake.clear()
            timer = loop.call_later(QUEUE_NOTE_S, stream.wake.set)  # no task per wait
            await stream.wake.wait()
            timer.cancel()
            if notes and not stream.pending and not stream.lagged and not srv.hub.closed \
                    and not stream.ended:
                try:
                    response = await _note_queue(srv, request, job_id, response)
                except (ConnectionError, RuntimeError):  # the client went away meanwhile
                    raise asyncio.CancelledError from None  # (the job is cancelled below)
                # Open as SSE now: a job that fails before its server answers ends with an
                # error event (a bare end reads as an empty, successful completion).
                enc.sse = enc.sse or response is not None
        if stream.client_gone:
            raise asyncio.CancelledError  # (the job is cancelled below)
        first = stream.pending[0] if stream.pending else None
        if first is None and not stream.lagged:
            stopped = from_engine(EngineStopped("the engine stopped before the job answered"))
            if response is None:
                raise stopped
            await response.write(sse_error(stopped))
            return response
        if first is not None and first.event.kind == "job" and first.event.job.finished:
            view = finished_view(srv, job_id, first.event.job)
            if response is None:
                return result_response(srv, view) if view.state is JobState.SUCCEEDED \
                    or answered_failure(view) else outcome_error(view).response()
            await response.write(enc.end(view))
            return response
        if response is None:
            # Its first chunk at hand too (a server that wrote both at once): the head waits
            # for it, so the client gets both in one send and is woken once, not twice.
            with_chunk = any(item.event.kind == "chunk" for item in stream.pending)
            response = await _open(srv, request, job_id, enc, with_chunk)
        else:
            enc.opened_as_sse(watch.answer_head(srv.engine, job_id)[2])
        await stream.run(response)
        return response


async def _note_queue(srv: HttpServer, request: web.Request, job_id: str,
                      response: web.StreamResponse | None) -> web.StreamResponse | None:
    """While the job waits, an SSE comment with its place (the answer opens as SSE then)."""
    view = watch.live_view(srv.engine, job_id)
    if view is None or view.state not in WAITING:
        return response
    if response is None:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no", "X-Vramtui-Job": job_id})
        await response.prepare(request)
    position = watch.queue_position(srv.engine, job_id)
    note = f"queued, position {position}" if position is not None else \
        "starting the model server"
    await response.write(f": {note}\n\n".encode())
    return response


async def _open(srv: HttpServer, request: web.Request, job_id: str,
                enc: _RawEncoder, with_chunk: bool = False) -> web.StreamResponse:
    """The answer under the server's status and headers (those the door lets through);
    ``with_chunk``: its head goes out with the first chunk, written next."""
    backend, status, headers = watch.answer_head(srv.engine, job_id)
    try:
        allowed = answer_headers(srv, backend, job_id, headers)
    except HttpError:
        cancel_quietly(srv, job_id, "cancelled: its server's headers cannot be served")
        raise
    enc.sse = "text/event-stream" in allowed.get("Content-Type", "")
    enc.whole_when_failed = status >= 500  # (its failure is the status: the body is whole)
    # A 5xx fails the job, and goes out as the server said it; one HTTP cannot carry: a 502.
    kind = HeadWithFirstChunk if with_chunk else web.StreamResponse
    response = kind(status=status if 200 <= status <= 599 else 502, headers=allowed)
    await response.prepare(request)
    return response


def sse_error(error: HttpError) -> bytes:
    """An OpenAI-shaped error as one SSE event, for an answer that opened as a stream."""
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


class HeadWithFirstChunk(web.StreamResponse):
    """A streamed answer whose head is held until its first write and goes out with it, in
    one send (as aiohttp's own ``Response`` sends its head with its body): for an answer
    whose first chunk is already at hand, so the client is not woken for the head alone."""

    _send_headers_immediately = False


class _RawEncoder:
    """One job's chunks as the server wrote them; at a failed end, an SSE error event, or
    (an answer of another type) its connection cut before the body's end."""

    def __init__(self, server: HttpServer, job_id: str, request: web.Request) -> None:
        self.server = server
        self.job_id = job_id
        self.request = request
        self.sent = 0
        self.sse = False
        self.whole_when_failed = False  # a 5xx answer: the job fails, its body went whole
        self.head_seen = False
        # An event stream's event the server has not finished yet: held until it is (no
        # client acts on half an event), so a stream that breaks off ends with whole events
        # and our error, never with the half of one that a client would fail to parse.
        self.partial = bytearray()
        # Opened as SSE for its queue notes, then answered with another type (a 400's JSON):
        # its body is held and goes as one ``data:`` event at its end, so an SSE client
        # reads it (raw, it is no event at all: the OpenAI client saw an empty stream).
        self.wrap = False
        self.held = bytearray()

    def opened_as_sse(self, headers: dict[str, Any]) -> None:
        """The answer opened as SSE before its head came; ``headers``: the server's."""
        self.sse = True
        kind = next((str(v) for k, v in headers.items() if k.lower() == "content-type"), "")
        self.wrap = "text/event-stream" not in kind

    def wants(self, item: Item) -> bool:
        ev = item.event
        if ev.kind == "chunk":
            return ev.job_id == self.job_id
        # Its end; or, once, its answer's head (the response opens then, before the first
        # chunk: a server that sends its head before it has a token gains the time).
        if ev.kind != "job" or ev.job is None or ev.job.id != self.job_id:
            return False
        if ev.job.finished:
            return True
        if ev.job.status_code is not None and not self.head_seen:
            self.head_seen = True
            return True
        return False

    def encode(self, item: Item) -> Encoded | None:
        ev = item.event
        if ev.kind == "chunk":
            self.sent += 1
            return self._body(ev.data or b""), False
        if ev.job is not None and not ev.job.finished:
            return None  # the head: the response is open already
        return self.end(ev.job), True

    def _body(self, data: bytes) -> bytes:
        """What of the server's body goes out now (all of it, unless it is held)."""
        if self.wrap:
            self.held += data
            return b""
        if not self.sse or not data:
            return data
        held = self.partial
        start = max(0, len(held) - 3)  # (a blank line may begin in what is held)
        end = None
        for match in _BLANK_LINE.finditer(bytes(held[start:]) + data):
            end = match.end()
        if end is None:
            held += data
            return b""
        whole = bytes(held) + data
        self.partial = bytearray(whole[start + end:])
        return whole[:start + end]

    def end(self, view: Any) -> bytes:
        failed = view is not None and view.state is not JobState.SUCCEEDED
        if self.wrap and not failed and self.held:
            lines = bytes(self.held).rstrip(b"\r\n").replace(b"\r\n", b"\n").split(b"\n")
            return b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
        rest, self.partial = bytes(self.partial), bytearray()
        if view is None or not failed:
            return rest  # (a server that ended its last event without a blank line)
        if not self.sse:
            # No error fits in its body: the connection closes (what was written still goes)
            # without the body's end (its last chunk), which would tell the client it was whole.
            if not self.whole_when_failed and self.request.transport is not None:
                self.request.transport.close()
            return b""
        # An event it left unfinished never goes (a 5xx's whole body does, ended), so the
        # error stands alone.
        rest = rest + b"\n\n" if rest and self.whole_when_failed else b""
        return rest + sse_error(outcome_error(view))

    def resync(self, lagged: int, seq: int) -> Encoded:
        """Fell behind: the chunks it missed, read back from the job, then the end if due."""
        view = watch.live_view(self.server.engine, self.job_id)
        if view is None:
            return b"", True
        out = self._body(b"".join(view.chunks[self.sent:]))
        self.sent = max(self.sent, len(view.chunks))
        if view.finished:
            return out + self.end(view), True
        return out, False


# -- /upstream/{model}/{path} ---------------------------------------------------------------
async def upstream(server: HttpServer, request: web.Request, backend: str,
                   path: str, segments: int = 1) -> web.StreamResponse:
    """Any request to ``backend``'s server (``segments``: how many path segments after
    ``/upstream`` its model ID took): a websocket straight through once it is ready,
    anything else as a job."""
    target = raw_target(request, path, segments)
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await _websocket(server, request, backend, target)
    payload = await read_body(request)
    # Queue notes only to a client that reads an event stream: any other body stays the
    # server's, byte for byte.
    sse = "text/event-stream" in request.headers.get("Accept", "")
    return await forward(server, request, backend, payload, stream=True, path=target,
                         metadata={"api": "upstream"}, headers=forwarded_headers(request),
                         notes=sse)


def raw_target(request: web.Request, path: str, segments: int = 1) -> str:
    """What follows ``/upstream/{model}`` (the model ID ``segments`` long) in the request as
    the client wrote it (still percent-encoded, its query kept): a relay that decoded it would
    send another request."""
    # "", "upstream", the model's segments, the rest
    parts = request.rel_url.raw_path.split("/", 2 + segments)
    rest = parts[-1] if len(parts) == 3 + segments and parts[1] == "upstream" else path
    query = request.rel_url.raw_query_string
    return "/" + rest + (f"?{query}" if query else "")


async def server_url(server: HttpServer, backend: str,
                     timeout: float) -> tuple[str, dict[str, str]]:
    """The base URL of ``backend``'s server once it is ready (it is started if cold, woken
    if asleep), and the headers the engine's own requests to it carry (its ``${API_KEY}``)."""
    engine = server.engine
    deadline = monotonic() + timeout
    asked = False
    while True:
        rt = engine.backends.get(backend)
        worker = rt.worker if rt is not None else None
        launch = getattr(worker, "launch", None)
        if worker is not None and worker.hot and launch is not None:
            return launch.url, launch.auth_headers
        if rt is not None and rt.health.failed:
            raise HttpError(502, f"{backend} failed to start: {rt.health.last_error}",
                            "server_error", "backend_failed")
        away = worker is None or worker.state == WorkerState.ASLEEP
        if away and not asked:  # asked once; again only if it went away (or fell asleep)
            try:
                engine.preload(backend)
            except VramtuiError as exc:
                raise from_engine(exc) from None
        asked = away
        if monotonic() > deadline:
            raise HttpError(504, f"{backend} was not ready within {timeout:g} s",
                            "timeout_error", "not_ready")
        await asyncio.sleep(0.05)


async def _websocket(server: HttpServer, request: web.Request, backend: str,
                     target: str) -> web.StreamResponse:
    """The server's websocket first (refused: a 502 to the client, who never had one), then
    the client's; open, it is use of the server: no keep_alive unload under it (room may
    still evict it; its server's end then closes the client's with WS_SERVER_GONE)."""
    spec = server.engine.backends[backend].spec
    base, auth = await server_url(server, backend, spec.timeouts.start_s)
    async with ClientSession(trace_configs=[_NO_REDIRECTS]) as session:
        try:
            # The handshake to the server is the engine's own, not the client's.
            own = {k: v for k, v in forwarded_headers(request).items()
                   if not k.lower().startswith("sec-websocket-")}
            own.update(auth)  # its ${API_KEY}
            upstream_ws = await session.ws_connect(
                target_url(base.replace("http", "ws", 1), target), headers=own)
        except Exception as exc:  # noqa: BLE001 - any failure is the client's 502
            raise HttpError(502, f"{backend}'s server refused the websocket: "
                            f"{str(exc)[:200] or type(exc).__name__}", "server_error",
                            "upstream_refused") from None
        async with upstream_ws:
            with tunnels.tunnel(server.engine, backend) as held:
                client = web.WebSocketResponse()
                await client.prepare(request)
                server_gone = (WS_SERVER_GONE, _reason(
                    f"{backend}'s server closed the websocket (it was unloaded, stopped "
                    "or failed)"))
                await asyncio.gather(_pipe(client, upstream_ws, held, CLIENT_GONE),
                                     _pipe(upstream_ws, client, held, server_gone),
                                     return_exceptions=True)
    return client


#: The close code a client gets when its server's side ended without a close of its own
#: (unloaded, stopped, crashed) or refused it: 1012, "service restart" (RFC 6455's registry):
#: a client that reconnects gets the server loaded again.
WS_SERVER_GONE = 1012
#: What the server is told when the client went without a close: 1001, "going away".
CLIENT_GONE = (1001, b"the client went away")


def _reason(text: str) -> bytes:
    """A close reason: at most 123 bytes (a close frame's limit), cut on a character."""
    return text.encode()[:120].decode("utf-8", "ignore").encode()


class RedirectRefused(ClientError):
    """A server answered a websocket's handshake with a redirect: never followed."""


async def _refuse_redirect(session: Any, context: Any, params: Any) -> None:
    where = params.response.headers.get("Location", "?")[:60]
    raise RedirectRefused(f"redirected to {where!r}: not followed")


# aiohttp's ws_connect follows redirects and has no switch for it: a server could send the
# engine's handshake to any host and port.  Plain requests are made with allow_redirects=False.
_NO_REDIRECTS = TraceConfig()
_NO_REDIRECTS.on_request_redirect.append(_refuse_redirect)


async def _pipe(source: Any, sink: Any, held: tunnels.Tunnel | None,
                gone: tuple[int, bytes]) -> None:
    """Messages from ``source`` to ``sink`` as they come; at the end, ``sink`` is closed with
    ``source``'s close code, or with ``gone`` when ``source`` went without one."""
    code, reason = gone
    try:
        async for msg in source:
            if held is not None:
                held.carried()
            if msg.type == WSMsgType.TEXT:
                await sink.send_str(msg.data)
            elif msg.type == WSMsgType.BINARY:
                await sink.send_bytes(msg.data)
            else:
                break
        if source.close_code is not None and 1000 <= source.close_code < 5000 \
                and source.close_code not in (1005, 1006, 1015):
            code, reason = source.close_code, b""  # (its own reason is not kept by aiohttp)
    finally:
        with contextlib.suppress(Exception):
            await sink.close(code=code, message=reason)


def unknown_server(model: str) -> HttpError:
    return not_found(f"no model server named {brief(model)} (a backend with an http: section)",
                     "model_not_found")
