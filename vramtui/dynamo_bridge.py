"""``vramtui --serve --dynamo NS``: every backend of the engine as an NVIDIA Dynamo endpoint.

:class:`DynamoBridge` is a facade service (:meth:`supervisor.facade.Supervisor.add_service`).
Once the engine is up it runs a Dynamo runtime on a thread of its own, with its own event loop
(Dynamo drives its handlers on the loop it was created with), and serves two endpoints per
backend ``B``:

``NS.B.generate``
    A request becomes an engine job for ``B``, submitted through the :class:`Supervisor`
    facade like a local one: it is journaled, waits in the same admission queue (so a box never
    overcommits its GPUs, whoever asks), and shows in the TUI and the CLI like any job, with
    ``{"dynamo": {"endpoint", "request_id", "call"}}`` added to the metadata the Dynamo
    client sent.  Requests and replies have the ``raw`` shapes of :mod:`worker_sdk.dynamo`
    (the same :mod:`worker_sdk.dynamo.shapes` code): bytes, text, ``{"b64": ...}`` or JSON
    in; one ``{"data", "encoding", "headers", "status_code"}`` item out, or one
    ``{"data", "encoding"}`` item per streamed chunk, as they come.  Dynamo's stop or kill of
    the request (the client stopped or went away) cancels the job, queued or running.

    Errors: a request that is not raw-shaped: HTTP 400; the engine refuses the job because it
    is too large for every GPU here: 507; queue full, backend failed, engine stopping or
    stopped (before or while the job ran): 503; the job failed: its status code (500 unless
    the worker said otherwise); timed out: 504; cancelled here (``vramtui cancel``): Dynamo's
    ``Cancelled``.  A 503 is the signal for a router to try another box.

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
its thread once the engine is up; Dynamo 1.6.1 holds the GIL while it waits for etcd, so the
wait is capped at 10 s unless ``ETCD_STARTUP_CONNECT_TIMEOUT_SECONDS`` says otherwise.  If the
runtime cannot start, the engine stops and ``vramtui --serve`` exits 1 with the reason.

Shutdown: when the engine stops, queued Dynamo requests are answered 503 at once and running
ones get their backend's stop grace; then :meth:`DynamoBridge.close` shuts the runtime down, so
its discovery entries are gone before the process exits.  Dynamo requests the journal still
holds when an engine starts (it was killed, or stopped with them queued) have had their answer
already: they are cancelled instead of run for nobody.

Streaming: chunk and job events reach the bridge through one facade subscription whose
callback runs on the engine thread.  It recognises a request's job by the ``call`` token in the
metadata of the job's first (``queued``) event, published inside ``submit`` before any chunk
can exist, and hands each event to the request's queue on the Dynamo loop; nothing is lost and
nothing arrives out of order.  The Dynamo loop never blocks: the facade's blocking calls
(submit, cancel, snapshot) run on a small thread pool.

Dynamo is imported lazily, through :func:`worker_sdk.dynamo.import_dynamo`, and only here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import re
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from supervisor.errors import (
    BackendFailed,
    EngineStopped,
    InvalidRequest,
    QueueFull,
    Refused,
    UnknownBackend,
    VramtuiError,
)
from supervisor.events import EngineEvent, Subscription
from supervisor.jobs import JobState, JobView
from worker_sdk import Response
from worker_sdk.dynamo import shapes
from worker_sdk.dynamo.server import request_metadata

if TYPE_CHECKING:
    from supervisor.facade import Supervisor

log = logging.getLogger("vramtui.dynamo")

HOT_STATES = frozenset({"ready", "busy"})
NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CLOSE_TIMEOUT_S = 30.0
ETCD_PATIENCE_S = 10  # default ETCD_STARTUP_CONNECT_TIMEOUT_SECONDS (Dynamo's own: 120)
_POOL = 4  # threads for the facade's blocking calls


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
    """One Dynamo request in flight: what the engine thread hands to its handler."""

    __slots__ = ("loop", "queue", "token", "job_id", "stopped", "finished")

    def __init__(self, loop: asyncio.AbstractEventLoop, token: str) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.token = token
        self.job_id: str | None = None
        self.stopped = False  # Dynamo's stop or kill: the client reads nothing more
        self.finished = False  # the job's final view (or why it will not come) arrived

    def deliver(self, kind: str, value: Any) -> None:
        """Queue ``(kind, value)`` for the handler; from any thread."""
        with contextlib.suppress(RuntimeError):  # the Dynamo loop is closed: nobody listens
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))


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
        yield await self.bridge.status(self.backend)


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
        self._executor = ThreadPoolExecutor(_POOL, thread_name_prefix="dynamo-facade")
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runtime: Any = None
        self.error: str | None = None  # why the Dynamo runtime could not start
        self._subscription: Subscription | None = None
        self._lock = threading.Lock()
        self._calls: dict[str, _Call] = {}  # token -> call, until its job is known
        self._jobs: dict[str, _Call] = {}  # job id -> call, until the job ends
        self._tokens = itertools.count(1)
        self._prefix = os.urandom(4).hex()

    # ======================================================================= lifecycle ======
    def start(self) -> None:
        """On the engine loop, once the engine is up: start the Dynamo thread, and return.

        The runtime connects on that thread (with etcd, Dynamo 1.6.1 holds the GIL while it
        waits: see :data:`ETCD_PATIENCE_S`).  If it cannot start, :attr:`error` says why and
        the engine is asked to stop (``vramtui --serve`` then exits 1).
        """
        from worker_sdk.dynamo import import_dynamo

        self.dyn = import_dynamo()
        engine = self.sup.engine
        self._cancel_orphans()
        taken: dict[str, str] = {}
        for name in sorted(engine.backends):
            component = component_name(name)
            if component in taken:
                log.warning("backend %s is not served on Dynamo: %s.%s is already %s's",
                            name, self.namespace, component, taken[component])
                continue
            taken[component] = name
            self.endpoints.append(_Endpoints(self, name))
        self._subscription = self.sup.subscribe(kinds=("job", "chunk"), callback=self._on_event)
        self._thread = threading.Thread(target=self._thread_main, name="dynamo", daemon=True)
        self._thread.start()

    async def close(self) -> None:
        """On the engine loop, after the engine stopped: shut Dynamo down (discovery too)."""
        for call in self._pending():
            call.deliver("closed", None)
        loop, runtime = self._loop, self._runtime
        if loop is not None and runtime is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(runtime.shutdown)
        if self._thread is not None:
            # Still connecting (no runtime yet): nothing is registered; the thread is a daemon.
            wait = CLOSE_TIMEOUT_S if runtime is not None else 1.0
            await asyncio.to_thread(self._thread.join, wait)
            if self._thread.is_alive() and runtime is not None:
                log.warning("the Dynamo runtime did not stop within %g s", CLOSE_TIMEOUT_S)
        if self._subscription is not None:
            self._subscription.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _cancel_orphans(self) -> None:
        """Cancel the Dynamo jobs a previous engine left in the journal (already answered)."""
        engine = self.sup.engine
        for view in engine.snapshot().queued:
            mark = view.metadata.get("dynamo")
            if isinstance(mark, dict) and "call" in mark:
                engine.cancel(view.id, note="its Dynamo caller was answered when the engine "
                              "stopped; not run again")

    def _thread_main(self) -> None:
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:  # a dependency of ai-dynamo-runtime, but not required
            loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - the engine is told, then stops
            self.error = " ".join(f"{exc}".split()) or type(exc).__name__
            log.error("Dynamo failed (%s discovery): %s; stopping the engine",
                      os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"), self.error)
            if self._runtime is not None:
                self._runtime.shutdown()
            self.sup.stop(timeout=0)  # asks the engine to stop; returns at once
        finally:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        assert self.dyn is not None
        runtime = self.dyn.DistributedRuntime(
            asyncio.get_running_loop(),
            os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
            os.environ.get("DYN_REQUEST_PLANE", "tcp"),
        )
        self._runtime = runtime
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
        for outcome in await asyncio.gather(*served, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.error("Dynamo stopped serving: %s: %s", type(outcome).__name__, outcome)

    # ======================================================================= engine events ==
    def _on_event(self, event: EngineEvent) -> None:
        """On the engine thread, for every job and chunk event: hand ours on.  Quick."""
        try:
            if event.kind == "chunk":
                call = self._jobs.get(event.job_id or "")
                if call is not None:
                    call.deliver("chunk", event.data)
            elif event.kind == "job" and event.job is not None:
                self._on_job(event.job)
            elif event.kind == "closed":
                for call in self._pending():
                    call.deliver("closed", None)
        except Exception:  # noqa: BLE001 - never let the bridge break the engine's publish
            log.exception("the Dynamo bridge could not handle an engine event")

    def _on_job(self, view: JobView) -> None:
        call = self._jobs.get(view.id)
        if call is None:
            if view.state is not JobState.QUEUED:
                return
            mark = view.metadata.get("dynamo")
            token = mark.get("call") if isinstance(mark, dict) else None
            with self._lock:
                call = self._calls.pop(token, None) if isinstance(token, str) else None
                if call is None:
                    return
                call.job_id = view.id
                self._jobs[view.id] = call
            future = self.sup.engine.futures.get(view.id)  # on the engine thread: safe
            if future is not None:
                future.add_done_callback(lambda f, c=call: self._on_future(c, f))
        if view.finished:
            with self._lock:
                self._jobs.pop(view.id, None)
            # Events carry no result (on the engine thread: the job's full view is safe here).
            call.deliver("end", self.sup.engine.job_view(view.id))

    def _on_future(self, call: _Call, future: Future[JobView]) -> None:
        """The job's future: an exception means the engine stopped before it could end."""
        if future.cancelled():
            return
        error = future.exception()
        if error is not None:
            with self._lock:
                if call.job_id is not None:
                    self._jobs.pop(call.job_id, None)
            call.deliver("gone", error)

    def _pending(self) -> list[_Call]:
        with self._lock:
            return [*self._calls.values(), *self._jobs.values()]

    # ======================================================================= handlers =======
    async def generate(self, ep: _Endpoints, request: Any, context: Any) -> AsyncIterator[Any]:
        """``NS.B.generate``: submit, stream the chunks or the reply, cancel on stop."""
        dyn = self.dyn
        assert dyn is not None
        loop = asyncio.get_running_loop()
        try:
            payload = shapes.request_payload("raw", request)
        except shapes.ShapeError as exc:
            raise dyn.HttpError(400, str(exc)) from None
        request_id = str(context.id()) if context is not None else ""
        metadata = request_metadata(context)
        call = _Call(loop, f"{self._prefix}-{next(self._tokens)}")
        metadata["dynamo"] = {"endpoint": ep.path, "request_id": request_id, "call": call.token}
        with self._lock:
            self._calls[call.token] = call
        watcher = (asyncio.ensure_future(self._watch(context, call))
                   if context is not None else None)
        shaper = shapes.Shaper("raw", model=ep.backend, request_id=request_id)
        streamed = 0
        submitted: Future[str] | None = None
        try:
            submitted = self._executor.submit(self.sup.submit, ep.backend, payload,
                                              metadata=metadata)
            try:
                job_id = await asyncio.wrap_future(submitted)
            except VramtuiError as exc:
                raise _http_error(dyn, exc) from None
            call.job_id = job_id
            while True:
                if call.stopped:
                    return  # the finally cancels the job
                kind, value = await call.queue.get()
                if call.stopped:
                    return
                if kind == "chunk":
                    streamed += 1
                    yield shaper.chunk(value)
                elif kind == "end":
                    call.finished = True
                    view: JobView = value
                    if view.state is JobState.SUCCEEDED:
                        if streamed or view.chunks:
                            for chunk in view.chunks[streamed:]:
                                yield shaper.chunk(chunk)
                        else:
                            yield shaper.reply(Response(view.data or b"", view.headers,
                                                        status_code=view.status_code or 200))
                        return
                    raise _job_error(dyn, view)
                elif kind == "gone":  # the engine stopped first (the journal keeps the job)
                    call.finished = True
                    raise dyn.HttpError(503, f"job {job_id}: the engine stopped before the "
                                        "job ended; try another instance")
                elif kind == "closed":
                    raise dyn.HttpError(503, "the engine stopped")
        finally:
            if watcher is not None:
                watcher.cancel()
            with self._lock:
                self._calls.pop(call.token, None)
                if call.job_id is not None:
                    self._jobs.pop(call.job_id, None)
            if call.job_id is not None and not call.finished:
                self._cancel_soon(call.job_id, "stopped" if call.stopped else "went away")
            elif call.job_id is None and submitted is not None:
                # Dropped while the submit was on its way: cancel the job it may yet create.
                submitted.add_done_callback(self._cancel_submitted)

    async def _watch(self, context: Any, call: _Call) -> None:
        """Turn Dynamo's stop or kill of the request into the end of its handler."""
        try:
            await context.async_killed_or_stopped()
        except Exception:  # noqa: BLE001 - no watch, no early cancel; the stream still ends
            log.debug("cannot watch a Dynamo request for its stop", exc_info=True)
            return
        call.stopped = True
        call.queue.put_nowait(("stop", None))

    def _cancel_soon(self, job_id: str, why: str) -> None:
        """Cancel the job of a request nobody reads any more (fire and forget)."""
        log.info("job %s: its Dynamo caller %s; cancelling it", job_id, why)

        def cancel() -> None:
            try:
                self.sup.cancel(job_id)
            except VramtuiError as exc:  # finished meanwhile, or the engine stopped
                log.debug("cancelling job %s: %s", job_id, exc)

        with contextlib.suppress(RuntimeError):  # the pool is shut down: the engine stopped
            self._executor.submit(cancel)

    def _cancel_submitted(self, submitted: Future[str]) -> None:
        if not submitted.cancelled() and submitted.exception() is None:
            self._cancel_soon(submitted.result(), "went away before its job was queued")

    async def status(self, backend: str) -> dict[str, Any]:
        """``NS.B.status``: whether ``backend`` is hot here, and its queue."""
        loop = asyncio.get_running_loop()
        try:
            snap = await loop.run_in_executor(self._executor, self.sup.snapshot)
        except VramtuiError as exc:
            assert self.dyn is not None
            raise _http_error(self.dyn, exc) from None
        view = snap.backend(backend)
        state = view.state if view is not None else "unknown"
        return {
            "backend": backend,
            "hot": state in HOT_STATES,
            "state": state,
            "queued": view.queued if view is not None else 0,
            "running": view.running if view is not None else 0,
            "gpu": view.gpu if view is not None else None,
            "stopping": snap.stopping,
            "instance_id": self.instance_id,
        }


def _http_error(dyn: SimpleNamespace, exc: VramtuiError) -> BaseException:
    """The Dynamo error for a refused submit (or a status asked of a stopped engine)."""
    code = 500
    if isinstance(exc, InvalidRequest):
        code = 400
    elif isinstance(exc, UnknownBackend):
        code = 404
    elif isinstance(exc, Refused):
        code = 507  # too large for every GPU of this box: another box may take it
    elif isinstance(exc, QueueFull | BackendFailed | EngineStopped):
        code = 503
    return dyn.HttpError(code, str(exc))


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
