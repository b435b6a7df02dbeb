"""The native routes: jobs, backends, GPUs, logs, events, health, version and metrics.

Each handler runs on the engine loop and calls the engine's own synchronous methods, or, for
an API method, its function in :mod:`supervisor.operations` with the arguments checked by its
entry in :mod:`supervisor.apispec` (as the control socket and the facade do).  The routes are
:data:`supervisor.http.route_table.ROUTES`, checked against the API's list of methods when
they are added; ``GET /v1`` lists them.  JSON comes from :mod:`supervisor.doors.codec`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
import os
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .. import operations
from ..apispec import METHODS
from ..control.logtail import read_log
from ..doors.codec import plain, yield_json
from ..errors import InvalidRequest, UnknownBackend, VramtuiError, brief
from ..jobs.query import job_detail
from ..units import digits, parse_duration
from ..validate import check_nesting, check_seconds
from . import route_table
from .bodies import read_json
from .errors import HttpError, bad_request, from_engine, not_found
from .jobflow import (
    JobStream,
    cancel_quietly,
    result_response,
    wait_done,
    worker_text_headers,
)
from .server import streaming
from .sse import HUB_KINDS, Stream, frame, last_event_id, open_response
from .views import backend_json, engine_event_json, gpu_json, job_resource

if TYPE_CHECKING:
    from .server import HttpServer

JOB_FIELDS = frozenset({"backend", "input", "input_b64", "priority", "timeout", "metadata",
                        "stream"})
CALIBRATE_FIELDS = frozenset({"repeats", "settle_s", "input", "input_b64"})
LOG_POLL_S = 0.5
INPUT_MAX_DEPTH = 64
MAX_LOG_LINES = 10_000

def add_routes(app: web.Application, server: HttpServer) -> None:
    """The native routes of :data:`~supervisor.http.route_table.ROUTES` (after checking the
    table against the API's methods: a method without its route fails here)."""
    route_table.check(METHODS)
    r = _Routes(server)
    make = {"GET": web.get, "POST": web.post}  # a GET answers HEAD too
    app.add_routes([make[route.method](route.path, getattr(r, route.handler))
                            for route in route_table.ROUTES if route.module == "native"])


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> web.Response:
    return web.Response(status=status, body=json.dumps(data, separators=(",", ":")).encode(),
                        content_type="application/json", headers=headers)


def wants_sse(request: web.Request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "")


def respond_async(request: web.Request) -> bool:
    prefer = request.headers.get("Prefer", "")
    return any(p.strip().lower() == "respond-async" for p in prefer.split(","))


class _Routes:
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.engine = server.engine

    # -- jobs -------------------------------------------------------------------------------
    async def index(self, request: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [
            {"method": r.method, "path": r.path, "what": r.what, "api": r.api}
            for r in route_table.ROUTES]})

    async def _op(self, method: str, /, **given: Any) -> Any:
        """API method ``method``: its arguments checked by its entry in the spec, the work
        done by :mod:`supervisor.operations` (a file read off the loop), errors as HTTP's."""
        try:
            kwargs = METHODS[method].check(given)
            result = getattr(operations, method)(self.engine, **kwargs)
            if isinstance(result, operations.Blocking):
                loop = asyncio.get_running_loop()
                value = await loop.run_in_executor(None, result.work)
                result = value if result.then is None else result.then(value)
        except VramtuiError as exc:
            raise from_engine(exc) from None
        return result

    async def submit(self, request: web.Request) -> web.StreamResponse:
        body = await read_json(request)
        backend, payload, kw = _job_request(body)
        try:
            job = self.engine.submit(backend, payload, **kw)
        except VramtuiError as exc:
            raise from_engine(exc, submitting=True) from None
        location = {"Location": f"/v1/jobs/{job.id}", "X-Vramtui-Job": job.id}
        if respond_async(request):
            return json_response(job_resource(job.view()), 202,
                                 {**location, "Preference-Applied": "respond-async"})
        if wants_sse(request):
            return await self._stream_job(request, job.id, cancel_on_disconnect=True,
                                          status=200, headers=location)
        return result_response(self.server, await wait_done(self.server, job.id))

    async def jobs(self, request: web.Request) -> web.Response:
        q = request.query  # what each may be: the API method's (supervisor.jobs.query)
        views = await self._op("jobs", state=q.get("state") or None,
                               backends=[b for b in q.getall("backend", []) if b],
                               limit=_whole(q.get("limit")))
        return json_response({"object": "list", "data": [
            job_resource(v, history=False) for v in views]})

    async def job(self, request: web.Request) -> web.Response:
        try:
            view = job_detail(self.engine, request.match_info["id"])
        except VramtuiError as exc:
            raise from_engine(exc) from None
        return json_response(job_resource(view))

    async def result(self, request: web.Request) -> web.Response:
        try:
            view = self.engine.job_view(request.match_info["id"])
        except VramtuiError as exc:
            raise from_engine(exc) from None
        return result_response(self.server, view)

    @streaming
    async def job_events(self, request: web.Request) -> web.StreamResponse:
        job_id = request.match_info["id"]
        try:
            self.engine.job_view(job_id)
        except VramtuiError as exc:
            raise from_engine(exc) from None
        return await self._stream_job(request, job_id, cancel_on_disconnect=False)

    async def _stream_job(self, request: web.Request, job_id: str, *,
                          cancel_on_disconnect: bool, status: int = 200,
                          headers: dict[str, str] | None = None) -> web.StreamResponse:
        srv = self.server
        enc = JobStream(srv, job_id)
        stream = Stream(srv.hub, request, wants=enc.wants, encode=enc.encode,
                        on_lag=enc.resync, heartbeat_s=srv.config.heartbeat_s,
                        buffer_limit=srv.config.subscriber_buffer, job_id=job_id,
                        resumable=True)
        last = last_event_id(request)
        replay = srv.hub.since(last) if last is not None else None
        if replay is None:
            stream.lagged = 0
            first, done = enc.resync(0, srv.hub.seq)  # the job as it is now, chunks so far
        else:
            enc.resume(replay)
            stream.replay(replay)
            first, done = b"", False
        first = f"retry: {3000}\n\n".encode() + first
        if done:
            stream.ended = stream.finished = True
        srv.hub.add(stream)  # before any await: no event is missed
        try:
            response = await open_response(request, status, headers)
            await stream.run(response, first)
        except asyncio.CancelledError:
            if cancel_on_disconnect:
                cancel_quietly(srv, job_id, "cancelled: the HTTP client went away")
            raise
        finally:
            srv.hub.discard(stream)
        if cancel_on_disconnect and stream.client_gone and not stream.finished:
            cancel_quietly(srv, job_id, "cancelled: the HTTP client went away")
        return response

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            view = self.engine.cancel(request.match_info["id"])
        except VramtuiError as exc:
            raise from_engine(exc) from None
        return json_response(job_resource(view))

    async def wait(self, request: web.Request) -> web.Response:
        job_id = request.match_info["id"]
        timeout = _seconds_query(request.query.get("timeout"), "timeout")
        try:
            METHODS["wait"].check({"job_id": job_id, "timeout": timeout})
        except VramtuiError as exc:
            raise from_engine(exc) from None
        await wait_done(self.server, job_id, cancel_on_disconnect=False, timeout=timeout)
        return await self.job(request)  # with its queue position and history, as GET shows

    async def job_request(self, request: web.Request) -> web.Response:
        limit = _int_query(request.query.get("limit"), "limit", 65536, 0, 64 << 20)
        got = await self._op("job_request", job_id=request.match_info["id"], limit=limit)
        return json_response(plain(got))

    async def cancel_many(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
            raise bad_request("the body must be {\"jobs\": [job ids]}", param="jobs")
        results = await self._op("cancel_many", job_ids=body["jobs"])
        return json_response({"object": "list", "data": plain(results)})

    async def retry(self, request: web.Request) -> web.Response:
        job_id = await self._op("retry", job_id=request.match_info["id"])
        view = await self._op("job", job_id=job_id)
        return json_response({**job_resource(view), "retry_of": request.match_info["id"]},
                             202, {"Location": f"/v1/jobs/{job_id}", "X-Vramtui-Job": job_id})

    async def set_priority(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if not isinstance(body, dict) or "priority" not in body:
            raise bad_request("the body must be {\"priority\": a whole number}",
                              param="priority")
        view = await self._op("set_priority", job_id=request.match_info["id"],
                              priority=body["priority"])
        return json_response(job_resource(view))

    # -- backends -----------------------------------------------------------------------------
    def _backend_extra(self, name: str) -> dict[str, Any]:
        rt = self.engine.backends[name]
        spec = rt.spec
        keep = spec.keep_alive_s
        extra = {"api": list(spec.api), "aliases": list(spec.aliases),
                 "keep_alive_s": keep if math.isfinite(keep) else None,
                 "concurrency": spec.concurrency, "stream": spec.stream,
                 "links": {"self": f"/v1/backends/{name}", "logs": f"/v1/backends/{name}/logs"}}
        if spec.http is not None:  # a model server: where its running one listens
            extra["server"] = {"url": getattr(rt.worker, "url", None), "health": spec.http.health}
            if spec.http.sleep is not None and spec.http.wake is not None:
                extra["server"].update(sleep=str(spec.http.sleep), wake=str(spec.http.wake))
        return extra

    async def backends(self, request: web.Request) -> web.Response:
        snap = self.engine.snapshot()
        return json_response({"object": "list", "data": [
            backend_json(b, snap, self._backend_extra(b.name)) for b in snap.backends]})

    async def backend(self, request: web.Request) -> web.Response:
        name = self._known(request.match_info["b"])
        snap = self.engine.snapshot()
        b = snap.backend(name)
        if b is None:
            raise not_found(f"unknown backend {brief(name)}", "unknown_backend")
        return json_response(backend_json(b, snap, self._backend_extra(name)))

    def _known(self, name: str) -> str:
        if name not in self.engine.backends:
            raise from_engine(UnknownBackend(name, self.engine.backends))
        return name

    async def _backend_action(self, request: web.Request, method: str,
                              action: str) -> web.Response:
        name = self._known(request.match_info["b"])
        await self._op(method, backend=name)
        return json_response({"backend": name, "action": action, "accepted": True,
                              "links": {"backend": f"/v1/backends/{name}"}}, 202)

    async def load(self, request: web.Request) -> web.Response:
        return await self._backend_action(request, "preload", "load")

    async def unload(self, request: web.Request) -> web.Response:
        return await self._backend_action(request, "evict", "unload")

    async def respawn(self, request: web.Request) -> web.Response:
        return await self._backend_action(request, "respawn", "respawn")

    async def kill(self, request: web.Request) -> web.Response:
        return await self._backend_action(request, "kill", "kill")

    async def sleep(self, request: web.Request) -> web.Response:
        return await self._backend_action(request, "sleep", "sleep")

    async def wake(self, request: web.Request) -> web.Response:
        return await self._backend_action(request, "wake", "wake")

    async def reload(self, request: web.Request) -> web.Response:
        result = await self._op("reload")
        return json_response({**plain(result), "unchanged": result.unchanged})

    async def descriptor(self, request: web.Request) -> web.Response:
        info = await self._op("descriptor", backend=self._known(request.match_info["b"]))
        return json_response(plain(info))

    async def calibration_report(self, request: web.Request) -> web.Response:
        report = await self._op("calibration_report",
                                backend=self._known(request.match_info["b"]),
                                name=request.query.get("name") or None)
        return web.Response(body=report.data, content_type="application/json", headers={
            "X-Vramtui-Report": report.name, "X-Vramtui-Reports": str(report.count),
            "X-Content-Type-Options": "nosniff"})

    async def calibrate(self, request: web.Request) -> web.Response:
        name = self._known(request.match_info["b"])
        body = await _optional_json(request)
        unknown = sorted(set(body) - CALIBRATE_FIELDS)
        if unknown:
            raise bad_request(f"unknown field(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(CALIBRATE_FIELDS))}", param=unknown[0])
        given: dict[str, Any] = {"repeats": body.get("repeats"),
                                 "settle_s": body.get("settle_s")}
        if "input" in body or "input_b64" in body:
            given["request"] = _payload(body)
        job_id = await self._op("calibrate", backend=name, **given)
        view = await self._op("job", job_id=job_id)
        return json_response(job_resource(view), 202,
                             {"Location": f"/v1/jobs/{job_id}", "X-Vramtui-Job": job_id})

    async def unload_all(self, request: web.Request) -> web.Response:
        try:
            evicted = self.engine.zero()
        except VramtuiError as exc:
            raise from_engine(exc) from None
        return json_response({"unloaded": evicted}, 202)

    @streaming
    async def logs(self, request: web.Request) -> web.StreamResponse:
        name = self._known(request.match_info["b"])
        lines = _int_query(request.query.get("lines"), "lines", 50, 0, MAX_LOG_LINES)
        follow = request.query.get("follow", "").lower() in ("1", "true", "yes")
        path = self.engine.paths.worker_log_path(name)
        loop = asyncio.get_running_loop()
        got = await loop.run_in_executor(None, read_log, path, lines, None)
        headers = {**worker_text_headers(), "X-Accel-Buffering": "no"}
        if not follow:
            return web.Response(body=got["data"], headers=headers)
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        offset = got["offset"]
        try:
            if got["data"]:
                await response.write(got["data"])
            quiet = 0.0
            while not self.server.hub.closed:
                await asyncio.sleep(LOG_POLL_S)
                got = await loop.run_in_executor(None, read_log, path, 0, offset)
                offset = got["offset"]
                if got["data"]:
                    await response.write(got["data"])
                    quiet = 0.0
                else:
                    quiet += LOG_POLL_S
                    if quiet >= self.server.config.heartbeat_s:
                        transport = request.transport
                        if transport is None or transport.is_closing():
                            break
                        quiet = 0.0
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        return response

    async def drain(self, request: web.Request) -> web.Response:
        raw = _gpu_index(request)
        body = await _optional_json(request)
        if set(body) - {"on"}:
            raise bad_request("the body may only say {\"on\": true | false}", param="on")
        draining = await self._op("drain", gpu=int(raw), on=body.get("on"))
        return json_response({"gpu": int(raw), "draining": list(draining)})

    async def yield_gpu(self, request: web.Request) -> web.Response:
        gpu = int(_gpu_index(request))
        body = await _optional_json(request)
        if set(body) - {"for", "now", "by"}:
            raise bad_request("the body may say {\"for\": \"1h\" | seconds, \"now\": "
                              "true | false, \"by\": \"who\"}", param="for")
        for_s = None
        if body.get("for") is not None:
            try:
                # (infinite, or past 10 years: the yield's own range, at most a year, refuses)
                for_s = parse_duration(body["for"], allow_infinite=True)
            except ValueError as exc:
                raise bad_request(f"for: {exc}", param="for") from None
        by = body.get("by") or f"http ({request.remote or 'local'})"
        given = await self._op("yield_gpus", gpus=[gpu], for_s=for_s, now=body.get("now"),
                               by=by)
        return json_response({"yielded": [yield_json(y) for y in given]})

    async def resume_gpu(self, request: web.Request) -> web.Response:
        gpu = int(_gpu_index(request))
        await _optional_json(request)
        back = await self._op("resume_gpus", gpus=[gpu])
        return json_response({"resumed": list(back)})

    async def snapshot(self, request: web.Request) -> web.Response:
        light = request.query.get("light", "").lower() in ("1", "true", "yes")
        snap = await self._op("snapshot", light=light)
        return json_response(plain(snap, data_limit=0))  # results: /v1/jobs/{id}/result

    async def stats(self, request: web.Request) -> web.Response:
        return json_response(self.server.stats())

    async def gpus(self, request: web.Request) -> web.Response:
        snap = self.engine.snapshot()
        return json_response({"object": "list", "simulated": snap.simulated,
                              "source": snap.source, "data": [
                                  gpu_json(g, self.server.uuids.get(g.index)) for g in snap.gpus]})

    @streaming
    async def events(self, request: web.Request) -> web.StreamResponse:
        srv = self.server
        kinds = request.query.get("kinds")
        wanted = frozenset(k.strip() for k in kinds.split(",") if k.strip()) if kinds else None
        if wanted is not None and not wanted <= HUB_KINDS:
            raise bad_request("kinds: a comma-separated list of job, chunk, worker, log, "
                              "sleep", param="kinds")
        backend = request.query.get("backend") or None

        def wants(item: Any) -> bool:
            ev = item.event
            return (wanted is None or ev.kind in wanted) and (
                backend is None or ev.backend == backend)

        def build(item: Any) -> bytes:
            return frame(item.event.kind, engine_event_json(item.event), item.id)

        def encode(item: Any) -> tuple[bytes, bool]:
            return item.encoded("events", build), False

        def on_lag(n: int, seq: int) -> tuple[bytes, bool]:
            return frame("snapshot", self._light_snapshot(n), seq), False

        stream = Stream(srv.hub, request, wants=wants, encode=encode, on_lag=on_lag,
                        heartbeat_s=srv.config.heartbeat_s,
                        buffer_limit=srv.config.subscriber_buffer, resumable=True)
        last = last_event_id(request)
        first = b"retry: 3000\n\n"
        if last is not None:
            replay = srv.hub.since(last)
            if replay is None:
                first += frame("snapshot", self._light_snapshot(0, resumed_from=last),
                               srv.hub.seq)
            else:
                stream.replay(replay)
        else:
            first += frame("snapshot", self._light_snapshot(0), srv.hub.seq)
        srv.hub.add(stream)
        try:
            response = await open_response(request)
            await stream.run(response, first)
        finally:
            srv.hub.discard(stream)
        return response

    def _light_snapshot(self, lagged: int, resumed_from: int | None = None) -> dict[str, Any]:
        snap = self.engine.snapshot()
        out: dict[str, Any] = {
            "stopping": snap.stopping, "simulated": snap.simulated,
            "gpus": [gpu_json(g, self.server.uuids.get(g.index)) for g in snap.gpus],
            "backends": [backend_json(b, snap, {}) for b in snap.backends],
            "running": [job_resource(v, history=False) for v in snap.running],
            "queued": [job_resource(v, history=False) for v in snap.queued[:100]],
            "queued_total": len(snap.queued),
        }
        if lagged:
            out["lagged"] = lagged
        if resumed_from is not None:
            out["missed_since"] = resumed_from
        return out

    # -- health -----------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        if self.engine.stopping:
            raise HttpError(503, "the engine is stopping", "unavailable_error",
                            "engine_stopping", headers={"Retry-After": "10"})
        return json_response({"status": "ready"})

    async def version(self, request: web.Request) -> web.Response:
        snap = self.engine.snapshot()
        return json_response({"version": self.server.version, "api": "1",
                              "python": snap.python, "gpu_source": snap.source,
                              "simulated": snap.simulated, "pid": os.getpid()})

    async def metrics(self, request: web.Request) -> web.Response:
        from .metrics import CONTENT_TYPE

        body = self.server.exporter.render()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _int_query(raw: str | None, name: str, default: int, low: int, high: int) -> int:
    if raw is None or raw == "":
        return default
    if not digits(raw) or not low <= int(raw) <= high:
        raise bad_request(f"{name} must be a whole number from {low} to {high}", param=name)
    return int(raw)


def _whole(raw: str | None) -> int | str | None:
    """A query's whole number as one, for the API method to check (None: not given; text
    that is no whole number stays text, which the method refuses)."""
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        return raw


def _seconds_query(raw: str | None, name: str) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise bad_request(f"{name} must be a number of seconds, 0 or more", param=name)
    return value


async def _optional_json(request: web.Request) -> dict[str, Any]:
    """A request's JSON object, or {} when it has no body."""
    if not request.can_read_body:
        return {}
    body = await read_json(request)
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


def _payload(body: dict[str, Any]) -> bytes:
    """A request's bytes from ``input`` (JSON, sent as its text) or ``input_b64``."""
    if "input" in body and "input_b64" in body:
        raise bad_request("give input (JSON) or input_b64 (bytes), not both", param="input")
    payload = b""
    if "input_b64" in body:
        raw = body["input_b64"]
        if not isinstance(raw, str):
            raise bad_request("input_b64: base64 text", param="input_b64")
        try:
            payload = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("input_b64 is not valid base64", param="input_b64") from None
    elif "input" in body:
        try:
            check_nesting(body["input"], INPUT_MAX_DEPTH, "input")
        except InvalidRequest as exc:
            raise bad_request(str(exc), param="input") from None
        payload = json.dumps(body["input"], ensure_ascii=False,
                             separators=(",", ":")).encode()
    return payload


def _job_request(body: Any) -> tuple[str, bytes, dict[str, Any]]:
    """``{backend, input | input_b64, priority, timeout, metadata, stream}`` checked."""
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object {\"backend\": …, \"input\": …}")
    unknown = sorted(set(body) - JOB_FIELDS)
    if unknown:
        raise bad_request(f"unknown field(s) {', '.join(unknown)}; known: "
                          f"{', '.join(sorted(JOB_FIELDS))}", param=unknown[0])
    backend = body.get("backend")
    if not isinstance(backend, str) or not backend:
        raise bad_request("backend: the name of a backend (GET /v1/backends lists them)",
                          param="backend")
    payload = _payload(body)
    kw: dict[str, Any] = {}
    priority = body.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int) or \
                abs(priority) > 1_000_000:
            raise bad_request("priority: a whole number (higher runs first)", param="priority")
        kw["priority"] = priority
    timeout = body.get("timeout")
    if timeout is not None:
        try:  # (the engine's own check, and its words: its limit, 30 days, said)
            kw["timeout"] = check_seconds(timeout, "timeout")
        except InvalidRequest as exc:
            raise bad_request(str(exc), param="timeout") from None
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise bad_request("metadata: a JSON object", param="metadata")
        kw["metadata"] = metadata
    stream = body.get("stream")
    if stream is not None:
        if not isinstance(stream, bool):
            raise bad_request("stream: true or false", param="stream")
        kw["stream"] = stream
    return backend, payload, kw


def _gpu_index(request: web.Request) -> str:
    raw = request.match_info["gpu"]
    if not digits(raw) or len(raw) > 6:
        raise bad_request("a GPU's index: a whole number (GET /v1/gpus lists them)",
                          param="gpu")
    return raw
