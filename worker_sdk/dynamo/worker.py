"""``DynamoWorker``: AITune's power-user base class, and the one lifecycle every entry uses.

Subclass it, override :meth:`DynamoWorker.setup` and :meth:`DynamoWorker.serve` (an async
generator: yield the response items), optionally :meth:`DynamoWorker.on_ready`, and call
:meth:`DynamoWorker.run`::

    from worker_sdk.dynamo import DynamoWorker

    class Echo(DynamoWorker):
        namespace, component, endpoint_name = "demo", "echo", "generate"

        def setup(self):
            self.prefix = "echo: "

        async def serve(self, request):
            yield {"text": self.prefix + str(request)}

    Echo().run()   # blocks until SIGTERM or SIGINT

What :meth:`run` does, in order: import Dynamo (``ImportError`` without it); ``setup()`` on
this thread; start a ``DistributedRuntime`` (from Dynamo's environment: ``DYN_DISCOVERY_BACKEND``,
``DYN_REQUEST_PLANE``, ...); install SIGTERM/SIGINT handlers that shut the runtime down (so its
discovery entries are removed); create the endpoint ``namespace.component.endpoint_name``;
await ``on_ready(runtime, endpoint)`` (register a model there; if it raises, the runtime is
shut down and the exception propagates); serve until a signal.  Then it waits up to
``drain_timeout`` seconds for the requests in flight, and returns.  A signal during ``setup()``
skips serving.  Exceptions from ``setup`` and ``on_ready`` propagate as they are; a runtime that
cannot start, or an endpoint that cannot be served, is :class:`DynamoFailed`.

``dynamo_worker(fn, config)`` and ``python -m worker_sdk.dynamo main.py`` both run a
:class:`worker_sdk.dynamo.server.FunctionWorker`, a subclass of this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncGenerator
from typing import Any

from .loader import (
    UnsafeDiscoveryDir,
    apply_enable_nats,
    discovery_backend,
    import_dynamo,
    request_plane,
    secure_discovery_dir,
)

log = logging.getLogger("worker_sdk.dynamo")


class DynamoFailed(RuntimeError):
    """Dynamo could not start (discovery unreachable, ...) or stopped serving; one line."""


class DynamoWorker:
    """Base class for Dynamo workers (AITune's power-user API).

    Subclass, override :meth:`setup` and :meth:`serve`, then call :meth:`run`.
    """

    namespace: str = "aitune"
    component: str = "backend"
    endpoint_name: str = "generate"
    #: ours: seconds a shutdown waits for requests in flight before :meth:`cancel_inflight`
    drain_timeout: float = 30.0

    # -- AITune's lifecycle -------------------------------------------------------------------
    def setup(self) -> None:
        """Initialize the model. Called once before serving starts.

        Raises:
            NotImplementedError: Must be overridden by subclasses.
        """
        raise NotImplementedError

    async def on_ready(self, runtime: Any, endpoint: Any) -> None:
        """Called once the endpoint exists, before it serves: call ``register_model`` here."""

    async def serve(self, request: Any) -> AsyncGenerator[Any, None]:
        """Handle one request: an async generator of response items.

        Add a parameter named ``context`` to receive Dynamo's request context.

        Raises:
            NotImplementedError: Must be overridden by subclasses.
        """
        raise NotImplementedError
        yield  # pragma: no cover

    def run(self, enable_nats: bool = False) -> None:
        """Start serving. Blocks until SIGTERM/SIGINT.

        Args:
            enable_nats: Enable NATS for Dynamo's event plane (``DYN_EVENT_PLANE=nats``).
        """
        run_worker(self, enable_nats=enable_nats)

    # -- ours: hooks a subclass may override --------------------------------------------------
    def cancel_inflight(self, why: str) -> None:
        """The drain timeout passed during a shutdown: cancel what still runs (default: no-op)."""

    def handles_signals(self) -> bool:
        """Whether :meth:`run` installs SIGTERM/SIGINT handlers (on the main thread only)."""
        return True

    async def on_stopped(self) -> None:
        """Called once the endpoint stopped serving, before :meth:`run` returns."""

    # -- ours: the lifecycle on a runtime ----------------------------------------------------
    @property
    def endpoint_path(self) -> str:
        return f"{self.namespace}.{self.component}.{self.endpoint_name}"

    @property
    def stopping(self) -> bool:
        return bool(getattr(self, "_stop_why", None))

    def request_stop(self, why: str) -> None:
        """Stop taking requests; those in flight get :attr:`drain_timeout` seconds (any thread
        once serving has begun: call it on the runtime's event loop)."""
        if self.stopping:
            log.info("%s: already stopping", why)
            return
        self._stop_why = why
        log.info("stopping (%s)", why)
        runtime = getattr(self, "_runtime", None)
        if runtime is not None:
            runtime.shutdown()
            loop = asyncio.get_running_loop()
            self._drain_timer = loop.call_later(self.drain_timeout, self.cancel_inflight,
                                                "shutdown")

    async def serve_on(self, runtime: Any, *, handle_signals: bool | None = None) -> None:
        """Serve on an existing ``DistributedRuntime`` until it shuts down (``setup`` done).

        Installs SIGTERM/SIGINT handlers when ``handle_signals`` (default:
        :meth:`handles_signals`) and this is the main thread.
        """
        loop = asyncio.get_running_loop()
        self._runtime = runtime
        if handle_signals is None:
            handle_signals = self.handles_signals()
        signals = handle_signals and threading.current_thread() is threading.main_thread()
        if signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop, f"signal {sig.name}")
        try:
            if self.stopping:  # a signal came during setup()
                runtime.shutdown()
            else:
                endpoint = runtime.endpoint(self.endpoint_path)
                try:
                    await self.on_ready(runtime, endpoint)
                except BaseException:
                    log.error("on_ready failed; shutting down")
                    runtime.shutdown()
                    raise
                if not self.stopping:
                    log.info("serving %s on Dynamo", self.endpoint_path)
                    try:
                        await endpoint.serve_endpoint(self.serve, graceful_shutdown=True)
                    except Exception as exc:  # noqa: BLE001 - Dynamo failed while serving
                        runtime.shutdown()
                        self.cancel_inflight("Dynamo failure")
                        raise DynamoFailed(f"Dynamo stopped serving {self.endpoint_path}: "
                                           f"{' '.join(str(exc).split())}") from exc
            await self.on_stopped()
        finally:
            timer = getattr(self, "_drain_timer", None)
            if timer is not None:
                timer.cancel()
            if signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)


def run_worker(worker: DynamoWorker, *, enable_nats: bool = False, setup: bool = True) -> None:
    """:meth:`DynamoWorker.run`: setup, a runtime of its own, serve until a signal, return.

    ``setup=False`` when the caller ran ``worker.setup()`` itself (the CLI does, to tell an
    ``@initialize`` failure from a Dynamo one).
    """
    dyn = import_dynamo()
    if enable_nats:
        apply_enable_nats()
    if setup:
        with stop_on_signal(worker):
            worker.setup()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        backend = discovery_backend()
        try:
            secure_discovery_dir()
        except UnsafeDiscoveryDir as exc:
            raise DynamoFailed(str(exc)) from None
        try:
            runtime = dyn.DistributedRuntime(loop, backend, request_plane())
        except Exception as exc:  # noqa: BLE001 - e.g. etcd unreachable, a bad backend name
            raise DynamoFailed(f"cannot start the Dynamo runtime (discovery {backend}): "
                               f"{' '.join(str(exc).split())}") from exc
        try:
            await worker.serve_on(runtime)
        finally:
            runtime.shutdown()

    try:
        import uvloop
    except ImportError:  # a dependency of ai-dynamo-runtime, but not required
        asyncio.run(main())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


@contextlib.contextmanager
def stop_on_signal(worker: DynamoWorker) -> Any:
    """During ``setup()`` (before any runtime): SIGTERM/SIGINT mean "do not serve, then exit"."""
    if not worker.handles_signals() or threading.current_thread() is not threading.main_thread():
        yield
        return

    def note(signum: int, _frame: Any) -> None:
        worker.request_stop(f"signal {signal.Signals(signum).name} during setup")

    saved = {sig: signal.signal(sig, note) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
