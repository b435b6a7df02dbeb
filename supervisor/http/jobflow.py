"""A job's life over HTTP, shared by the native and the OpenAI-compatible routes.

- :func:`wait_done`: await a job's end on the loop (:mod:`supervisor.doors.watch`), and
  cancel the job if the client goes away first;
- :func:`result_response`: a finished job as the worker answered it — its body, Content-Type,
  headers and status — or the error shape when it did not succeed;
- :func:`following` and :func:`stream_job`: a just-submitted job answered as a stream, the
  job cancelled when nobody will read the rest of its answer (its client went, or the
  answer failed);
- :class:`JobStream`: the SSE encoding of one job's events.  A job stream never loses a chunk:
  when its client falls behind, the chunks it missed are read back from the job itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..doors import watch
from ..errors import EngineStopped, JobTimeout, UnknownJob
from ..jobs import JobState, JobView
from .errors import HttpError, conflict, from_engine
from .sse import Encoded, Item, Stream, frame
from .views import chunk_json, job_resource

if TYPE_CHECKING:
    from .server import HttpServer

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# What a worker may say about its body, and nothing else: a response's other headers are the
# door's own (framing, security, redirects, CORS, cookies, refresh).
_ALLOWED = frozenset({"content-type", "content-encoding", "content-language",
                      "content-disposition", "cache-control", "expires", "etag",
                      "last-modified"})
# X- names that are not the worker's to set: ours, and those a proxy in front would obey.
_X_RESERVED = ("x-content-type-options", "x-frame-options", "x-xss-protection",
               "x-permitted-cross-domain-policies", "x-vramtui-", "x-accel-", "x-sendfile",
               "x-lighttpd-send-file", "x-forwarded-", "x-real-ip")
# Types a browser runs or renders as a document of this origin: served as attachments unless
# the backend says ``inline_results: true``.
_ACTIVE = frozenset({"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml",
                     "application/xml", "text/xsl", "text/javascript",
                     "application/javascript", "application/x-javascript", "text/ecmascript",
                     "application/ecmascript", "application/pdf",
                     "application/x-shockwave-flash", "multipart/x-mixed-replace"})
MAX_HEADERS = 64
MAX_HEADER_VALUE = 8192
# On every body a worker provides: never sniffed into something active, and if it is shown
# as a document anyway, a sandbox with no script and an opaque origin.
SANDBOX = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}


def worker_text_headers() -> dict[str, str]:
    """The headers of text a worker or a model server wrote, served as text by every route
    that serves it (a backend's log, the engine's event log that quotes their errors): plain
    text, never sniffed into a page, a sandbox if shown as one anyway, not cached."""
    return {"Content-Type": "text/plain; charset=utf-8", "Cache-Control": "no-cache",
            **SANDBOX}


class BadWorkerHeader(ValueError):
    """A worker's header that no HTTP response may carry (a control character, a bad name)."""


def _allowed(name: str) -> bool:
    low = name.lower()
    if low in _ALLOWED:
        return True
    return low.startswith("x-") and not low.startswith(_X_RESERVED)


def worker_headers(headers: dict[str, Any]) -> dict[str, str]:
    """The worker's headers that may go out on HTTP: an allow-list of names, values bounded;
    raises :class:`BadWorkerHeader` for one that could break or split the response."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        if not isinstance(key, str) or not _TOKEN.match(key):
            raise BadWorkerHeader(f"the header name {str(key)[:40]!r} is not an HTTP token")
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise BadWorkerHeader(f"the header {key} has a {type(value).__name__} value")
        text = str(value)
        if _CONTROL.search(text):
            raise BadWorkerHeader(f"the header {key} has a control character")
        if not _allowed(key) or len(text) > MAX_HEADER_VALUE or len(out) >= MAX_HEADERS:
            continue
        out[key] = text
    return out


def is_active(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind in _ACTIVE or kind.endswith("+xml")


def outcome_error(view: JobView) -> HttpError:
    """Why a finished job has no result to give."""
    text = view.error or view.state.value
    if view.state is JobState.TIMED_OUT:
        return HttpError(504, f"job {view.id}: {text}", "timeout_error", "job_timed_out")
    if view.state is JobState.CANCELLED:
        return conflict(f"job {view.id} was cancelled: {text}", "job_cancelled")
    return HttpError(502, f"job {view.id} failed: {text}", "job_failed_error", "job_failed")


def answered_failure(view: JobView) -> bool:
    """A job that failed with its model server's own whole answer (a 5xx): its client gets
    that answer, status, headers and body, as the server gave it (not a 502 of ours)."""
    return view.state is JobState.FAILED and view.data is not None and \
        500 <= (view.status_code or 0) <= 599


def finished_view(server: HttpServer, job_id: str, fallback: JobView | None = None) -> JobView:
    """The job as the engine holds it now (its result included), or ``fallback``."""
    try:
        return watch.job_view(server.engine, job_id)
    except UnknownJob:
        if fallback is not None:
            return fallback
        raise


def result_response(server: HttpServer, view: JobView) -> web.Response:
    """A finished job's answer: the worker's own body, headers and status (a model server's
    5xx too: :func:`answered_failure`), or an error."""
    if not view.finished:
        raise HttpError(409, f"job {view.id} has not finished ({view.state.value}); wait for "
                        "it (GET /v1/jobs/{id}/events) and ask again", "conflict_error",
                        "job_not_finished", headers={"Retry-After": "1"})
    if view.state is not JobState.SUCCEEDED and not answered_failure(view):
        raise outcome_error(view)
    data = view.data if view.data is not None else b"".join(view.chunks)
    status = view.status_code or 200
    if not 200 <= status <= 599:
        raise HttpError(502, f"job {view.id}: the worker answered status {status}, which HTTP "
                        "cannot carry", "job_failed_error", "bad_worker_status")
    headers = answer_headers(server, view.backend, view.id, view.headers)
    ctype = headers.pop("Content-Type", None)
    kind = (ctype or "application/octet-stream").split(";")[0].strip() or \
        "application/octet-stream"
    resp = web.Response(status=status, body=data, headers=headers)
    resp.content_type = kind
    if ctype and "charset=" in ctype:
        resp.charset = ctype.split("charset=", 1)[1].split(";")[0].strip() or None
    return resp


def answer_headers(server: HttpServer, backend: str, job_id: str,
                   given: dict[str, Any]) -> dict[str, str]:
    """The headers a worker's or a model server's answer goes out with, whole or streamed:
    its allowed headers (``Content-Type`` under that name), an active type as an attachment
    unless the backend says ``inline_results``, and :data:`SANDBOX`; a header that HTTP
    cannot carry is a 502 (``bad_worker_header``)."""
    try:
        allowed = worker_headers(given)
    except BadWorkerHeader as exc:
        raise HttpError(502, f"job {job_id}: {exc}, which HTTP cannot carry; the answer is "
                        "not served", "job_failed_error", "bad_worker_header") from None
    headers: dict[str, str] = {}
    for key, value in allowed.items():
        low = key.lower()
        headers[{"content-type": "Content-Type",
                 "content-disposition": "Content-Disposition"}.get(low, key)] = value
    kind = headers.get("Content-Type", "").split(";")[0].strip()
    if is_active(kind) and not _inline_allowed(server, backend):
        disposition = headers.get("Content-Disposition", "")
        headers["Content-Disposition"] = disposition if disposition.lower().startswith(
            "attachment") else "attachment"
    headers.update(SANDBOX)
    headers["X-Vramtui-Job"] = job_id
    return headers


def _inline_allowed(server: HttpServer, backend: str) -> bool:
    rt = server.engine.backends.get(backend)
    return rt is not None and rt.spec.inline_results


async def wait_done(server: HttpServer, job_id: str, *, cancel_on_disconnect: bool = True,
                    timeout: float | None = None) -> JobView:
    """The job's final view once it ends, its result included (what the engine holds of the
    finished job: no need to read it again); cancels the job if this request is cancelled (the
    client went away) before that.  ``timeout``: give up waiting (504) after this many seconds
    (the job goes on)."""
    engine = server.engine
    end = watch.JobEnd.of(engine, job_id)
    if end is None:
        try:
            return watch.job_view(engine, job_id)
        except UnknownJob as exc:
            raise from_engine(exc) from None
    try:
        # hurry: a job just submitted reaches a hot worker before this waits
        return await end.wait(timeout, hurry=True)
    except asyncio.CancelledError:
        if cancel_on_disconnect:
            cancel_quietly(server, job_id, "cancelled: the HTTP client went away")
        raise
    except (EngineStopped, JobTimeout) as exc:
        raise from_engine(exc) from None


def cancel_quietly(server: HttpServer, job_id: str, note: str) -> None:
    """Cancel a job whose HTTP client went away (if it has not ended)."""
    watch.abandon(server.engine, job_id, note)


@contextlib.contextmanager
def following(server: HttpServer, job_id: str, stream: Stream) -> Iterator[None]:
    """``stream`` fed by the hub while the block runs (joined now: no chunk is missed); the
    job is cancelled when nobody will read the rest of its answer: its client went away (the
    block cancelled, or the stream ended by the client before the job did), or the block
    failed (an error is answered instead, or the answer is cut)."""
    server.hub.add(stream)
    try:
        yield
    except asyncio.CancelledError:
        cancel_quietly(server, job_id, "cancelled: the HTTP client went away")
        raise
    except Exception as exc:
        cancel_quietly(server, job_id, f"cancelled: its answer failed: "
                       f"{str(exc)[:200] or type(exc).__name__}")
        raise
    finally:
        server.hub.discard(stream)
    if stream.client_gone and not stream.finished:
        cancel_quietly(server, job_id, "cancelled: the HTTP client went away")


async def stream_job(server: HttpServer, job_id: str, stream: Stream, *,
                     whole: Callable[[JobView], Awaitable[web.StreamResponse]],
                     opened: Callable[[], Awaitable[web.StreamResponse]],
                     hurry: bool = False) -> web.StreamResponse:
    """Answer a just-submitted job as a stream: ``stream`` joins the hub at once (no chunk is
    missed; ``hurry``: a hot worker starts on it now, not on the loop's next turn); a job that
    ends before its first chunk, or whose answer began with a status that is not 2xx (a model
    server's refusal: its error, with its status, not a 200 stream of it), is answered by
    ``whole`` (its final view); else ``opened()`` is the response the stream runs into.  A
    client that goes away cancels the job."""
    with following(server, job_id, stream):
        if hurry:
            watch.hurry(server.engine)
        while not stream.pending and not stream.lagged and not server.hub.closed:
            stream.wake.clear()
            await stream.wake.wait()
        first = stream.pending[0] if stream.pending else None
        if first is None and not stream.lagged:
            raise from_engine(EngineStopped("the engine stopped before the job streamed"))
        if first is not None and first.event.kind == "job" and first.event.job is not None \
                and first.event.job.finished:
            return await whole(finished_view(server, job_id, first.event.job))
        if not 200 <= watch.answer_head(server.engine, job_id)[1] <= 299:
            return await whole(await wait_done(server, job_id))
        response = await opened()
        await stream.run(response)
        return response


class JobStream:
    """The native SSE encoding of one job: ``state``, ``progress`` and ``chunk`` events."""

    def __init__(self, server: HttpServer, job_id: str, state: str | None = None) -> None:
        self.server = server
        self.job_id = job_id
        self.last_state = state
        self.sent_chunks = 0

    def wants(self, item: Item) -> bool:
        ev = item.event
        return ev.job_id == self.job_id if ev.kind == "chunk" else (
            ev.kind == "job" and ev.job is not None and ev.job.id == self.job_id)

    def encode(self, item: Item) -> Encoded | None:
        ev = item.event
        if ev.kind == "chunk":
            self.sent_chunks += 1
            return frame("chunk", {"job_id": self.job_id, "index": self.sent_chunks - 1,
                                   **chunk_json(ev.data or b"")}, item.id), False
        view = ev.job
        assert view is not None
        if view.state.value != self.last_state:
            self.last_state = view.state.value
            return frame("state", job_resource(view, history=False), item.id), view.finished
        return frame("progress", {"job_id": view.id, "state": view.state.value,
                                  "progress": view.progress, "text": view.progress_text},
                     item.id), view.finished

    def resume(self, replay: list[Item]) -> None:
        """A client resuming after an event: the chunks it had are the job's so far less
        those ``replay`` holds, so the replayed ones keep their index in the job."""
        try:
            had = len(watch.job_view(self.server.engine, self.job_id).chunks)
        except UnknownJob:
            return
        again = sum(1 for item in replay
                    if item.event.kind == "chunk" and item.event.job_id == self.job_id)
        self.sent_chunks = max(0, had - again)

    def resync(self, lagged: int, seq: int) -> Encoded:
        """The job as it is now (a fresh snapshot), with every chunk this client missed."""
        try:
            view = watch.job_view(self.server.engine, self.job_id)
        except UnknownJob:
            return frame("state", {"job_id": self.job_id, "state": "unknown",
                                   "error": "the job is no longer known"}, seq), True
        out = bytearray()
        body = job_resource(view, history=False)
        if lagged:
            body["lagged"] = lagged
        out += frame("state", body, seq)
        self.last_state = view.state.value
        chunks = view.chunks  # the job's chunks so far, from the same view
        for i in range(self.sent_chunks, len(chunks)):
            out += frame("chunk", {"job_id": self.job_id, "index": i, **chunk_json(chunks[i])})
        self.sent_chunks = max(self.sent_chunks, len(chunks))
        return bytes(out), view.finished
