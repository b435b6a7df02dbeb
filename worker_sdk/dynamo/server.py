"""``FunctionWorker``: a function, a model or a decorated worker script served on Dynamo.

The :class:`~worker_sdk.dynamo.worker.DynamoWorker` behind both entries:
``dynamo_worker(fn, config)`` (AITune's calling convention) and ``python -m worker_sdk.dynamo
main.py`` (our decorated functions).  What ``serve`` hands the served function:

- AITune's convention (a function, a ``torch.nn.Module``, any callable given to
  ``dynamo_worker``): the typed request of the endpoint type
  (:mod:`worker_sdk.dynamo.requests`; for ``raw``, the request as Dynamo delivered it) as its
  one argument, or, with ``config.mapping``, ``fn(**mapping(request))``;
- a decorated ``@predict`` (the script's registry): the request's bytes, exactly as under
  ``python -m worker_sdk`` (:func:`worker_sdk.dynamo.shapes.request_payload`), and the request
  context as a second argument when it takes one.

Either way the call runs off the event loop, on a pool of ``concurrency`` threads (one by
default, so a model's CUDA work stays on the thread that ran its ``@initialize`` functions, as in
the socket worker); sync and async functions, generators and async generators all work, and
their results are shaped by :class:`~worker_sdk.dynamo.shapes.Shaper`.  Each request gets a
:class:`~worker_sdk.RequestContext` (``worker_sdk.current()`` works) whose id and metadata are
Dynamo's; the thread hands shaped items to the handler through an asyncio queue, with a small
window of credits so a fast generator cannot outrun a slow client.  A Dynamo stop or kill of
the request (the client stopped, or dropped the stream) cancels the context; so does a shutdown
whose in-flight requests outlive the drain timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
import logging
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from .. import context as ctxmod
from ..asyncpredict import iterate_async, run_async
from ..context import Cancelled, RequestContext
from ..registry import REGISTRY, Registry, takes_context
from . import shapes
from .config import DynamoWorkerConfig
from .worker import DynamoFailed, DynamoWorker

log = logging.getLogger("worker_sdk.dynamo")

_WINDOW = 8  # stream items a predict thread may run ahead of the client
# A request is watched for Dynamo's stop only once it has lasted this long: the watch (a Rust
# future per request) costs as much as a short request's own work, and a stop sent earlier is
# seen as soon as the watch begins.
WATCH_AFTER_S = 0.02


class _Call:
    """One request in flight: its context, its shaper and the queue the thread fills."""

    __slots__ = ("ctx", "argument", "shaper", "queue", "loop", "credits", "closed",
                 "cancelled_by", "watch")

    def __init__(
        self, argument: Any, shaper: shapes.Shaper, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.argument = argument
        self.shaper = shaper
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.credits = threading.Semaphore(_WINDOW)
        self.closed = False
        self.cancelled_by: str | None = None
        self.watch: asyncio.Task[None] | None = None
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


class InitializeFailed(RuntimeError):
    """An ``@initialize`` function raised (its traceback was printed); the message is one line."""


def is_torch_module(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module`` (never imports torch: one exists only if it is)."""
    torch = sys.modules.get("torch")
    module_cls = getattr(getattr(torch, "nn", None), "Module", None)
    return isinstance(module_cls, type) and isinstance(obj, module_cls)


class FunctionWorker(DynamoWorker):
    """Serve a function, a model or a decorated worker script as one Dynamo endpoint.

    ``target`` is a callable (AITune's convention: ``fn(request)`` or ``fn(**mapping(request))``)
    or a :class:`~worker_sdk.registry.Registry` (the decorated ``@predict`` gets bytes).  A
    callable is served with the script's decorated ``@initialize``, ``@hardware_health`` and
    ``@unload`` functions, if it has any.
    """

    def __init__(self, target: Callable[..., Any] | Registry, config: DynamoWorkerConfig, *,
                 script: str = "worker script") -> None:
        if isinstance(target, Registry):
            self.registry = target
            self.predict = target.require_predict(script)
            self.aitune_call = config.mapping is not None
        elif callable(target):
            self.registry = REGISTRY
            self.predict = target
            self.aitune_call = True
        else:
            raise TypeError(f"dynamo_worker() serves a function, a model or a Registry, "
                            f"got {target!r}")
        self.takes_context = (self.registry.predict_takes_context
                              if self.predict is self.registry.predict
                              else takes_context(self.predict))
        self.config = config
        self.namespace, self.component = config.namespace, config.component
        self.endpoint_name = config.endpoint
        self.drain_timeout = config.drain_timeout
        self.dyn: SimpleNamespace | None = None
        self.executor = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="worker-predict"
        )
        self._seq = itertools.count(1)
        self._inflight: set[_Call] = set()
        self._local = threading.local()
        self._thread_loops: list[asyncio.AbstractEventLoop] = []

    def handles_signals(self) -> bool:
        return self.config.handle_signals

    # -- lifecycle ----------------------------------------------------------------------------
    def setup(self) -> None:
        """Run the ``@initialize`` functions in order, on the predict thread."""
        failure = self.executor.submit(self._initialize).result()
        if failure is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            raise InitializeFailed(failure)

    def _initialize(self) -> str | None:
        for fn in self.registry.ordered_initializers():
            if self.stopping:
                return None
            try:
                fn()
            except Exception as exc:  # noqa: BLE001 - an init failure of any kind is reported
                traceback.print_exc()
                return f"{type(exc).__name__}: {exc}"
        return None

    async def on_ready(self, runtime: Any, endpoint: Any) -> None:
        """The health route, ``register_model`` for a typed endpoint, then healthy."""
        from .loader import import_dynamo

        self.dyn = import_dynamo()
        runtime.register_engine_route("hardware_health", self.health_route)
        if self.config.registers:
            try:
                await self._register(endpoint)
            except Exception as exc:  # noqa: BLE001 - the worker cannot be found without it
                raise DynamoFailed(f"register_model failed for {self.endpoint_path}: "
                                   f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                                   ) from exc
        runtime.set_health_status(True)
        log.info("serving %s as a Dynamo endpoint (type %s%s)", self.endpoint_path,
                 self.config.type,
                 f", model {self.config.served_model_name!r}" if self.config.registers else "")

    async def _register(self, endpoint: Any) -> None:
        dyn = self.dyn
        assert dyn is not None
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

    def cancel_inflight(self, why: str) -> None:
        for call in list(self._inflight):
            log.info("cancelling request %s (%s)", call.ctx.id, why)
            call.cancel(why)

    def request_stop(self, why: str) -> None:
        if not self.stopping and getattr(self, "_runtime", None) is not None:
            log.info("%d request(s) in flight", len(self._inflight))
        super().request_stop(why)

    async def on_stopped(self) -> None:
        """Run the ``@unload`` functions on a predict thread, after the requests still running."""
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.executor, self.unload)
        try:
            await asyncio.wait_for(future, timeout=max(self.config.drain_timeout, 1.0))
        except TimeoutError:
            log.warning("a predict call is still running; exiting without waiting for @unload")
        self.executor.shutdown(wait=False, cancel_futures=True)
        log.info("stopped")

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

    # -- requests (event loop) ----------------------------------------------------------------
    async def serve(self, request: Any, context: Any = None) -> AsyncIterator[Any]:
        """Dynamo's handler: ``request`` in, shaped response items out.

        Dynamo passes its per-request context only to a parameter named ``context``.
        """
        dyn = self.dyn
        assert dyn is not None
        loop = asyncio.get_running_loop()
        request_id = str(context.id()) if context is not None else ""
        kind = self.config.type
        try:
            if self.aitune_call:
                from .requests import parse_request

                argument: Any = parse_request(kind, request)
            else:
                argument = shapes.request_payload(kind, request)
        except shapes.ShapeError as exc:
            raise dyn.HttpError(400, str(exc)) from None
        shaper = shapes.Shaper(
            kind,
            model=self.config.served_model_name,
            request=request,
            request_id=request_id,
            stream_progress=self.config.progress,
        )
        call = _Call(argument, shaper, loop)
        call.ctx = RequestContext(
            next(self._seq),
            request_id=request_id or None,
            metadata=request_metadata(context),
            progress_sink=call.progress,
        )
        self._inflight.add(call)
        watcher: asyncio.TimerHandle | None = None
        if context is not None:
            watcher = loop.call_later(WATCH_AFTER_S, self._start_watch, context, call)
        future = loop.run_in_executor(self.executor, self._run, call)
        try:
            while True:
                item_kind, value = await call.queue.get()
                if call.cancelled_by is not None:
                    item_kind, value = "error", Cancelled(f"request {call.ctx.id} was cancelled")
                if item_kind == "item":
                    yield value
                    call.credits.release()
                elif item_kind == "end":
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
            if call.watch is not None:
                call.watch.cancel()
            self._inflight.discard(call)

    def _start_watch(self, context: Any, call: _Call) -> None:
        """A request still in flight after :data:`WATCH_AFTER_S`: watch it for Dynamo's stop."""
        call.watch = asyncio.ensure_future(self._watch(context, call))

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
        dyn = self.dyn
        assert dyn is not None
        if isinstance(exc, Cancelled | asyncio.CancelledError):
            if call.cancelled_by == "client":
                return None  # the client stopped or went away: it reads nothing more
            return dyn.Cancelled(f"request {call.ctx.id} was cancelled")
        if isinstance(exc, shapes.ReplyStatus):
            return dyn.HttpError(exc.status_code, exc.message)
        error = dyn.HttpError(500, f"{type(exc).__name__}: {exc}")
        # Dynamo prints the traceback of what a handler raises; chained, it shows predict's.
        error.__cause__ = exc
        return error

    # -- requests (predict threads) -----------------------------------------------------------
    def _invoke(self, call: _Call) -> Any:
        """Call the served function as its convention says (see the module docstring)."""
        if self.aitune_call:
            mapping = self.config.mapping
            if mapping is None:
                return self.predict(call.argument)
            kwargs = mapping(call.argument)
            if not isinstance(kwargs, dict):
                raise TypeError(f"DynamoWorkerConfig.mapping must return a dict, "
                                f"got {type(kwargs).__name__}")
            return self.predict(**kwargs)
        if self.takes_context:
            return self.predict(call.argument, call.ctx)
        return self.predict(call.argument)

    def _run(self, call: _Call) -> None:
        ctx = call.ctx
        token = ctxmod.activate(ctx)
        try:
            ctx.check_cancelled()
            result = self._invoke(call)
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


def request_metadata(context: Any) -> dict[str, Any]:
    """The metadata a Dynamo client sent with the request (empty when there is none)."""
    if context is None:
        return {}
    try:
        return dict(context.metadata.items())
    except Exception:  # noqa: BLE001 - metadata is a convenience, never a failure
        return {}
