"""A small blocking Dynamo client, for scripts, tests and benchmarks.

It runs its own Dynamo runtime on a background event-loop thread::

    from worker_sdk.dynamo.client import Client
    from worker_sdk.dynamo.shapes import raw_bytes

    with Client("demo.echo.generate", discovery_dir="/tmp/dyn") as client:
        client.wait_for_instances(timeout=30)
        reply = client.call(b"hello")[0]
        print(raw_bytes(reply))
        stream = client.stream({"ticks": 100, "interval": 0.1})
        first = next(stream)
        stream.cancel()             # Dynamo's stop: the worker's request context is cancelled

A failed request raises :class:`~worker_sdk.dynamo.errors.RequestError` (its ``info``: Dynamo's
class, the code, and our retry hint); ``client.call(request, retries=2)`` sends a request that
an instance refused with "try another instance" (a 503 or 507 of ``vramtui --serve --dynamo``)
to the other instances, one by one, as long as nothing was answered yet.

Importing this module does not import Dynamo; creating a :class:`Client` does.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from types import TracebackType
from typing import Any

from .errors import RequestError, error_info
from .loader import apply_discovery_dir, import_dynamo, secure_discovery_dir

_ENV_LOCK = threading.Lock()
_END = object()


class Stream:
    """The response items of one request, as a blocking iterator; :meth:`cancel` stops it."""

    def __init__(
        self,
        client: Client,
        request: Any,
        timeout: float | None,
        request_id: str | None = None,
        metadata: dict[str, str] | None = None,
        instance_id: int | None = None,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._items: queue.Queue[Any] = queue.Queue()
        self.received = 0  # items handed to the reader so far
        self.context = client.dyn.Context(id=request_id, metadata=metadata)
        self._future: Future[None] = asyncio.run_coroutine_threadsafe(
            self._pump(request, instance_id), client.loop
        )

    async def _pump(self, request: Any, instance_id: int | None) -> None:
        endpoint = self._client.endpoint_client
        try:
            if instance_id is None:
                responses = await endpoint.generate(request, annotated=False,
                                                    context=self.context)
            else:
                responses = await endpoint.direct(request, instance_id, annotated=False,
                                                  context=self.context)
            async for item in responses:
                self._items.put(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
            self._items.put(_Failure(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._items.put(_END)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            item = self._items.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no response item within {self._timeout} s") from None
        if item is _END:
            self._items.put(_END)  # stay exhausted
            raise StopIteration
        if isinstance(item, _Failure):
            info = error_info(item.error) if isinstance(item.error, Exception) else None
            if info is not None:
                raise RequestError(str(item.error), info) from item.error
            raise item.error
        self.received += 1
        return item

    def cancel(self) -> None:
        """Ask the worker to stop generating (Dynamo's ``stop_generating``)."""
        self._client.loop.call_soon_threadsafe(self.context.stop_generating)


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Client:
    """A Dynamo client for one endpoint, usable from plain (non-async) code."""

    def __init__(self, endpoint: str, *, discovery_dir: str | None = None) -> None:
        self.dyn = import_dynamo()
        self.endpoint = endpoint
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="dynamo-client", daemon=True
        )
        self._thread.start()
        self.runtime: Any = None
        self.endpoint_client: Any = None
        try:
            self._run(self._open(discovery_dir), timeout=60)
        except BaseException:
            self.close()
            raise

    async def _open(self, discovery_dir: str | None) -> None:
        with _ENV_LOCK:
            saved = dict(os.environ)
            try:
                if discovery_dir:
                    apply_discovery_dir(discovery_dir)
                secure_discovery_dir()  # (UnsafeDiscoveryDir: one that others could write)
                self.runtime = self.dyn.DistributedRuntime(
                    asyncio.get_running_loop(),
                    os.environ.get("DYN_DISCOVERY_BACKEND", "etcd"),
                    os.environ.get("DYN_REQUEST_PLANE", "tcp"),
                )
            finally:
                os.environ.clear()
                os.environ.update(saved)
        self.endpoint_client = await self.runtime.endpoint(self.endpoint).client()

    def _run(self, coro: Any, timeout: float | None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def wait_for_instances(self, timeout: float = 30.0) -> list[int]:
        """Block until at least one worker serves the endpoint; their instance ids."""

        async def wait() -> list[int]:
            return list(await asyncio.wait_for(self.endpoint_client.wait_for_instances(), timeout))

        return self._run(wait(), timeout=None)

    def instance_ids(self) -> list[int]:
        """The instances discovery knows right now."""
        return list(self.endpoint_client.instance_ids())

    def stream(
        self,
        request: Any,
        *,
        timeout: float | None = 30.0,
        request_id: str | None = None,
        metadata: dict[str, str] | None = None,
        instance_id: int | None = None,
    ) -> Stream:
        """Send ``request``; iterate the response items (``timeout`` per item).

        ``request_id`` and ``metadata`` travel in Dynamo's request context: the worker sees
        them as ``worker_sdk.current().id`` and ``.metadata``.  ``instance_id`` sends it to that
        instance (Dynamo's ``direct``) instead of the next one in Dynamo's rotation.
        """
        return Stream(self, request, timeout, request_id, metadata, instance_id)

    def call(
        self,
        request: Any,
        *,
        timeout: float | None = 30.0,
        request_id: str | None = None,
        metadata: dict[str, str] | None = None,
        instance_id: int | None = None,
        retries: int = 0,
    ) -> list[Any]:
        """Send ``request`` and return all its response items.

        With ``retries``, a request refused before any answer with the hint "try another
        instance" goes to an instance that has not refused it yet (Dynamo's ``direct``), up to
        ``retries`` more times; the last refusal is raised when none is left.
        """
        refused: set[int] = set()
        target = instance_id
        attempt = 0
        while True:
            stream = self.stream(request, timeout=timeout, request_id=request_id,
                                 metadata=metadata, instance_id=target)
            try:
                return list(stream)
            except RequestError as exc:
                if attempt >= retries or stream.received or not exc.info.try_another_instance:
                    raise
                refused.add(exc.info.instance_id if exc.info.instance_id is not None
                            else target if target is not None else -1)
                others = [i for i in self.instance_ids() if i not in refused]
                if not others:
                    raise
                target = others[0]
                attempt += 1

    def close(self) -> None:
        if self.runtime is not None:
            self.loop.call_soon_threadsafe(self.runtime.shutdown)
            self.runtime = None
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self.loop.is_running():
            self.loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
