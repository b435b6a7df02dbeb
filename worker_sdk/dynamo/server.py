"""The bridge between Dynamo's request handler and a worker's decorated functions.

One :class:`DynamoServer` serves one :class:`~worker_sdk.registry.Registry` on one Dynamo
endpoint.  ``predict`` runs off the event loop, on a thread pool of ``concurrency`` threads
(one by default, so a model's CUDA work stays on the thread that ran its ``@initialize``
functions, as in the socket worker).  Each request gets a :class:`~worker_sdk.RequestContext`
(``worker_sdk.current()`` works) whose id and metadata are Dynamo's; the thread hands shaped
items to the handler through an asyncio queue, with a small window of credits so a fast
generator cannot outrun a slow client.  A Dynamo stop or kill of the request (the client
stopped, or dropped the stream) cancels the context; so does a shutdown whose in-flight
requests outlive the drain timeout.

Dynamo itself is never imported here: :mod:`worker_sdk.dynamo` passes the pieces in.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import signal
import threading
import traceback
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .. import context as ctxmod
from ..asyncpredict import iterate_async, run_async
from ..context import Cancelled, RequestContext
from ..registry import Registry
from ..worker import ExitCode
from . import shapes

if TYPE_CHECKING:
    from . import DynamoWorkerConfig

log = logging.getLogger("worker_sdk.dynamo")

_WINDOW = 8  # stream items a predict thread may run ahead of the client


class _Call:
    """One request in flight: its context, its shaper and the queue the thread fills."""

    __slots__ = ("ctx", "payload", "shaper", "queue", "loop", "credits", "closed", "cancelled_by")

    def __init__(
        self, payload: bytes, shaper: shapes.Shaper, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.payload = payload
        self.shaper = shaper
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.credits = threading.Semaphore(_WINDOW)
        self.closed = False
        self.cancelled_by: str | None = None
        self.ctx: RequestContext  # set right after construction

    # -- predict thread side ------------------------------------------------------------------
    def emit(self, kind: str, value: Any) -> bool:
        """Queue ``(kind, value)`` for the handler; False once nobody listens any more."""
        if self.closed:
            return False
        if kind == "item":
            self.credits.acquire()
            if self.closed:
                return False
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed: the process is going away
            return False
        return True

    def progress(self, _wire_id: int, fraction: float | None, message: str) -> None:
        item = self.shaper.progress(fraction, message)
        if item is not None:
            self.emit("item", item)

    # -- event loop side ----------------------------------------------------------------------
    def cancel(self, why: str) -> None:
        if self.cancelled_by is None:
            self.cancelled_by = why
        self.ctx.cancel()
        self.queue.put_nowait(("cancel", None))

    def close(self) -> None:
        self.closed = True
        # Wake a thread blocked on a credit; it sees ``closed`` and emits nothing more.
        self.credits.release(_WINDOW)


class DynamoServer:
    """Serve one registry's functions as a Dynamo endpoint handler."""

    def __init__(self, registry: Registry, config: DynamoWorkerConfig, dyn: SimpleNamespace,
                 *, script: str = "worker script") -> None:
        self.registry = registry
        self.predict = registry.require_predict(script)
        self.takes_context = registry.predict_takes_context
        self.config = config
        self.dyn = dyn
        self.executor = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="worker-predict"
        )
        self.stopping = False
        self._seq = itertools.count(1)
        self._inflight: set[_Call] = set()
        self._local = threading.local()
        self._thread_loops: list[asyncio.AbstractEventLoop] = []
        self._runtime: Any = None

    # -- lifecycle (predict threads) ----------------------------------------------------------
    def initialize(self) -> str | None:
        """Run the @initialize functions in order; the failure text, or None."""
        for fn in self.registry.ordered_initializers():
            if self.stopping:
                return None
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - an init failure of any kind is reported
                traceback.print_exc()
                return f"{type(exc).__name__}: {exc}"
        return None

    def unload(self) -> None:
        for fn in self.registry.unload:
            try:
                fn()
            except Exception:  # noqa: BLE001 - an unload error must not block the exit
                log.exception("@unload function %s failed", getattr(fn, "__name__", fn))
        for loop in self._thread_loops:
            with contextlib.suppress(RuntimeError):
                loop.close()

    def health(self) -> dict[str, Any]:
        """The @hardware_health result (as the socket worker answers it)."""
        fn = self.registry.hardware_health
        if fn is None:
            return {"status": "not enabled"}
        try:
            result = fn()
            json.dumps(result)
        except Exception as exc:  # noqa: BLE001 - a failing health check is reported, not raised
            return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        return result if isinstance(result, dict) else {"status": "ok", "result": result}

    async def health_route(self, _body: dict[str, Any]) -> dict[str, Any]:
        """``/engine/hardware_health`` on Dynamo's system server (``DYN_SYSTEM_PORT``)."""
        return await asyncio.to_thread(self.health)

    # -- shutdown (event loop) ----------------------------------------------------------------
    def begin_shutdown(self, why: str) -> None:
        """Stop taking requests, drain the ones in flight, cancel them after the timeout."""
        if self.stopping:
            log.info("%s: already stopping", why)
            return
        self.stopping = True
        log.info("stopping (%s); %d request(s) in flight", why, len(self._inflight))
        if self._runtime is not None:
            self._runtime.shutdown()
        if self._inflight:
            asyncio.get_running_loop().call_later(
                self.config.drain_timeout, self.cancel_all, "shutdown"
            )

    def cancel_all(self, why: str) -> None:
        for call in list(self._inflight):
            log.info("cancelling request %s (%s)", call.ctx.id, why)
            call.cancel(why)

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.begin_shutdown, f"signal {sig.name}")

    # -- requests (event loop) ----------------------------------------------------------------
    async def handle(self, request: Any, context: Any) -> AsyncIterator[Any]:
        """Dynamo's handler: ``request`` in, shaped response items out.

        Dynamo passes its per-request context only to a parameter named ``context``.
        """
        loop = asyncio.get_running_loop()
        request_id = str(context.id()) if context is not None else ""
        try:
            payload = shapes.request_payload(self.config.type, request, self.config.mapping)
        except shapes.ShapeError as exc:
            raise self.dyn.HttpError(400, str(exc)) from None
        shaper = shapes.Shaper(
            self.config.type,
            model=self.config.served_model_name,
            request=request,
            request_id=request_id,
            stream_progress=self.config.progress,
        )
        call = _Call(payload, shaper, loop)
        call.ctx = RequestContext(
            next(self._seq),
            request_id=request_id or None,
            metadata=request_metadata(context),
            progress_sink=call.progress,
        )
        self._inflight.add(call)
        watcher = (
            asyncio.ensure_future(self._watch(context, call)) if context is not None else None
        )
        future = loop.run_in_executor(self.executor, self._run, call)
        try:
            while True:
                kind, value = await call.queue.get()
                if call.cancelled_by is not None:
                    kind, value = "error", Cancelled(f"request {call.ctx.id} was cancelled")
                if kind == "item":
                    yield value
                    call.credits.release()
                elif kind == "end":
                    return
                else:
                    error = self._error(value, call)
                    if error is None:
                        return
                    raise error
        finally:
            if not future.done():
                call.ctx.cancel()  # nobody reads this request's result any more
            call.close()
            if watcher is not None:
                watcher.cancel()
            self._inflight.discard(call)

    async def _watch(self, context: Any, call: _Call) -> None:
        """Turn Dynamo's stop or kill of the request into a cancellation of its context."""
        try:
            await context.async_killed_or_stopped()
        except Exception:  # noqa: BLE001 - no watch, no early cancel; the stream still ends
            log.debug("cannot watch request %s for cancellation", call.ctx.id, exc_info=True)
            return
        call.cancel("client")

    def _error(self, exc: BaseException, call: _Call) -> BaseException | None:
        """The exception to raise to Dynamo for ``exc``; None to end the stream quietly."""
        if isinstance(exc, Cancelled | asyncio.CancelledError):
            if call.cancelled_by == "client":
                return None  # the client stopped or went away: it reads nothing more
            return self.dyn.Cancelled(f"request {call.ctx.id} was cancelled")
        if isinstance(exc, shapes.ReplyStatus):
            return self.dyn.HttpError(exc.status_code, exc.message)
        error = self.dyn.HttpError(500, f"{type(exc).__name__}: {exc}")
        # Dynamo prints the traceback of what a handler raises; chained, it shows predict's.
        error.__cause__ = exc
        return error

    # -- requests (predict threads) -----------------------------------------------------------
    def _run(self, call: _Call) -> None:
        ctx = call.ctx
        token = ctxmod.activate(ctx)
        try:
            ctx.check_cancelled()
            args = (call.payload, ctx) if self.takes_context else (call.payload,)
            result = self.predict(*args)
            if inspect.isawaitable(result):
                result = run_async(self._thread_loop(), result, ctx)
            if inspect.isgenerator(result):
                self._stream(call, result)
            elif inspect.isasyncgen(result):
                self._stream(call, iterate_async(self._thread_loop, result, ctx))
            else:
                call.emit("item", call.shaper.reply(result))
            call.emit("end", None)
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller
            call.emit("error", exc)
        finally:
            ctxmod.deactivate(token)

    def _stream(self, call: _Call, chunks: Any) -> None:
        ctx = call.ctx
        try:
            for chunk in chunks:
                if ctx.cancelled:
                    raise Cancelled(f"request {ctx.id} was cancelled")
                if not call.emit("item", call.shaper.chunk(chunk)):
                    raise Cancelled(f"request {ctx.id} was cancelled")
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _thread_loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None:
            loop = self._local.loop = asyncio.new_event_loop()
            self._thread_loops.append(loop)
        return loop

    # -- the whole life -----------------------------------------------------------------------
    async def run(self, runtime: Any, *, handle_signals: bool = True) -> ExitCode:
        """Initialise, register, serve until shutdown, unload; returns the exit code."""
        self._runtime = runtime
        loop = asyncio.get_running_loop()
        if handle_signals and threading.current_thread() is threading.main_thread():
            self.install_signal_handlers()
        try:
            failure = await loop.run_in_executor(self.executor, self.initialize)
            if failure is not None:
                log.error("initialize failed: %s", failure)
                runtime.shutdown()
                return ExitCode.INIT_FAILED
            if not self.stopping:
                code = await self._serve(runtime)
                if code != ExitCode.OK:
                    return code
            await self._unload(loop)
            log.info("stopped")
            return ExitCode.OK
        finally:
            if handle_signals and threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            self.executor.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, runtime: Any) -> ExitCode:
        config = self.config
        try:
            endpoint = runtime.endpoint(config.endpoint)
            runtime.register_engine_route("hardware_health", self.health_route)
            if config.registers:
                await self._register(endpoint)
            runtime.set_health_status(True)
            log.info(
                "serving %s as a Dynamo endpoint (type %s%s)",
                config.endpoint,
                config.type,
                f", model {config.served_model_name!r}" if config.registers else "",
            )
            await endpoint.serve_endpoint(self.handle, graceful_shutdown=True)
        except Exception as exc:  # noqa: BLE001 - any Dynamo failure ends the worker
            log.error("Dynamo: %s: %s", type(exc).__name__, exc)
            runtime.shutdown()
            self.cancel_all("Dynamo failure")
            return ExitCode.SERVER_LOST
        return ExitCode.OK

    async def _register(self, endpoint: Any) -> None:
        dyn = self.dyn
        model_type = {
            "image": dyn.ModelType.Images,
            "video": dyn.ModelType.Videos,
            "embedding": dyn.ModelType.Embedding,
        }[self.config.type]
        await dyn.register_model(
            dyn.ModelInput.Text,
            model_type,
            endpoint,
            self.config.registered_model_path,
            model_name=self.config.served_model_name,
            worker_type=dyn.WorkerType.Aggregated,
            # a worker is not a Hugging Face LLM: register a minimal card, fetch nothing
            skip_model_assets=True,
        )

    async def _unload(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the @unload functions on a predict thread, after the requests still running."""
        future = loop.run_in_executor(self.executor, self.unload)
        try:
            await asyncio.wait_for(future, timeout=max(self.config.drain_timeout, 1.0))
        except TimeoutError:
            log.warning("a predict call is still running; exiting without waiting for @unload")


def request_metadata(context: Any) -> dict[str, Any]:
    """The metadata a Dynamo client sent with the request (empty when there is none)."""
    if context is None:
        return {}
    try:
        return dict(context.metadata.items())
    except Exception:  # noqa: BLE001 - metadata is a convenience, never a failure
        return {}
