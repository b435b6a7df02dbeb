"""``vramtui --serve --dynamo NS``: every backend of the engine as an NVIDIA Dynamo endpoint.

:class:`DynamoBridge` is a facade service (:meth:`supervisor.facade.Supervisor.add_service`).
Once the engine is up it starts a Dynamo runtime whose handlers run on the engine's own event
loop (Dynamo drives its handlers on the loop it is created with), as the control socket's do:
a request reaches the engine with no thread hop, and its events come back the same way.  It
serves two endpoints per backend ``B``:

``NS.B.generate``
    A request becomes an engine job for ``B``, submitted through the :class:`Supervisor`
    facade like a local one (but not journaled: see Shutdown below): it waits in the same
    admission queue (so a box never overcommits its GPUs, whoever asks), and shows in the TUI
    and the CLI like any job, with ``{"dynamo": {"endpoint", "request_id"}}`` added to the
    metadata the Dynamo client sent.  Requests and replies have the ``raw`` shapes of
    :mod:`worker_sdk.dynamo` (the same :mod:`worker_sdk.dynamo.shapes` code): bytes, text,
    ``{"b64": ...}`` or JSON in; one ``{"data", "encoding", "headers", "status_code"}`` item
    out, or one ``{"data", "encoding"}`` item per streamed chunk, as they come.  Dynamo's stop
    or kill of the request (the client stopped or went away) cancels the job, queued or
    running.

    Errors: a request that is not raw-shaped: HTTP 400; the job failed: its status code (500
    unless the worker said otherwise); timed out: 504; cancelled here (``vramtui cancel``):
    Dynamo's ``Cancelled``.  "Not here: try another box" is raised the way Dynamo 1.6.1 lets a
    caller act on it (:mod:`worker_sdk.dynamo.errors`): as a ``WorkerUnavailable`` whose text
    is one JSON object, so the client sees ``Unavailable: {"message", "code", "reason",
    "retry": "another_instance", "instance_id", ["retry_after_s"], "backend"}`` and its
    router leaves this instance out for about 5 s: code 507 (reason ``cannot_run_here``: too
    large for every GPU here, or no allowed GPU), 503 (``queue_full``, with ``retry_after_s``;
    ``backend_failed``; ``engine_stopping``; ``engine_stopped``: the engine stopped before or
    while the job ran).

``NS.B.status``
    One item ``{"backend", "hot", "state", "queued", "running", "gpu", "stopping",
    "instance_id"}``: whether the backend's worker is loaded (``hot``: state ``ready`` or
    ``busy``, so a request starts without loading weights), and how many jobs wait for it.
    Both endpoints of one engine share one Dynamo instance id, so a router reads each box's
    status with ``client.direct(request, instance_id)`` on ``NS.B.status`` and sends the
    request with ``direct`` on ``NS.B.generate`` to a box where ``B`` is hot.  Dynamo 1.6.1
    has no writable per-instance metadata in discovery (the model card's ``runtime_data`` is
    fixed at registration, and ``WorkerMetricsPublisher`` carries KV-cache block counts), so a
    pull endpoint on the request plane is the mechanism that works with every discovery
    backend, etcd or file.

A backend name with dots (allowed in vramtui, not in a Dynamo component) is served with each
dot replaced by ``_``.  Discovery and transport come from Dynamo's environment
(``DYN_DISCOVERY_BACKEND``, default ``etcd``; ``DYN_FILE_KV``; ``DYN_REQUEST_PLANE``, default
``tcp``; ...); Dynamo's own log level is ``DYN_LOG`` (default here: ``warn``, and ``error``
for the endpoint target, whose every clean shutdown warns in 1.6.1).  The runtime connects on
a thread of its own once the engine is up; Dynamo 1.6.1 holds the GIL while it waits for etcd,
so the wait is capped at 10 s unless ``ETCD_STARTUP_CONNECT_TIMEOUT_SECONDS`` says otherwise.
If the runtime cannot start, the engine stops and ``vramtui --serve`` exits 1 with the reason.

Shutdown: when the engine stops, queued Dynamo requests are answered 503 at once and running
ones get their backend's stop grace; then :meth:`DynamoBridge.close` shuts the runtime down, so
its discovery entries are gone before the process exits.  Dynamo requests are not journaled
(``durable=False``): their caller goes with the engine, so a restarted engine never runs one
for nobody, and they cost the journal's writes nothing.

Streaming: a handler submits on the engine loop, so its job is known before the engine's
next step can dispatch it, and follows it with :mod:`supervisor.doors.watch`: one
:class:`~supervisor.doors.watch.Feed` (the bridge's one subscription, to ``chunk`` events)
hands each job's chunks to its :class:`~supervisor.doors.watch.Follow`, which then gives the
job's end (its final view, or why it will not end), so nothing is lost and nothing arrives
out of order.  The bridge takes no ``job`` events, so a headless engine serving Dynamo builds
none.  Like the control server, the handlers call the engine directly (they run on its
loop), and never block.

Dynamo is imported lazily, through :func:`worker_sdk.dynamo.import_dynamo`, and only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from worker_sdk import Response
from worker_sdk.dynamo import shapes
from worker_sdk.dynamo.errors import unavailable
from worker_sdk.dynamo.server import request_metadata

from ..errors import (
    BackendFailed,
    EngineStopped,
    InvalidRequest,
    QueueFull,
    Refused,
    UnknownBackend,
    VramtuiError,
)
from ..jobs import JobState, JobView
from .watch import Feed, Follow, WatchClosed, hurry

if TYPE_CHECKING:
    from ..facade import Supervisor

log = logging.getLogger("vramtui.dynamo")

HOT_STATES = frozenset({"ready", "busy"})
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CLOSE_TIMEOUT_S = 30.0
ETCD_PATIENCE_S = 10  # default ETCD_STARTUP_CONNECT_TIMEOUT_SECONDS (Dynamo's own: 120)
QUEUE_FULL_RETRY_S = 1.0  # the retry_after_s hint of a queue-full refusal
# A request is watched for Dynamo's stop only once it has lasted this long: the watch (a Rust
# future per request) costs more than a short job's whole engine round trip, and a stop sent
# earlier is seen as soon as the watch begins.
WATCH_AFTER_S = 0.02


def check_dynamo(namespace: str) -> str | None:
    """Why ``--dynamo NAMESPACE`` cannot work here (one line), or None; imports Dynamo."""
    if not NAMESPACE_RE.match(namespace):
        return (f"--dynamo {namespace!r} is not a Dynamo namespace (letters, digits, _ -; "
                "no dots)")
    # Before Dynamo's first import sets up its logs.  The endpoint target is raised to error:
    # in 1.6.1 every clean shutdown warns that the instance keys it then removes are gone
    # (the runtime's shutdown has removed them already).
    os.environ.setdefault("DYN_LOG", "warn,dynamo_runtime::component::endpoint=error")
    # Dynamo 1.6.1 holds the GIL while it connects to etcd, freezing the whole engine (its
    # signals too); its default patience is 120 s.
    os.environ.setdefault("ETCD_STARTUP_CONNECT_TIMEOUT_SECONDS", str(ETCD_PATIENCE_S))
    from worker_sdk.dynamo import MISSING_MESSAGE, DynamoMissing, import_dynamo

    try:
        import_dynamo()
    except DynamoMissing as exc:
        if str(exc) == MISSING_MESSAGE:
            return "--dynamo needs NVIDIA Dynamo: pip install 'vramtui[dynamo]'"
        return f"--dynamo: {exc}"
    return None


def component_name(backend: str) -> str:
    """The Dynamo component a backend is served as (dots are not allowed there)."""
    return backend.replace(".", "_")


class _Call:
    """One Dynamo request in flight: its job, followed, and the watch for Dynamo's stop."""

    __slots__ = ("follow", "stopped", "watcher")

    def __init__(self) -> None:
        self.follow: Follow | None = None
        self.watcher: asyncio.Handle | asyncio.Task[None] | None = None
        self.stopped = False  # Dynamo's stop or kill: the client reads nothing more


class _Endpoints:
    """The two handlers of one backend (Dynamo passes its context to a param named context)."""

    def __init__(self, bridge: DynamoBridge, backend: str) -> None:
        self.bridge = bridge
        self.backend = backend
        self.path = f"{bridge.namespace}.{component_name(backend)}.generate"

    async def generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        # aclosing: when Dynamo drops this stream, the bridge's finally runs now, not at GC
        async with contextlib.aclosing(self.bridge.generate(self, request, context)) as items:
            async for item in items:
                yield item

    async def status(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield self.bridge.status(self.backend)


class DynamoBridge:
    """Serve an engine's backends on Dynamo; add it with ``sup.add_service(...)``."""

    def __init__(self, sup: Supervisor, namespace: str) -> None:
        if not NAMESPACE_RE.match(namespace):
            raise ValueError(f"{namespace!r} is not a Dynamo namespace")
        self.sup = sup
        self.namespace = namespace
        self.dyn: SimpleNamespace | None = None
        self.instance_id: int | None = None
        self.endpoints: list[_Endpoints] = []
        self.error: str | None = None  # why the Dynamo runtime could not start, or stopped
        self._loop: asyncio.AbstractEventLoop | None = None  # the engine's
        self._connecting: threading.Thread | None = None
        self._runtime: Any = None
        self._serving: asyncio.Future[None] | None = None
        self._closing = False
        self._feed: Feed | None = None  # the jobs' chunks and ends, from the engine

    # ======================================================================= lifecycle ======
    def start(self) -> None:
        """On the engine loop, once the engine is up: start connecting, and return at once.

        The runtime is created on a thread of its own (with etcd, Dynamo 1.6.1 holds the GIL
        while it waits: see :data:`ETCD_PATIENCE_S`), bound to this loop, and the endpoints
        are served from here.  If it cannot start, :attr:`error` says why and the engine is
        asked to stop (``vramtui --serve`` then exits 1).
        """
        from worker_sdk.dynamo import import_dynamo

        self.dyn = import_dynamo()
        self._loop = asyncio.get_running_loop()
        engine = self.sup.engine
        taken: dict[str, str] = {}
        for name in sorted(engine.backends):
            component = component_name(name)
            if component in taken:
                log.warning("backend %s is not served on Dynamo: %s.%s is already %s's",
                            name, self.namespace, component, taken[component])
                continue
            taken[component] = name
            self.endpoints.append(_Endpoints(self, name))
        self._feed = Feed(engine, frozenset({"chunk"}))
        self._feed.start()
        self._connecting = threading.Thread(target=self._connect, name="dynamo-connect",
                                            daemon=True)
        self._connecting.start()

    def _connect(self) -> None:
        """On the connect thread: create the runtime, then hand it to the engine loop."""
        assert self.dyn is not None and self._loop is not None
        from worker_sdk.dynamo.loader import secure_discovery_dir

        backend = os.environ.get("DYN_DISCOVERY_BACKEND", "etcd")
        try:
            secure_discovery_dir()  # file discovery: a directory no other user can write
            runtime = self.dyn.DistributedRuntime(
                self._loop, backend, os.environ.get("DYN_REQUEST_PLANE", "tcp"))
        except BaseException as exc:  # noqa: BLE001 - the engine is told, then stops
            with contextlib.suppress(RuntimeError):  # the engine loop is gone already
                self._loop.call_soon_threadsafe(self._failed, exc)
            return
        try:
            self._loop.call_soon_threadsafe(self._begin, runtime)
        except RuntimeError:  # the engine loop closed while we connected
            runtime.shutdown()

    def _failed(self, exc: BaseException) -> None:
        """On the engine loop: Dynamo could not start or stopped serving; stop the engine."""
        if self._closing:
            return
        self.error = " ".join(f"{exc}".split()) or type(exc).__name__
        log.error("Dynamo failed (%s discovery): %s; stopping the engine",
                  os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"), self.error)
        if self._runtime is not None:
            self._runtime.shutdown()
        self.sup.engine.request_stop()

    def _begin(self, runtime: Any) -> None:
        """On the engine loop: serve every backend's two endpoints on ``runtime``."""
        self._runtime = runtime
        if self._closing:
            runtime.shutdown()
            return
        served = []
        for ep in self.endpoints:
            generate = runtime.endpoint(ep.path)
            status = runtime.endpoint(ep.path.removesuffix(".generate") + ".status")
            self.instance_id = generate.connection_id()
            served.append(generate.serve_endpoint(ep.generate, graceful_shutdown=True))
            served.append(status.serve_endpoint(ep.status, graceful_shutdown=True))
        log.info("serving %d backend(s) on Dynamo as %s.<backend>.generate and .status "
                 "(instance %x, discovery %s)", len(self.endpoints), self.namespace,
                 self.instance_id or 0, os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"))
        self._serving = asyncio.ensure_future(self._serve(served))

    async def _serve(self, served: list[Any]) -> None:
        for outcome in await asyncio.gather(*served, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.error("Dynamo stopped serving: %s: %s", type(outcome).__name__, outcome)
                self._failed(outcome)

    async def close(self) -> None:
        """On the engine loop, after the engine stopped: shut Dynamo down (discovery too)."""
        self._closing = True
        if self._feed is not None:
            self._feed.close()  # every request still waiting hears that the engine stopped
        if self._runtime is not None:
            self._runtime.shutdown()
        if self._serving is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._serving), CLOSE_TIMEOUT_S)
            except TimeoutError:
                log.warning("the Dynamo runtime did not stop within %g s", CLOSE_TIMEOUT_S)
        elif self._connecting is not None and self._connecting.is_alive():
            # Still connecting: nothing is registered yet; the thread is a daemon.
            await asyncio.to_thread(self._connecting.join, 1.0)

    # ======================================================================= handlers =======
    async def generate(self, ep: _Endpoints, request: Any, context: Any) -> AsyncIterator[Any]:
        """``NS.B.generate``: submit, stream the chunks or the reply, cancel on stop."""
        dyn = self.dyn
        assert dyn is not None
        try:
            payload = shapes.request_payload("raw", request)
        except shapes.ShapeError as exc:
            raise dyn.HttpError(400, str(exc)) from None
        request_id = str(context.id()) if context is not None else ""
        metadata = request_metadata(context)
        metadata["dynamo"] = {"endpoint": ep.path, "request_id": request_id}
        call = _Call()
        if context is not None:
            call.watcher = asyncio.get_running_loop().call_later(
                WATCH_AFTER_S, self._start_watch, context, call)
        shaper = shapes.Shaper("raw", model=ep.backend, request_id=request_id)
        streamed = 0
        try:
            engine = self.sup.engine
            try:
                # Not journaled: its caller goes with the engine, so a restart must not run it.
                job_id = engine.submit(ep.backend, payload, metadata=metadata,
                                       durable=False).id
            except VramtuiError as exc:
                raise self._http_error(exc, ep.backend) from None
            # On the engine loop: nothing of the job can have happened since submit returned.
            assert self._feed is not None
            call.follow = follow = self._feed.follow(job_id)
            hurry(engine)  # a hot worker has the request before this handler waits
            try:
                async for kind, value in follow:
                    if kind == "chunk":
                        streamed += 1
                        yield shaper.chunk(value)
                    elif kind == "end":
                        view: JobView = value
                        if view.state is JobState.SUCCEEDED:
                            if streamed or view.chunks:
                                for chunk in view.chunks[streamed:]:
                                    yield shaper.chunk(chunk)
                            else:
                                yield shaper.reply(Response(
                                    view.data or b"", view.headers,
                                    status_code=view.status_code or 200))
                            return
                        raise _job_error(dyn, view)
            except WatchClosed:
                raise self._unavailable(503, "the engine stopped", "engine_stopped",
                                        ep.backend) from None
            except EngineStopped:  # the engine stopped before the job could end
                raise self._unavailable(503, f"job {job_id}: the engine stopped before "
                                        "the job ended; try another instance",
                                        "engine_stopped", ep.backend) from None
            # here only when Dynamo stopped the request: the finally cancels the job
        finally:
            if call.watcher is not None:
                call.watcher.cancel()
            follow_ = call.follow
            if follow_ is not None:
                follow_.close()
                if not follow_.ended:
                    self._cancel_soon(follow_.job_id,
                                      "stopped" if call.stopped else "went away")

    def _start_watch(self, context: Any, call: _Call) -> None:
        """A request still in flight after :data:`WATCH_AFTER_S`: watch it for Dynamo's stop."""
        call.watcher = asyncio.ensure_future(self._watch(context, call))

    async def _watch(self, context: Any, call: _Call) -> None:
        """Turn Dynamo's stop or kill of the request into the end of its handler."""
        try:
            await context.async_killed_or_stopped()
        except Exception:  # noqa: BLE001 - no watch, no early cancel; the stream still ends
            log.debug("cannot watch a Dynamo request for its stop", exc_info=True)
            return
        call.stopped = True
        if call.follow is not None:
            call.follow.interrupt()

    def _cancel_soon(self, job_id: str, why: str) -> None:
        """Cancel the job of a request nobody reads any more (next turn of the engine loop)."""
        log.info("job %s: its Dynamo caller %s; cancelling it", job_id, why)

        def cancel() -> None:
            try:
                self.sup.engine.cancel(job_id)
            except VramtuiError as exc:  # finished meanwhile, or the engine stopped
                log.debug("cancelling job %s: %s", job_id, exc)

        if self._loop is not None:
            self._loop.call_soon(cancel)

    def status(self, backend: str) -> dict[str, Any]:
        """``NS.B.status``: whether ``backend`` is hot here, and its queue.

        Read from the engine's live state (we are on its loop), not a whole snapshot: that
        copies every recent job, and a router asks this often.
        """
        engine = self.sup.engine
        rt = engine.backends.get(backend)
        state = rt.state if rt is not None else "unknown"
        worker = rt.worker if rt is not None else None
        return {
            "backend": backend,
            "hot": state in HOT_STATES,
            "state": state,
            "queued": engine.jobs.queue.counts.get(("job", backend), 0),
            "running": len(rt.admitted) if rt is not None else 0,
            "gpu": worker.gpu if worker is not None else None,
            "stopping": engine.stopping,
            "instance_id": self.instance_id,
        }

    # ======================================================================= errors =========
    def _unavailable(self, code: int, message: str, reason: str, backend: str,
                     retry_after_s: float | None = None) -> BaseException:
        assert self.dyn is not None
        return unavailable(self.dyn, code, message, reason=reason, instance_id=self.instance_id,
                           retry_after_s=retry_after_s, backend=backend)

    def _http_error(self, exc: VramtuiError, backend: str) -> BaseException:
        """The Dynamo error for a refused submit."""
        assert self.dyn is not None
        text = str(exc)
        if isinstance(exc, Refused):  # too large for every GPU here: another box may take it
            return self._unavailable(507, text, "cannot_run_here", backend)
        if isinstance(exc, QueueFull):
            return self._unavailable(503, text, "queue_full", backend, QUEUE_FULL_RETRY_S)
        if isinstance(exc, BackendFailed):
            return self._unavailable(503, text, "backend_failed", backend)
        if isinstance(exc, EngineStopped):
            return self._unavailable(503, text, "engine_stopping", backend)
        if isinstance(exc, InvalidRequest):
            return self.dyn.HttpError(400, text)
        if isinstance(exc, UnknownBackend):
            return self.dyn.HttpError(404, text)
        return self.dyn.HttpError(500, text)


def _job_error(dyn: SimpleNamespace, view: JobView) -> BaseException:
    """The Dynamo error for a job that ended other than succeeded."""
    text = view.error or view.state.value
    if view.state is JobState.CANCELLED:
        return dyn.Cancelled(f"job {view.id} was cancelled: {text}")
    if view.state is JobState.TIMED_OUT:
        return dyn.HttpError(504, f"job {view.id}: {text}")
    code = view.status_code if view.status_code and 400 <= view.status_code < 600 else 500
    return dyn.HttpError(code, f"job {view.id} failed: {text}")


__all__ = ["HOT_STATES", "DynamoBridge", "check_dynamo", "component_name"]
